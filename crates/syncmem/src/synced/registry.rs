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
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::device::{Device, Evictable, Mirrors};

struct Entry {
    item: Weak<dyn Evictable>,
    bytes: usize,
    /// Registration number: the order of registrations (see the [module docs](self)).
    seq: u64,
    /// A block spilled in place, not a device mirror (see `super::park`).
    parked: bool,
    /// The slot's generation when this entry was made: an id names its slot and generation,
    /// so that a stale id (its entry dropped as dead, its slot taken again) unregisters
    /// nothing.
    generation: u32,
}

/// The registered mirrors: a slab of slots (an entry, or free), reused in place, so that
/// registering and unregistering, as a capped run does for every value it drops and makes
/// again, allocates nothing once the slab has grown to the most mirrors alive at once.
#[derive(Default)]
struct Slots {
    entries: Vec<Option<Entry>>,
    /// Per slot, the generation of its next entry.
    generations: Vec<u32>,
    free: Vec<u32>,
    next_seq: u64,
}

impl Slots {
    fn remove(&mut self, slot: usize) {
        if self.entries[slot].take().is_some() {
            self.free.push(slot as u32);
        }
    }
}

/// Weak references to the device mirrors of one device (see the [module docs](self)).
#[derive(Default)]
pub(crate) struct MirrorRegistry {
    slots: Mutex<Slots>,
}

/// An id of `slot` at `generation`.
fn id_of(slot: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(slot)
}

impl MirrorRegistry {
    /// Adds a mirror of `bytes` bytes; the id unregisters it.
    pub(crate) fn register(&self, item: Weak<dyn Evictable>, bytes: usize) -> u64 {
        let mut s = self.slots.lock();
        let slot = match s.free.pop() {
            Some(slot) => slot,
            None => {
                s.entries.push(None);
                s.generations.push(0);
                (s.entries.len() - 1) as u32
            }
        };
        let generation = s.generations[slot as usize];
        s.generations[slot as usize] = generation.wrapping_add(1);
        let seq = s.next_seq;
        s.next_seq += 1;
        s.entries[slot as usize] = Some(Entry {
            item,
            bytes,
            seq,
            parked: false,
            generation,
        });
        id_of(slot, generation)
    }

    /// Marks the entry of `id` as a block spilled in place (`parked`), or as a device mirror
    /// again: the out-of-memory path passes parked ones over, but for its last resort
    /// ([`Mirrors::parked`]).
    pub(crate) fn set_parked(&self, id: u64, parked: bool) {
        let slot = (id & u64::from(u32::MAX)) as usize;
        let generation = (id >> 32) as u32;
        let mut s = self.slots.lock();
        if let Some(e) = s.entries.get_mut(slot).and_then(Option::as_mut) {
            if e.generation == generation {
                e.parked = parked;
            }
        }
    }

    /// Removes the mirror of `id` (nothing when it was dropped already, as dead).
    pub(crate) fn unregister(&self, id: u64) {
        let slot = (id & u64::from(u32::MAX)) as usize;
        let generation = (id >> 32) as u32;
        let mut s = self.slots.lock();
        let current = s
            .entries
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.generation == generation);
        if current {
            s.remove(slot);
        }
    }

    /// The live mirrors in eviction order: largest first, then first registered first (see
    /// the [module docs](self)). The registry lock is not held afterwards.
    pub(crate) fn live(&self) -> Vec<(Arc<dyn Evictable>, usize)> {
        self.entries(false)
    }

    /// The live entries of one kind (device mirrors, or blocks spilled in place) in eviction
    /// order.
    fn entries(&self, parked: bool) -> Vec<(Arc<dyn Evictable>, usize)> {
        let mut v: Vec<_> = {
            let mut s = self.slots.lock();
            let mut live = Vec::new();
            for slot in 0..s.entries.len() {
                let Some(e) = s.entries[slot].as_ref() else {
                    continue;
                };
                if e.parked != parked {
                    continue;
                }
                match e.item.upgrade() {
                    Some(item) => live.push((item, e.bytes, e.seq)),
                    None => s.remove(slot),
                }
            }
            live
        };
        v.sort_unstable_by_key(|e| (std::cmp::Reverse(e.1), e.2));
        v.into_iter()
            .map(|(item, bytes, _)| (item, bytes))
            .collect()
    }
}

impl Mirrors for MirrorRegistry {
    fn candidates(&self) -> Vec<(Arc<dyn Evictable>, usize)> {
        self.live()
    }

    fn parked(&self) -> Vec<Arc<dyn Evictable>> {
        self.entries(true)
            .into_iter()
            .map(|(item, _)| item)
            .collect()
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

    #[test]
    fn a_stale_id_unregisters_nothing_and_slots_are_reused() {
        let r = MirrorRegistry::default();
        let gone: Arc<dyn Evictable> = Arc::new(Fake("gone"));
        let stale = r.register(Arc::downgrade(&gone), 10);
        drop(gone);
        // Reading the registry drops the dead entry and frees its slot...
        assert!(r.live().is_empty());
        // ...which the next registration takes, under a new generation.
        let kept: Arc<dyn Evictable> = Arc::new(Fake("kept"));
        let id = r.register(Arc::downgrade(&kept), 20);
        assert_eq!(id & u64::from(u32::MAX), stale & u64::from(u32::MAX));
        assert_ne!(id, stale);
        // The owner of the dead entry unregisters late: the new entry stays.
        r.unregister(stale);
        assert_eq!(labels(&r), ["kept"]);
        r.unregister(id);
        assert!(r.live().is_empty());
        // Registering and unregistering again reuses the one slot.
        for _ in 0..100 {
            let id = r.register(Arc::downgrade(&kept), 20);
            r.unregister(id);
        }
        assert_eq!(r.slots.lock().entries.len(), 1);
    }
}
