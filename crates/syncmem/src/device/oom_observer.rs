//! Out-of-memory observers: callbacks that run when a device refuses an allocation for good,
//! with the [`OomReport`], before the error returns (PyTorch's
//! `torch._C._cuda_attach_out_of_memory_observer`).
//!
//! An observer runs on the thread whose allocation failed, after the out-of-memory path gave
//! up and with no pool lock held: it may read statistics, take snapshots and write files. An
//! allocation that fails inside an observer does not call the observers again.
//!
//! Observers run once per error the user sees: an attempt whose failure the library handles
//! itself (the first allocation of a zero-copy buffer, which falls back to a host mirror of its
//! own) runs under [`unobserved`], and its refusal calls no observer.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::OomReport;

/// A callback of [`on_out_of_memory`].
type Observer = Arc<dyn Fn(&OomReport) + Send + Sync>;

static OBSERVERS: RwLock<Vec<(u64, Observer)>> = RwLock::new(Vec::new());
/// True while at least one observer is registered: the failure path's only cost otherwise.
static ANY: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// True while this thread runs the observers.
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// True while this thread makes an attempt whose failure does not reach the user.
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, an attempt whose out-of-memory failure the caller handles (the user never sees
/// it): a refusal inside calls no observer.
pub(crate) fn unobserved<R>(f: impl FnOnce() -> R) -> R {
    let _held = crate::alloc::thread::SetFlag::new(&HELD, true);
    f()
}

/// Registers `observer`, called with the report each time a device allocation fails for lack
/// of memory (after the device freed its cache, dropped clean mirrors and spilled dirty ones),
/// before the [`crate::Error::OutOfMemory`] returns. It stays registered until the returned
/// handle is dropped.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use syncmem::alloc::pool::MemoryCap;
/// use syncmem::{Device, PoolConfig};
///
/// let seen = Arc::new(AtomicUsize::new(0));
/// let s = seen.clone();
/// let _observer = syncmem::device::on_out_of_memory(move |report| {
///     assert_eq!(report.requested, 1 << 20);
///     s.fetch_add(1, Ordering::SeqCst);
/// });
/// let dev = Device::cpu().detached();
/// dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(1 << 16))).unwrap();
/// let stream = dev.default_stream().unwrap();
/// assert!(dev.alloc_pooled(1 << 20, &stream).is_err());
/// assert_eq!(seen.load(Ordering::SeqCst), 1);
/// ```
pub fn on_out_of_memory(
    observer: impl Fn(&OomReport) + Send + Sync + 'static,
) -> OomObserverHandle {
    let id = NEXT.fetch_add(1, Relaxed);
    let mut list = OBSERVERS.write();
    list.push((id, Arc::new(observer)));
    ANY.store(true, Relaxed);
    OomObserverHandle { id }
}

/// Keeps an observer of [`on_out_of_memory`] registered; dropping it unregisters it.
#[must_use = "the observer is unregistered when the handle is dropped"]
#[derive(Debug)]
pub struct OomObserverHandle {
    id: u64,
}

impl Drop for OomObserverHandle {
    fn drop(&mut self) {
        let mut list = OBSERVERS.write();
        list.retain(|(id, _)| *id != self.id);
        ANY.store(!list.is_empty(), Relaxed);
    }
}

/// Calls every registered observer with `report` (not from inside an observer).
pub(crate) fn notify(report: &OomReport) {
    if !ANY.load(Relaxed) || RUNNING.with(Cell::get) || HELD.with(Cell::get) {
        return;
    }
    // A copy of the list: an observer may register or unregister others.
    let observers: Vec<Observer> = OBSERVERS.read().iter().map(|(_, o)| o.clone()).collect();
    RUNNING.with(|r| r.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            RUNNING.with(|r| r.set(false));
        }
    }
    let _reset = Reset;
    for o in observers {
        o(report);
    }
}
