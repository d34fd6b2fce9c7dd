//! The registry of device mirrors that can be dropped under memory pressure, one per device.
//!
//! [`crate::SyncedMemory`] registers a weak reference to its state when it allocates a device
//! mirror from the pool and unregisters when the mirror goes. The registry never keeps a
//! buffer alive, and eviction only *tries* the buffer's locks, so it never waits for (or
//! deadlocks with) a thread that uses the buffer. The device reaches it through the
//! [`Mirrors`] hook this layer installs on the device at first use.
//!
//! # Eviction order
//!
//! Candidates are tried largest first (one eviction frees as much as possible). Among mirrors
//! of the same size, the one registered first goes first: registration happens when a device
//! mirror is allocated, so that is the mirror allocated longest ago (a mirror evicted and
//! allocated again registers anew, at the back). The order is total, so which mirror goes is
//! the same from run to run.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::device::{Device, Evictable, Mirrors};

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
}

impl Mirrors for MirrorRegistry {
    fn candidates(&self) -> Vec<(Arc<dyn Evictable>, usize)> {
        self.live()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The registry of `device`'s mirrors, installed on the device at first use.
pub(crate) fn of(device: &Device) -> &MirrorRegistry {
    let hook = device.mirrors_hook(|| Arc::new(MirrorRegistry::default()) as Arc<dyn Mirrors>);
    hook.as_any()
        .downcast_ref::<MirrorRegistry>()
        .expect("the only mirror registry type is this one")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Inert as Fake;

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
        let again: Vec<String> = r2.live().iter().map(|(e, _)| e.label_now()).collect();
        assert_eq!(again, ["d", "b", "e", "a", "c", "f"]);
    }
}
