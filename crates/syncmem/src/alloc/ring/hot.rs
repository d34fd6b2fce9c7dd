//! The write path of the allocations and frees: an event written into the thread's ring
//! straight from the pool's own fields, with no event value made and no call, through one
//! thread-local of cells with no destructor ([`Hot`]: reached with no registration check and
//! no borrow).
//!
//! The thread's recorder (the rings it owns, its numbered names) stays in the thread-local of
//! [`super::Local`], behind its `RefCell`; the hot state mirrors what an event needs of it:
//! the history's generation, the ring written last and the run of its slots that can be
//! written with no look at the ring (up to the end of the ring's chunk or to the next reading
//! of the clock, whichever comes first), the time read last, the number of the operator
//! running, and the numbers of the names the recorder's cache holds. Anything else (another
//! history, another source, the end of the run, a name not cached) takes the cold path
//! ([`super::cold`]), which borrows the recorder and sets the hot state again.
//!
//! # The invariant that makes the slot pointer safe
//!
//! While `generation` is not [`DISARMED`], the thread's recorder is of that generation and holds (in an
//! `Arc`) the ring of `source`, whose chunk contains the slots from `cur` to `end`; the cold
//! path disarms the state before it changes the recorder or the run, and back once they
//! agree again, and the recorder's destructor disarms it first. A chunk never moves or is
//! freed while its ring lives.

use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::slots::{self, Slot};
use super::{cold, trace_stacks, CACHE, STEP};
use crate::alloc::event::{PoolEvent, StreamId};

/// An allocation as the history records it: the pool's own fields, borrowed (no event made).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocRecord<'a> {
    /// Bytes asked for.
    pub(crate) requested: usize,
    /// Block size.
    pub(crate) size: usize,
    /// Served from cached memory.
    pub(crate) cache_hit: bool,
    /// The block's id in the pool.
    pub(crate) block: u64,
    /// The stream the block was allocated for.
    pub(crate) stream: StreamId,
    /// The segment's id in the pool.
    pub(crate) segment: u64,
    /// The block's start in its segment.
    pub(crate) offset: usize,
    /// The label of the buffer the block is handed to.
    pub(crate) owner: Option<&'a Arc<str>>,
}

impl AllocRecord<'_> {
    /// The event (for an observer or a sink).
    pub(crate) fn event(&self) -> PoolEvent {
        PoolEvent::Alloc {
            requested: self.requested,
            size: self.size,
            cache_hit: self.cache_hit,
            block: self.block,
            stream: self.stream,
            segment: self.segment,
            offset: self.offset,
            owner: self.owner.cloned(),
        }
    }
}

/// The generation of a hot state out of use: no history has it (generations are below
/// 2^63), so no event passes its first test.
pub(super) const DISARMED: u64 = u64::MAX;

/// What an event of the thread reads and writes (see the module docs).
pub(crate) struct Hot {
    /// The generation of the history the thread writes into; [`DISARMED`]: none, or the cold
    /// path runs (no history has that generation).
    pub(super) generation: Cell<u64>,
    /// The source of the ring written last (`u64::MAX`: none).
    pub(super) source: Cell<u64>,
    /// The next slot of that ring, and the end of the run of slots written with no look at
    /// the ring.
    pub(super) cur: Cell<*const Slot>,
    pub(super) end: Cell<*const Slot>,
    /// The sequence number of the event at `cur` in its ring.
    pub(super) seq: Cell<u64>,
    /// The time read last, in nanoseconds from the history's start.
    pub(super) now: Cell<u64>,
    /// The thread's number, placed as word 2 of a slot holds it.
    pub(super) thread_bits: Cell<u64>,
    /// The thread's mark in the history, which a lease keeps from its allocation (see
    /// [`Recorded`]): its number plus one, or [`MARK_UNKNOWN`] past [`MAX_MARKED_THREAD`].
    pub(super) mark: Cell<u8>,
    /// The number of the operator running on the thread (0: none), placed as word 5 of an
    /// allocation holds it.
    pub(super) op: Cell<u64>,
    /// Per cache slot: the address of the name the recorder's cache holds there, and its
    /// number (the recorder holds the `Arc`, so no other name has that address).
    pub(super) names: [Cell<(usize, u32)>; CACHE],
}

impl Hot {
    /// Takes the hot state out of use (see the module docs); returns the generation it had.
    pub(super) fn disarm(&self) -> u64 {
        self.generation.replace(DISARMED)
    }

    /// Reads the clock of `rings` into the thread's time, which never goes back (an event
    /// may have been stamped after the newest reading, see [`Recorded`]).
    pub(super) fn read_clock(&self, rings: &super::Rings) {
        self.now.set(self.now.get().max(rings.now()));
    }

    /// The number of `name` in the history when the cache holds it.
    #[inline(always)]
    fn cached_id(&self, name: &Arc<str>) -> Option<u32> {
        let addr = Arc::as_ptr(name) as *const u8 as usize;
        let (held, id) = self.names[cache_index(addr)].get();
        (held == addr).then_some(id)
    }

    /// The number of `name` in the history (0 when it cannot be numbered now).
    #[inline(always)]
    fn id_of(&self, name: &Arc<str>) -> u32 {
        match self.cached_id(name) {
            Some(id) => id,
            None => cold::number(self, name),
        }
    }

    /// The next slot of the ring of `source` in the history of `generation`, with its
    /// sequence number; `None` when the event cannot be recorded (the thread ends, or the
    /// event is made by the cold path itself).
    #[inline(always)]
    fn next_slot(&self, generation: u64, source: u64) -> Option<(u64, &Slot)> {
        let cur = self.cur.get();
        if (self.generation.get() != generation
            || self.source.get() != source
            || cur == self.end.get())
            && !cold::prepare(generation, source)
        {
            return None;
        }
        let cur = self.cur.get();
        // SAFETY: the hot state is armed for this generation and source with a run that is
        // not empty (checked above, or set so by `prepare`): `cur` points to a slot of a chunk
        // of the ring of `source`, which the thread's recorder holds (module docs), and the
        // slot is written by this thread only. Nothing below calls out before the slot is
        // written, so the run cannot change under it.
        let slot = unsafe { &*cur };
        self.cur.set(cur.wrapping_add(1));
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        Some((seq, slot))
    }
}

/// The slot of the name cache of the name at `addr`.
#[inline(always)]
pub(super) fn cache_index(addr: usize) -> usize {
    (addr >> 4) & (CACHE - 1)
}

thread_local! {
    pub(super) static HOT: Hot = const {
        Hot {
            generation: Cell::new(DISARMED),
            source: Cell::new(u64::MAX),
            cur: Cell::new(std::ptr::null()),
            end: Cell::new(std::ptr::null()),
            seq: Cell::new(0),
            now: Cell::new(0),
            thread_bits: Cell::new(0),
            mark: Cell::new(MARK_UNKNOWN),
            op: Cell::new(0),
            names: [const { Cell::new((0, 0)) }; CACHE],
        }
    };
}

/// The thread's hot state, reached with one address computation (no closure: a closure
/// the compiler declines to inline would put a call on the allocation path).
#[inline(always)]
fn hot<'a>() -> &'a Hot {
    let h: *const Hot = HOT.with(std::ptr::from_ref);
    // SAFETY: a thread-local with no destructor stays at its address, alive, as long as its
    // thread runs. The reference is only used by the inlined writers of this thread, which
    // keep it no longer than the event they write.
    unsafe { &*h }
}

/// Runs `f` with the thread's hot state ([`hot`]).
#[inline(always)]
fn with_hot<R>(f: impl FnOnce(&Hot) -> R) -> R {
    f(hot())
}

/// The words 0 to 2 of an event of `kind` from the pool (or device) labelled `label`, at the
/// thread's time.
#[inline(always)]
fn head(h: &Hot, kind: u64, label: u32) -> [u64; 3] {
    head_at(h, h.now.get(), kind, label)
}

/// [`head`] at time `t`.
#[inline(always)]
fn head_at(h: &Hot, t: u64, kind: u64, label: u32) -> [u64; 3] {
    [
        t,
        STEP.load(Relaxed).wrapping_add(1),
        kind | h.thread_bits.get() | u64::from(label) << 32,
    ]
}

/// A lease's mark ([`Recorded::mark`]) when the thread that recorded its block's newest
/// event is not known (the history was off, or the thread's number is past
/// [`MAX_MARKED_THREAD`]): its next event reads the clock.
pub(crate) const MARK_UNKNOWN: u8 = 0;
/// A lease's mark when its free is no event: a thread cache gives a block back to its shard,
/// and the free was recorded when the block went into the cache.
pub(crate) const MARK_SILENT: u8 = u8::MAX;
/// The highest thread number that has a mark of its own (its number plus one).
const MAX_MARKED_THREAD: u64 = 253;

/// This thread's mark in the history it records.
#[inline]
pub(super) fn own_mark() -> u8 {
    hot().mark.get()
}

/// The time of this thread's newest event, or of its newest reading of the clock, in the
/// history of `generation` (0 when it records another or none).
#[inline]
pub(crate) fn thread_time(generation: u64) -> u64 {
    let h = hot();
    if h.generation.get() == generation {
        h.now.get()
    } else {
        0
    }
}

/// The mark of the thread numbered `number` in its history.
pub(super) fn mark_of(number: u64) -> u8 {
    if number <= MAX_MARKED_THREAD {
        number as u8 + 1
    } else {
        MARK_UNKNOWN
    }
}

/// What recording an event wrote: its time, and the mark of the thread that wrote it
/// ([`MARK_UNKNOWN`] when nothing was written), which the block's lease keeps.
///
/// # Time across threads
/// A block's events are made one after the other, on one thread or passed between threads,
/// but each thread stamps its events with the time it read last. So that the events of one
/// block read in their order whatever the threads' clocks: an event of a block whose newest
/// event another thread (or no known thread) recorded reads the clock and is stamped one
/// nanosecond later (its block's event, made before it, was stamped with a time read before
/// it); the events of a pool shard are stamped after the shard's newest one (`floor`, kept
/// under the shard's lock); a thread never stamps an event before its own newest one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recorded {
    /// Nanoseconds from the history's start.
    pub(crate) t: u64,
    /// The writing thread's mark.
    pub(crate) mark: u8,
}

/// Nothing recorded.
const NOT_RECORDED: Recorded = Recorded {
    t: 0,
    mark: MARK_UNKNOWN,
};

/// The time of the thread's next event, not before `floor`; the thread's time moves to it.
#[inline(always)]
fn stamp(h: &Hot, floor: u64) -> u64 {
    let t = h.now.get().max(floor);
    h.now.set(t);
    t
}

/// Records the allocation `a` makes (for a request of `owner`, which `a` names too) of
/// `source` from the pool labelled `label` (its `label_key`), with its shard's `order` word
/// (0: none, a thread cache's), stamped not before `floor`, in the history of `generation`.
/// Inlined into the pool's allocation path: the common case (the ring written last, a run of
/// slots not used up, the owner's number cached, no stacks) is a few tests and the slot's
/// stores straight from the pool's fields (`a` is called past the tests), with no call and no
/// record made in memory; everything else goes to [`record_alloc_cold`] whole, out of line.
#[inline(always)]
pub(crate) fn record_alloc<'r>(
    generation: u64,
    source: u64,
    label: u32,
    (order, floor): (u64, u64),
    owner: Option<&'r Arc<str>>,
    a: impl FnOnce() -> AllocRecord<'r>,
) -> Recorded {
    let h = hot();
    let cur = h.cur.get();
    let owner_id = match owner {
        None => Some(0),
        Some(o) => h.cached_id(o),
    };
    match owner_id {
        Some(owner_id)
            if h.generation.get() == generation
                && h.source.get() == source
                && cur != h.end.get()
                && !maybe_stacks() =>
        {
            // SAFETY: as in `Hot::next_slot`: armed for this generation and source, with a
            // run that is not empty.
            let slot = unsafe { &*cur };
            h.cur.set(cur.wrapping_add(1));
            let seq = h.seq.get();
            h.seq.set(seq + 1);
            let t = stamp(h, floor);
            // Made here, past the tests: its fields go from where they lie into the slot,
            // none of them held in a register (or spilled) across the tests.
            write_alloc(h, (seq, slot), (label, order, t), owner_id, &a());
            Recorded {
                t,
                mark: h.mark.get(),
            }
        }
        // By value: the record is made in memory on this rare path only.
        _ => record_alloc_cold(generation, source, label, (order, floor), a()),
    }
}

/// [`record_alloc`] the long way: joins the history, switches rings, starts a run, numbers
/// the owner, keeps the stack, as needed.
#[cold]
#[inline(never)]
fn record_alloc_cold(
    generation: u64,
    source: u64,
    label: u32,
    (order, floor): (u64, u64),
    a: AllocRecord<'_>,
) -> Recorded {
    with_hot(|h| {
        if h.generation.get() != generation && !cold::prepare(generation, source) {
            return NOT_RECORDED;
        }
        let owner = a.owner.map_or(0, |o| h.id_of(o));
        let Some((seq, slot)) = h.next_slot(generation, source) else {
            return NOT_RECORDED;
        };
        let t = stamp(h, floor);
        write_alloc(h, (seq, slot), (label, order, t), owner, &a);
        if trace_stacks() {
            cold::keep_stack(source, seq);
        }
        Recorded {
            t,
            mark: h.mark.get(),
        }
    })
}

/// Whether allocations may have to capture their stack (on, or not read yet).
#[inline(always)]
fn maybe_stacks() -> bool {
    super::STACKS.load(Relaxed) != super::STACKS_OFF
}

/// Writes allocation `a` into `slot`, event `seq`, at time `t`.
#[inline(always)]
fn write_alloc(
    h: &Hot,
    (seq, slot): (u64, &Slot),
    (label, order, t): (u32, u64, u64),
    owner: u32,
    a: &AllocRecord<'_>,
) {
    let [t, step, head] = head_at(h, t, slots::ALLOC | u64::from(a.cache_hit) << 8, label);
    slot.begin();
    slot.set(0, t);
    slot.set(1, step);
    slot.set(2, head);
    slot.set(3, order);
    slot.set(5, u64::from(owner) | h.op.get());
    slot.set(6, a.requested as u64);
    slot.set(7, a.size as u64);
    slot.set(8, a.block);
    slot.set(9, a.stream);
    slot.set(10, a.segment);
    slot.set(11, a.offset as u64);
    slot.end(seq);
}

/// Records the free of block `block` (`size` bytes) of `source` from the pool labelled
/// `label`, with its shard's `order` word (0: none), stamped not before `floor`, in the
/// history of `generation`; `mark` is the block's lease's ([`Recorded::mark`]): when another
/// thread (or none known) recorded the block's newest event, the clock is read (see
/// [`Recorded`]). Inlined, with the rare cases out of line, as [`record_alloc`]. Returns the
/// time written (0: nothing).
#[inline(always)]
pub(crate) fn record_free(
    generation: u64,
    source: u64,
    label: u32,
    (order, floor, mark): (u64, u64, u8),
    (size, block): (usize, u64),
) -> u64 {
    let h = hot();
    let cur = h.cur.get();
    if h.generation.get() == generation
        && h.source.get() == source
        && cur != h.end.get()
        && mark == h.mark.get()
        && mark != MARK_UNKNOWN
    {
        // SAFETY: as in `Hot::next_slot`: armed for this generation and source, with a run
        // that is not empty.
        let slot = unsafe { &*cur };
        h.cur.set(cur.wrapping_add(1));
        let seq = h.seq.get();
        h.seq.set(seq + 1);
        let t = stamp(h, floor);
        write_free(h, (seq, slot), (label, order, t), (size, block));
        t
    } else {
        record_free_cold(
            generation,
            source,
            label,
            (order, floor, mark),
            (size, block),
        )
    }
}

/// [`record_free`] the long way.
#[cold]
#[inline(never)]
fn record_free_cold(
    generation: u64,
    source: u64,
    label: u32,
    (order, floor, mark): (u64, u64, u8),
    (size, block): (usize, u64),
) -> u64 {
    with_hot(|h| {
        if h.generation.get() != generation && !cold::prepare(generation, source) {
            return 0;
        }
        let floor = if mark == h.mark.get() && mark != MARK_UNKNOWN {
            floor
        } else {
            // Made after the block's newest event, stamped before this reading.
            cold::read_clock(h);
            floor.max(h.now.get() + 1)
        };
        let Some(at) = h.next_slot(generation, source) else {
            return 0;
        };
        let t = stamp(h, floor);
        write_free(h, at, (label, order, t), (size, block));
        t
    })
}

/// Writes the free of `block` (`size` bytes) into `slot`, event `seq`, at time `t`.
#[inline(always)]
fn write_free(
    h: &Hot,
    (seq, slot): (u64, &Slot),
    (label, order, t): (u32, u64, u64),
    (size, block): (usize, u64),
) {
    let [t, step, head] = head_at(h, t, slots::FREE, label);
    slot.begin();
    slot.set(0, t);
    slot.set(1, step);
    slot.set(2, head);
    slot.set(3, order);
    slot.set(7, size as u64);
    slot.set(8, block);
    slot.end(seq);
}

/// Records an event of `kind` from `label` with words 3 to 11 `w` (a rare event, a copy: the
/// clock is read first) in the history of `generation`.
pub(super) fn record_words(generation: u64, source: u64, kind: u64, label: u32, w: [u64; 9]) {
    HOT.with(|h| {
        if h.generation.get() != generation && !cold::prepare(generation, source) {
            return;
        }
        cold::read_clock(h);
        let Some((seq, slot)) = h.next_slot(generation, source) else {
            return;
        };
        let [t, step, head] = head(h, kind, label);
        slot.begin();
        slot.set(0, t);
        slot.set(1, step);
        slot.set(2, head);
        for (i, v) in w.iter().enumerate() {
            slot.set(3 + i, *v);
        }
        slot.end(seq);
    });
}
