//! A net's schedule as the out-of-memory path sees it: while a net runs on a device with a
//! memory cap, the device knows which operator uses which buffer next, and drops or spills
//! first the mirrors the net does not use, then those it uses furthest ahead (Belady's rule),
//! instead of the least recently used ([`crate::device::NextUse`]).
//!
//! What each operator does with each blob name is fixed for the net ([`BlobUses`], made when
//! the net is built); when a run starts, the schedule maps the buffers the blobs hold then to
//! their names (one lookup per blob name). A blob whose tensor has no storage yet (an output on
//! a net's first run) is not known then; its buffer is ordered as one the net does not use
//! until the next run. Uses count on into the next run (a training step repeats), so a
//! parameter read by the first operator is "soon" when the last one runs. With no cap the run
//! reads nothing and installs nothing.
//!
//! A buffer is *dead* when its next use overwrites it whole before anything reads it: its
//! blob is internal to the net (not an external input or output, not kept: nothing outside
//! the run reads it) and the next operator to use it has it as an output only, and says it
//! writes such outputs whole ([`Operator::overwrites_outputs`]). A use by the running operator
//! counts as a read (it may have written the output already). A dead buffer's device mirror
//! goes without a write-back ([`crate::SyncedMemory::drop_contents`]): at once after the
//! operator that used it last ([`Schedule::drop_dead_after`], so that the allocations of the
//! next operators find room without failing), else first when an allocation fails.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::device::{Device, Evictable, NextUse};
use crate::ops::Operator;
use crate::tensor::Tensor;
use crate::workspace::Workspace;

/// One use of a blob: the operator's index, and whether it overwrites the blob whole without
/// reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Use {
    op: u32,
    overwrite: bool,
}

/// What a net's operators do with each blob name, fixed for the net: the uses of each name in
/// order, whether it is internal to the net, and the names each operator uses.
pub(super) struct BlobUses {
    names: Vec<String>,
    uses: Vec<SmallVec<[Use; 4]>>,
    internal: Vec<bool>,
    by_op: Vec<SmallVec<[u32; 6]>>,
    /// Operator -> the names it uses that are dead once it ran (for a buffer of one name).
    dead_after: Vec<SmallVec<[u32; 4]>>,
}

impl BlobUses {
    #[cfg(test)]
    fn clone_for_test(&self) -> BlobUses {
        BlobUses {
            names: self.names.clone(),
            uses: self.uses.clone(),
            internal: self.internal.clone(),
            by_op: self.by_op.clone(),
            dead_after: self.dead_after.clone(),
        }
    }

    /// The uses of the blobs of `ops`; `internal`: the names nothing outside a run reads.
    pub(super) fn new(ops: &[Box<dyn Operator>], internal: &BTreeSet<String>) -> BlobUses {
        let mut index: HashMap<&str, u32> = HashMap::new();
        let mut b = BlobUses {
            names: Vec::new(),
            uses: Vec::new(),
            internal: Vec::new(),
            by_op: vec![SmallVec::new(); ops.len()],
            dead_after: vec![SmallVec::new(); ops.len()],
        };
        for (i, op) in ops.iter().enumerate() {
            let def = op.def();
            let overwrites = op.overwrites_outputs();
            for (j, name) in def.inputs.iter().chain(&def.outputs).enumerate() {
                let n = *index.entry(name.as_str()).or_insert_with(|| {
                    b.names.push(name.clone());
                    b.uses.push(SmallVec::new());
                    b.internal.push(internal.contains(name));
                    (b.names.len() - 1) as u32
                });
                if !b.by_op[i].contains(&n) {
                    b.by_op[i].push(n);
                }
                let overwrite = overwrites && j >= def.inputs.len() && !def.inputs.contains(name);
                let list = &mut b.uses[n as usize];
                match list.last_mut() {
                    Some(u) if u.op == i as u32 => u.overwrite &= overwrite,
                    _ => list.push(Use {
                        op: i as u32,
                        overwrite,
                    }),
                }
            }
        }
        for i in 0..ops.len() {
            let dead: SmallVec<[u32; 4]> = b.by_op[i]
                .iter()
                .copied()
                .filter(|&n| {
                    b.internal[n as usize]
                        && next_use(&b.uses[n as usize], i + 1, ops.len())
                            .is_some_and(|(_, u)| u.overwrite)
                })
                .collect();
            b.dead_after[i] = dead;
        }
        b
    }
}

/// The next of `list`'s uses from position `pos` of a run of `len` operators on (none left:
/// the first of the next run), as (operators until it, the use).
fn next_use(list: &[Use], pos: usize, len: usize) -> Option<(usize, Use)> {
    match list.iter().find(|u| u.op as usize >= pos) {
        Some(u) => Some((u.op as usize - pos, *u)),
        None => list.first().map(|u| (u.op as usize + len - pos, *u)),
    }
}

/// A buffer of this run: the names that hold it, and the buffer.
struct Buffer {
    names: SmallVec<[u32; 2]>,
    item: Weak<dyn Evictable>,
}

/// The buffer a name holds in this run.
#[derive(Clone)]
struct Held {
    item: Weak<dyn Evictable>,
    /// Other names hold it too.
    shared: bool,
}

/// Which operators use which buffer in this run, and the operator running now.
pub(super) struct Schedule {
    blobs: Arc<BlobUses>,
    /// Buffer key -> the buffer.
    buffers: HashMap<usize, Buffer>,
    /// Name index -> the key of its buffer (0: none).
    keys: Vec<usize>,
    /// Name index -> its buffer.
    held: Vec<Option<Held>>,
    at: AtomicUsize,
}

impl Schedule {
    /// The schedule of `blobs` over the buffers `ws` holds now.
    fn read(blobs: &Arc<BlobUses>, ws: &Workspace) -> Schedule {
        let mut buffers: HashMap<usize, Buffer> = HashMap::with_capacity(blobs.names.len());
        let mut keys = vec![0; blobs.names.len()];
        let mut held = vec![None; blobs.names.len()];
        for (n, name) in blobs.names.iter().enumerate() {
            let Some((key, item)) = buffer_of(ws, name) else {
                continue;
            };
            keys[n] = key;
            held[n] = Some(Held {
                item: item.clone(),
                shared: false,
            });
            let b = buffers.entry(key).or_insert_with(|| Buffer {
                names: SmallVec::new(),
                item,
            });
            b.names.push(n as u32);
        }
        for b in buffers.values().filter(|b| b.names.len() > 1) {
            for &n in &b.names {
                if let Some(h) = &mut held[n as usize] {
                    h.shared = true;
                }
            }
        }
        Schedule {
            blobs: blobs.clone(),
            buffers,
            keys,
            held,
            at: AtomicUsize::new(0),
        }
    }

    /// Brings the schedule up to the buffers `ws` holds now: each name whose buffer changed
    /// leaves its old buffer and joins its new one.
    fn refresh(&mut self, ws: &Workspace) {
        self.at.store(0, Relaxed);
        let blobs = self.blobs.clone();
        for (n, name) in blobs.names.iter().enumerate() {
            let old = self.keys[n];
            if key_of(ws, name) == old {
                continue;
            }
            if let Some(b) = self.buffers.get_mut(&old) {
                b.names.retain(|m| *m as usize != n);
                if b.names.is_empty() {
                    self.buffers.remove(&old);
                } else {
                    self.mark_shared(old);
                }
            }
            self.keys[n] = 0;
            self.held[n] = None;
            let Some((key, item)) = buffer_of(ws, name) else {
                continue;
            };
            self.keys[n] = key;
            self.held[n] = Some(Held {
                item: item.clone(),
                shared: false,
            });
            self.buffers
                .entry(key)
                .or_insert_with(|| Buffer {
                    names: SmallVec::new(),
                    item,
                })
                .names
                .push(n as u32);
            self.mark_shared(key);
        }
    }

    /// Marks the names of buffer `key` as sharing it or not.
    fn mark_shared(&mut self, key: usize) {
        let Some(b) = self.buffers.get(&key) else {
            return;
        };
        let shared = b.names.len() > 1;
        for &m in &b.names {
            if let Some(h) = &mut self.held[m as usize] {
                h.shared = shared;
            }
        }
    }

    /// Operator `i` runs now.
    pub(super) fn at(&self, i: usize) {
        self.at.store(i, Relaxed);
    }

    /// The next use of `b` from position `pos` of the run on (none left: the first of the
    /// next run), over all its names, as (operators until it, the use). Two names used by one
    /// operator make an overwrite only when both are.
    fn next(&self, b: &Buffer, pos: usize) -> Option<(usize, Use)> {
        let len = self.blobs.by_op.len();
        let mut best: Option<(usize, Use)> = None;
        for &n in &b.names {
            let next = next_use(&self.blobs.uses[n as usize], pos, len);
            best = match (best, next) {
                (Some((d, u)), Some((e, v))) if e == d => Some((
                    d,
                    Use {
                        op: u.op,
                        overwrite: u.overwrite && v.overwrite,
                    },
                )),
                (Some((d, u)), Some((e, _))) if d < e => Some((d, u)),
                (best, None) => best,
                (_, next) => next,
            };
        }
        best
    }

    /// Whether `b` is dead at position `pos`: every name holding it is internal, and its next
    /// use overwrites it. `running`: operator `pos` runs, and its use counts as a read.
    fn dead_at(&self, b: &Buffer, pos: usize, running: bool) -> bool {
        b.names.iter().all(|&n| self.blobs.internal[n as usize])
            && self
                .next(b, pos)
                .is_some_and(|(d, u)| u.overwrite && !(running && d == 0))
    }

    /// After operator `i` ran: drops the device mirrors of the buffers it used that are dead
    /// now (it read them last), so that their memory serves the next allocations at once. A
    /// buffer of one name is looked up in [`BlobUses::dead_after`]; one of several names is
    /// judged over all of them.
    pub(super) fn drop_dead_after(&self, i: usize, device: &Device) {
        let drop = |item: &Weak<dyn Evictable>| {
            if let Some(item) = item.upgrade() {
                device.drop_dead(item.as_ref());
            }
        };
        for &n in &self.blobs.dead_after[i] {
            if let Some(h) = self.held[n as usize].as_ref().filter(|h| !h.shared) {
                drop(&h.item);
            }
        }
        for &n in &self.blobs.by_op[i] {
            if !self.held[n as usize].as_ref().is_some_and(|h| h.shared) {
                continue;
            }
            if let Some(b) = self.buffers.get(&self.keys[n as usize]) {
                if self.dead_at(b, i + 1, false) {
                    drop(&b.item);
                }
            }
        }
    }
}

/// The key of the buffer of blob `name` in `ws`, and the buffer, when the blob holds a tensor
/// with storage.
fn buffer_of(ws: &Workspace, name: &str) -> Option<(usize, Weak<dyn Evictable>)> {
    let blob = ws.try_get_blob(name)?;
    let guard = blob.read_recursive();
    let synced = guard.get::<Tensor>().ok().and_then(Tensor::synced)?;
    Some((synced.key(), synced.evictable()))
}

/// The key of the buffer of blob `name` in `ws` (0: none).
fn key_of(ws: &Workspace, name: &str) -> usize {
    let Some(blob) = ws.try_get_blob(name) else {
        return 0;
    };
    let guard = blob.read_recursive();
    guard
        .get::<Tensor>()
        .ok()
        .and_then(Tensor::synced)
        .map_or(0, |s| s.key())
}

/// A net's blob uses, and the schedule of its last run under a cap: a run whose blobs hold the
/// same buffers (a training step after the first) takes it again instead of reading a new one.
/// It holds weak references to those buffers (their memory is freed with them; only their
/// shared state's allocation waits for the next schedule), so a key it knows cannot name
/// another buffer.
pub(super) struct Schedules {
    blobs: Arc<BlobUses>,
    last: Mutex<Option<Arc<Schedule>>>,
}

impl Schedules {
    pub(super) fn new(blobs: BlobUses) -> Schedules {
        Schedules {
            blobs: Arc::new(blobs),
            last: Mutex::new(None),
        }
    }

    /// The schedule over the buffers `ws` holds now: the last one brought up to date where
    /// no run holds it any more (only the names whose buffer changed are read again: a step's
    /// batch), else a new one.
    fn current(&self, ws: &Workspace) -> Arc<Schedule> {
        let mut last = self.last.lock();
        match last.as_mut().and_then(Arc::get_mut) {
            Some(s) => s.refresh(ws),
            None => *last = Some(Arc::new(Schedule::read(&self.blobs, ws))),
        }
        last.as_ref()
            .map_or_else(|| Arc::new(Schedule::read(&self.blobs, ws)), Arc::clone)
    }
}

impl NextUse for Schedule {
    fn next_use(&self, key: usize) -> Option<usize> {
        let b = self.buffers.get(&key)?;
        self.next(b, self.at.load(Relaxed)).map(|(d, _)| d)
    }

    fn is_dead(&self, key: usize) -> bool {
        // A use by the running operator is not known to be over.
        self.buffers
            .get(&key)
            .is_some_and(|b| self.dead_at(b, self.at.load(Relaxed), true))
    }
}

/// A schedule installed on a device for one run; the one it replaced goes back when dropped.
pub(super) struct Installed<'a> {
    device: &'a Device,
    previous: Option<Arc<dyn NextUse>>,
    pub(super) schedule: Arc<Schedule>,
}

impl<'a> Installed<'a> {
    /// Reads and installs the schedule of `blobs` on `device`, when the device has a memory
    /// cap (without one nothing is evicted, and the run reads nothing).
    pub(super) fn on_capped(
        device: &'a Device,
        schedules: &Schedules,
        ws: &Workspace,
    ) -> Option<Installed<'a>> {
        device.memory_cap()?;
        let schedule = schedules.current(ws);
        let previous = device.swap_next_use(Some(schedule.clone()));
        Some(Installed {
            device,
            previous,
            schedule,
        })
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.device.swap_next_use(self.previous.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::device::Inert;

    /// A schedule of `len` operators over buffers `1..`, each of one name with these uses
    /// (`(op, overwrite)`) and internal or not; buffer `k` is name `k - 1`.
    fn schedule(len: usize, names: &[(&[(u32, bool)], bool)]) -> Schedule {
        let blobs = BlobUses {
            names: (0..names.len()).map(|n| format!("b{n}")).collect(),
            uses: names
                .iter()
                .map(|(l, _)| {
                    l.iter()
                        .map(|&(op, overwrite)| Use { op, overwrite })
                        .collect()
                })
                .collect(),
            internal: names.iter().map(|&(_, i)| i).collect(),
            by_op: vec![SmallVec::new(); len],
            dead_after: vec![SmallVec::new(); len],
        };
        let buffers = (0..names.len())
            .map(|n| {
                let item: Weak<dyn Evictable> = Weak::<Inert>::new();
                let names = SmallVec::from_slice(&[n as u32]);
                (n + 1, Buffer { names, item })
            })
            .collect();
        Schedule {
            blobs: Arc::new(blobs),
            buffers,
            keys: (1..=names.len()).collect(),
            held: vec![None; names.len()],
            at: AtomicUsize::new(0),
        }
    }

    #[test]
    fn next_uses_count_on_into_the_next_run() {
        let s = schedule(
            8,
            &[(&[(0, false), (5, false)], true), (&[(3, false)], true)],
        );
        assert_eq!(
            (s.next_use(1), s.next_use(2), s.next_use(3)),
            (Some(0), Some(3), None)
        );
        s.at(4);
        assert_eq!((s.next_use(1), s.next_use(2)), (Some(1), Some(7)));
        s.at(6);
        // Buffer 1 next at operator 0 of the next run.
        assert_eq!(s.next_use(1), Some(2));
    }

    #[test]
    fn dead_until_overwritten_and_only_inside_the_net() {
        let s = schedule(
            6,
            &[
                // Written by 1, read by 4 (an activation): dead after 4 until the next run's 1.
                (&[(1, true), (4, false)], true),
                // The same, but an external output: never dead.
                (&[(1, true), (4, false)], false),
                // Read by 0, overwritten by 2 in the run, read by 3.
                (&[(0, false), (2, true), (3, false)], true),
            ],
        );
        // Before 1 writes it: dead (the next use overwrites it). Buffer 3 is read by 0, which
        // runs now.
        assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
        s.at(1);
        // 1 runs now and may have written it already.
        assert!(!s.is_dead(1) && s.is_dead(3));
        s.at(2);
        assert!(!s.is_dead(1) && !s.is_dead(3));
        s.at(5);
        // Past its last read: dead until the next run's write; never for the external one.
        assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
        assert!(
            !s.is_dead(9),
            "a buffer the net does not use is not known dead"
        );
    }

    #[test]
    fn a_buffer_of_two_names_is_dead_only_if_both_say_so() {
        let mut s = schedule(
            4,
            &[
                (&[(0, true), (2, false)], true),
                (&[(1, false), (2, true)], true),
            ],
        );
        // One buffer under both names.
        s.buffers.remove(&2);
        s.buffers.get_mut(&1).unwrap().names.push(1);
        s.at(3);
        // Next: name 0's overwrite at 0 (the next run's), before name 1's read at 1.
        assert!(s.is_dead(1));
        s.at(1);
        // Next: name 1's read at 1, running now: not dead.
        assert!(!s.is_dead(1));
        s.at(2);
        // At 2 name 0 is read and name 1 overwritten: a read.
        assert!(!s.is_dead(1));
        let mut t = schedule(4, &[(&[(2, true)], true), (&[(2, true)], false)]);
        t.buffers.remove(&2);
        t.buffers.get_mut(&1).unwrap().names.push(1);
        assert!(!t.is_dead(1), "one external name keeps it");
    }

    /// A blob `name` of `ws` holding a 4-element tensor of `dev` with storage of its own, or
    /// sharing blob `from`'s; returns the key of its buffer.
    fn blob(ws: &Workspace, dev: &Device, name: &str, from: Option<&str>) -> usize {
        let t = match from {
            Some(src) => {
                let src = ws.try_get_blob(src).unwrap();
                let src = src.read();
                let mut t = Tensor::new(dev);
                t.resize(&[4]).unwrap();
                t.share_data(src.get::<Tensor>().unwrap()).unwrap();
                t
            }
            None => Tensor::from_slice(&[4], &[1.0f32; 4], Some(dev)).unwrap(),
        };
        let key = t.synced().unwrap().key();
        ws.create_blob(name).unwrap().write().reset(t);
        key
    }

    #[test]
    fn a_schedule_is_reused_and_follows_a_blob_to_its_new_buffer() {
        let dev = Device::cpu();
        let ws = Workspace::new();
        let a = blob(&ws, &dev, "b0", None);
        blob(&ws, &dev, "b1", None);
        let mut blobs = schedule(2, &[(&[(0, false)], true), (&[(1, false)], true)])
            .blobs
            .as_ref()
            .clone_for_test();
        blobs.by_op = vec![SmallVec::from_slice(&[0]), SmallVec::from_slice(&[1])];
        let schedules = Schedules::new(blobs);
        let first = schedules.current(&ws);
        assert_eq!(first.next_use(a), Some(0));
        let first_ptr = Arc::as_ptr(&first);
        drop(first);
        // The same buffers: the same schedule, brought up to date in place.
        assert_eq!(Arc::as_ptr(&schedules.current(&ws)), first_ptr);
        // b1 now shares b0's buffer (a batch fed by sharing): one buffer of two names.
        assert_eq!(blob(&ws, &dev, "b1", Some("b0")), a);
        let s = schedules.current(&ws);
        assert_eq!(Arc::as_ptr(&s), first_ptr);
        assert_eq!(s.keys, vec![a, a]);
        assert_eq!(s.buffers.len(), 1);
        assert!(s.held.iter().all(|h| h.as_ref().is_some_and(|h| h.shared)));
        drop(s);
        // b1 back on a buffer of its own.
        let c = blob(&ws, &dev, "b1", None);
        let s = schedules.current(&ws);
        assert_eq!(Arc::as_ptr(&s), first_ptr);
        assert_eq!(s.buffers.len(), 2);
        assert!(s.held.iter().all(|h| h.as_ref().is_some_and(|h| !h.shared)));
        assert_eq!((s.next_use(a), s.next_use(c)), (Some(0), Some(1)));
        // While a run holds it, the next gets a schedule of its own.
        let other = schedules.current(&ws);
        assert!(!Arc::ptr_eq(&s, &other));
        assert_eq!(other.next_use(c), Some(1));
    }
}
