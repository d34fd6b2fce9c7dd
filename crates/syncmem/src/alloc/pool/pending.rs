//! Work still in flight on a freed block: a fence per stream that used it, and when the block
//! may be handed out again.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::StreamId;

/// Something that completes: work in flight on a block.
///
/// A fence is `Any` so that the layer that made it can recognise its own fences on a block it
/// gets back (a device orders the new owner's first commands after the old owner's work).
pub trait Fence: Any + Send + Sync {
    /// True once the work has completed. Never blocks for the work (it may queue a marker). An
    /// error of the work counts as completed (it no longer runs).
    fn is_complete(&self) -> bool;
    /// Blocks until the work has completed.
    fn wait(&self);
    /// A cheap check used to prune pending uses: may say `false` for work that is done when
    /// finding out would cost something (a lazily recorded event not recorded yet).
    fn poll(&self) -> bool {
        self.is_complete()
    }
}

/// An in-order queue of numbered commands (a device's stream), as a block's pending use sees
/// it: a command number stands for the work up to it, with no fence object of its own.
pub(crate) trait Queue: Any + Send + Sync {
    /// True once command `seq` has completed (an error counts as completed).
    fn reached(&self, seq: u64) -> bool;
    /// Blocks until command `seq` has completed.
    fn wait_reached(&self, seq: u64);
}

/// Command `seq` of `queue`: a [`Fence`] made without a heap allocation (the queue is shared).
#[derive(Clone)]
pub(crate) struct QueuePoint {
    pub(crate) queue: Arc<dyn Queue>,
    pub(crate) seq: u64,
}

impl Fence for QueuePoint {
    fn is_complete(&self) -> bool {
        self.queue.reached(self.seq)
    }
    fn wait(&self) {
        self.queue.wait_reached(self.seq);
    }
}

/// The fence of a pending use: a shared one ([`Lease::add_pending`]), or a point on a queue
/// ([`Lease::add_pending_at`]: a device's own commands, recorded on every free of a block in
/// use, so that such a free allocates nothing). Derefs to the fence.
///
/// [`Lease::add_pending`]: super::Lease::add_pending
/// [`Lease::add_pending_at`]: super::Lease::add_pending_at
#[derive(Clone)]
pub(crate) enum PendingFence {
    Shared(Arc<dyn Fence>),
    At(QueuePoint),
}

impl std::ops::Deref for PendingFence {
    type Target = dyn Fence;
    fn deref(&self) -> &(dyn Fence + 'static) {
        match self {
            PendingFence::Shared(f) => &**f,
            PendingFence::At(p) => p,
        }
    }
}

/// A use of a block still in flight on a stream.
#[derive(Clone)]
pub(crate) struct PendingUse {
    /// The stream the work was queued on.
    pub(crate) stream: StreamId,
    /// Completes when the work is done.
    pub(crate) fence: PendingFence,
    /// Order of creation: on one (in-order) stream a newer fence covers every older one.
    pub(crate) seq: u64,
}

static NEXT_PENDING: AtomicU64 = AtomicU64::new(0);

impl PendingUse {
    pub(crate) fn new(stream: StreamId, fence: PendingFence) -> Self {
        Self {
            stream,
            fence,
            seq: NEXT_PENDING.fetch_add(1, Relaxed),
        }
    }
}

/// Adds `more` to `into`, keeping only the newest fence per stream and dropping completed ones
/// (cheaply: see [`Fence::poll`]). Lists stay as short as the number of streams involved.
pub(crate) fn merge_pending(into: &mut Vec<PendingUse>, more: Vec<PendingUse>) {
    if into.is_empty() && more.len() <= 1 {
        // Nothing to merge with (the common case): take the list over without copying.
        *into = more;
    } else {
        for p in more {
            merge_one(into, p);
        }
    }
    if !into.is_empty() {
        into.retain(|p| !p.fence.poll());
    }
}

/// Adds `p` to `into`, keeping only the newest fence per stream (no pruning).
pub(crate) fn merge_one(into: &mut Vec<PendingUse>, p: PendingUse) {
    match into.iter_mut().find(|q| q.stream == p.stream) {
        Some(q) if q.seq < p.seq => *q = p,
        Some(_) => {}
        None => into.push(p),
    }
}

/// True when a block with these pending uses may be handed to work on `stream`.
pub(crate) fn usable_by(pending: &[PendingUse], stream: StreamId) -> bool {
    pending
        .iter()
        .all(|p| p.stream == stream || p.fence.is_complete())
}

/// True when some of these uses may still be running (a cheap check: see [`Fence::poll`]).
pub(crate) fn in_flight(pending: &[PendingUse]) -> bool {
    pending.iter().any(|p| !p.fence.poll())
}
