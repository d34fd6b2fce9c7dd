//! What a pool reports: [`PoolEvent`]s, seen by a [`PoolObserver`].

use std::sync::Arc;

use super::StreamId;

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

/// Sees a pool's events (the trace hook). Called with the pool's lock held: it must not
/// allocate from the same pool.
pub trait PoolObserver: Send + Sync {
    /// One event of the pool labelled `pool`.
    fn on_event(&self, pool: &str, event: &PoolEvent);
}
