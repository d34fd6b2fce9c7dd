//! [`Slim`]: a lease with no uses in flight and no owner kept, the form in which the host pool
//! hands its blocks out and thread caches keep them (see [`super::tcache`]).
//!
//! It is eight words with no padding, 16-byte aligned, with `None` of an `Option<Slim>` in
//! its last word: it moves in whole 16-byte pieces, each read back whole by the next move. A
//! move that reads a piece written in narrower parts stalls on the store it waits for, and a
//! block handed back by a thread cache is moved right after the move that put it there.

use std::mem::ManuallyDrop;
use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::Arc;

use super::lease::CACHEABLE as CACHEABLE_LEASE;
use super::shard::Shard;
use super::{BlockId, Lease, StreamId};
use crate::alloc::ring::MARK_SILENT;

/// [`Slim::flags`]: the block's bytes are known to be zero (a fresh segment's).
const ZEROED: u64 = 1;
/// [`Slim::flags`]: the block is small (see [`crate::alloc::pool::PoolStats::small`]).
const SMALL: u64 = 2;
/// [`Slim::flags`]: handed out on the host stream without an owner's name by a pool with
/// thread caches: may go into the freeing thread's cache.
pub(super) const CACHEABLE: u64 = 4;
/// [`Slim::flags`]: a device block whose stream's owner the pool keeps (see
/// [`Lease::is_kept`]); the stream is the tag.
const KEPT: u64 = 8;
/// [`Slim::flags`]: a device block handed out with an owner's name, which its shard keeps
/// (see [`Lease`]'s `cacheable`).
const NAMED: u64 = 16;
/// The first bit of [`Slim::flags`] free for the caller's tags ([`Slim::with_tag`]); a
/// device block's tag is its stream.
pub(crate) const TAG_SHIFT: u32 = 8;
/// The caller's tags: the 32 bits from [`TAG_SHIFT`].
const TAG_BITS: u64 = 0xffff_ffff << TAG_SHIFT;
/// The first bit of [`Slim::flags`] that holds the lease's mark in the history
/// ([`Lease`]'s `mark`, eight bits).
const MARK_SHIFT: u32 = 40;
/// The first bit of [`Slim::flags`] that holds the block's segment's id ([`Lease`]'s `seg`,
/// sixteen bits), for a thread cache's events in the history.
const SEG_SHIFT: u32 = 48;

/// A block of a pool with no uses in flight and no owner kept: the fields of a [`Lease`] that
/// such a block needs. Given back to its shard (or its thread's cache) when dropped.
#[repr(C, align(16))]
pub(crate) struct Slim<T: Send + Sync + 'static, V: Send + 'static = ()> {
    // First, 16-byte aligned: the four words a lease keeps side by side, so that moving them
    // into a lease reads whole the 16-byte pieces that the move into the `Slim` wrote. With
    // the segment first, each read spanned two of them and waited for both stores: a device
    // pool's allocation and free from a thread cache took about 3 ns more.
    pub(super) block: BlockId,
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) requested: usize,
    /// As [`Lease`]'s (never null): a plain pointer, so that `Option<Slim>` keeps `None` in
    /// `shard`, the last word.
    pub(super) segment: *const T,
    /// [`ZEROED`], [`SMALL`], [`CACHEABLE`], and the caller's tags ([`Slim::with_tag`]).
    pub(super) flags: u64,
    pub(super) view: Option<Box<V>>,
    /// Last: `None` of an `Option<Slim>`.
    pub(super) shard: NonNull<Shard<T, V>>,
}

// SAFETY: as for `Lease` (the same fields, less the list of uses in flight and the kept
// stream, which are plain values there).
unsafe impl<T: Send + Sync + 'static, V: Send + 'static> Send for Slim<T, V> {}
// SAFETY: as for `Lease`.
unsafe impl<T: Send + Sync + 'static, V: Send + Sync + 'static> Sync for Slim<T, V> {}

impl<T: Send + Sync + 'static, V: Send + 'static> Lease<T, V> {
    /// The lease as a [`Slim`], waiting first for its uses in flight (a host block's: the
    /// host is about to use it); `cacheable`: it may go into a thread cache when dropped.
    ///
    /// # Panics
    /// Never for a lease of the host stream; a lease whose pool keeps an owner for it is a
    /// caller's error (debug assertion; the owner is then let go with the block).
    pub(crate) fn into_slim(self, cacheable: bool) -> Slim<T, V> {
        debug_assert!(self.kept.is_none(), "a slim lease keeps no owner");
        for p in &self.pending {
            p.fence.wait();
        }
        let mark = u64::from(self.mark) << MARK_SHIFT;
        self.slim_with((u64::from(cacheable) * CACHEABLE) | mark)
    }

    /// The lease as a [`Slim`] with the flags of its own (its segment's id among them) and
    /// `flags`, its uses in flight let go (none are left but the list's room); the block is
    /// given back once, by the result.
    #[inline(always)]
    fn slim_with(self, flags: u64) -> Slim<T, V> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used again, nor dropped (nothing is written back into it: a
        // store there would stall the moves after it, see the module docs).
        unsafe { me.slim_out(flags) }
    }

    /// [`Lease::slim_with`] of a lease left where it is: its fields are read where they lie
    /// (a lease moved out of its owner first is copied whole once more).
    ///
    /// # Safety
    /// `self` is never used nor dropped again: the two fields that own something are moved
    /// out (the caller overwrites the lease or forgets it).
    #[inline(always)]
    unsafe fn slim_out(&mut self, flags: u64) -> Slim<T, V> {
        // SAFETY: moved out once, as the caller promises.
        let view = unsafe { std::ptr::read(&self.view) };
        // A list with no room owns nothing (a cached block's: no call made).
        if self.pending.capacity() != 0 {
            // SAFETY: as the view.
            drop(unsafe { std::ptr::read(&self.pending) });
        }
        Slim {
            segment: self.segment.as_ptr().cast_const(),
            block: self.block,
            offset: self.offset,
            size: self.size,
            requested: self.requested,
            flags: flags
                | (u64::from(self.small) * SMALL)
                | (u64::from(self.zeroed) * ZEROED)
                | u64::from(self.seg) << SEG_SHIFT,
            view,
            shard: self.shard,
        }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Lease<T, V> {
    /// Whether [`Lease::give_back`] may put the block into a thread's cache now: it was
    /// handed out cacheable (see [`super::Pool::alloc_device`]), no use of it is in flight,
    /// its pool has thread caches that hold blocks of its size, and nobody but the history
    /// listens to the pool's events: then the hook's state (see [`Shard::cache_state`]), for
    /// [`Lease::take_cached`] and [`Slim::give_back`].
    ///
    /// Nor when its list of uses has room: the block had uses in flight before, and its
    /// shard keeps the room for its next lease (a cached block leaves it behind, and its
    /// next use in flight would allocate a list again: a steady step on a device that
    /// queues work would then allocate on the heap).
    #[inline]
    pub(crate) fn may_cache(&self) -> Option<u64> {
        let sh = self.shard();
        if self.cacheable != 0
            && self.pending.capacity() == 0
            && sh.cache_key != 0
            && self.size <= sh.cache_limit
        {
            sh.cache_state()
        } else {
            None
        }
    }

    /// The block of a lease that [`Lease::may_cache`] has just allowed into a thread's cache,
    /// for [`Slim::give_back`]: as a [`Slim`] of `stream` (the stream the lease was asked
    /// for), with the lease's mark. `None`, the lease left as it was, when it goes back to
    /// its shard whole, as dropping it does: a use in flight is kept whatever the caller
    /// checked, and a stream id above 32 bits does not fit a slim lease's tag.
    ///
    /// # Safety
    /// On `Some`, the lease's fields have been moved out: the caller never uses nor drops the
    /// lease again (it overwrites it, or forgets it).
    #[inline(always)]
    pub(crate) unsafe fn take_cached(&mut self, stream: StreamId) -> Option<(Slim<T, V>, u8)> {
        // (Not `may_cache` itself: whether the pool is listened to may change meanwhile.)
        debug_assert!(self.cacheable != 0, "take_cached follows may_cache");
        // (`may_cache` let only a list with no room through.)
        if self.pending.capacity() != 0 || stream > u64::from(u32::MAX) {
            return None;
        }
        debug_assert!(
            self.kept.is_none_or(|k| k.get() == stream),
            "a kept lease is given back on its own stream"
        );
        // Its mark, for the free's event: a cached block's is set again by its hit.
        let mark = self.mark;
        let named = u64::from(self.cacheable == super::lease::CACHEABLE_NAMED) * NAMED;
        let flags = (u64::from(self.kept.is_some()) * KEPT) | named;
        // SAFETY: as the caller promises.
        Some((unsafe { self.slim_out(flags | stream << TAG_SHIFT) }, mark))
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Slim<T, V> {
    /// Gives back the block of [`Lease::take_cached`], answering the hook's `state` (see
    /// [`Lease::may_cache`]): into the calling thread's cache of its pool when there is room
    /// and `stays` agrees (asked with the cache's flag held; see [`super::tcache::absorb`]),
    /// its free written into the history with the lease's `mark` when `state` says it
    /// records; else to its shard, as dropping the lease does.
    #[inline]
    pub(crate) fn give_back(mut self, state: u64, mark: u8, stays: impl FnOnce() -> bool) {
        // SAFETY: the shard lives while the block is handed out (see `Lease::shard`).
        let sh = unsafe { self.shard.as_ref() };
        let (key, limit) = (sh.cache_key, sh.cache_limit);
        // Written before the block can be seen in the cache by another thread (a drain).
        if state != 0 {
            sh.record_cached_free(state, (self.size, self.block), mark);
        }
        // SAFETY: `key` is the key of the thread caches of this block's pool (its shard's),
        // whose types are this one's; 0 (no caches) is never passed on.
        if key != 0 && unsafe { super::tcache::absorb(key, limit, &mut self, stays) } {
            // Moved into the cache: `self` gives nothing back (its view is `None`).
            std::mem::forget(self);
            return;
        }
        // Not cached: to its shard (`self` is not CACHEABLE), with its stream's owner, and
        // with no second event.
        if state != 0 {
            self.silence();
        }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Slim<T, V> {
    /// The device block as a lease again, taken from a thread cache for a request of its
    /// stream for `owner` (see [`super::Pool::alloc_device`]): the owner's name is written in
    /// the block's shard (under its lock) where the request has one or the block had one.
    /// `mark` is the lease's mark in the history (see [`Lease`]'s). The fields are read where
    /// they lie (a block moved out of the cache's room first is copied whole once more).
    ///
    /// # Safety
    /// `self` is never used nor dropped again (it lies in a `MaybeUninit`): its view is moved
    /// out, and the block is the lease's.
    #[inline(always)]
    pub(super) unsafe fn lease_out(&mut self, owner: Option<&Arc<str>>, mark: u8) -> Lease<T, V> {
        if (self.flags & NAMED != 0) | owner.is_some() {
            self.rename(owner);
        }
        let kept = if self.flags & KEPT != 0 {
            NonZeroU64::new(self.tag())
        } else {
            None
        };
        Lease {
            shard: self.shard,
            // SAFETY: a slim lease's segment is a lease's (never null).
            segment: unsafe { NonNull::new_unchecked(self.segment.cast_mut()) },
            block: self.block,
            offset: self.offset,
            size: self.size,
            requested: self.requested,
            zeroed: self.flags & ZEROED != 0,
            small: self.flags & SMALL != 0,
            cacheable: CACHEABLE_LEASE + u8::from(owner.is_some()),
            mark,
            seg: self.seg(),
            pending: Vec::new(),
            // SAFETY: moved out once, as the caller promises.
            view: unsafe { std::ptr::read(&self.view) },
            kept,
        }
    }

    /// Writes `owner` as the name of the block's owner in its shard. Out of line and cold,
    /// so that an unnamed hit of an unnamed block keeps a straight path; a net's mirrors
    /// under a cap take this way at every hit (see `Pool::alloc_device`).
    #[cold]
    #[inline(never)]
    fn rename(&self, owner: Option<&Arc<str>>) {
        // SAFETY: the shard lives while the block is handed out (see `Lease::shard`).
        unsafe { self.shard.as_ref() }.rename(self.block, owner);
    }

    /// The segment holding the block.
    pub(crate) fn segment(&self) -> &T {
        // SAFETY: as `Lease::segment` (the pointer is the lease's): the shard keeps the
        // segment's `Arc` until the block is given back, in `drop`, after the last use of
        // this reference.
        unsafe { &*self.segment }
    }

    /// Start of the block in its segment.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes asked for.
    pub(crate) fn len(&self) -> usize {
        self.requested
    }

    /// Block size (at least `len()`).
    pub(crate) fn block_size(&self) -> usize {
        self.size
    }

    /// True when the block's bytes are known to be zero (a fresh segment, never handed out).
    pub(crate) fn zeroed(&self) -> bool {
        self.flags & ZEROED != 0
    }

    /// Replaces the caller's tags (32 bits of the flags from bit [`TAG_SHIFT`] up: the host
    /// pool's statistics stripe) with `tag`, which has no bit outside them.
    pub(crate) fn with_tag(mut self, tag: u64) -> Self {
        debug_assert_eq!(tag & !TAG_BITS, 0, "tags are 32 bits from bit {TAG_SHIFT}");
        self.flags = (self.flags & !TAG_BITS) | (tag & TAG_BITS);
        self
    }

    /// The caller's tags ([`Slim::with_tag`]) shifted down: a device block's stream.
    #[inline(always)]
    pub(crate) fn tag(&self) -> u64 {
        (self.flags & TAG_BITS) >> TAG_SHIFT
    }

    /// The block's segment's id in its shard ([`Lease`]'s `seg`).
    #[inline(always)]
    pub(super) fn seg(&self) -> u16 {
        (self.flags >> SEG_SHIFT) as u16
    }

    /// Makes the block's free, when it goes back to its shard, no event: its free was
    /// recorded when it went into a thread cache (see [`super::tcache`]).
    pub(super) fn silence(&mut self) {
        self.flags = (self.flags & !(0xff << MARK_SHIFT)) | u64::from(MARK_SILENT) << MARK_SHIFT;
    }

    /// The flags (the pool's and the tags of [`Slim::with_tag`]).
    pub(crate) fn flags(&self) -> u64 {
        self.flags
    }

    /// Moves the block into the freeing thread's cache when it may go there and there is
    /// room; returns whether it went.
    #[inline(always)]
    fn cache_on_this_thread(&mut self) -> bool {
        // SAFETY: the shard lives while the block is handed out (see `Lease::shard`).
        let sh = unsafe { self.shard.as_ref() };
        let (key, limit) = (sh.cache_key, sh.cache_limit);
        if key == 0 || self.size > limit || !sh.quiet() {
            return false;
        }
        // SAFETY: `key` is the key of the thread caches of this block's pool (its shard's),
        // whose types are this one's.
        unsafe { super::tcache::absorb(key, limit, self, || true) }
    }

    /// Clears [`ZEROED`] (out of line: once in a block's life).
    #[cold]
    #[inline(never)]
    fn clear_zeroed(&mut self) {
        self.flags &= !ZEROED;
    }

    /// Moves the block into `dst`, for a thread cache; `self` keeps nothing to give back. Its
    /// next users find this one's bytes: it is no longer [`ZEROED`].
    ///
    /// # Safety
    /// `dst` is valid for a write of one block and holds nothing that needs a drop (a
    /// cache's spare room); the block written there is owned by its holder.
    #[inline(always)]
    pub(super) unsafe fn move_to(&mut self, dst: *mut Slim<T, V>) {
        // Written once in a block's life, on its first way into a cache (a flag written here
        // stalls the whole read below; a cached block's flag is clear already).
        if self.flags & ZEROED != 0 {
            self.clear_zeroed();
        }
        // SAFETY: a bitwise copy, whole and straight to `dst` (a copy returned by value went
        // through memory once more); the one field that owns something (the view) is made
        // `None` in `self` right after, so it is owned once, and `self` gives nothing back
        // when dropped (the caller returns from `drop`).
        unsafe {
            std::ptr::copy_nonoverlapping(self, dst, 1);
            std::ptr::write(&mut self.view, None);
        }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Slim<T, V> {
    fn drop(&mut self) {
        if self.flags & CACHEABLE != 0 && self.cache_on_this_thread() {
            return;
        }
        let view = self.view.take();
        let mark = (self.flags >> MARK_SHIFT) as u8;
        let sizes = (self.size, self.requested, self.flags & SMALL != 0, mark);
        let kept = if self.flags & KEPT != 0 {
            NonZeroU64::new(self.tag())
        } else {
            None
        };
        // SAFETY: the shard lives until the block is given back, which this does, once.
        unsafe { Shard::release_block(self.shard, self.block, sizes, kept, Vec::new(), view) };
    }
}
