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
//! reads nothing and installs nothing, unless the net was built to drop dead values
//! ([`super::NetOptions::drop_dead`]).
//!
//! A buffer is *dead* when its next use overwrites it whole before anything reads it: its
//! blob is internal to the net (not an external input or output, not kept: nothing outside
//! the run reads it) and the next operator to use it has it as an output only, and says it
//! writes such outputs whole ([`Operator::overwrites_outputs`]). A use by the running operator
//! counts as a read (it may have written the output already). A dead buffer's device mirror
//! goes without a write-back ([`crate::SyncedMemory::drop_contents`]): at once after the
//! operator that used it last ([`Schedule::drop_dead_after`], so that the allocations of the
//! next operators find room without failing); a buffer the previous run did not know (it made
//! it) before the next run starts ([`Schedule::drop_dead_joined`]); else first when an
//! allocation fails. Under a memory cap (unless [`super::NetOptions::drop_dead`] asks for
//! every dead value at once), a dead value smaller than a [`SMALL_DEAD`]th of the cap is left
//! for that last path: dropped at once, it would be freed and allocated again every step for
//! little room. Until then it keeps its data (a read gets what was last written, not
//! [`crate::Error::ContentsDropped`]), and between the net's runs, when no schedule says it
//! is dead, the out-of-memory path spills it (written back) like any other mirror.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use foldhash::fast::FixedState;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::blob::Blob;
use crate::device::{Device, Evictable, NextUse};
use crate::ops::Operator;
use crate::tensor::Tensor;
use crate::workspace::{names_generation, BlobRef, Workspace};

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

/// A buffer of this run: the names that hold it, the buffer, and its bytes.
struct Buffer {
    names: SmallVec<[u32; 2]>,
    item: Weak<dyn Evictable>,
    bytes: usize,
}

/// Buffers by key.
type Buffers = HashMap<usize, Buffer, FixedState>;

/// The buffer a name holds in this run.
#[derive(Clone)]
struct Held {
    item: Weak<dyn Evictable>,
    /// Other names hold it too.
    shared: bool,
    /// The buffer's bytes.
    bytes: usize,
}

/// Which operators use which buffer in this run, and the operator running now.
pub(super) struct Schedule {
    blobs: Arc<BlobUses>,
    /// Buffer key -> the buffer (keys are addresses: a fast fixed hash, not SipHash, whose
    /// per-lookup cost showed in every capped step).
    buffers: Buffers,
    /// Name index -> the key of its buffer (0: none).
    keys: Vec<usize>,
    /// Name index -> its buffer.
    held: Vec<Option<Held>>,
    at: AtomicUsize,
    /// Name index -> the blob it named at the last lookup: valid while `looked_up` holds the
    /// workspace and the count of name changes of that lookup
    /// ([`crate::workspace::names_generation`]), so that a run reads each blob without
    /// looking its name up.
    found: Vec<Weak<RwLock<Blob>>>,
    looked_up: Option<(usize, u64)>,
    /// The keys of the buffers that names joined at the last read or refresh: the previous
    /// run did not know them under those names (see [`Schedule::drop_dead_joined`]).
    joined: Vec<usize>,
}

impl Schedule {
    /// The schedule of `blobs` over the buffers `ws` holds now.
    fn read(blobs: &Arc<BlobUses>, ws: &Workspace) -> Schedule {
        let mut buffers =
            Buffers::with_capacity_and_hasher(blobs.names.len(), FixedState::default());
        let mut keys = vec![0; blobs.names.len()];
        let mut held = vec![None; blobs.names.len()];
        let generation = names_generation();
        let found: Vec<_> = blobs
            .names
            .iter()
            .map(|name| {
                ws.try_get_blob(name)
                    .map_or_else(Weak::new, |b| Arc::downgrade(&b))
            })
            .collect();
        for (n, blob) in found.iter().enumerate() {
            let Some((key, item, bytes)) = blob.upgrade().and_then(|b| buffer_in(&b)) else {
                continue;
            };
            keys[n] = key;
            held[n] = Some(Held {
                item: item.clone(),
                shared: false,
                bytes,
            });
            let b = buffers.entry(key).or_insert_with(|| Buffer {
                names: SmallVec::new(),
                item,
                bytes,
            });
            b.names.push(n as u32);
        }
        let joined = buffers.keys().copied().collect();
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
            found,
            looked_up: Some((workspace_id(ws), generation)),
            joined,
        }
    }

    /// The blob of name `n` in `ws`: the one found by the last lookup while no name changed
    /// since, else looked up again (`fresh`: the lookups of this refresh are made at that
    /// count).
    fn blob(&mut self, ws: &Workspace, n: usize, fresh: bool) -> Option<BlobRef> {
        if !fresh {
            return self.found[n].upgrade();
        }
        let blob = ws.try_get_blob(&self.blobs.names[n]);
        self.found[n] = blob.as_ref().map_or_else(Weak::new, Arc::downgrade);
        blob
    }

    /// Brings the schedule up to the buffers `ws` holds now: each name whose buffer changed
    /// leaves its old buffer and joins its new one.
    fn refresh(&mut self, ws: &Workspace) {
        self.at.store(0, Relaxed);
        // Read before the lookups: a change made during them makes the next refresh look up.
        let now = (workspace_id(ws), names_generation());
        let fresh = self.looked_up != Some(now);
        self.looked_up = Some(now);
        self.joined.clear();
        for n in 0..self.blobs.names.len() {
            let old = self.keys[n];
            let blob = self.blob(ws, n, fresh);
            if blob.as_ref().map_or(0, key_in) == old {
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
            let Some((key, item, bytes)) = blob.as_ref().and_then(buffer_in) else {
                continue;
            };
            self.keys[n] = key;
            self.held[n] = Some(Held {
                item: item.clone(),
                shared: false,
                bytes,
            });
            self.buffers
                .entry(key)
                .or_insert_with(|| Buffer {
                    names: SmallVec::new(),
                    item,
                    bytes,
                })
                .names
                .push(n as u32);
            self.mark_shared(key);
            if !self.joined.contains(&key) {
                self.joined.push(key);
            }
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

    /// Before the run: drops the device mirrors of the buffers that names joined at this
    /// read or refresh (the previous run did not know them: it made them, or they came from
    /// outside) and that are dead now (their first use in the run overwrites them) and hold
    /// at least `min_bytes`. The previous run could not drop them after their last use, and
    /// the run's first allocations would otherwise fail first. Known buffers went then.
    fn drop_dead_joined(&self, device: &Device, dropped: &Cell<(u64, u64)>, min_bytes: usize) {
        for key in &self.joined {
            let Some(b) = self.buffers.get(key) else {
                continue;
            };
            if b.bytes < min_bytes || !self.dead_at(b, 0, false) {
                continue;
            }
            if let Some(bytes) = b
                .item
                .upgrade()
                .and_then(|item| device.drop_dead(item.as_ref()))
            {
                let (n, total) = dropped.get();
                dropped.set((n + 1, total + bytes as u64));
            }
        }
    }

    /// After operator `i` ran: drops the device mirrors of the buffers it used that are dead
    /// now (it read them last) and hold at least `min_bytes`, so that their memory serves the
    /// next allocations at once. A buffer of one name is looked up in
    /// [`BlobUses::dead_after`]; one of several names is judged over all of them. Adds the
    /// mirrors dropped and their bytes to `dropped`.
    fn drop_dead_after(
        &self,
        i: usize,
        device: &Device,
        dropped: &Cell<(u64, u64)>,
        min_bytes: usize,
    ) {
        let drop = |item: &Weak<dyn Evictable>| {
            if let Some(bytes) = item
                .upgrade()
                .and_then(|item| device.drop_dead(item.as_ref()))
            {
                let (n, total) = dropped.get();
                dropped.set((n + 1, total + bytes as u64));
            }
        };
        for &n in &self.blobs.dead_after[i] {
            if let Some(h) = self.held[n as usize]
                .as_ref()
                .filter(|h| !h.shared && h.bytes >= min_bytes)
            {
                drop(&h.item);
            }
        }
        for &n in &self.blobs.by_op[i] {
            if !self.held[n as usize].as_ref().is_some_and(|h| h.shared) {
                continue;
            }
            if let Some(b) = self.buffers.get(&self.keys[n as usize]) {
                if b.bytes >= min_bytes && self.dead_at(b, i + 1, false) {
                    drop(&b.item);
                }
            }
        }
    }
}

/// The key of the buffer of `blob`, the buffer and its bytes, when the blob holds a tensor
/// with storage.
fn buffer_in(blob: &BlobRef) -> Option<(usize, Weak<dyn Evictable>, usize)> {
    let guard = blob.read_recursive();
    let synced = guard.get::<Tensor>().ok().and_then(Tensor::synced)?;
    Some((synced.key(), synced.evictable(), synced.len()))
}

/// The key of the buffer of `blob` (0: none).
fn key_in(blob: &BlobRef) -> usize {
    let guard = blob.read_recursive();
    guard
        .get::<Tensor>()
        .ok()
        .and_then(Tensor::synced)
        .map_or(0, |s| s.key())
}

/// Which workspace `ws` is, while it lives.
fn workspace_id(ws: &Workspace) -> usize {
    std::ptr::from_ref(ws) as usize
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

/// Under a memory cap, dead values of less than this fraction of the cap are not dropped at
/// once (see [`Installed::drop_dead_after`]).
const SMALL_DEAD: u64 = 32;

/// A schedule installed on a device for one run; the one it replaced goes back when dropped,
/// and the dead mirrors the run dropped are counted then, on the device pool (one lock for
/// the run, not one per value: the pool's `drops` reading lags the run until it ends).
pub(super) struct Installed<'a> {
    device: &'a Device,
    previous: Option<Arc<dyn NextUse>>,
    pub(super) schedule: Arc<Schedule>,
    /// Dead mirrors dropped by the run so far, and their bytes.
    dropped: Cell<(u64, u64)>,
    /// The least bytes of a dead mirror dropped at once (see [`Installed::drop_dead_after`]).
    min_bytes: usize,
}

impl<'a> Installed<'a> {
    /// Reads and installs the schedule of `blobs` on `device`, when the device has a memory
    /// cap or `drop_dead` asks for dead values to go (else nothing is evicted or dropped, and
    /// the run reads nothing).
    pub(super) fn when_needed(
        device: &'a Device,
        schedules: &Schedules,
        ws: &Workspace,
        drop_dead: bool,
    ) -> Option<Installed<'a>> {
        let cap = device.memory_cap();
        if !drop_dead {
            cap?;
        }
        // Asked for (`drop_dead`), every dead value goes at once; under a cap alone, the
        // small ones stay.
        let min_bytes = match cap {
            Some(cap) if !drop_dead => usize::try_from(cap / SMALL_DEAD).unwrap_or(usize::MAX),
            _ => 0,
        };
        let schedule = schedules.current(ws);
        let previous = device.swap_next_use(Some(schedule.clone()));
        let dropped = Cell::new((0, 0));
        schedule.drop_dead_joined(device, &dropped, min_bytes);
        Some(Installed {
            device,
            previous,
            schedule,
            dropped,
            min_bytes,
        })
    }

    /// After operator `i` ran: drops the device mirrors of the buffers it used that are dead
    /// now (see [`Schedule`]'s `drop_dead_after`). Under a memory cap, unless the net was
    /// built to drop dead values ([`super::NetOptions::drop_dead`]), a dead value smaller than
    /// a [`SMALL_DEAD`]th of the cap stays: dropping it would cost a free now and an
    /// allocation at its next use for little room, and the out-of-memory path drops dead
    /// values first, without a write-back, when an allocation does not fit.
    pub(super) fn drop_dead_after(&self, i: usize) {
        self.schedule
            .drop_dead_after(i, self.device, &self.dropped, self.min_bytes);
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.device.swap_next_use(self.previous.take());
        let (n, bytes) = self.dropped.get();
        if n > 0 {
            self.device.note_dead_drops(n, bytes);
        }
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
