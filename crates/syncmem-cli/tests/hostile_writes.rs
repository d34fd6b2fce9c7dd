//! Every file the command writes (`train --save`, `train --snapshot`, `trace record --out`,
//! `SYNCMEM_TRACE`) goes through a temporary file renamed over the target: targets that a
//! rename would destroy (a device node, a FIFO, a directory) are refused before any work, and a
//! symbolic link is followed to its target.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{refused, run, run_env};

/// A fresh directory under the temporary directory, removed with its contents when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "syncmem-cli-writes-{}-{n}-{what}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[cfg(target_os = "linux")]
fn mkfifo(p: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", p.display());
}

#[cfg(target_os = "linux")]
fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
}

/// Reads (and counts) whatever is written into a FIFO until dropped, so that a writer that
/// opened it (wrongly) never blocks: the test can then report what it did.
#[cfg(target_os = "linux")]
struct Drain {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

#[cfg(target_os = "linux")]
impl Drain {
    fn new(p: &Path) -> Drain {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        const O_NONBLOCK: i32 = 0o4000;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_NONBLOCK)
            .open(p)
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut total = 0;
            let mut buf = vec![0u8; 1 << 16];
            while !flag.load(Ordering::Relaxed) {
                match f.read(&mut buf) {
                    Ok(n) if n > 0 => total += n,
                    _ => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
            total
        });
        Drain {
            stop,
            thread: Some(thread),
        }
    }

    /// Bytes written into the FIFO.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A short training run writing `flag path` (the run is what a refusal must prevent).
fn train_writing(flag: &str, path: &str) -> std::process::Output {
    run(&[
        "train", "--device", "cpu", "--epochs", "1", "--hidden", "4", flag, path,
    ])
}

/// Requires a refusal of `path` before any work: exit status 1, nothing on stdout, a message
/// naming the flag, the path and what it is.
fn assert_refused(what: &str, out: &std::process::Output, path: &str, kind: &str) {
    let stderr = refused(what, out);
    assert!(out.stdout.is_empty(), "{what}: worked before refusing");
    for needle in [path, kind, "not a regular file"] {
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} missing from {stderr}"
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn writes_refuse_a_fifo_before_any_work() {
    let dir = TempDir::new("fifo");
    let fifo = dir.join("pipe");
    mkfifo(&fifo);
    let drain = Drain::new(&fifo);
    for flag in ["--save", "--snapshot"] {
        let out = train_writing(flag, arg(&fifo));
        assert_refused(flag, &out, arg(&fifo), "a FIFO");
        assert!(String::from_utf8_lossy(&out.stderr).contains(flag));
        assert!(is_fifo(&fifo), "{flag} replaced the FIFO");
    }
    let out = run(&[
        "trace",
        "record",
        "--device",
        "cpu",
        "--hidden",
        "4",
        "--out",
        arg(&fifo),
    ]);
    assert_refused("trace record --out", &out, arg(&fifo), "a FIFO");
    let out = run_env(&["devices"], &[("SYNCMEM_TRACE", &fifo)]);
    assert_refused("SYNCMEM_TRACE", &out, arg(&fifo), "a FIFO");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SYNCMEM_TRACE"));
    assert!(is_fifo(&fifo));
    assert_eq!(drain.finish(), 0, "something was written into the FIFO");
}

/// `/dev/null` is refused by every writer and stays a character device (as root, a rename
/// would have replaced it with a regular file).
#[cfg(unix)]
#[test]
fn writes_refuse_dev_null_and_leave_it_a_device() {
    use std::os::unix::fs::FileTypeExt;
    let null = "/dev/null";
    for flag in ["--save", "--snapshot"] {
        assert_refused(flag, &train_writing(flag, null), null, "a character device");
    }
    let out = run(&[
        "trace", "record", "--device", "cpu", "--hidden", "4", "--out", null,
    ]);
    assert_refused("trace record --out", &out, null, "a character device");
    let out = run_env(&["devices"], &[("SYNCMEM_TRACE", null)]);
    assert_refused("SYNCMEM_TRACE", &out, null, "a character device");
    let m = std::fs::metadata(null).unwrap();
    assert!(
        m.file_type().is_char_device(),
        "/dev/null is no longer a device"
    );
}

#[test]
fn writes_refuse_a_directory_before_any_work() {
    let dir = TempDir::new("dir");
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for flag in ["--save", "--snapshot"] {
        assert_refused(
            flag,
            &train_writing(flag, arg(&sub)),
            arg(&sub),
            "a directory",
        );
    }
    let out = run(&[
        "trace",
        "record",
        "--device",
        "cpu",
        "--hidden",
        "4",
        "--out",
        arg(&sub),
    ]);
    assert_refused("trace record --out", &out, arg(&sub), "a directory");
    assert!(sub.is_dir());
}

/// A symbolic link is followed: the file it points to is written, the link stays a link.
#[cfg(unix)]
#[test]
fn writes_follow_a_symbolic_link() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new("links");
    for (flag, name) in [("--save", "w.safetensors"), ("--snapshot", "s.json")] {
        let target = dir.join(name);
        std::fs::write(&target, b"old").unwrap();
        let link = dir.join(&format!("link-{name}"));
        symlink(name, &link).unwrap();
        let out = train_writing(flag, arg(&link));
        assert!(
            out.status.success(),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{flag} replaced the link"
        );
        assert_ne!(
            std::fs::read(&target).unwrap(),
            b"old",
            "{flag}: target not written"
        );
    }
    let ws = syncmem::Workspace::new();
    ws.load(dir.join("w.safetensors"), None, None).unwrap();
    assert!(ws.has_blob("fc1_w"));
    let snapshot: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("s.json")).unwrap()).unwrap();
    assert_eq!(snapshot["device"], "cpu");
    // No temporary file is left behind.
    let mut names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "link-s.json",
            "link-w.safetensors",
            "s.json",
            "w.safetensors"
        ]
    );
}
