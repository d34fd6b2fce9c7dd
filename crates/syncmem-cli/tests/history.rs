//! The failing run, seen: `syncmem trace record` keeps the trace of a run that fails and says
//! so; `syncmem train --on-oom-dump DIR` leaves the report, a PyTorch snapshot and the history
//! at an out-of-memory failure, which `trace view` and `trace export-torch --at oom` open;
//! `export-torch --at` picks the instant (on `cpu` and on OpenCL/PoCL).

mod common;

use std::path::Path;
use std::process::Command;

use common::{fails, ok, run, TempPath};
use syncmem::report::{Trace, TraceEvent};

/// The kinds of the events of the trace file `path`.
fn kinds(path: &Path) -> Vec<&'static str> {
    let t = Trace::load_file(path).unwrap();
    t.events().iter().map(TraceEvent::kind).collect()
}

/// Loads `file` with Python's pickle and checks it as PyTorch's viewer would, where python3 is.
fn python_checks(file: &str) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check_torch_snapshot.py");
    let Ok(out) = Command::new("python3").arg(script).arg(file).output() else {
        println!("note: no python3: the snapshot was not loaded with Python's pickle");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn a_failed_recording_keeps_its_trace(device: &str) {
    let trace = TempPath::new(
        "history",
        &format!("{device}-failed.jsonl").replace(':', "-"),
    );
    let err = fails(&[
        "trace",
        "record",
        "--device",
        device,
        "--memory-cap",
        "4KiB",
        "--out",
        trace.arg(),
    ]);
    assert!(err.contains("trace up to the failure"), "{err}");
    assert!(err.contains("out of memory"), "{err}");
    // The failure is in it, and the frees of the run's buffers after it.
    let k = kinds(&trace.0);
    assert!(k.contains(&"oom"), "{k:?}");
    // The instant of the failure exports; a step the run never reached is refused.
    let snap = TempPath::new(
        "history",
        &format!("{device}-failed.pickle").replace(':', "-"),
    );
    let out = ok(&[
        "trace",
        "export-torch",
        "--at",
        "oom",
        trace.arg(),
        "-o",
        snap.arg(),
    ]);
    assert!(out.contains("alive at oom"), "{out}");
    python_checks(snap.arg());
    let err = fails(&[
        "trace",
        "export-torch",
        "--at",
        "step 9",
        trace.arg(),
        "-o",
        snap.arg(),
    ]);
    assert!(err.contains("no event of step 9"), "{err}");
}

fn an_out_of_memory_leaves_a_snapshot_and_a_history(device: &str) {
    let dir = std::env::temp_dir().join(format!(
        "syncmem-cli-history-{}-{}",
        std::process::id(),
        device.replace(':', "-")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = run(&[
        "train",
        "--device",
        device,
        "--memory-cap",
        "64KiB",
        "--on-oom-dump",
        d,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("out of memory 1 time(s)"), "{err}");
    for f in ["oom-1.txt", "oom-1.snapshot.pickle", "oom-1.history.jsonl"] {
        assert!(dir.join(f).is_file(), "{f} missing: {err}");
    }
    python_checks(dir.join("oom-1.snapshot.pickle").to_str().unwrap());
    let history = dir.join("oom-1.history.jsonl");
    let k = kinds(&history);
    assert_eq!(k.last(), Some(&"oom"), "{k:?}");
    assert!(k.iter().filter(|k| **k == "alloc").count() > 4, "{k:?}");
    // The allocations name the operator that made them.
    let t = Trace::load_file(&history).unwrap();
    assert!(t.events().iter().any(|e| matches!(e,
        TraceEvent::Alloc { operator: Some(op), .. } if op.contains("FC"))));
    let page = dir.join("page.html");
    let out = ok(&[
        "trace",
        "view",
        history.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(out.contains("wrote"), "{out}");
    let snap = dir.join("at-oom.pickle");
    ok(&[
        "trace",
        "export-torch",
        "--at",
        "oom",
        history.to_str().unwrap(),
        "-o",
        snap.to_str().unwrap(),
    ]);
    python_checks(snap.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failing_runs_on_cpu() {
    a_failed_recording_keeps_its_trace("cpu");
    an_out_of_memory_leaves_a_snapshot_and_a_history("cpu");
}

#[cfg(feature = "opencl")]
#[test]
fn failing_runs_on_opencl() {
    if syncmem::testing::opencl_or_skip("failing_runs_on_opencl").is_none() {
        return;
    }
    a_failed_recording_keeps_its_trace("opencl:0");
    an_out_of_memory_leaves_a_snapshot_and_a_history("opencl:0");
}

#[test]
fn export_torch_takes_the_peak_by_default() {
    let trace = TempPath::new("history", "run.jsonl");
    let snap = TempPath::new("history", "run.pickle");
    ok(&["trace", "record", "--device", "cpu", "--out", trace.arg()]);
    let out = ok(&["trace", "export-torch", trace.arg(), "-o", snap.arg()]);
    assert!(out.contains("alive at peak"), "{out}");
    python_checks(snap.arg());
    let out = ok(&[
        "trace",
        "export-torch",
        "--at",
        "step 2",
        trace.arg(),
        "-o",
        snap.arg(),
    ]);
    assert!(
        out.contains("alive at step 2") && out.contains(", step 2)"),
        "{out}"
    );
    let out = ok(&[
        "trace",
        "export-torch",
        "--at",
        "end",
        trace.arg(),
        "-o",
        snap.arg(),
    ]);
    assert!(out.contains("alive at end"), "{out}");
    let err = fails(&[
        "trace",
        "export-torch",
        "--at",
        "top",
        trace.arg(),
        "-o",
        snap.arg(),
    ]);
    assert!(err.contains("expected peak, oom, end or step N"), "{err}");
}
