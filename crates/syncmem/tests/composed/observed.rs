//! The history and an out-of-memory observer, on for the whole test binary (the history but
//! while a program pauses it, `HistoryPause`): every failure,
//! injected or of the cap, runs the observer in the middle of the failing operation, and the
//! observer reads the history and snapshots every pool then (which must neither deadlock nor
//! find a history without the failure).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, Once};

use syncmem::device::on_out_of_memory;
use syncmem::report::torch::TorchSnapshot;
use syncmem::report::{current_history, record_history};

static START: Once = Once::new();
static RUNS: AtomicU64 = AtomicU64::new(0);
static WRONG: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The tests (one per backend, on threads of their own) that stopped the history for a while
/// (see [`pause`]), changed with [`TOGGLE`] held; read by the observer without it.
static PAUSES: AtomicUsize = AtomicUsize::new(0);
/// Held while the history is stopped or started again.
static TOGGLE: Mutex<()> = Mutex::new(());

/// The history's length while it records.
const EVENTS: usize = 512;

/// Stops the history (`paused`) for the test whose state is `mine`, or lets it start again
/// when no other test has it stopped; the observer expects a history only while no test has
/// it stopped.
pub fn pause(paused: bool, mine: &Cell<bool>) {
    if mine.replace(paused) == paused {
        return;
    }
    let _toggle = TOGGLE.lock().unwrap_or_else(|e| e.into_inner());
    if paused {
        // Counted before the history stops: the observer never misses it.
        if PAUSES.fetch_add(1, Relaxed) == 0 {
            record_history(None);
        }
    } else if PAUSES.load(Relaxed) == 1 {
        // Started before it is counted: the observer never expects one that is not there.
        record_history(Some(EVENTS));
        PAUSES.store(0, Relaxed);
    } else {
        PAUSES.fetch_sub(1, Relaxed);
    }
}

/// Turns the history and the observer on (once).
pub fn observe() {
    START.call_once(|| {
        record_history(Some(EVENTS));
        let handle = on_out_of_memory(|report| {
            RUNS.fetch_add(1, Relaxed);
            let wrong = |w: String| WRONG.lock().unwrap_or_else(|e| e.into_inner()).push(w);
            let Some(h) = current_history() else {
                if PAUSES.load(Relaxed) == 0 {
                    wrong("no history".into());
                }
                return;
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
