//! The per-device registry of device mirrors that can be dropped under memory pressure, and
//! the out-of-memory report.
//!
//! [`crate::SyncedMemory`] registers a weak reference to its state when it allocates a device
//! mirror from the pool and unregisters when the mirror goes. The registry never keeps a
//! buffer alive, and eviction only *tries* the buffer's locks, so it never waits for (or
//! deadlocks with) a thread that uses the buffer.
//!
//! # Eviction order
//!
//! Candidates are tried largest first (one eviction frees as much as possible). Among mirrors
//! of the same size, the one registered first goes first: registration happens when a device
//! mirror is allocated, so that is the mirror allocated longest ago (a mirror evicted and
//! allocated again registers anew, at the back). The order is total, so which mirror goes is
//! the same from run to run.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::stats::PoolStats;
use crate::alloc::stats::human_bytes;
use crate::synced::Head;

/// A device mirror the out-of-memory path may drop.
pub(crate) trait Evictable: Send + Sync {
    /// Drops the device mirror if the host copy is current too (head [`Head::Synced`]) and no
    /// guard or transfer uses the buffer; never waits for a lock. Returns the bytes freed.
    fn try_evict(&self) -> Option<usize>;
    /// The head now, or `None` when the buffer is busy (its state lock is held).
    fn head_now(&self) -> Option<Head>;
    /// The buffer's label.
    fn label_now(&self) -> String;
}

/// A live device mirror of a [`crate::SyncedMemory`] (see [`crate::Device::live_buffers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveBuffer {
    /// The buffer's label.
    pub label: String,
    /// Size of the device mirror.
    pub bytes: u64,
    /// Its head, or `None` when it was busy at the time of reading.
    pub head: Option<Head>,
}

impl fmt::Display for LiveBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = self.head.map_or("busy", Head::as_str);
        write!(f, "{} ({}, {head})", self.label, human_bytes(self.bytes))
    }
}

struct Entry {
    item: Weak<dyn Evictable>,
    bytes: usize,
}

/// Weak references to the device mirrors of one device, by registration number (increasing
/// with the registration order).
#[derive(Default)]
pub(crate) struct MirrorRegistry {
    next: AtomicU64,
    map: Mutex<BTreeMap<u64, Entry>>,
}

impl MirrorRegistry {
    /// Adds a mirror of `bytes` bytes; the id unregisters it.
    pub(crate) fn register(&self, item: Weak<dyn Evictable>, bytes: usize) -> u64 {
        let id = self.next.fetch_add(1, Relaxed);
        self.map.lock().insert(id, Entry { item, bytes });
        id
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// The live mirrors in eviction order: largest first, then first registered first (see
    /// the [module docs](self)). The registry lock is not held afterwards.
    pub(crate) fn live(&self) -> Vec<(Arc<dyn Evictable>, usize)> {
        let mut v: Vec<_> = {
            let mut map = self.map.lock();
            map.retain(|_, e| e.item.strong_count() > 0);
            map.values()
                .filter_map(|e| Some((e.item.upgrade()?, e.bytes)))
                .collect()
        };
        // The map yields registration order; the stable sort keeps it among equal sizes.
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v
    }

    /// Label, size and head of every live mirror, in eviction order.
    pub(crate) fn live_buffers(&self) -> Vec<LiveBuffer> {
        self.live()
            .into_iter()
            .map(|(item, bytes)| LiveBuffer {
                label: item.label_now(),
                bytes: bytes as u64,
                head: item.head_now(),
            })
            .collect()
    }
}

/// What the out-of-memory path saw and did, attached to the error it returns (formatted into
/// [`crate::Error::OutOfMemory`]'s detail) and kept by the device
/// ([`crate::Device::last_oom_report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    /// The device.
    pub device: String,
    /// Bytes asked for.
    pub requested: usize,
    /// The device pool after every attempt.
    pub pool: PoolStats,
    /// Total memory the device reports.
    pub device_total: u64,
    /// Bytes of cached segments released while retrying.
    pub released_cache: u64,
    /// Clean mirrors dropped while retrying (label, bytes).
    pub evicted: Vec<(String, usize)>,
    /// The largest live mirrors left, largest first (at most 8).
    pub holders: Vec<LiveBuffer>,
    /// The last refusal (the cap, or the backend's message).
    pub cause: String,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pool;
        let cap = p.cap.map_or_else(
            || "no cap".to_string(),
            |c| format!("cap {}", human_bytes(c)),
        );
        write!(
            f,
            "{} pool: requested {}, allocated {}, reserved {}, direct {}, free {}, largest free \
             block {}, fragmentation {:.2}, {cap}, device total {}",
            p.kind,
            human_bytes(self.requested as u64),
            human_bytes(p.allocated.current),
            human_bytes(p.reserved.current),
            human_bytes(p.direct_bytes),
            human_bytes(p.free_bytes),
            human_bytes(p.largest_free_block),
            p.fragmentation(),
            human_bytes(self.device_total),
        )?;
        write!(
            f,
            "; released {} of cache, dropped {} clean mirror(s)",
            human_bytes(self.released_cache),
            self.evicted.len()
        )?;
        if self.holders.is_empty() {
            write!(f, "; no synced buffer holds device memory")?;
        } else {
            write!(f, "; biggest holders: ")?;
            for (i, h) in self.holders.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{h}")?;
            }
        }
        write!(f, "; last refusal: {}", self.cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(&'static str);

    impl Evictable for Fake {
        fn try_evict(&self) -> Option<usize> {
            None
        }
        fn head_now(&self) -> Option<Head> {
            Some(Head::Synced)
        }
        fn label_now(&self) -> String {
            self.0.to_string()
        }
    }

    fn labels(r: &MirrorRegistry) -> Vec<String> {
        r.live().iter().map(|(e, _)| e.label_now()).collect()
    }

    #[test]
    fn largest_first_then_first_registered() {
        let r = MirrorRegistry::default();
        let items: Vec<Arc<dyn Evictable>> = ["a", "b", "c", "d", "e", "f"]
            .into_iter()
            .map(|l| Arc::new(Fake(l)) as Arc<dyn Evictable>)
            .collect();
        let sizes = [10, 20, 10, 30, 20, 10];
        let ids: Vec<u64> = items
            .iter()
            .zip(sizes)
            .map(|(it, b)| r.register(Arc::downgrade(it), b))
            .collect();
        assert_eq!(labels(&r), ["d", "b", "e", "a", "c", "f"]);
        // A mirror registered again (evicted, then allocated again) goes behind its peers.
        r.unregister(ids[0]);
        r.register(Arc::downgrade(&items[0]), 10);
        assert_eq!(labels(&r), ["d", "b", "e", "c", "f", "a"]);
        // Dead entries are skipped, the rest keeps its order.
        let r2 = MirrorRegistry::default();
        for (it, b) in items.iter().zip(sizes) {
            r2.register(Arc::downgrade(it), b);
        }
        let gone: Arc<dyn Evictable> = Arc::new(Fake("gone"));
        r2.register(Arc::downgrade(&gone), 10);
        drop(gone);
        let again: Vec<String> = r2.live_buffers().into_iter().map(|b| b.label).collect();
        assert_eq!(again, ["d", "b", "e", "a", "c", "f"]);
    }
}
