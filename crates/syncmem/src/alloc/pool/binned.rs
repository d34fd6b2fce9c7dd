//! The `binned` core: CUB's `CachingDeviceAllocator` as pure bookkeeping.
//!
//! - Bin sizes are `growth^k` for `k` in `min_bin..=max_bin` (defaults 8, 3, 10: 512 B, 4 KiB,
//!   32 KiB, 256 KiB, 2 MiB, 16 MiB, 128 MiB, 1 GiB). A request rounds up to its bin and
//!   gets a segment of exactly the bin size; no splitting, no merging.
//! - A cached block serves only requests of the same bin: at once on the stream of its pending
//!   uses, on other streams once their fences have completed.
//! - Requests above the largest bin are allocated at their exact size and never cached.
//! - At most `max_cached` bytes are kept cached; a block freed beyond that is released.

use std::collections::BTreeMap;

use super::config::PoolConfig;
use super::strategy::Grant;
use super::{merge_pending, usable_by, BlockId, IdMap, PendingUse, SegId, StreamId};

struct Cached {
    id: BlockId,
    seg: SegId,
    size: usize,
    zeroed: bool,
    pending: Vec<PendingUse>,
}

struct Live {
    seg: SegId,
    size: usize,
    bin: Option<u32>,
}

/// Bin bookkeeping of the binned pool.
pub(crate) struct Bins {
    growth: u64,
    min_bin: u32,
    max_bin_bytes: u64,
    max_cached: u64,
    /// Cached blocks per bin, most recently freed last.
    cached: BTreeMap<u32, Vec<Cached>>,
    cached_bytes: u64,
    live: IdMap<Live>,
    next_id: BlockId,
}

impl Bins {
    pub(crate) fn new(cfg: &PoolConfig) -> Self {
        let growth = u64::from(cfg.bin_growth);
        Self {
            growth,
            min_bin: cfg.min_bin,
            max_bin_bytes: growth.saturating_pow(cfg.max_bin),
            max_cached: cfg.effective_max_cached_bytes(),
            cached: BTreeMap::new(),
            cached_bytes: 0,
            live: IdMap::default(),
            next_id: 1,
        }
    }

    /// The bin of a request and its size; `None` (and the exact size) above the largest bin.
    pub(crate) fn bin_for(&self, bytes: usize) -> (Option<u32>, usize) {
        let bytes = bytes.max(1);
        if bytes as u64 > self.max_bin_bytes {
            return (None, bytes);
        }
        let mut k = self.min_bin;
        let mut size = self.growth.pow(k);
        while size < bytes as u64 {
            k += 1;
            size *= self.growth;
        }
        (Some(k), size as usize)
    }

    /// A cached block of the request's bin usable by `stream`, most recently freed first.
    pub(crate) fn find(&mut self, bytes: usize, stream: StreamId) -> Option<Grant> {
        let (Some(bin), _) = self.bin_for(bytes) else {
            return None;
        };
        let list = self.cached.get_mut(&bin)?;
        let pos = list.iter().rposition(|c| usable_by(&c.pending, stream))?;
        let c = list.remove(pos);
        self.cached_bytes -= c.size as u64;
        self.live.insert(
            c.id,
            Live {
                seg: c.seg,
                size: c.size,
                bin: Some(bin),
            },
        );
        Some(Grant {
            block: c.id,
            seg: c.seg,
            offset: 0,
            size: c.size,
            zeroed: c.zeroed,
        })
    }

    /// Registers a fresh (zeroed) segment made for a request of `bytes` as a live block.
    pub(crate) fn add_segment(&mut self, seg: SegId, size: usize, bytes: usize) -> Grant {
        let (bin, _) = self.bin_for(bytes);
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(id, Live { seg, size, bin });
        Grant {
            block: id,
            seg,
            offset: 0,
            size,
            zeroed: true,
        }
    }

    /// Returns a block: cached if binned and under the cap, else its segment is given back.
    pub(crate) fn free(&mut self, id: BlockId, pending: Vec<PendingUse>) -> Vec<(SegId, usize)> {
        let Some(l) = self.live.remove(&id) else {
            return Vec::new();
        };
        let fits = self.cached_bytes.saturating_add(l.size as u64) <= self.max_cached;
        match l.bin {
            Some(bin) if fits => {
                let mut kept = Vec::new();
                merge_pending(&mut kept, pending);
                self.cached_bytes += l.size as u64;
                self.cached.entry(bin).or_default().push(Cached {
                    id,
                    seg: l.seg,
                    size: l.size,
                    zeroed: false,
                    pending: kept,
                });
                Vec::new()
            }
            _ => vec![(l.seg, l.size)],
        }
    }

    /// Removes cached blocks (largest bins first) until at most `keep` bytes stay cached.
    /// Blocks with uses in flight are waited for when `wait`, else skipped.
    pub(crate) fn release_free_segments(&mut self, wait: bool, keep: u64) -> Vec<(SegId, usize)> {
        let mut out = Vec::new();
        for list in self.cached.values_mut().rev() {
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
                out.push((c.seg, c.size));
            }
        }
        self.cached.retain(|_, l| !l.is_empty());
        out
    }

    /// Bytes in cached blocks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Size of the largest cached block.
    pub(crate) fn largest_free(&self) -> u64 {
        self.cached
            .values()
            .rev()
            .find_map(|l| l.first().map(|c| c.size as u64))
            .unwrap_or(0)
    }
}
