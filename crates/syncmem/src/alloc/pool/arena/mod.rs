//! The `caching` core: PyTorch's best-fit allocator with block splitting and merging, as pure
//! bookkeeping of (segment, offset, size), with exact-size free lists in front of it. It never
//! touches memory; [`super::Pool`] owns the segments (and the views it keeps with free blocks).
//!
//! - Requests round up to a multiple of `round` (512 B).
//! - A freed block of at most `size_class_limit` bytes goes on the exact-size free list of its
//!   stream ([`super::front`]): the next request of that size on that stream takes it back in
//!   O(1). A larger one goes on the short list of recently freed large blocks, reused by a
//!   request of exactly its size on its stream. A list miss goes through the best-fit arena
//!   below; with `size_class_limit` 0 every block does.
//! - Requests up to `small_size` (1 MiB) use the small pool, larger ones the large pool; each
//!   pool grows by segments sized to the job ([`Arena::segment_size`]): at least the request
//!   and `min_segment`, at least a `growth` share of what the pool already reserves, at most
//!   `small_segment` (2 MiB) or `large_segment` (20 MiB); requests from `large_segment_limit`
//!   (10 MiB) get a segment of their own, rounded to `segment_round` (2 MiB). A small program
//!   so reserves little more than it uses, a big one ends up with PyTorch's segment sizes.
//! - Free blocks sit in ordered sets keyed (size, id): the first usable entry at or above the
//!   request is the best fit.
//! - A block bigger than the request is split when the remainder is worth keeping (small pool:
//!   at least `round`; large pool: more than `small_size`, and only for requests below
//!   `max_split_size`). On free, a block merges with free neighbours of its segment.
//! - Stream awareness: a freed block carries the uses still in flight ([`PendingUse`]). It is
//!   usable at once by the stream of each pending use (streams run in order), and by other
//!   streams once every fence of another stream has completed.
//! - Before the pool grows, and before segments are given back, the free lists are flushed into
//!   the arena (see [`super::front`]); wholly free segments that no pending work needs can be
//!   given back before growing ([`Arena::idle_segments`]).

#[cfg(test)]
mod check;
mod release;
mod walk;

use std::collections::BTreeSet;
use std::sync::Arc;

use super::config::PoolConfig;
use super::front::Front;
use super::grant::{Grant, Request};
use super::slab::Slab;
use super::stats::SplitGauge;
use super::{merge_pending, usable_by, BlockId, PendingUse, SegId, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the arena's free sets.
    Free,
    /// Handed out.
    Allocated,
    /// Free, on an exact-size list of [`Front`].
    Cached,
}

struct Block<V> {
    seg: SegId,
    offset: usize,
    size: usize,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    state: State,
    small: bool,
    /// The bytes are known to be zero (a fresh segment's, never handed out).
    zeroed: bool,
    /// Its segment was made for one block of its size (not preallocated, no room to carve):
    /// under a cap, small requests keep it whole while they can (see [`Arena::find`]).
    fitted: bool,
    /// The stream the block was last handed out for.
    stream: StreamId,
    pending: Vec<PendingUse>,
    /// The backend view of the block, kept while the block is free for its next user; dropped
    /// when the block is split or merged (its placement changes) or its segment is released.
    view: Option<Box<V>>,
    /// While handed out: the bytes asked for and the owner's name, if given (snapshots).
    requested: usize,
    owner: Option<Arc<str>>,
}

impl<V> Block<V> {
    /// True when the block shares its segment with other blocks.
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// Under a cap, a small request does not split a wholly free segment this many times its size
/// or more while the pool can grow instead (see [`Arena::find`]).
pub(crate) const KEEP_WHOLE: usize = 2;

/// How segments grow: see [`Arena::segment_size`].
struct Growth {
    min_segment: usize,
    small_segment: usize,
    large_segment: usize,
    large_segment_limit: usize,
    segment_round: usize,
    /// A new segment is at least this percentage of what its pool reserves.
    percent: u64,
}

/// Best-fit bookkeeping of the caching pool, keeping each free block's view (`V`).
pub(crate) struct Arena<V> {
    round: usize,
    small_size: usize,
    class_limit: usize,
    growth: Growth,
    max_split: Option<usize>,
    max_non_split_rounding: usize,
    max_cached: u64,
    max_idle_percent: Option<u64>,
    blocks: Slab<Block<V>>,
    /// Free blocks: `[small pool, large pool]`, ordered by (size, id).
    free: [BTreeSet<(usize, BlockId)>; 2],
    /// Bytes in the free sets: `[small pool, large pool]` (the lists' bytes are
    /// `front.bytes()`, all in the small pool).
    free_bytes: [u64; 2],
    front: Front,
    /// Bytes of segments held: `[small pool, large pool]`.
    reserved: [u64; 2],
    /// Bytes of free blocks (in the free sets or on the lists) that share their segment with
    /// other blocks.
    inactive: SplitGauge,
}

fn pool_index(small: bool) -> usize {
    usize::from(!small)
}

impl<V> Arena<V> {
    pub(crate) fn new(cfg: &PoolConfig) -> Self {
        Self {
            round: cfg.round,
            small_size: cfg.small_size,
            class_limit: cfg.size_class_limit.min(cfg.small_size),
            growth: Growth {
                min_segment: cfg.min_segment,
                small_segment: cfg.small_segment,
                large_segment: cfg.large_segment,
                large_segment_limit: cfg.large_segment_limit,
                segment_round: cfg.segment_round,
                percent: u64::from(cfg.segment_growth_percent),
            },
            max_split: cfg.max_split_size,
            max_non_split_rounding: cfg.max_non_split_rounding,
            max_cached: cfg.effective_max_cached_bytes(),
            max_idle_percent: cfg.max_idle_percent.map(u64::from),
            blocks: Slab::default(),
            free: [BTreeSet::new(), BTreeSet::new()],
            free_bytes: [0, 0],
            front: Front::default(),
            reserved: [0, 0],
            inactive: SplitGauge::default(),
        }
    }

    #[inline]
    /// Counts `size` bytes of a free block of pool `small` into (`add`) or out of the
    /// inactive-split gauges.
    fn inactive(&mut self, small: bool, size: usize, add: bool) {
        if add {
            self.inactive.add(small, size as u64);
        } else {
            self.inactive.sub(small, size as u64);
        }
    }

    /// The inactive-split gauge.
    pub(crate) fn inactive_split(&self) -> SplitGauge {
        self.inactive
    }

    /// Resets the peaks of the inactive-split gauge.
    pub(crate) fn reset_peaks(&mut self) {
        self.inactive.reset_peak();
    }

    /// The block size for a request (`None` on overflow). `round` is a power of two.
    #[inline]
    pub(crate) fn round(&self, bytes: usize) -> Option<usize> {
        let mask = self.round - 1;
        bytes.max(1).checked_add(mask).map(|v| v & !mask)
    }

    /// The segment to ask the backend for when nothing cached fits `rounded`: requests from
    /// `large_segment_limit` get their own, rounded to `segment_round`; others get the largest
    /// of the request, `min_segment` and `percent` % of what their pool (small or large) holds,
    /// capped at `small_segment` / `large_segment` (but never below the request).
    ///
    /// Under a cap (`capped`), a request of at most a [`KEEP_WHOLE`]² share of the smallest
    /// small-pool segment (`min_segment` and `small_segment`: 4 KiB by default) gets a segment
    /// of that size: small blocks so share small segments, and leave the room under the cap in
    /// pieces the larger requests can use.
    pub(crate) fn segment_size(&self, rounded: usize, capped: bool) -> Option<usize> {
        let g = &self.growth;
        let small = rounded <= self.small_size;
        let unit = g.min_segment.min(g.small_segment) / (KEEP_WHOLE * KEEP_WHOLE);
        if capped && small && rounded <= unit {
            return round_up(unit, self.round);
        }
        if !small && rounded >= g.large_segment_limit {
            return round_up(rounded, g.segment_round);
        }
        let cap = if small {
            g.small_segment
        } else {
            g.large_segment
        };
        let share = self.reserved[pool_index(small)].saturating_mul(g.percent) / 100;
        let share = usize::try_from(share).unwrap_or(usize::MAX);
        round_up(share.max(g.min_segment).min(cap).max(rounded), self.round)
    }

    /// A free block for `rounded` bytes usable by `stream`: the stream's exact-size list first,
    /// then the best fit in the arena (split if worth it). On a miss, the lists are flushed into
    /// the arena and the best fit is tried again, so that the pool only grows when merged free
    /// memory cannot serve the request either.
    ///
    /// With `keep_whole` (asked only on a list miss: the pool is under a cap), a small request
    /// does not split a wholly free segment made for one block (not a preallocated one) at
    /// least [`KEEP_WHOLE`] times its size: under a
    /// cap, the blocks a program frees and asks for again step after step (activations,
    /// gradients) would otherwise be split by small requests until the next one of their size
    /// finds no block whole, though the bytes are there. The pool then makes a small segment for
    /// the request, and splits the whole one only when the cap refuses that (see
    /// [`super::Pool`]'s allocation path).
    pub(crate) fn find(
        &mut self,
        rounded: usize,
        req: Request<'_>,
        keep_whole: impl FnOnce() -> bool,
    ) -> Option<Grant<V>> {
        let stream = req.stream;
        if rounded <= self.class_limit {
            // `round` is a power of two (the configuration checks it): a shift, not a division
            // (a 32-bit `div` costs 10 to 40 cycles, about a tenth of a cycle of the pool).
            let class = rounded >> self.round.trailing_zeros();
            if let Some(id) = self.front.pop(stream, class, rounded) {
                return Some(self.take_cached(id, req));
            }
        } else if let Some(id) = self.front.pop_large(stream, rounded) {
            return Some(self.take_cached(id, req));
        }
        let keep = rounded <= self.small_size && keep_whole();
        if let Some(g) = self.best_fit(rounded, req, keep) {
            return Some(g);
        }
        if !self.front.is_empty() {
            self.flush_front();
            return self.best_fit(rounded, req, keep);
        }
        None
    }

    // Always inlined: the fast path of every small allocation.
    #[inline(always)]
    fn take_cached(&mut self, id: BlockId, req: Request<'_>) -> Grant<V> {
        let (small, size, split) = {
            let b = &self.blocks[id];
            (b.small, b.size, b.is_split())
        };
        if split {
            self.inactive(small, size, false);
        }
        debug_assert_eq!(self.blocks[id].state, State::Cached);
        // Uses in flight are all on `stream` (the list's): the new user's work follows them on
        // the stream, and they go back with the block.
        self.grant(id, small, req)
    }

    /// Marks block `id` handed out for `req` and gives it, with its view and the uses still
    /// in flight on it (on `req`'s stream, or complete: the block is usable by that stream;
    /// they go back with the block, so a free with no work of its own does not forget them).
    /// Always inlined: part of the fast path of [`Self::take_cached`].
    #[inline(always)]
    fn grant(&mut self, id: BlockId, small: bool, req: Request<'_>) -> Grant<V> {
        let b = &mut self.blocks[id];
        b.state = State::Allocated;
        b.stream = req.stream;
        b.requested = req.requested;
        b.owner = req.owner.cloned();
        let mut pending = std::mem::take(&mut b.pending);
        if !pending.is_empty() {
            pending.retain(|p| !p.fence.poll());
        }
        Grant {
            block: id,
            seg: b.seg,
            offset: b.offset,
            size: b.size,
            zeroed: std::mem::replace(&mut b.zeroed, false),
            view: b.view.take(),
            pending,
            small,
        }
    }

    /// The best-fit free block for `rounded` bytes usable by `req`'s stream, carved; with
    /// `keep_whole`, wholly free segments of at least [`KEEP_WHOLE`] times `rounded` are passed
    /// over (see [`Arena::find`]).
    fn best_fit(&mut self, rounded: usize, req: Request<'_>, keep_whole: bool) -> Option<Grant<V>> {
        let small = rounded <= self.small_size;
        let mut pick = None;
        let whole_from = rounded.saturating_mul(KEEP_WHOLE);
        for &(size, id) in self.free[pool_index(small)].range((rounded, 0)..) {
            if let Some(m) = self.max_split {
                // Small requests never take oversize blocks; big ones take them only when
                // little is wasted (the sets are ordered, so nothing later fits either).
                if rounded < m && size >= m {
                    break;
                }
                if rounded >= m && size >= rounded.saturating_add(self.max_non_split_rounding) {
                    break;
                }
            }
            let b = &self.blocks[id];
            if keep_whole && size >= whole_from && b.fitted && !b.is_split() {
                continue;
            }
            if usable_by(&b.pending, req.stream) {
                pick = Some(id);
                break;
            }
        }
        pick.map(|id| self.carve(id, rounded, req))
    }

    /// Adds a fresh (zeroed) segment of `size` bytes and carves `rounded` bytes from it for
    /// `req`.
    pub(crate) fn add_segment(
        &mut self,
        seg: SegId,
        size: usize,
        rounded: usize,
        req: Request<'_>,
    ) -> Grant<V> {
        let small = rounded <= self.small_size;
        let id = self.insert_segment(seg, size, small, req.stream, size == rounded);
        self.carve(id, rounded, req)
    }

    /// Adds segment `seg` of `size` fresh (zeroed) bytes to the small or the large pool as one
    /// free block of `stream` (`fitted`: made for one block of its size); returns the block.
    pub(super) fn insert_segment(
        &mut self,
        seg: SegId,
        size: usize,
        small: bool,
        stream: StreamId,
        fitted: bool,
    ) -> BlockId {
        self.reserved[pool_index(small)] += size as u64;
        let id = self.blocks.insert(Block {
            seg,
            offset: 0,
            size,
            prev: None,
            next: None,
            state: State::Free,
            small,
            zeroed: true,
            fitted,
            stream,
            pending: Vec::new(),
            view: None,
            requested: 0,
            owner: None,
        });
        self.link_free(id);
        id
    }

    fn should_split(&self, size: usize, rounded: usize, small: bool) -> bool {
        let rest = size - rounded;
        if small {
            rest >= self.round
        } else {
            self.max_split.is_none_or(|m| rounded < m) && rest > self.small_size
        }
    }

    /// Takes free block `id` for `req`, of `rounded` bytes.
    fn carve(&mut self, id: BlockId, rounded: usize, req: Request<'_>) -> Grant<V> {
        self.unlink_free(id);
        let (size, small, split) = {
            let b = &self.blocks[id];
            (b.size, b.small, b.is_split())
        };
        if split {
            self.inactive(small, size, false);
        }
        if self.should_split(size, rounded, small) {
            let b = &mut self.blocks[id];
            // Both parts keep the uses in flight.
            b.pending.retain(|p| !p.fence.poll());
            let pending = b.pending.clone();
            let rest = Block {
                seg: b.seg,
                offset: b.offset + rounded,
                size: b.size - rounded,
                prev: Some(id),
                next: b.next,
                state: State::Free,
                small: b.small,
                zeroed: b.zeroed,
                fitted: b.fitted,
                stream: b.stream,
                pending,
                view: None,
                requested: 0,
                owner: None,
            };
            let next = rest.next;
            let rest_id = self.blocks.insert(rest);
            if let Some(n) = next {
                self.blocks[n].prev = Some(rest_id);
            }
            self.link_free(rest_id);
            // The rest shares its segment with the block handed out.
            self.inactive(small, size - rounded, true);
            let b = &mut self.blocks[id];
            b.next = Some(rest_id);
            b.size = rounded;
            // A view of the whole block would reach into the rest.
            b.view = None;
        }
        self.grant(id, small, req)
    }

    /// Names `owner` as the owner of block `id`, handed out.
    pub(crate) fn rename(&mut self, id: BlockId, owner: Option<&Arc<str>>) {
        if let Some(b) = self.blocks.get_mut(id) {
            debug_assert_eq!(b.state, State::Allocated, "rename of free block {id}");
            b.owner = owner.cloned();
        }
    }

    /// Returns block `id` with the uses still in flight on it and its view: onto its stream's
    /// exact-size list (small blocks) or the large list when its pending uses are all on one
    /// stream, else into the arena, merged with free neighbours (a merge drops the views of the
    /// blocks merged).
    /// Gives back the segments to release when cached bytes exceed the configured cap.
    pub(crate) fn free(
        &mut self,
        id: BlockId,
        pending: Vec<PendingUse>,
        view: Option<Box<V>>,
    ) -> Vec<(SegId, usize)> {
        let (round, class_limit) = (self.round, self.class_limit);
        let Some(b) = self.blocks.get_mut(id) else {
            return Vec::new();
        };
        debug_assert_eq!(b.state, State::Allocated, "double free of block {id}");
        if b.state != State::Allocated {
            return Vec::new();
        }
        // A block handed out holds no view of its own (its lease has it): the slot is empty,
        // and the test keeps the drop of its old value off the common path.
        if let Some(stale) = std::mem::replace(&mut b.view, view) {
            drop(stale);
        }
        b.owner = None;
        b.requested = 0;
        b.pending.clear();
        if !pending.is_empty() {
            merge_pending(&mut b.pending, pending);
        } else if pending.capacity() == 0 {
            // No room: it owns nothing (the usual free: no call made to drop it).
            std::mem::forget(pending);
        } else if b.pending.capacity() == 0 {
            // The list's memory stays with the block, for the uses its next lease records
            // (the block's own list has no room: it owns nothing).
            std::mem::forget(std::mem::replace(&mut b.pending, pending));
        }
        // One pending use per stream: at most one entry means at most one stream.
        let stream = match b.pending.as_slice() {
            [] => Some(b.stream),
            [p] => Some(p.stream),
            _ => None,
        };
        if let (Some(stream), true) = (stream, class_limit > 0) {
            b.state = State::Cached;
            let (size, small, split) = (b.size, b.small, b.is_split());
            if split {
                self.inactive(small, size, true);
            }
            if small && size <= class_limit {
                // A shift: `round` is a power of two (see `find`).
                self.front
                    .push(stream, size >> round.trailing_zeros(), size, id);
            } else if let Some((old, _)) = self.front.push_large(stream, size, id) {
                self.settle(old);
            }
            return self.over_cap();
        }
        self.settle(id);
        self.over_cap()
    }

    /// Segments to give back when the cached bytes exceed the cap.
    #[inline]
    fn over_cap(&mut self) -> Vec<(SegId, usize)> {
        if self.free_bytes() > self.max_cached {
            self.release_free_segments(false, self.max_cached, usize::MAX)
        } else {
            Vec::new()
        }
    }

    /// Puts block `id` (handed out or cached, not in the free sets) into the arena, merged
    /// with its free neighbours.
    fn settle(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        if b.state == State::Cached && b.is_split() {
            // Counted while on a list; counted again below as what it merges into.
            self.inactive(b.small, b.size, false);
        }
        self.blocks[id].state = State::Free;
        let mut cur = id;
        let free = |a: &Self, b: Option<BlockId>| b.filter(|&b| a.blocks[b].state == State::Free);
        // A free neighbour shares its segment with `id`: it was counted.
        if let Some(p) = free(self, self.blocks[cur].prev) {
            self.unlink_free(p);
            let (small, size) = (self.blocks[p].small, self.blocks[p].size);
            self.inactive(small, size, false);
            self.absorb(p, cur);
            cur = p;
        }
        if let Some(n) = free(self, self.blocks[cur].next) {
            self.unlink_free(n);
            let (small, size) = (self.blocks[n].small, self.blocks[n].size);
            self.inactive(small, size, false);
            self.absorb(cur, n);
        }
        self.link_free(cur);
        let b = &self.blocks[cur];
        if b.is_split() {
            self.inactive(b.small, b.size, true);
        }
    }

    /// Moves every block of the exact-size lists into the arena.
    fn flush_front(&mut self) {
        for id in self.front.drain() {
            self.settle(id);
        }
    }

    /// `left` takes over its right neighbour `right` (both free, not in the free sets).
    fn absorb(&mut self, left: BlockId, right: BlockId) {
        let r = self.blocks.remove(right).expect("neighbour exists");
        if let Some(n) = r.next {
            self.blocks[n].prev = Some(left);
        }
        let l = &mut self.blocks[left];
        l.size += r.size;
        l.next = r.next;
        l.zeroed &= r.zeroed;
        // Neither view describes the merged block.
        l.view = None;
        merge_pending(&mut l.pending, r.pending);
    }

    /// Bytes in free blocks (in the arena and on the exact-size lists).
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes[0] + self.free_bytes[1] + self.front.bytes()
    }

    /// Size of the largest free block.
    pub(crate) fn largest_free(&self) -> u64 {
        let listed = self
            .front
            .largest_class()
            .map_or(0, |c| (c * self.round) as u64)
            .max(self.front.largest_large().unwrap_or(0) as u64);
        self.free
            .iter()
            .filter_map(|s| s.last().map(|&(size, _)| size as u64))
            .max()
            .unwrap_or(0)
            .max(listed)
    }

    fn link_free(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        self.free[pool_index(b.small)].insert((b.size, id));
        self.free_bytes[pool_index(b.small)] += b.size as u64;
    }

    fn unlink_free(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        if self.free[pool_index(b.small)].remove(&(b.size, id)) {
            self.free_bytes[pool_index(b.small)] -= b.size as u64;
        }
    }
}

/// `v` rounded up to a multiple of `to` (`None` on overflow).
pub(crate) fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_add(to - 1).map(|x| x / to * to)
}
