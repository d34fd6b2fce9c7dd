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
            let Some(h) = current_history() else {
                WRONG.lock().unwrap().push("no history".into());
                return;
            };
            let trace = h.trace();
            if !trace.events().iter().any(|e| e.kind() == "oom") {
                WRONG
                    .lock()
                    .unwrap()
                    .push(format!("no oom in the history at {report:?}"));
            }
            if let Err(e) = TorchSnapshot::from_trace(&trace) {
                WRONG.lock().unwrap().push(format!("history export: {e}"));
            }
            drop(TorchSnapshot::from_snapshot(&syncmem::memory_snapshot()));
        });
        // On for the whole binary.
        std::mem::forget(handle);
    });
}

/// The runs of the observer so far, after checking that none found anything wrong.
pub fn runs() -> u64 {
    let wrong = WRONG.lock().unwrap();
    assert!(
        wrong.is_empty(),
        "out-of-memory observer: {:?}",
        &wrong[..wrong.len().min(3)]
    );
    RUNS.load(Relaxed)
}
