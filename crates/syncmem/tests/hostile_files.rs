//! Paths and files a hostile (or careless) user hands the library: writes aimed at device
//! nodes, FIFOs, directories and symbolic links; reads of endless or oversized inputs; traces
//! whose sizes would overflow the statistics.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use syncmem::dtype::DType;
use syncmem::report::{replay_with, EnvTrace, ReplayOptions, Trace, TraceEvent};
use syncmem::{Error, PoolConfig, PoolKind, Tensor, Workspace};

/// A fresh directory under the temporary directory, removed with its contents when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("syncmem-hostile-{}-{n}-{what}", std::process::id()));
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

fn workspace() -> Workspace {
    let ws = Workspace::new();
    ws.feed(
        "w",
        Tensor::from_slice(&[2], &[1.0_f32, 2.0], None).unwrap(),
    )
    .unwrap();
    ws
}

#[cfg(target_os = "linux")]
fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", p.display());
}

#[cfg(target_os = "linux")]
fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

/// A non-blocking reader of the FIFO `p`, so that a writer that (wrongly) opens it does not
/// wait for a reader forever.
#[cfg(target_os = "linux")]
fn fifo_reader(p: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(p)
        .unwrap()
}

/// Asserts that `e` is an I/O error naming `p` and saying what it is.
fn assert_refused(e: &Error, p: &Path, kind: &str) {
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&p.display().to_string()), "{text}");
    assert!(text.contains(kind), "{kind:?} missing from: {text}");
    assert!(text.contains("not a regular file"), "{text}");
}

/// Every writer of the library refuses a FIFO and leaves it a FIFO (a rename would have
/// replaced it with a regular file, as `/dev/null` was replaced when run as root).
#[cfg(target_os = "linux")]
#[test]
fn writers_refuse_a_fifo_and_leave_it_alone() {
    let dir = TempDir::new("fifo");
    let fifo = dir.join("pipe");
    mkfifo(&fifo);
    let _reader = fifo_reader(&fifo);
    let e = workspace().save(&fifo, None).unwrap_err();
    assert_refused(&e, &fifo, "a FIFO");
    assert!(is_fifo(&fifo), "Workspace::save replaced the FIFO");

    let e = Trace::synthetic(1).save_file(&fifo).unwrap_err();
    assert_refused(&e, &fifo, "a FIFO");
    assert!(is_fifo(&fifo), "Trace::save_file replaced the FIFO");

    let e = EnvTrace::start(&fifo).unwrap_err();
    assert_refused(&e, &fifo, "a FIFO");
    assert!(is_fifo(&fifo));
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

/// A device node is refused without touching it (`/dev/null` stays a character device).
#[cfg(unix)]
#[test]
fn writers_refuse_a_device_node() {
    use std::os::unix::fs::FileTypeExt;
    let null = Path::new("/dev/null");
    let e = workspace().save(null, None).unwrap_err();
    assert_refused(&e, null, "a character device");
    let e = Trace::synthetic(1).save_file(null).unwrap_err();
    assert_refused(&e, null, "a character device");
    let e = EnvTrace::start(null).unwrap_err();
    assert_refused(&e, null, "a character device");
    assert!(std::fs::metadata(null)
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn writers_refuse_a_directory() {
    let dir = TempDir::new("dir");
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let e = workspace().save(&sub, None).unwrap_err();
    assert_refused(&e, &sub, "a directory");
    let e = Trace::synthetic(1).save_file(&sub).unwrap_err();
    assert_refused(&e, &sub, "a directory");
    assert!(sub.is_dir());
}

/// A symbolic link is followed: its target gets the new contents and the link stays a link,
/// also through a chain of links and to a target that does not exist yet.
#[cfg(unix)]
#[test]
fn writers_follow_symbolic_links() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new("links");
    let target = dir.join("real.safetensors");
    std::fs::write(&target, b"old").unwrap();
    let link = dir.join("link.safetensors");
    symlink("real.safetensors", &link).unwrap();
    let chain = dir.join("chain.safetensors");
    symlink(&link, &chain).unwrap();

    workspace().save(&chain, None).unwrap();
    for l in [&link, &chain] {
        assert!(std::fs::symlink_metadata(l)
            .unwrap()
            .file_type()
            .is_symlink());
    }
    let back = Workspace::new();
    back.load(&target, None, None).unwrap();
    assert_eq!(back.fetch::<f32>("w").unwrap(), [1.0, 2.0]);

    let trace_target = dir.join("trace.jsonl");
    let trace_link = dir.join("trace-link.jsonl");
    symlink(&trace_target, &trace_link).unwrap();
    let t = Trace::synthetic(1);
    t.save_file(&trace_link).unwrap();
    assert!(std::fs::symlink_metadata(&trace_link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        Trace::load_file(&trace_target).unwrap().events(),
        t.events()
    );

    // A link to a device node is refused like the node itself.
    let to_null = dir.join("to-null");
    symlink("/dev/null", &to_null).unwrap();
    let e = workspace().save(&to_null, None).unwrap_err();
    assert_refused(&e, &to_null, "a character device");
}

/// `/dev/zero` is endless: the load reads a bounded header and fails, instead of reading until
/// memory runs out.
#[cfg(unix)]
#[test]
fn loading_an_endless_file_is_an_error() {
    let zero = Path::new("/dev/zero");
    let ws = Workspace::new();
    let e = ws.load(zero, None, None).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
    assert!(e.to_string().contains("/dev/zero"), "{e}");
    assert!(ws.local_blobs().is_empty());

    let e = Trace::load_file(zero).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
    assert!(e.to_string().contains("line 1"), "{e}");
    assert!(e.to_string().contains("longer than"), "{e}");
}

/// A file streamed through a FIFO (no size known in advance) loads when it holds exactly what
/// its header says, and is an error when it goes on past it.
#[cfg(target_os = "linux")]
#[test]
fn loading_from_a_fifo_streams_and_checks_the_end() {
    let dir = TempDir::new("stream");
    let file = dir.join("good.safetensors");
    let src = Workspace::new();
    src.feed("a", Tensor::from_slice(&[3], &[1_i32, 2, 3], None).unwrap())
        .unwrap();
    src.feed("b", Tensor::from_slice(&[2], &[true, false], None).unwrap())
        .unwrap();
    src.save(&file, None).unwrap();
    let good = std::fs::read(&file).unwrap();
    let mut long = good.clone();
    long.extend_from_slice(b"extra");

    for (bytes, ok) in [(good, true), (long, false)] {
        let fifo = dir.join(&format!("pipe-{ok}"));
        mkfifo(&fifo);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                // The reader may stop early: a broken pipe is fine.
                let _ = std::fs::write(&fifo, bytes);
            })
        };
        let ws = Workspace::new();
        let r = ws.load(&fifo, None, Some(&["b"]));
        writer.join().unwrap();
        if ok {
            assert_eq!(r.unwrap(), ["b"]);
            assert_eq!(ws.fetch::<bool>("b").unwrap(), [true, false]);
            assert_eq!(
                ws.tensor("b").unwrap().read().unwrap().dtype(),
                Some(DType::Bool)
            );
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "{e}");
            assert!(e.to_string().contains("past the"), "{e}");
            assert!(ws.local_blobs().is_empty());
        }
    }
}

/// A trace line longer than the bound is an error naming the line, whatever follows.
#[test]
fn trace_lines_are_bounded() {
    let mut text = String::from("{\"op\":\"free\",\"id\":0,\"device\":\"x\"}\n");
    text.push_str(&" ".repeat(syncmem::report::MAX_LINE_BYTES + 1));
    text.push('\n');
    let e = Trace::load(text.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
}

fn alloc(id: u64, size: usize) -> TraceEvent {
    TraceEvent::Alloc {
        id,
        size,
        stream: 1,
        device: "d".into(),
        owner: None,
        place: None,
        operator: None,
        frames: Vec::new(),
    }
}

/// Sizes near the top of `usize` neither wrap nor panic: summaries saturate, loading and
/// replaying refuse sizes no program has.
#[test]
fn absurd_trace_sizes_never_overflow() {
    let huge = usize::MAX / 2 + 1;
    let t = Trace::from_events(vec![
        alloc(0, huge),
        alloc(u64::MAX, huge),
        TraceEvent::Copy {
            direction: syncmem::Direction::HostToDevice,
            bytes: usize::MAX,
            device: "d".into(),
            stream: None,
            peer: None,
        },
        TraceEvent::Copy {
            direction: syncmem::Direction::HostToDevice,
            bytes: usize::MAX,
            device: "d".into(),
            stream: None,
            peer: None,
        },
        TraceEvent::Evict {
            label: "x".into(),
            bytes: usize::MAX,
            device: "d".into(),
        },
        TraceEvent::Evict {
            label: "x".into(),
            bytes: usize::MAX,
            device: "d".into(),
        },
    ]);
    let s = t.summary();
    assert_eq!(s.allocs, 2);
    assert_eq!(s.alloc_bytes, u64::MAX, "saturated, not wrapped");
    assert_eq!(s.copies.host_to_device.bytes, u64::MAX);
    assert_eq!(s.evicted_bytes, u64::MAX);

    // Replaying refuses sizes above the per-event limit...
    let e = replay_with(
        &t,
        &PoolConfig::new(PoolKind::Caching),
        &ReplayOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("limit"), "{e}");
    // ... and totals no program allocates, each size within the limit.
    let max = syncmem::report::MAX_EVENT_BYTES as usize;
    let many: Vec<TraceEvent> = (0..(1 << 15) + 1).map(|i| alloc(i, max)).collect();
    let e = replay_with(
        &Trace::from_events(many),
        &PoolConfig::new(PoolKind::Binned),
        &ReplayOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("in all"), "{e}");

    // Loading refuses them, naming the line.
    let text = format!(
        "{{\"op\":\"alloc\",\"id\":0,\"size\":1,\"stream\":1,\"device\":\"d\"}}\n\
         {{\"op\":\"alloc\",\"id\":1,\"size\":{huge},\"stream\":1,\"device\":\"d\"}}\n"
    );
    let e = Trace::load(text.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
    assert!(e.to_string().contains(&huge.to_string()), "{e}");
}
