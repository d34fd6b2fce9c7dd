//! The history and an out-of-memory observer, on for the whole test binary: every failure,
//! injected or of the cap, runs the observer in the middle of the failing operation, and the
//! observer reads the history and snapshots every pool then (which must neither deadlock nor
//! find a history without the failure).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, Once};

use syncmem::device::on_out_of_memory;
use syncmem::report::torch::TorchSnapshot;
use syncmem::report::{current_history, record_history};

static START: Once = Once::new();
static RUNS: AtomicU64 = AtomicU64::new(0);
static WRONG: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Turns the history and the observer on (once).
pub fn observe() {
    START.call_once(|| {
        record_history(Some(512));
        let handle = on_out_of_memory(|report| {
            RUNS.fetch_add(1, Relaxed);
            let wrong = |w: String| WRONG.lock().unwrap_or_else(|e| e.into_inner()).push(w);
            let Some(h) = current_history() else {
                return wrong("no history".into());
            };
            let trace = h.trace();
            // A failure of the out-of-memory path (not an injected one, which comes before
            // the pool) is in the history already.
            let from_path = report.retry.is_some();
            if from_path && !trace.events().iter().any(|e| e.kind() == "oom") {
                wrong(format!("no oom in the history at {report:?}"));
            }
            if let Err(e) = TorchSnapshot::from_trace(&trace) {
                wrong(format!("history export: {e}"));
            }
            drop(TorchSnapshot::from_snapshot(&syncmem::memory_snapshot()));
        });
        // On for the whole binary.
        std::mem::forget(handle);
    });
}

/// The runs of the observer so far, after checking that none found anything wrong.
pub fn runs() -> u64 {
    let wrong = WRONG.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        wrong.is_empty(),
        "out-of-memory observer: {:?}",
        &wrong[..wrong.len().min(3)]
    );
    RUNS.load(Relaxed)
}
