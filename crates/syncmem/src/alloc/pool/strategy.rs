//! Dispatch over the three pool strategies: caching (best fit), binned, none (direct).

use std::sync::Arc;

use super::arena::Arena;
use super::binned::Bins;
use super::config::{PoolConfig, PoolKind};
use super::grant::{Grant, Request};
use super::snapshot::{BlockSnapshot, BlockState};
use super::stats::SplitGauge;
use super::{BlockId, IdMap, PendingUse, SegId, StreamId};

/// A block of the `none` pool (a whole segment).
struct DirectBlock {
    seg: SegId,
    size: usize,
    stream: StreamId,
    requested: usize,
    owner: Option<Arc<str>>,
}

/// `none`: one segment per block.
pub(crate) struct Direct {
    live: IdMap<DirectBlock>,
    next_id: BlockId,
    small_size: usize,
}

// One per pool: boxing the arena would add a pointer chase to every allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Core<V> {
    Caching(Arena<V>),
    Binned(Bins<V>),
    Direct(Direct),
}

impl<V> Core<V> {
    pub(crate) fn new(cfg: &PoolConfig) -> Self {
        match cfg.kind {
            PoolKind::Caching => Core::Caching(Arena::new(cfg)),
            PoolKind::Binned => Core::Binned(Bins::new(cfg)),
            PoolKind::None => Core::Direct(Direct {
                live: IdMap::default(),
                next_id: 0,
                small_size: cfg.small_size,
            }),
        }
    }

    /// Block size of a request (`None` on overflow).
    #[inline]
    pub(crate) fn round(&self, bytes: usize) -> Option<usize> {
        match self {
            Core::Caching(a) => a.round(bytes),
            Core::Binned(b) => Some(b.bin_for(bytes).1),
            Core::Direct(_) => Some(bytes.max(1)),
        }
    }

    /// The segment to make when nothing cached fits a request of `bytes` (`rounded`);
    /// `capped`: the pool is under a cap (see [`Arena::segment_size`]).
    pub(crate) fn segment_size(&self, bytes: usize, rounded: usize, capped: bool) -> Option<usize> {
        match self {
            Core::Caching(a) => a.segment_size(rounded, capped),
            Core::Binned(_) => Some(rounded),
            Core::Direct(_) => Some(bytes.max(1)),
        }
    }

    /// A cached block for `req` (`rounded`: its block size).
    #[inline]
    /// `keep_whole` is asked on a miss of the caching core's lists (see [`Arena::find`]).
    pub(crate) fn find(
        &mut self,
        rounded: usize,
        req: Request<'_>,
        keep_whole: impl FnOnce() -> bool,
    ) -> Option<Grant<V>> {
        match self {
            Core::Caching(a) => a.find(rounded, req, keep_whole),
            Core::Binned(b) => b.find(req),
            Core::Direct(_) => None,
        }
    }

    /// Keeps nothing cached from now on: every free gives back what it can (a pool that
    /// drains).
    pub(crate) fn stop_caching(&mut self) {
        match self {
            Core::Caching(a) => a.stop_caching(),
            Core::Binned(b) => b.stop_caching(),
            Core::Direct(_) => {}
        }
    }

    /// Adds a fresh segment `seg` of `size` bytes and hands out a block of it for `req`.
    pub(crate) fn add_segment(
        &mut self,
        seg: SegId,
        size: usize,
        rounded: usize,
        req: Request<'_>,
    ) -> Grant<V> {
        match self {
            Core::Caching(a) => a.add_segment(seg, size, rounded, req),
            Core::Binned(b) => b.add_segment(seg, size, req),
            Core::Direct(d) => {
                d.next_id += 1;
                d.live.insert(
                    d.next_id,
                    DirectBlock {
                        seg,
                        size,
                        stream: req.stream,
                        requested: req.requested,
                        owner: req.owner.cloned(),
                    },
                );
                Grant {
                    block: d.next_id,
                    seg,
                    offset: 0,
                    size,
                    zeroed: true,
                    view: None,
                    pending: Vec::new(),
                    small: size <= d.small_size,
                }
            }
        }
    }

    /// Names `owner` as the owner of `block`, handed out (a thread cache handed it to another
    /// owner: see `Pool::alloc_device`). Only a caching pool has thread caches: the other
    /// kinds keep the name they were given.
    pub(crate) fn rename(&mut self, block: BlockId, owner: Option<&Arc<str>>) {
        if let Core::Caching(a) = self {
            a.rename(block, owner);
        }
    }

    /// Gives back `block` with its uses in flight and its view (kept while the block keeps its
    /// placement). Returns the segments to release.
    #[inline]
    pub(crate) fn free(
        &mut self,
        block: BlockId,
        pending: Vec<PendingUse>,
        view: Option<Box<V>>,
    ) -> Vec<(SegId, usize)> {
        match self {
            Core::Caching(a) => a.free(block, pending, view),
            Core::Binned(b) => b.free(block, pending, view),
            // The segment goes with the block: so does its view.
            Core::Direct(d) => d
                .live
                .remove(&block)
                .map(|b| (b.seg, b.size))
                .into_iter()
                .collect(),
        }
    }

    /// Segments to give back before the pool grows for a request of `bytes` (`rounded`): idle
    /// memory the request cannot use (see each core's `idle_segments`).
    pub(crate) fn idle_segments(&mut self, bytes: usize, rounded: usize) -> Vec<(SegId, usize)> {
        match self {
            Core::Caching(a) => a.idle_segments(rounded),
            Core::Binned(b) => b.idle_segments(bytes),
            Core::Direct(_) => Vec::new(),
        }
    }

    /// Wholly free segments to give back, largest first, until at most `keep` free bytes
    /// remain; segments with uses in flight are waited for when `wait`, else skipped.
    pub(crate) fn release(&mut self, wait: bool, keep: u64) -> Vec<(SegId, usize)> {
        match self {
            Core::Caching(a) => a.release_free_segments(wait, keep, usize::MAX),
            Core::Binned(b) => b.release_free_segments(wait, keep),
            Core::Direct(_) => Vec::new(),
        }
    }

    /// The bytes [`Core::release_at_least`] could give back with `spare`, waiting for work in
    /// flight.
    pub(crate) fn releasable(&mut self, spare: usize) -> u64 {
        match self {
            Core::Caching(a) => a.releasable(spare),
            Core::Binned(b) => b.free_bytes(),
            Core::Direct(_) => 0,
        }
    }

    /// Releases cached memory (whole free segments, largest first; bins, largest first)
    /// until `need` bytes went back or nothing more can go.
    ///
    /// The caching core passes over whole segments of `spare` bytes or more (`usize::MAX`:
    /// none).
    pub(crate) fn release_at_least(
        &mut self,
        wait: bool,
        need: u64,
        spare: usize,
    ) -> Vec<(SegId, usize)> {
        let keep = self.free_bytes().saturating_sub(need);
        match self {
            Core::Caching(a) => a.release_free_segments(wait, keep, spare),
            _ => self.release(wait, keep),
        }
    }

    /// Adds a fresh segment `seg` of `size` bytes as one free block of the small or large
    /// pool (a preallocation); `false` for a core that keeps no free segments (binned, none).
    pub(crate) fn add_free_segment(&mut self, seg: SegId, size: usize, small: bool) -> bool {
        match self {
            Core::Caching(a) => {
                a.add_free_segment(seg, size, small);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        match self {
            Core::Caching(a) => a.free_bytes(),
            Core::Binned(b) => b.free_bytes(),
            Core::Direct(_) => 0,
        }
    }

    pub(crate) fn largest_free(&self) -> u64 {
        match self {
            Core::Caching(a) => a.largest_free(),
            Core::Binned(b) => b.largest_free(),
            Core::Direct(_) => 0,
        }
    }
}

impl<V> Core<V> {
    /// Bytes of free blocks sharing their segment with other blocks.
    pub(crate) fn inactive_split(&self) -> SplitGauge {
        match self {
            Core::Caching(a) => a.inactive_split(),
            _ => SplitGauge::default(),
        }
    }

    /// Resets the peaks the core keeps.
    pub(crate) fn reset_peaks(&mut self) {
        if let Core::Caching(a) = self {
            a.reset_peaks();
        }
    }

    /// Every segment (with whether it serves small blocks) and its blocks in address order.
    pub(crate) fn walk(&self) -> Vec<(SegId, bool, Vec<BlockSnapshot>)> {
        match self {
            Core::Caching(a) => a.walk(),
            Core::Binned(b) => b.walk(),
            Core::Direct(d) => d
                .live
                .values()
                .map(|b| {
                    let block = BlockSnapshot {
                        offset: 0,
                        size: b.size as u64,
                        requested: b.requested as u64,
                        state: BlockState::Allocated,
                        stream: b.stream,
                        owner: b.owner.as_deref().map(str::to_string),
                    };
                    (b.seg, b.size <= d.small_size, vec![block])
                })
                .collect(),
        }
    }
}
