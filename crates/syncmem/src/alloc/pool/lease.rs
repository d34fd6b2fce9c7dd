//! [`Lease`]: a block handed out by a [`Pool`].

use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::Arc;

use super::shard::Shard;
#[cfg(doc)]
use super::Pool;
use super::{merge_one, BlockId, Fence, PendingFence, PendingUse, Queue, QueuePoint, StreamId};

/// [`Lease::cacheable`]: may go into a thread's cache; handed out with no owner's name.
pub(super) const CACHEABLE: u8 = 1;
/// [`Lease::cacheable`]: may go into a thread's cache; handed out with an owner's name.
pub(super) const CACHEABLE_NAMED: u8 = 2;
// A cached block's lease is `CACHEABLE` plus whether it has a name (`Slim::into_lease`).
const _: () = assert!(CACHEABLE_NAMED == CACHEABLE + 1);

/// [`Lease::seg`] of a segment whose id does not fit.
pub(super) const NO_SEG: u16 = u16::MAX;

/// A block of a [`Pool`]: `len()` bytes at `offset()` in `segment()`, with the block's view
/// (see [Views](Pool#views)). Given back to the pool, with its pending uses and its view, when
/// dropped.
pub struct Lease<T: Send + Sync + 'static, V: Send + 'static = ()> {
    /// The pool shard the block belongs to: alive while the block is handed out (the pool
    /// holds it, or once the pool is dropped its blocks do; see [`super::shard`]). No
    /// reference count is taken per lease.
    pub(super) shard: NonNull<Shard<T, V>>,
    /// The segment holding the block: the value inside an `Arc` the pool holds for as long as
    /// a block of the segment is handed out (so no reference count is taken per lease).
    pub(super) segment: NonNull<T>,
    pub(super) block: BlockId,
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) requested: usize,
    pub(super) zeroed: bool,
    /// The block is small (see [`crate::alloc::pool::PoolStats::small`]).
    pub(super) small: bool,
    /// [`CACHEABLE`] or [`CACHEABLE_NAMED`]: handed out by [`Pool::alloc_device`] by a pool
    /// with thread caches, [`Lease::give_back`] may put it into the freeing thread's cache;
    /// the second, handed out with an owner's name, which the block's shard keeps
    /// (snapshots): a thread cache that hands the block to a request with another name, or
    /// none, writes it there (see [`Pool::alloc_device`]). `0`: neither. One byte, which
    /// [`Lease::may_cache`] and [`Lease::give_back`] read once between them (a second byte
    /// read there cost about 5 ns a cycle).
    pub(super) cacheable: u8,
    /// The mark of the thread that recorded the block's newest event in the history
    /// ([`crate::alloc::ring::Recorded`]): the block's next event on another thread reads
    /// the clock.
    pub(super) mark: u8,
    /// The block's segment's id in its shard, for a thread cache's events in the history
    /// ([`NO_SEG`] when it does not fit). With `cacheable` and `mark`, in the bytes the
    /// lease's other fields leave free.
    pub(super) seg: u16,
    pub(super) pending: Vec<PendingUse>,
    /// The block's view (`None` only while the pool makes the lease).
    pub(super) view: Option<Box<V>>,
    /// The stream whose owner the pool keeps for this lease (see [`Pool::alloc_with`];
    /// never [`super::HOST_STREAM`]). Eight bytes: a device buffer, which holds a lease, moves
    /// whole.
    pub(super) kept: Option<NonZeroU64>,
}

// SAFETY: a lease is an owner of a block like a `Box`, and shares the segment (`T: Send +
// Sync`) like an `Arc<T>` would: `segment` points into an `Arc<T>` that the block's shard holds
// while the block is handed out, and only `&T` is ever made from it. The shard (a lock around
// `Send` data) is shared like an `Arc` would share it. The view is owned (`V: Send`).
unsafe impl<T: Send + Sync + 'static, V: Send + 'static> Send for Lease<T, V> {}
// SAFETY: as for Send; `&Lease` hands out only `&T`, `&V` (`V: Sync`) and plain values.
unsafe impl<T: Send + Sync + 'static, V: Send + Sync + 'static> Sync for Lease<T, V> {}

impl<T: Send + Sync + 'static, V: Send + 'static> Lease<T, V> {
    /// The segment holding the block.
    pub fn segment(&self) -> &T {
        // SAFETY: the shard keeps the segment's `Arc` (and so the `T` it points to) until every
        // block of it is given back, which happens in `drop`, after the last use of this
        // reference; `self.shard` keeps the shard alive until then.
        unsafe { self.segment.as_ref() }
    }

    /// A new owner of the segment holding the block, e.g. for a view of the block that keeps
    /// the segment alive on its own (one reference count; [`Lease::segment`] takes none).
    pub fn segment_arc(&self) -> Arc<T> {
        let ptr = self.segment.as_ptr().cast_const();
        // SAFETY: `ptr` came from `Arc::as_ptr` of an `Arc<T>` the shard holds alive (see
        // `segment`); taking one more strong count and making an `Arc` of it is what
        // `Arc::clone` does.
        unsafe {
            Arc::increment_strong_count(ptr);
            Arc::from_raw(ptr)
        }
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
        self.add(stream, PendingFence::Shared(fence));
    }

    /// As [`Lease::add_pending`], with command `seq` of `queue` as the fence (no allocation).
    pub(crate) fn add_pending_at(&mut self, stream: StreamId, queue: Arc<dyn Queue>, seq: u64) {
        self.add(stream, PendingFence::At(QueuePoint { queue, seq }));
    }

    fn add(&mut self, stream: StreamId, fence: PendingFence) {
        merge_one(&mut self.pending, PendingUse::new(stream, fence));
        self.pending.retain(|p| !p.fence.poll());
    }

    /// The uses still in flight that the block came with: work of its previous owners, queued
    /// on `stream` (the stream this lease was asked for; the fences of other streams had
    /// completed when the block was handed out). Whatever touches the block through another
    /// stream must be ordered after them.
    pub fn pending(&self) -> impl Iterator<Item = (StreamId, &dyn Fence)> {
        self.pending.iter().map(|p| (p.stream, &*p.fence))
    }

    /// The label of the pool the block belongs to.
    pub fn pool_label(&self) -> &str {
        &self.shard().label
    }

    pub(super) fn shard(&self) -> &Shard<T, V> {
        // SAFETY: the shard lives while the block is handed out (see the field), and the
        // block is given back only in `drop`, after the last use of this reference.
        unsafe { self.shard.as_ref() }
    }

    /// True when the pool keeps an owner alive for this lease until it is given back (see
    /// [`Pool::alloc_with`]).
    pub(crate) fn is_kept(&self) -> bool {
        self.kept.is_some()
    }

    /// The address of the owner the pool keeps for this lease (`None` when not kept): for
    /// checks that a caller's owner is the one kept (see [`Pool::alloc_with`]).
    #[cfg(debug_assertions)]
    pub(crate) fn kept_owner(&self) -> Option<*const ()> {
        let stream = self.kept?.get();
        self.shard().inner.lock().kept.owner_of(stream)
    }

    /// The block's view (see [Views](Pool#views)): made for the whole block, so it may be
    /// larger than `len()`. It goes back to the pool with the block, for the block's next user.
    pub fn view(&self) -> Option<&V> {
        self.view.as_deref()
    }

    /// The block's view, mutably (e.g. to ready it for the block's next user).
    pub fn view_mut(&mut self) -> Option<&mut V> {
        self.view.as_deref_mut()
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Lease<T, V> {
    fn drop(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let view = self.view.take();
        let sizes = (self.size, self.requested, self.small, self.mark);
        // SAFETY: the shard lives until the block is given back, which this does, once.
        unsafe { Shard::release_block(self.shard, self.block, sizes, self.kept, pending, view) };
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> std::fmt::Debug for Lease<T, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("pool", &self.shard().label)
            .field("offset", &self.offset)
            .field("len", &self.requested)
            .field("block_size", &self.size)
            .finish()
    }
}
