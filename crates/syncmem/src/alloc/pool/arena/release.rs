//! Giving memory back: whole free segments released before the pool grows, under the cap on
//! cached bytes, or on request.

use super::{pool_index, Arena};
use crate::alloc::pool::{BlockId, SegId, HOST_STREAM};

impl<V> Arena<V> {
    /// Caches nothing from now on: each free gives back the whole free segments it leaves.
    pub(crate) fn stop_caching(&mut self) {
        self.max_cached = 0;
    }

    /// Adds a fresh (zeroed) segment `seg` of `size` bytes to the small or the large pool as
    /// one free block, usable by every stream (a preallocation: nothing is handed out).
    pub(crate) fn add_free_segment(&mut self, seg: SegId, size: usize, small: bool) {
        self.insert_segment(seg, size, small, HOST_STREAM, false);
    }

    /// Segments to give back before the pool grows by a segment for `rounded` bytes: wholly
    /// free segments of the request's pool (small or large) that no pending work needs (the
    /// request fits none of them, or it would have been served), largest first, while that
    /// pool's free bytes exceed `max_idle_percent` % of the bytes it has handed out. A program
    /// whose demand moves on (bigger batches, other shapes) so keeps little memory it no longer
    /// uses, and the pool never gives back memory it would not have to reserve again anyway.
    pub(crate) fn idle_segments(&mut self, rounded: usize) -> Vec<(SegId, usize)> {
        let Some(percent) = self.max_idle_percent else {
            return Vec::new();
        };
        self.flush_front();
        let p = pool_index(rounded <= self.small_size);
        let in_use = self.reserved[p] - self.free_bytes[p];
        self.release_whole(
            Some(p),
            false,
            in_use.saturating_mul(percent) / 100,
            usize::MAX,
        )
    }

    /// Removes whole free segments (largest first) until at most `keep` free bytes remain.
    /// Segments with uses in flight are waited for when `wait`, else skipped. The exact-size
    /// lists are flushed into the arena first.
    /// Segments of `spare` bytes or more stay (`usize::MAX`: none is spared).
    pub(crate) fn release_free_segments(
        &mut self,
        wait: bool,
        keep: u64,
        spare: usize,
    ) -> Vec<(SegId, usize)> {
        self.flush_front();
        self.release_whole(None, wait, keep, spare)
    }

    /// The bytes of the whole free segments [`Arena::release_free_segments`] may give back,
    /// passing over those of `spare` bytes or more made for one block (work in flight on them
    /// waited for).
    pub(crate) fn releasable(&mut self, spare: usize) -> u64 {
        self.flush_front();
        self.free
            .iter()
            .flat_map(|s| s.iter().copied())
            .filter(|&(size, id)| self.may_go(size, id, spare))
            .map(|(size, _)| size as u64)
            .sum()
    }

    /// Whether free block `id` of `size` bytes is a whole segment that may be given back,
    /// passing over segments of `spare` bytes or more made for one block.
    fn may_go(&self, size: usize, id: BlockId, spare: usize) -> bool {
        let b = &self.blocks[id];
        b.prev.is_none() && b.next.is_none() && (size < spare || !b.fitted)
    }

    /// Removes whole free segments of pool `pool` (`None`: both), largest first, until at most
    /// `keep` free bytes remain in it, passing over segments of `spare` bytes or more made for
    /// one block (see [`Arena::find`]); pending uses as in [`Arena::release_free_segments`].
    fn release_whole(
        &mut self,
        pool: Option<usize>,
        wait: bool,
        keep: u64,
        spare: usize,
    ) -> Vec<(SegId, usize)> {
        let free_now = |a: &Self| match pool {
            Some(p) => a.free_bytes[p],
            None => a.free_bytes[0] + a.free_bytes[1],
        };
        if free_now(self) <= keep {
            return Vec::new();
        }
        let mut whole: Vec<(usize, BlockId)> = self
            .free
            .iter()
            .enumerate()
            .filter(|&(i, _)| pool.is_none_or(|p| p == i))
            .flat_map(|(_, s)| s.iter().copied())
            .filter(|&(size, id)| self.may_go(size, id, spare))
            .collect();
        whole.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for (size, id) in whole {
            if free_now(self) <= keep {
                break;
            }
            let b = &self.blocks[id];
            if wait {
                b.pending.iter().for_each(|p| p.fence.wait());
            } else if !b.pending.iter().all(|p| p.fence.is_complete()) {
                continue;
            }
            self.unlink_free(id);
            let b = self.blocks.remove(id).expect("listed block");
            self.reserved[pool_index(b.small)] -= size as u64;
            out.push((b.seg, size));
        }
        out
    }
}
