//! The registry of device mirrors that can be dropped under memory pressure, one per device.
//!
//! [`crate::SyncedMemory`] registers a weak reference to its state when it first allocates a
//! device mirror from the pool. When the mirror goes the entry goes idle, and the buffer's next
//! mirror revives it without the registry's lock ([`Reg`]); the buffer unregisters when it is
//! dropped. The registry never keeps a buffer alive, and eviction only *tries* the buffer's
//! locks, so it never waits for (or deadlocks with) a thread that uses the buffer. The device
//! reaches it through the [`Mirrors`] hook this layer installs on the device at first use.
//!
//! # Eviction order
//!
//! Candidates are tried largest first (one eviction frees as much as possible). Among mirrors
//! of the same size, the one registered first goes first: registration happens when a device
//! mirror is allocated (or revived), so that is the mirror allocated longest ago (a mirror
//! evicted and allocated again is numbered anew, at the back). The order is total, so which
//! mirror goes is the same from run to run.

use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::device::{Device, Evictable, Mirrors};

/// The part of an entry its buffer writes without the registry's lock: the mirror's bytes
/// (0: the buffer has no device mirror now, and is no candidate) and its registration number.
#[derive(Default)]
struct Live {
    bytes: AtomicUsize,
    seq: AtomicU64,
}

/// A buffer's handle on its entry. The entry outlives the buffer's device mirror: when the
/// mirror goes, the entry goes idle ([`Reg::idle`]) and the next mirror takes it again
/// ([`MirrorRegistry::revive`]), without the registry's lock or a new weak reference (a
/// capped run drops a dead value and makes it again every step). It goes when the buffer does
/// ([`MirrorRegistry::unregister`]).
#[must_use = "an entry is unregistered with its handle"]
pub(crate) struct Reg {
    id: u64,
    live: Arc<Live>,
}

impl Reg {
    /// The buffer's device mirror went: the entry stays, no candidate until revived.
    pub(crate) fn idle(&self) {
        self.live.bytes.store(0, Ordering::Release);
    }

    /// The id that names the entry in the registry (its slot and the slot's generation).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

struct Entry {
    item: Weak<dyn Evictable>,
    live: Arc<Live>,
    /// A block spilled in place, not a device mirror (see `super::park`).
    parked: bool,
    /// The slot's generation when this entry was made: an id names its slot and generation,
    /// so that a stale id (its entry dropped as dead, its slot taken again) unregisters
    /// nothing.
    generation: u32,
}

/// The registered buffers: a slab of slots (an entry, or free), reused in place, so that
/// registering and unregistering allocates nothing in the slab once it has grown to the most
/// buffers registered at once.
#[derive(Default)]
struct Slots {
    entries: Vec<Option<Entry>>,
    /// Per slot, the generation of its next entry.
    generations: Vec<u32>,
    free: Vec<u32>,
}

impl Slots {
    fn remove(&mut self, slot: usize) {
        if self.entries[slot].take().is_some() {
            self.free.push(slot as u32);
        }
    }
}

/// Weak references to the buffers with a device mirror on one device (see the
/// [module docs](self)).
#[derive(Default)]
pub(crate) struct MirrorRegistry {
    slots: Mutex<Slots>,
    /// The next registration number (see the [module docs](self)).
    next_seq: AtomicU64,
}

/// An id of `slot` at `generation`.
fn id_of(slot: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(slot)
}

/// The slot and generation of `id`.
fn parts(id: u64) -> (usize, u32) {
    ((id & u64::from(u32::MAX)) as usize, (id >> 32) as u32)
}

impl MirrorRegistry {
    /// Adds a buffer whose device mirror has `bytes` bytes; the handle revives the entry for
    /// the buffer's next mirrors and unregisters it.
    pub(crate) fn register(&self, item: Weak<dyn Evictable>, bytes: usize) -> Reg {
        let live = Arc::new(Live::default());
        self.revive_live(&live, bytes);
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
        s.entries[slot as usize] = Some(Entry {
            item,
            live: live.clone(),
            parked: false,
            generation,
        });
        Reg {
            id: id_of(slot, generation),
            live,
        }
    }

    /// The buffer of `reg` has a device mirror of `bytes` bytes again: a candidate again, as
    /// registered now (behind its peers of the same size). No lock.
    pub(crate) fn revive(&self, reg: &Reg, bytes: usize) {
        self.revive_live(&reg.live, bytes);
    }

    fn revive_live(&self, live: &Live, bytes: usize) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        live.seq.store(seq, Ordering::Relaxed);
        live.bytes.store(bytes, Ordering::Release);
    }

    /// Marks the entry of `id` as a block spilled in place (`parked`), or as a device mirror
    /// again: the out-of-memory path passes parked ones over, but for its last resort
    /// ([`Mirrors::parked`]).
    pub(crate) fn set_parked(&self, id: u64, parked: bool) {
        let (slot, generation) = parts(id);
        let mut s = self.slots.lock();
        if let Some(e) = s.entries.get_mut(slot).and_then(Option::as_mut) {
            if e.generation == generation {
                e.parked = parked;
            }
        }
    }

    /// Removes the entry of `reg` (nothing when it was dropped already, its buffer gone).
    pub(crate) fn unregister(&self, reg: Reg) {
        let (slot, generation) = parts(reg.id);
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
    /// order; idle ones (no mirror now) are passed over.
    fn entries(&self, parked: bool) -> Vec<(Arc<dyn Evictable>, usize)> {
        let mut v: Vec<_> = {
            let mut s = self.slots.lock();
            let mut live = Vec::new();
            for slot in 0..s.entries.len() {
                let Some(e) = s.entries[slot].as_ref() else {
                    continue;
                };
                let bytes = e.live.bytes.load(Ordering::Acquire);
                if bytes == 0 && e.item.strong_count() == 0 {
                    // Idle, and its buffer gone without unregistering: a plain load.
                    s.remove(slot);
                    continue;
                }
                if e.parked != parked || bytes == 0 {
                    continue;
                }
                let seq = e.live.seq.load(Ordering::Relaxed);
                match e.item.upgrade() {
                    Some(item) => live.push((item, bytes, seq)),
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
        let mut regs: Vec<Reg> = items
            .iter()
            .zip(sizes)
            .map(|(it, b)| r.register(Arc::downgrade(it), b))
            .collect();
        assert_eq!(labels(&r), ["d", "b", "e", "a", "c", "f"]);
        // A mirror registered again (evicted, then allocated again) goes behind its peers.
        r.unregister(regs.remove(0));
        regs.insert(0, r.register(Arc::downgrade(&items[0]), 10));
        assert_eq!(labels(&r), ["d", "b", "e", "c", "f", "a"]);
        // So does one revived (its mirror dropped, then made again): idle, it is no candidate.
        regs[2].idle();
        assert_eq!(labels(&r), ["d", "b", "e", "f", "a"]);
        r.revive(&regs[2], 10);
        assert_eq!(labels(&r), ["d", "b", "e", "f", "a", "c"]);
        // Revived at another size, it is ordered by that size.
        regs[2].idle();
        r.revive(&regs[2], 40);
        assert_eq!(labels(&r), ["c", "d", "b", "e", "f", "a"]);
        // Dead entries are skipped, the rest keeps its order.
        let r2 = MirrorRegistry::default();
        let _kept: Vec<Reg> = items
            .iter()
            .zip(sizes)
            .map(|(it, b)| r2.register(Arc::downgrade(it), b))
            .collect();
        let gone: Arc<dyn Evictable> = Arc::new(Fake("gone"));
        let _gone = r2.register(Arc::downgrade(&gone), 10);
        drop(gone);
        let again: Vec<String> = r2.live().iter().map(|(e, _)| e.label_now()).collect();
        assert_eq!(again, ["d", "b", "e", "a", "c", "f"]);
        // An idle entry whose buffer went without unregistering goes at the next reading.
        let lost: Arc<dyn Evictable> = Arc::new(Fake("lost"));
        let idle = r2.register(Arc::downgrade(&lost), 10);
        idle.idle();
        drop(lost);
        let count = |r: &MirrorRegistry| r.slots.lock().entries.iter().flatten().count();
        assert_eq!(count(&r2), 7);
        let _ = r2.live();
        assert_eq!(count(&r2), 6);
    }

    #[test]
    fn a_stale_id_unregisters_nothing_and_slots_are_reused() {
        let r = MirrorRegistry::default();
        let gone: Arc<dyn Evictable> = Arc::new(Fake("gone"));
        let stale = r.register(Arc::downgrade(&gone), 10);
        let stale_again = Reg {
            id: stale.id(),
            live: stale.live.clone(),
        };
        drop(gone);
        // Reading the registry drops the dead entry and frees its slot...
        assert!(r.live().is_empty());
        // ...which the next registration takes, under a new generation.
        let kept: Arc<dyn Evictable> = Arc::new(Fake("kept"));
        let id = r.register(Arc::downgrade(&kept), 20);
        assert_eq!(parts(id.id()).0, parts(stale.id()).0);
        assert_ne!(id.id(), stale.id());
        // The owner of the dead entry unregisters late: the new entry stays...
        r.unregister(stale);
        assert_eq!(labels(&r), ["kept"]);
        // ...and its handle revives nothing but its own (unlisted) state.
        r.revive(&stale_again, 30);
        assert_eq!(labels(&r), ["kept"]);
        r.unregister(id);
        assert!(r.live().is_empty());
        // An idle entry stays in its slot (no candidate) until unregistered.
        let idle = r.register(Arc::downgrade(&kept), 20);
        idle.idle();
        assert!(r.live().is_empty());
        assert_eq!(r.slots.lock().entries.iter().flatten().count(), 1);
        r.unregister(idle);
        assert_eq!(r.slots.lock().entries.iter().flatten().count(), 0);
        // Registering and unregistering again reuses the one slot.
        for _ in 0..100 {
            let id = r.register(Arc::downgrade(&kept), 20);
            r.unregister(id);
        }
        assert_eq!(r.slots.lock().entries.len(), 1);
    }
}
