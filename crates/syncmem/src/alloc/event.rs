//! What the memory system reports, and to whom: the one leaf type between the pools and
//! streams that make events and whatever records them.
//!
//! - A [`PoolEvent`] is an allocation, free, segment, eviction or out-of-memory event of a
//!   pool; a [`PoolObserver`] set on one pool sees that pool's events
//!   ([`crate::alloc::pool::Pool::set_observer`]).
//! - The process's own pools (each device's device and pinned pools, the global host pool)
//!   and the streams of every device also publish [`Event`]s (a pool event, a copy, a step
//!   mark) to the sinks a higher layer installs process-wide ([`attach`]). Each event comes
//!   from a *source*: a number per device ([`new_source`]; two handles on the same hardware
//!   made by `Device::isolated` stay apart), and [`HOST_SOURCE`] for the global host pool. A
//!   pool is marked with its source when it is made, so a sink attached to a device also sees
//!   a pool that `Device::set_pool` puts in place later.
//!
//! Of the crate it names only `alloc`'s statistics (the direction of a copy): the layers above
//! install sinks, and the pools and streams never know what records them.
//!
//! # Cost
//!
//! Nothing is published while no sink is attached and no history records: a copy or a pool
//! event then costs one relaxed load of the hook's state and a predicted branch ([`active`]).
//! With sinks attached, an event takes a shared read lock on the list of attachments and calls
//! each sink whose scope covers the source. The always-on history is not a sink: its
//! generation is in the same state word, and an event goes to the thread's own rings
//! ([`super::ring`]) with no lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::alloc::stats::Direction;

/// Identifies a stream for stream-ordered reuse ([`crate::alloc::pool::HOST_STREAM`] for
/// host-side memory) and in events.
pub type StreamId = u64;

/// What a pool tells its observer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolEvent {
    /// A block was handed out.
    Alloc {
        /// Bytes asked for.
        requested: usize,
        /// Block size.
        size: usize,
        /// Served from cached memory.
        cache_hit: bool,
        /// The block's id in the pool (unique among live blocks; reused after a free).
        block: u64,
        /// The stream the block was allocated for.
        stream: StreamId,
        /// The pool's id of the segment the block lies in (unique among live segments).
        segment: u64,
        /// The block's start in its segment.
        offset: usize,
        /// The label of the buffer the block is handed to (a tensor's or blob's name), when
        /// known.
        owner: Option<Arc<str>>,
    },
    /// A block was given back.
    Free {
        /// Block size.
        size: usize,
        /// The block's id in the pool (as in its [`PoolEvent::Alloc`]).
        block: u64,
    },
    /// A segment was made by the backend.
    SegmentAlloc {
        /// Its size.
        bytes: usize,
        /// The pool's id of the segment (unique among live segments; reused after a free).
        segment: u64,
        /// The stream of the allocation that made it.
        stream: StreamId,
    },
    /// A segment was given back to the backend.
    SegmentFree {
        /// Its size.
        bytes: usize,
        /// The pool's id of the segment (as in its [`PoolEvent::SegmentAlloc`]).
        segment: u64,
    },
    /// A clean device mirror was dropped to make room.
    Evict {
        /// The buffer's label.
        label: String,
        /// Bytes freed.
        bytes: usize,
    },
    /// An allocation failed for good.
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
    },
}

/// Sees a pool's events (a recorder's hook on one pool). Called with the pool's lock held: it
/// must not allocate from the same pool.
pub trait PoolObserver: Send + Sync {
    /// One event of the pool labelled `pool`.
    fn on_event(&self, pool: &str, event: &PoolEvent);
}

/// The source of the global host pool ([`crate::alloc::pool::HostPool::global`]).
pub(crate) const HOST_SOURCE: u64 = 0;

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(HOST_SOURCE + 1);
static NEXT_ATTACHMENT: AtomicU64 = AtomicU64::new(0);
/// The hook's state: bit 0 set while at least one sink is attached, the generation of the
/// history recording (0: none) above it. The fast-path flag: not 0 while anything listens.
static STATE: AtomicU64 = AtomicU64::new(0);
/// Bit 0 of [`STATE`].
const SINKS: u64 = 1;
static ATTACHED: RwLock<Vec<Attached>> = RwLock::new(Vec::new());

/// What a process pool or a stream publishes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event<'a> {
    /// An event of the pool labelled `pool`. Published with the pool's lock held.
    Pool {
        /// The pool's label (`opencl:0`, `opencl:0 pinned`, `host`).
        pool: &'a str,
        /// What happened.
        event: &'a PoolEvent,
        /// The pool shard's key and its sequence number of this event (taken under the
        /// shard's lock: the order of one shard's events across threads).
        order: (u64, u64),
    },
    /// A copy made by stream `stream` of the device labelled `device`.
    Copy {
        /// The device's label.
        device: &'a str,
        /// The stream's id.
        stream: StreamId,
        /// Which way.
        direction: Direction,
        /// Bytes copied.
        bytes: usize,
        /// For a copy from another device with one device command: that device's label.
        peer: Option<&'a str>,
    },
    /// The program marked the step it is in (`None`: none).
    Step(Option<u64>),
    /// A net with a memory plan was built for the source's device: per planner slot, the
    /// names the plan puts in it, in the order the net first uses them.
    Plan {
        /// The device's label.
        device: &'a str,
        /// The net's name.
        net: &'a str,
        /// The slots and their names.
        slots: &'a [(String, Vec<String>)],
    },
}

/// Receives the events of the sources it is attached to.
pub(crate) trait Sink: Send + Sync {
    /// One event of source `source`. Called with the lock of the pool that made a pool event
    /// held: it must not allocate from that pool.
    fn on_event(&self, source: u64, event: &Event<'_>);
}

/// Which sources an attached sink receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every source: every device and the host pool.
    All,
    /// One device's source, and the host pool's when `host`.
    Device {
        /// The device's source.
        source: u64,
        /// Whether the global host pool is covered too.
        host: bool,
    },
}

impl Scope {
    fn covers(self, source: u64) -> bool {
        match self {
            Scope::All => true,
            Scope::Device { source: s, host } => s == source || (host && source == HOST_SOURCE),
        }
    }
}

struct Attached {
    id: u64,
    scope: Scope,
    sink: Arc<dyn Sink>,
}

/// Keeps a sink attached; dropping it detaches the sink.
#[must_use = "the sink is detached when the attachment is dropped"]
#[derive(Debug)]
pub(crate) struct Attachment {
    id: u64,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut list = ATTACHED.write();
        list.retain(|a| a.id != self.id);
        set_sinks(!list.is_empty());
    }
}

/// A new device source.
pub(crate) fn new_source() -> u64 {
    NEXT_SOURCE.fetch_add(1, Relaxed)
}

/// Attaches `sink` for the sources of `scope` until the attachment is dropped.
pub(crate) fn attach(sink: Arc<dyn Sink>, scope: Scope) -> Attachment {
    let id = NEXT_ATTACHMENT.fetch_add(1, Relaxed);
    let mut list = ATTACHED.write();
    list.push(Attached { id, scope, sink });
    set_sinks(true);
    Attachment { id }
}

/// Sets or clears the sinks' bit of the state (with the list of attachments locked).
fn set_sinks(on: bool) {
    if on {
        STATE.fetch_or(SINKS, Relaxed);
    } else {
        STATE.fetch_and(!SINKS, Relaxed);
    }
}

/// Sets the generation of the history recording (0: none).
pub(crate) fn set_history(generation: u64) {
    let _ = STATE.fetch_update(Relaxed, Relaxed, |s| Some((s & SINKS) | generation << 1));
}

/// The generation of the history recording (0: none).
#[inline(always)]
pub(crate) fn history_generation() -> u64 {
    STATE.load(Relaxed) >> 1
}

/// The hook's state (one relaxed atomic load): 0 while nothing listens; else the generation
/// of the history recording ([`history_generation`]) above bit 0, which is set while a sink
/// is attached ([`state_has_sinks`]). For the pools' allocations and frees, which write the
/// history with no event made while no sink is attached.
#[inline(always)]
pub(crate) fn state() -> u64 {
    STATE.load(Relaxed)
}

/// Whether `state` (a [`state`]) has a sink attached.
#[inline(always)]
pub(crate) fn state_has_sinks(state: u64) -> bool {
    state & SINKS != 0
}

/// True when some sink is attached or the history records (one relaxed atomic load): test it
/// before making an event.
#[inline]
pub(crate) fn active() -> bool {
    STATE.load(Relaxed) != 0
}

/// Gives `event` of source `source` to every attached sink whose scope covers the source, and
/// to the history recording.
#[cold]
pub(crate) fn publish(source: u64, event: &Event<'_>) {
    let state = STATE.load(Relaxed);
    if state & SINKS != 0 {
        publish_to_sinks(source, event);
    }
    let generation = state >> 1;
    if generation != 0 {
        match *event {
            Event::Step(step) => super::ring::set_step(step),
            Event::Plan { .. } => {}
            Event::Pool {
                pool, event, order, ..
            } => super::ring::record_pool(
                generation,
                source,
                super::ring::label_key(pool),
                event,
                order,
            ),
            Event::Copy {
                device,
                stream,
                direction,
                bytes,
                peer,
            } => {
                super::ring::record_copy(generation, source, device, stream, direction, bytes, peer)
            }
        }
    }
}

/// Publishes pool event `event` of `source` from the pool labelled `label` (numbered
/// `label_key`), with its shard's `order`: the pools' path, which gives the history the
/// label's number rather than its text.
#[inline]
pub(crate) fn publish_pool(
    source: u64,
    label: &str,
    label_key: u32,
    event: &PoolEvent,
    order: (u64, u64),
) {
    let state = STATE.load(Relaxed);
    if state & SINKS != 0 {
        publish_to_sinks(
            source,
            &Event::Pool {
                pool: label,
                event,
                order,
            },
        );
    }
    let generation = state >> 1;
    if generation != 0 {
        super::ring::record_pool(generation, source, label_key, event, order);
    }
}

#[cold]
fn publish_to_sinks(source: u64, event: &Event<'_>) {
    for a in ATTACHED.read().iter().filter(|a| a.scope.covers(source)) {
        a.sink.on_event(source, event);
    }
}
