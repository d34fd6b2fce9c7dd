//! The `binned` core: CUB's `CachingDeviceAllocator` as pure bookkeeping, with finer bins.
//!
//! - Main bins are `growth^k` bytes for `k` in `min_bin..=max_bin`; each step between two main
//!   bins is divided into `divisions` equal steps, as PyTorch's `roundup_power2_divisions`
//!   (defaults 2, 8, 30, 4: 256 B, 320 B, 384 B, 448 B, 512 B, 640 B, ... 1 GiB, so a block
//!   wastes at most a fifth of itself instead of up to seven eighths with CUB's bins of 8x).
//!   A request rounds up to its bin and gets a segment of exactly the bin size; no splitting,
//!   no merging.
//! - A cached block serves only requests of the same bin: at once on the stream of its pending
//!   uses, on other streams once their fences have completed.
//! - Requests above the largest bin are allocated at their exact size and never cached.
//! - At most `max_cached` bytes are kept cached; a block freed beyond that is released.
//! - Before the pool grows, settled cached blocks of other bins are given back while the cache
//!   holds more than `max_idle_percent` % of the bytes in use ([`Bins::idle_segments`]).

use super::config::PoolConfig;
use super::slab::Slab;
use std::sync::Arc;

use super::grant::{Grant, Request};
use super::snapshot::{BlockSnapshot, BlockState};
use super::{in_flight, merge_pending, usable_by, BlockId, PendingUse, SegId, StreamId};

struct Cached<V> {
    id: BlockId,
    seg: SegId,
    size: usize,
    zeroed: bool,
    /// The stream it was last handed out for.
    stream: StreamId,
    pending: Vec<PendingUse>,
    /// The block's view, handed to its next user (a block is a whole segment: its placement
    /// never changes).
    view: Option<Box<V>>,
}

struct Live {
    seg: SegId,
    size: usize,
    bin: Option<usize>,
    stream: StreamId,
    /// Bytes asked for and the owner's name, if given (snapshots).
    requested: usize,
    owner: Option<Arc<str>>,
}

/// Bin bookkeeping of the binned pool, keeping each cached block's view (`V`).
pub(crate) struct Bins<V> {
    /// Every bin size, ascending.
    sizes: Vec<usize>,
    max_cached: u64,
    max_idle_percent: Option<u64>,
    /// Blocks up to this size are small.
    small_size: usize,
    /// Cached blocks per bin (index into `sizes`), most recently freed last.
    cached: Vec<Vec<Cached<V>>>,
    cached_bytes: u64,
    /// Bytes of blocks handed out.
    live_bytes: u64,
    /// Live blocks; the ids of cached blocks are kept reserved in here too (as `None`) so an
    /// id is never handed out twice.
    live: Slab<Option<Live>>,
}

/// The bin sizes of a configuration: `growth^k` for `k` in `min_bin..=max_bin`, each step
/// divided into `divisions` equal steps (rounded up to whole bytes, duplicates dropped).
fn bin_sizes(cfg: &PoolConfig) -> Vec<usize> {
    let g = u64::from(cfg.bin_growth);
    let d = u64::from(cfg.bin_divisions.max(1));
    let mut out: Vec<usize> = Vec::new();
    let mut push = |v: u64| {
        let v = usize::try_from(v).unwrap_or(usize::MAX);
        if out.last() != Some(&v) {
            out.push(v);
        }
    };
    for k in cfg.min_bin..cfg.max_bin {
        let (lo, hi) = (g.saturating_pow(k), g.saturating_pow(k + 1));
        for i in 0..d {
            push(lo + ((hi - lo) * i).div_ceil(d));
        }
    }
    push(g.saturating_pow(cfg.max_bin));
    out
}

impl<V> Bins<V> {
    pub(crate) fn new(cfg: &PoolConfig) -> Self {
        let sizes = bin_sizes(cfg);
        Self {
            cached: sizes.iter().map(|_| Vec::new()).collect(),
            sizes,
            max_cached: cfg.effective_max_cached_bytes(),
            max_idle_percent: cfg.max_idle_percent.map(u64::from),
            small_size: cfg.small_size,
            cached_bytes: 0,
            live_bytes: 0,
            live: Slab::default(),
        }
    }

    /// The bin of a request and its size; `None` (and the exact size) above the largest bin.
    pub(crate) fn bin_for(&self, bytes: usize) -> (Option<usize>, usize) {
        let bytes = bytes.max(1);
        let i = self.sizes.partition_point(|&s| s < bytes);
        match self.sizes.get(i) {
            Some(&s) => (Some(i), s),
            None => (None, bytes),
        }
    }

    /// A cached block of the request's bin usable by `stream`, most recently freed first.
    pub(crate) fn find(&mut self, req: Request<'_>) -> Option<Grant<V>> {
        let stream = req.stream;
        let (Some(bin), _) = self.bin_for(req.requested) else {
            return None;
        };
        let list = &mut self.cached[bin];
        let pos = list.iter().rposition(|c| usable_by(&c.pending, stream))?;
        // Most recently freed last: removing keeps that order (O(1) for the last one).
        let c = list.remove(pos);
        self.cached_bytes -= c.size as u64;
        self.live_bytes += c.size as u64;
        self.live[c.id] = Some(Live {
            seg: c.seg,
            size: c.size,
            bin: Some(bin),
            stream,
            requested: req.requested,
            owner: req.owner.cloned(),
        });
        let mut pending = c.pending;
        if !pending.is_empty() {
            pending.retain(|p| !p.fence.poll());
        }
        Some(Grant {
            block: c.id,
            seg: c.seg,
            offset: 0,
            size: c.size,
            zeroed: c.zeroed,
            view: c.view,
            pending,
            small: c.size <= self.small_size,
        })
    }

    /// Registers a fresh (zeroed) segment made for a request of `bytes` as a live block.
    pub(crate) fn add_segment(&mut self, seg: SegId, size: usize, req: Request<'_>) -> Grant<V> {
        let (bin, _) = self.bin_for(req.requested);
        self.live_bytes += size as u64;
        let id = self.live.insert(Some(Live {
            seg,
            size,
            bin,
            stream: req.stream,
            requested: req.requested,
            owner: req.owner.cloned(),
        }));
        Grant {
            block: id,
            seg,
            offset: 0,
            size,
            zeroed: true,
            view: None,
            pending: Vec::new(),
            small: size <= self.small_size,
        }
    }

    /// Every block (a whole segment each) with whether it is small, live ones first.
    pub(crate) fn walk(&self) -> Vec<(SegId, bool, Vec<BlockSnapshot>)> {
        let live = self.live.iter().filter_map(|(_, l)| l.as_ref()).map(|l| {
            let b = BlockSnapshot {
                offset: 0,
                size: l.size as u64,
                requested: l.requested as u64,
                state: BlockState::Allocated,
                stream: l.stream,
                owner: l.owner.as_deref().map(str::to_string),
            };
            (l.seg, l.size <= self.small_size, vec![b])
        });
        let cached = self.cached.iter().flatten().map(|c| {
            let b = BlockSnapshot {
                offset: 0,
                size: c.size as u64,
                requested: 0,
                state: if in_flight(&c.pending) {
                    BlockState::Pending
                } else {
                    BlockState::Free
                },
                stream: c.stream,
                owner: None,
            };
            (c.seg, c.size <= self.small_size, vec![b])
        });
        live.chain(cached).collect()
    }

    /// Returns a block with its view: cached if binned and under the cap, else its segment is
    /// given back (and the view dropped).
    pub(crate) fn free(
        &mut self,
        id: BlockId,
        pending: Vec<PendingUse>,
        view: Option<Box<V>>,
    ) -> Vec<(SegId, usize)> {
        let Some(l) = self.live.get_mut(id).and_then(Option::take) else {
            return Vec::new();
        };
        self.live_bytes -= l.size as u64;
        let fits = self.cached_bytes.saturating_add(l.size as u64) <= self.max_cached;
        match l.bin {
            Some(bin) if fits => {
                // Most blocks come back with no work in flight: nothing to merge.
                let kept = if pending.is_empty() {
                    pending
                } else {
                    let mut kept = Vec::new();
                    merge_pending(&mut kept, pending);
                    kept
                };
                self.cached_bytes += l.size as u64;
                self.cached[bin].push(Cached {
                    id,
                    seg: l.seg,
                    size: l.size,
                    zeroed: false,
                    stream: l.stream,
                    pending: kept,
                    view,
                });
                Vec::new()
            }
            _ => {
                self.live.remove(id);
                vec![(l.seg, l.size)]
            }
        }
    }

    /// Cached blocks to give back before the pool grows by a block of `bytes`' bin: settled
    /// blocks of other bins, largest bins first, while the cache holds more than
    /// `max_idle_percent` % of the bytes handed out. A program whose sizes move on (other batch
    /// sizes, other shapes) so does not keep a cache of blocks it no longer asks for.
    pub(crate) fn idle_segments(&mut self, bytes: usize) -> Vec<(SegId, usize)> {
        let Some(percent) = self.max_idle_percent else {
            return Vec::new();
        };
        let (bin, _) = self.bin_for(bytes);
        let keep = self.live_bytes.saturating_mul(percent) / 100;
        let mut out = Vec::new();
        for b in (0..self.cached.len()).rev() {
            if self.cached_bytes <= keep {
                break;
            }
            if Some(b) == bin {
                continue;
            }
            self.take_settled(b, keep, false, &mut out);
        }
        out
    }

    /// Removes cached blocks of bin `b` while more than `keep` bytes are cached; blocks with
    /// uses in flight are waited for when `wait`, else skipped.
    fn take_settled(&mut self, b: usize, keep: u64, wait: bool, out: &mut Vec<(SegId, usize)>) {
        let list = &mut self.cached[b];
        let mut i = 0;
        while i < list.len() && self.cached_bytes > keep {
            let c = &list[i];
            if wait {
                c.pending.iter().for_each(|p| p.fence.wait());
            } else if !c.pending.iter().all(|p| p.fence.is_complete()) {
                i += 1;
                continue;
            }
            let c = list.remove(i);
            self.cached_bytes -= c.size as u64;
            self.live.remove(c.id);
            out.push((c.seg, c.size));
        }
    }

    /// Removes cached blocks (largest bins first) until at most `keep` bytes stay cached.
    /// Blocks with uses in flight are waited for when `wait`, else skipped.
    pub(crate) fn release_free_segments(&mut self, wait: bool, keep: u64) -> Vec<(SegId, usize)> {
        let mut out = Vec::new();
        for b in (0..self.cached.len()).rev() {
            if self.cached_bytes <= keep {
                break;
            }
            self.take_settled(b, keep, wait, &mut out);
        }
        out
    }

    /// Caches nothing from now on: each block freed goes back to the backend.
    pub(crate) fn stop_caching(&mut self) {
        self.max_cached = 0;
    }

    /// Bytes in cached blocks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Size of the largest cached block.
    pub(crate) fn largest_free(&self) -> u64 {
        self.cached
            .iter()
            .rev()
            .find_map(|l| l.first().map(|c| c.size as u64))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::pool::PoolKind;

    #[test]
    fn four_divisions_per_power_of_two() {
        let b = Bins::<()>::new(&PoolConfig::new(PoolKind::Binned));
        assert_eq!(&b.sizes[..6], &[256, 320, 384, 448, 512, 640]);
        assert_eq!(*b.sizes.last().unwrap(), 1 << 30);
        assert_eq!(b.bin_for(1), (Some(0), 256));
        assert_eq!(b.bin_for(1200).1, 1280, "PyTorch's example");
        assert_eq!(b.bin_for(4 << 20).1, 4 << 20, "powers of two are bins");
        assert_eq!(b.bin_for(3 << 20).1, 3 << 20, "so are 1.5 x powers of two");
        assert_eq!(b.bin_for((1 << 30) + 1), (None, (1 << 30) + 1));
        // CUB's bins: growth 8, no divisions.
        let cub = Bins::<()>::new(&PoolConfig::new(PoolKind::Binned).with_bins(8, 3, 10));
        assert_eq!(&cub.sizes[..3], &[512, 4096, 32768]);
        assert_eq!(cub.sizes.len(), 8);
        // Divisions that do not divide a step evenly round up; duplicates go.
        let odd = Bins::<()>::new(
            &PoolConfig::new(PoolKind::Binned)
                .with_bins(2, 0, 2)
                .with_bin_divisions(3),
        );
        assert_eq!(odd.sizes, [1, 2, 3, 4]);
    }
}
