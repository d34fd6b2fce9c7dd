//! `syncmem trace export-torch`: a recorded training run as a snapshot in PyTorch's format,
//! loaded with Python's own `pickle` by `scripts/check_torch_snapshot.py`, which checks the
//! two properties PyTorch's viewer relies on (blocks tile their segments; the history replays
//! backwards from the final state to an empty one). Where `torch` is importable, also runs
//! `python -m torch.cuda._memory_viz stats` on it.
//!
//! Without `python3` the Python checks print a note and pass, unless
//! `SYNCMEM_REQUIRE_PYTHON=1` (CI sets it).

mod common;

use std::path::Path;
use std::process::Command;

use common::{ok, ok_env, TempPath};
use syncmem::report::torch::{TorchBlock, TorchSegment, TorchSnapshot, TorchState};

fn python() -> Option<&'static str> {
    let found = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("python3");
    }
    assert!(
        std::env::var("SYNCMEM_REQUIRE_PYTHON").map_or(true, |v| v != "1"),
        "SYNCMEM_REQUIRE_PYTHON=1 but python3 was not found"
    );
    println!("note: no python3: the snapshot was not loaded with Python's pickle");
    None
}

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check_torch_snapshot.py")
}

/// Runs the check script on `file`; returns (success, stdout + stderr).
fn check(py: &str, file: &TempPath, from_empty: bool) -> (bool, String) {
    let mut c = Command::new(py);
    c.arg(script()).arg(&file.0);
    if from_empty {
        c.arg("--from-empty");
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_recorded_run_exports_to_a_snapshot_python_loads() {
    let trace = TempPath::new("torch", "run.jsonl");
    let snap = TempPath::new("torch", "run.pickle");
    // Two mirrors: the host pool is in the trace too.
    ok_env(
        &["trace", "record", "--epochs", "2", "--out", trace.arg()],
        &[("SYNCMEM_ZERO_COPY", "off")],
    );
    let out = ok(&["trace", "export-torch", trace.arg(), "-o", snap.arg()]);
    assert!(out.contains("device 0: "), "{out}");
    assert!(out.contains(": host"), "{out}");
    let bytes = std::fs::read(&snap.0).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x03", "protocol 3");
    let Some(py) = python() else { return };
    let (good, text) = check(py, &snap, true);
    assert!(good, "{text}");
    assert!(text.contains("replay ok"), "{text}");

    // The checks can fail: a segment whose blocks do not tile it is caught.
    let bad = TempPath::new("torch", "bad.pickle");
    let mut s = TorchSnapshot::default();
    s.device_labels.push("dev".into());
    s.device_traces.push(Vec::new());
    s.segments.push(TorchSegment {
        device: 0,
        address: 1 << 36,
        total_size: 4096,
        stream: 0,
        blocks: vec![TorchBlock {
            size: 1024,
            requested_size: 1000,
            state: TorchState::Allocated,
            frame: None,
        }],
    });
    s.save_file(&bad.0).unwrap();
    let (good, text) = check(py, &bad, false);
    assert!(!good && text.contains("do not tile"), "{text}");

    // PyTorch's own summary, where torch is installed.
    let has_torch = Command::new(py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        println!("note: torch is not installed: `python -m torch.cuda._memory_viz stats` not run");
        return;
    }
    let out = Command::new(py)
        .args(["-m", "torch.cuda._memory_viz", "stats"])
        .arg(&snap.0)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "_memory_viz stats failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("segment"), "{text}");
}
