//! [`Lease`]: a block handed out by a [`Pool`].

use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::{merge_one, BlockId, Fence, PendingUse, Pool, StreamId};

/// A block of a [`Pool`]: `len()` bytes at `offset()` in `segment()`. Given back to the pool,
/// with its pending uses, when dropped.
pub struct Lease<T: Send + Sync + 'static> {
    pub(super) pool: Arc<Pool<T>>,
    /// Dropped in `Drop` before the block is given back, so a released segment is freed there.
    pub(super) segment: ManuallyDrop<Arc<T>>,
    pub(super) block: BlockId,
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) requested: usize,
    pub(super) zeroed: bool,
    pub(super) pending: Vec<PendingUse>,
}

impl<T: Send + Sync + 'static> Lease<T> {
    /// The segment holding the block.
    pub fn segment(&self) -> &Arc<T> {
        &self.segment
    }

    /// Start of the block in its segment.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.requested
    }

    /// True for a zero-byte request (which still holds a minimal block).
    pub fn is_empty(&self) -> bool {
        self.requested == 0
    }

    /// Block size (at least `len()`).
    pub fn block_size(&self) -> usize {
        self.size
    }

    /// True when the block's bytes are known to be zero (a fresh segment, never handed out).
    pub fn zeroed(&self) -> bool {
        self.zeroed
    }

    /// Records a use still in flight when the lease is dropped: the block is reusable at once
    /// on `stream`, elsewhere once `fence` has completed.
    pub fn add_pending(&mut self, stream: StreamId, fence: Arc<dyn Fence>) {
        merge_one(&mut self.pending, PendingUse::new(stream, fence));
        self.pending.retain(|p| !p.fence.poll());
    }

    /// The pool the block belongs to.
    pub fn pool(&self) -> &Arc<Pool<T>> {
        &self.pool
    }
}

impl<T: Send + Sync + 'static> Drop for Lease<T> {
    fn drop(&mut self) {
        // SAFETY: `segment` is taken exactly once, here, and never used afterwards.
        drop(unsafe { ManuallyDrop::take(&mut self.segment) });
        let pending = std::mem::take(&mut self.pending);
        self.pool
            .release_block(self.block, self.size, self.requested, pending);
    }
}

impl<T: Send + Sync + 'static> std::fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.pool.label)
            .field("offset", &self.offset)
            .field("len", &self.requested)
            .field("block_size", &self.size)
            .finish()
    }
}
