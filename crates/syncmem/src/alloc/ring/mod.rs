//! The rings of the always-on history: each thread writes the memory events it makes into rings
//! of its own (one per source of events), with plain stores and no lock; a reader collects
//! every thread's rings and merges them ([`Rings::collect`]).
//!
//! # The write path
//!
//! A pool's allocation or free costs, while the history records and no sink is attached: one
//! relaxed load of the hook's state (shared with the sinks' flag, [`super::event::active`]),
//! the shard's order word (its key and sequence number in one word), and the writer
//! ([`record_alloc`], [`record_free`], inlined into the pool: no call) that stores the pool's
//! own fields (no event value is made) into the next slot of the thread's ring,
//! through the thread's hot state ([`hot`]: one thread-local of cells, no borrow): a test of
//! the history's generation, of the ring written last and of the run of slots left, the
//! words (names as numbers: a pool's label is numbered when the pool is made, an owner and an
//! operator once per thread and history, through a cache held by the thread), stored between
//! two stores of the slot's sequence number (a seqlock per slot: a reader copies a slot and
//! keeps it only when the number did not change). No atomic read-modify-write, no lock, no
//! clock: the time is read every [`SAMPLE`] events of a ring (when a run of slots ends) and
//! whenever the operator running on the thread changes, a step is marked, or a rare event
//! comes (a segment made or given back, a copy, an eviction, an out-of-memory); the events in
//! between carry the last time read. Everything else (joining a history, another ring, the
//! end of a run, a name not numbered yet, a stack to capture) is the cold path ([`cold`]).
//! Other events, and every event of a pool with an observer or sinks, are made as values
//! first and written the same way ([`record_pool`]).
//!
//! # Order
//!
//! The events of one thread keep their order. Across threads, the events of one pool shard
//! carry the shard's own sequence number (modulo 2^40, with the shard's key in the same word),
//! taken under the shard's lock, so a block's allocation
//! comes before its free even when two threads made them within one reading of the clock; the
//! rest is merged by time. A thread cache's events (a hit, a block taken in) take no shard's
//! number; what keeps a block's events in order then is their times: a shard's event is
//! stamped after the shard's newest one, an event of a block whose newest event another
//! thread (or no known thread) recorded reads the clock and is stamped a nanosecond later,
//! and a thread's time never goes back ([`Recorded`]). The block's lease keeps the mark of the
//! thread that recorded its newest event (one byte), so the common case (a block allocated
//! and freed on one thread) reads no clock.
//!
//! # Bound
//!
//! Each thread keeps at most `max_entries` events per source; reading keeps the newest
//! `max_entries` events of each source over all threads (those are among the threads' own
//! newest). Memory is bounded by `max_entries` slots per thread that made events of a source;
//! the rings of a thread that ended are merged into one ring per source kept by the history.

mod cold;
mod hot;
mod read;
mod slots;
mod write;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

pub(crate) use hot::{
    record_alloc, record_free, thread_time, AllocRecord, Recorded, MARK_SILENT, MARK_UNKNOWN,
};
pub(crate) use read::{RawEvent, RawWhat};
use slots::SourceRing;
pub(crate) use slots::{order_word, split_order};
pub(crate) use write::{label_key, record_copy, record_pool};

/// The clock is read every `SAMPLE` events of a ring (a power of two), besides the reads at
/// each new operator, step mark and rare event: one read took about 110 ns on the 2-core VM,
/// 1.7 ns an event at 64, 0.4 ns at 256 (a tight loop of 256 events lasts about 10 µs).
pub(crate) const SAMPLE: u64 = 256;

/// The most names a history numbers; further names read as [`TOO_MANY`].
const MAX_NAMES: usize = 1 << 20;
/// What a name past [`MAX_NAMES`] reads as.
const TOO_MANY: &str = "(too many names)";

/// Entries of a thread's cache of numbered names (a power of two).
const CACHE: usize = 64;

/// Rings of threads that ended kept per source before they are merged into one.
const RETIRED: usize = 4;

/// The history recording now (its generation is in the hook's state).
static CURRENT: RwLock<Option<Arc<Rings>>> = RwLock::new(None);
/// Generations of histories, from 1.
static NEXT_GEN: AtomicU64 = AtomicU64::new(1);
/// The step marked now (`u64::MAX`: none).
static STEP: AtomicU64 = AtomicU64::new(u64::MAX);
/// 0: not read from the environment yet; 1: off; 2: on (see [`trace_stacks`]).
static STACKS: AtomicU8 = AtomicU8::new(0);

/// The environment variable that turns stack capture on (`SYNCMEM_TRACE_STACKS=1`).
pub(crate) const TRACE_STACKS_ENV: &str = "SYNCMEM_TRACE_STACKS";

/// The names a history numbers (pool labels, owners, operators): number 0 is none.
#[derive(Debug, Default)]
struct Names {
    ids: HashMap<Arc<str>, u32>,
    list: Vec<Arc<str>>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        if self.list.len() >= MAX_NAMES {
            return self.id_unchecked(TOO_MANY);
        }
        self.id_unchecked(name)
    }

    fn id_unchecked(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let name: Arc<str> = name.into();
        self.list.push(name.clone());
        let id = self.list.len() as u32;
        self.ids.insert(name, id);
        id
    }
}

/// The rings of one thread.
#[derive(Debug)]
pub(crate) struct ThreadRings {
    /// The thread's number in the history (for a stable order of ties).
    number: u64,
    rings: Mutex<Vec<Arc<SourceRing>>>,
}

/// One history: every thread's rings.
#[derive(Debug)]
pub(crate) struct Rings {
    generation: u64,
    max_entries: usize,
    /// Times count from here.
    start: Instant,
    threads: Mutex<Vec<Arc<ThreadRings>>>,
    /// The number of the next thread to join.
    next_thread: AtomicU64,
    /// The rings of threads that ended, one per source.
    retired: Mutex<Vec<Arc<SourceRing>>>,
    names: Mutex<Names>,
}

/// A thread's way into the history recording now (what an event needs of it is mirrored in
/// the hot state, [`hot`]).
struct Recorder {
    /// The history's generation.
    generation: u64,
    rings: Arc<Rings>,
    thread: Arc<ThreadRings>,
    /// The rings written, by source.
    sources: Vec<(u64, Arc<SourceRing>)>,
    /// Numbered names, by the address of the `Arc` held here (so that it cannot be reused).
    cache: Box<NameCache>,
}

/// Numbered names of a thread's recorder: a name and its number, per cache slot.
type NameCache = [Option<(Arc<str>, u32)>; CACHE];

/// What the thread holds: the operator running on it and its recorder.
#[derive(Default)]
struct Local {
    op: Option<Arc<str>>,
    recorder: Option<Recorder>,
}

impl Drop for Local {
    fn drop(&mut self) {
        // The hot state first: it points into the rings given up below.
        let _ = hot::HOT.try_with(cold::reset);
        if let Some(r) = self.recorder.take() {
            r.rings.retire(&r.thread);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            op: None,
            recorder: None,
        })
    };
}

/// Starts a history keeping `max_entries` events per source, replacing the one recording.
pub(crate) fn start(max_entries: usize) -> Arc<Rings> {
    let rings = Arc::new(Rings {
        generation: NEXT_GEN.fetch_add(1, Relaxed),
        max_entries: max_entries.max(1),
        start: Instant::now(),
        threads: Mutex::new(Vec::new()),
        next_thread: AtomicU64::new(0),
        retired: Mutex::new(Vec::new()),
        names: Mutex::new(Names::default()),
    });
    let mut current = CURRENT.write();
    *current = Some(rings.clone());
    super::event::set_history(rings.generation);
    rings
}

/// The time now in the history of `generation` (0 when it does not record).
#[cold]
pub(crate) fn clock(generation: u64) -> u64 {
    match &*CURRENT.read() {
        Some(r) if r.generation == generation => r.now(),
        _ => 0,
    }
}

/// Stops the history recording now, if any.
pub(crate) fn stop() {
    let mut current = CURRENT.write();
    *current = None;
    super::event::set_history(0);
}

/// Marks the step the program is in, for the events recorded from now on.
pub(crate) fn set_step(step: Option<u64>) {
    STEP.store(step.unwrap_or(u64::MAX), Relaxed);
    let _ = LOCAL.try_with(|l| {
        if let Ok(l) = l.try_borrow() {
            if let Some(r) = &l.recorder {
                let _ = hot::HOT.try_with(|h| h.read_clock(&r.rings));
            }
        }
    });
}

/// Marks `op` as the operator running on this thread; returns the one marked before.
pub(crate) fn replace_op(op: Option<Arc<str>>) -> Option<Arc<str>> {
    LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            let l = &mut *l;
            let generation = super::event::history_generation();
            if let Some(r) = l.recorder.as_mut().filter(|r| r.generation == generation) {
                let _ = hot::HOT.try_with(|h| {
                    h.read_clock(&r.rings);
                    h.op.set(u64::from(op.as_ref().map_or(0, |o| r.id_of(h, o))) << 32);
                });
            }
            std::mem::replace(&mut l.op, op)
        })
        .ok()
        .flatten()
}

/// The operator marked on this thread.
pub(crate) fn current_op() -> Option<Arc<str>> {
    LOCAL.try_with(|l| l.borrow().op.clone()).ok().flatten()
}

/// [`STACKS`] when stacks are not captured.
const STACKS_OFF: u8 = 1;

/// Turns stack capture on or off.
pub(crate) fn set_trace_stacks(on: bool) {
    STACKS.store(if on { 2 } else { STACKS_OFF }, Relaxed);
}

/// Whether recorded allocations capture their stack: [`set_trace_stacks`], else
/// [`TRACE_STACKS_ENV`] set to `1`, `true`, `on` or `yes`.
#[inline]
pub(crate) fn trace_stacks() -> bool {
    match STACKS.load(Relaxed) {
        0 => stacks_from_env(),
        s => s == 2,
    }
}

#[cold]
fn stacks_from_env() -> bool {
    let on = std::env::var(TRACE_STACKS_ENV)
        .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "on" | "yes"));
    set_trace_stacks(on);
    on
}

impl Rings {
    /// Nanoseconds since the history started.
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The most events kept per source.
    pub(crate) fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Moves the rings of `thread` (which ended, or left for a newer history) into the
    /// retired rings; past [`RETIRED`] rings of one source, they are merged into one keeping
    /// the newest events.
    fn retire(&self, thread: &Arc<ThreadRings>) {
        // Locks in the reader's order: the retired rings, then the threads.
        let mut retired = self.retired.lock();
        self.threads.lock().retain(|t| !Arc::ptr_eq(t, thread));
        let rings: Vec<Arc<SourceRing>> = std::mem::take(&mut *thread.rings.lock());
        for ring in rings {
            let source = ring.source;
            retired.push(ring);
            if retired.iter().filter(|r| r.source == source).count() > RETIRED {
                let (these, rest): (Vec<_>, Vec<_>) =
                    retired.drain(..).partition(|r| r.source == source);
                *retired = rest;
                let mut events: Vec<_> = these.iter().flat_map(|r| r.events()).collect();
                events.sort_by_key(|(seq, w, _)| (w[0], (w[2] >> 16) & 0xffff, *seq));
                let skip = events.len().saturating_sub(self.max_entries);
                let merged = SourceRing::new(source, self.max_entries);
                merged.absorb(events.split_off(skip));
                retired.push(Arc::new(merged));
            }
        }
    }
}
