//! The `caching` core: PyTorch's best-fit allocator with block splitting and merging, as pure
//! bookkeeping of (segment, offset, size). It never touches memory; [`super::Pool`] owns the
//! segments.
//!
//! - Requests round up to a multiple of `round` (512 B).
//! - Requests up to `small_size` (1 MiB) use the small pool, whose segments are
//!   `small_segment` (2 MiB); larger ones use the large pool: `large_segment` (20 MiB) for
//!   requests below `large_segment_limit` (10 MiB), else the request rounded to
//!   `segment_round` (2 MiB).
//! - Free blocks sit in ordered sets keyed (size, id): the first usable entry at or above the
//!   request is the best fit.
//! - A block bigger than the request is split when the remainder is worth keeping (small pool:
//!   at least `round`; large pool: more than `small_size`, and only for requests below
//!   `max_split_size`). On free, a block merges with free neighbours of its segment.
//! - Stream awareness: a freed block carries the uses still in flight ([`PendingUse`]). It is
//!   usable at once by the stream of each pending use (streams run in order), and by other
//!   streams once every fence of another stream has completed.

use std::collections::BTreeSet;

use super::config::PoolConfig;
use super::strategy::Grant;
use super::{merge_pending, usable_by, BlockId, IdMap, PendingUse, SegId, StreamId};

struct Block {
    seg: SegId,
    offset: usize,
    size: usize,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    allocated: bool,
    small: bool,
    /// The bytes are known to be zero (a fresh segment's, never handed out).
    zeroed: bool,
    pending: Vec<PendingUse>,
}

/// Best-fit bookkeeping of the caching pool.
pub(crate) struct Arena {
    round: usize,
    small_size: usize,
    small_segment: usize,
    large_segment: usize,
    large_segment_limit: usize,
    segment_round: usize,
    max_split: Option<usize>,
    max_non_split_rounding: usize,
    max_cached: u64,
    blocks: IdMap<Block>,
    /// Free blocks: `[small pool, large pool]`, ordered by (size, id).
    free: [BTreeSet<(usize, BlockId)>; 2],
    free_bytes: u64,
    next_id: BlockId,
}

fn pool_index(small: bool) -> usize {
    usize::from(!small)
}

impl Arena {
    pub(crate) fn new(cfg: &PoolConfig) -> Self {
        Self {
            round: cfg.round,
            small_size: cfg.small_size,
            small_segment: cfg.small_segment,
            large_segment: cfg.large_segment,
            large_segment_limit: cfg.large_segment_limit,
            segment_round: cfg.segment_round,
            max_split: cfg.max_split_size,
            max_non_split_rounding: cfg.max_non_split_rounding,
            max_cached: cfg.effective_max_cached_bytes(),
            blocks: IdMap::default(),
            free: [BTreeSet::new(), BTreeSet::new()],
            free_bytes: 0,
            next_id: 1,
        }
    }

    /// The block size for a request (`None` on overflow).
    pub(crate) fn round(&self, bytes: usize) -> Option<usize> {
        round_up(bytes.max(1), self.round)
    }

    /// The segment to ask the backend for when nothing cached fits `rounded`.
    pub(crate) fn segment_size(&self, rounded: usize) -> Option<usize> {
        if rounded <= self.small_size {
            Some(self.small_segment)
        } else if rounded < self.large_segment_limit {
            Some(self.large_segment)
        } else {
            round_up(rounded, self.segment_round)
        }
    }

    /// Best fit among the free blocks usable by `stream`, split if worth it.
    pub(crate) fn find(&mut self, rounded: usize, stream: StreamId) -> Option<Grant> {
        let small = rounded <= self.small_size;
        let mut pick = None;
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
            if usable_by(&self.blocks[&id].pending, stream) {
                pick = Some(id);
                break;
            }
        }
        pick.map(|id| self.carve(id, rounded))
    }

    /// Adds a fresh (zeroed) segment of `size` bytes and carves `rounded` bytes from it.
    pub(crate) fn add_segment(&mut self, seg: SegId, size: usize, rounded: usize) -> Grant {
        let id = self.new_id();
        let small = rounded <= self.small_size;
        self.blocks.insert(
            id,
            Block {
                seg,
                offset: 0,
                size,
                prev: None,
                next: None,
                allocated: false,
                small,
                zeroed: true,
                pending: Vec::new(),
            },
        );
        self.link_free(id);
        self.carve(id, rounded)
    }

    fn new_id(&mut self) -> BlockId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn should_split(&self, size: usize, rounded: usize, small: bool) -> bool {
        let rest = size - rounded;
        if small {
            rest >= self.round
        } else {
            self.max_split.map_or(true, |m| rounded < m) && rest > self.small_size
        }
    }

    /// Takes free block `id` for a request of `rounded` bytes.
    fn carve(&mut self, id: BlockId, rounded: usize) -> Grant {
        self.unlink_free(id);
        let (size, small) = {
            let b = &self.blocks[&id];
            (b.size, b.small)
        };
        if self.should_split(size, rounded, small) {
            let b = self.block_mut(id);
            // The rest keeps the uses in flight (the block's own list is cleared below).
            let mut pending = std::mem::take(&mut b.pending);
            pending.retain(|p| !p.fence.poll());
            let rest = Block {
                seg: b.seg,
                offset: b.offset + rounded,
                size: b.size - rounded,
                prev: Some(id),
                next: b.next,
                allocated: false,
                small: b.small,
                zeroed: b.zeroed,
                pending,
            };
            let rest_id = self.new_id();
            if let Some(n) = rest.next {
                self.block_mut(n).prev = Some(rest_id);
            }
            self.blocks.insert(rest_id, rest);
            self.link_free(rest_id);
            let b = self.block_mut(id);
            b.next = Some(rest_id);
            b.size = rounded;
        }
        let b = self.block_mut(id);
        b.allocated = true;
        b.pending.clear();
        let zeroed = std::mem::replace(&mut b.zeroed, false);
        Grant {
            block: id,
            seg: b.seg,
            offset: b.offset,
            size: b.size,
            zeroed,
        }
    }

    /// Returns block `id` with the uses still in flight on it; merges it with free neighbours.
    /// Gives back the segments to release when cached bytes exceed the configured cap.
    pub(crate) fn free(&mut self, id: BlockId, pending: Vec<PendingUse>) -> Vec<(SegId, usize)> {
        let Some(b) = self.blocks.get_mut(&id) else {
            return Vec::new();
        };
        debug_assert!(b.allocated, "double free of block {id}");
        b.allocated = false;
        b.pending.clear();
        merge_pending(&mut b.pending, pending);
        let mut cur = id;
        if let Some(p) = self.blocks[&cur].prev.filter(|p| !self.blocks[p].allocated) {
            self.unlink_free(p);
            self.absorb(p, cur);
            cur = p;
        }
        if let Some(n) = self.blocks[&cur].next.filter(|n| !self.blocks[n].allocated) {
            self.unlink_free(n);
            self.absorb(cur, n);
        }
        self.link_free(cur);
        if self.free_bytes > self.max_cached {
            self.release_free_segments(false, self.max_cached)
        } else {
            Vec::new()
        }
    }

    /// `left` takes over its right neighbour `right` (both free, not in the free sets).
    fn absorb(&mut self, left: BlockId, right: BlockId) {
        let r = self.blocks.remove(&right).expect("neighbour exists");
        if let Some(n) = r.next {
            self.block_mut(n).prev = Some(left);
        }
        let l = self.block_mut(left);
        l.size += r.size;
        l.next = r.next;
        l.zeroed &= r.zeroed;
        merge_pending(&mut l.pending, r.pending);
    }

    /// Removes whole free segments (largest first) until at most `keep` free bytes remain.
    /// Segments with uses in flight are waited for when `wait`, else skipped.
    pub(crate) fn release_free_segments(&mut self, wait: bool, keep: u64) -> Vec<(SegId, usize)> {
        let mut whole: Vec<(usize, BlockId)> = self
            .free
            .iter()
            .flat_map(|s| s.iter().copied())
            .filter(|(_, id)| {
                let b = &self.blocks[id];
                b.prev.is_none() && b.next.is_none()
            })
            .collect();
        whole.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for (size, id) in whole {
            if self.free_bytes <= keep {
                break;
            }
            let b = &self.blocks[&id];
            if wait {
                b.pending.iter().for_each(|p| p.fence.wait());
            } else if !b.pending.iter().all(|p| p.fence.is_complete()) {
                continue;
            }
            self.unlink_free(id);
            let b = self.blocks.remove(&id).expect("listed block");
            out.push((b.seg, size));
        }
        out
    }

    /// Bytes in free blocks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Size of the largest free block.
    pub(crate) fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|s| s.last().map(|&(size, _)| size as u64))
            .max()
            .unwrap_or(0)
    }

    fn block_mut(&mut self, id: BlockId) -> &mut Block {
        self.blocks.get_mut(&id).expect("block exists")
    }

    fn link_free(&mut self, id: BlockId) {
        let b = &self.blocks[&id];
        self.free[pool_index(b.small)].insert((b.size, id));
        self.free_bytes += b.size as u64;
    }

    fn unlink_free(&mut self, id: BlockId) {
        let b = &self.blocks[&id];
        if self.free[pool_index(b.small)].remove(&(b.size, id)) {
            self.free_bytes -= b.size as u64;
        }
    }

    /// Checks the invariants (tests): blocks of a segment tile it, free sets match.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut free = 0u64;
        for (&id, b) in &self.blocks {
            if let Some(n) = b.next {
                let nb = &self.blocks[&n];
                assert_eq!(nb.prev, Some(id));
                assert_eq!(nb.offset, b.offset + b.size);
                assert_eq!(nb.seg, b.seg);
                assert!(
                    b.allocated || nb.allocated,
                    "two free neighbours not merged"
                );
            }
            let mut streams: Vec<_> = b.pending.iter().map(|p| p.stream).collect();
            streams.sort_unstable();
            streams.dedup();
            assert_eq!(streams.len(), b.pending.len(), "one pending use per stream");
            let listed = self.free[pool_index(b.small)].contains(&(b.size, id));
            assert_eq!(listed, !b.allocated);
            if !b.allocated {
                free += b.size as u64;
            }
        }
        assert_eq!(free, self.free_bytes);
    }
}

/// `v` rounded up to a multiple of `to` (`None` on overflow).
pub(crate) fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_add(to - 1).map(|x| x / to * to)
}
