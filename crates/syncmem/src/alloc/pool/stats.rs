//! Statistics of one pool: bytes (current, peak and cumulative; small and large blocks apart),
//! counts, cache hits, backend calls, the largest free block and fragmentation.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::PoolKind;
use crate::alloc::stats::human_bytes;

/// A byte count with its high-water mark and its cumulative movements (PyTorch's `current`,
/// `peak`, `allocated` and `freed` of a memory statistic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Gauge {
    /// Bytes now.
    pub current: u64,
    /// Highest `current` since creation or the last peak reset.
    pub peak: u64,
    /// Bytes added since creation (cumulative; never reset).
    pub allocated: u64,
    /// Bytes removed since creation (cumulative; never reset): `allocated - freed` is
    /// `current`.
    pub freed: u64,
}

impl Gauge {
    // On every allocation and free: kept to a few instructions (byte counts of one process
    // never reach 2^64, so the additions need no saturation).
    #[inline]
    pub(crate) fn add(&mut self, n: u64) {
        let current = self.current.wrapping_add(n);
        self.current = current;
        if current > self.peak {
            self.peak = current;
        }
        self.allocated = self.allocated.wrapping_add(n);
    }

    #[inline]
    pub(crate) fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed = self.freed.wrapping_add(n);
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Adds `other` (another shard's gauge): sums, and the sum of the peaks.
    pub(crate) fn absorb(&mut self, other: &Gauge) {
        self.current += other.current;
        self.peak += other.peak;
        self.allocated = self.allocated.wrapping_add(other.allocated);
        self.freed = self.freed.wrapping_add(other.freed);
    }
}

/// The byte gauges of one size class (small or large blocks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizeStats {
    /// Bytes in blocks handed out.
    pub allocated: Gauge,
    /// Bytes callers asked for.
    pub requested: Gauge,
    /// Bytes in segments held from the backend.
    pub reserved: Gauge,
    /// Bytes in free blocks inside segments that also hold other blocks (see
    /// [`PoolStats::inactive_split`]).
    pub inactive_split: Gauge,
    /// Segments held now.
    pub segments: u64,
    /// Blocks handed out, counted (PyTorch's `allocation` counts): current, peak, and the
    /// cumulative handed out (`allocated`) and given back (`freed`).
    #[serde(default)]
    pub block_count: Gauge,
    /// Segments held, counted (PyTorch's `segment` counts): current, peak, and the cumulative
    /// made (`allocated`) and given back (`freed`).
    #[serde(default)]
    pub segment_count: Gauge,
}

/// What a pool's callers hold of it: see [`super::Pool::usage`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolUsage {
    /// Bytes requested by the blocks handed out now.
    pub(crate) in_use: u64,
    /// The peak of `in_use` (the sum of the shards' peaks).
    pub(crate) peak: u64,
    /// Allocations.
    pub(crate) allocs: u64,
    /// Frees.
    pub(crate) frees: u64,
}

impl PoolUsage {
    /// This usage plus another pool's (peaks: their sum).
    pub(crate) fn fold(self, o: PoolUsage) -> Self {
        PoolUsage {
            in_use: self.in_use + o.in_use,
            peak: self.peak + o.peak,
            allocs: self.allocs + o.allocs,
            frees: self.frees + o.frees,
        }
    }

    /// This usage plus a shard's counters.
    pub(crate) fn plus(self, c: &Counters) -> Self {
        let requested = c.requested.all();
        PoolUsage {
            in_use: self.in_use + requested.current,
            peak: self.peak + requested.peak,
            allocs: self.allocs + c.allocations,
            frees: self.frees + c.frees,
        }
    }
}

/// A byte gauge kept for small and large blocks apart, with the peak of their sum: the figures
/// of both together are derived ([`SplitGauge::all`]), so an update touches one class and
/// one peak.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SplitGauge {
    /// `[small, large]`.
    class: [Gauge; 2],
    /// The highest sum of both classes' `current`.
    peak: u64,
}

impl SplitGauge {
    #[inline]
    pub(crate) fn add(&mut self, small: bool, n: u64) {
        self.class[usize::from(!small)].add(n);
        let total = self.class[0].current.wrapping_add(self.class[1].current);
        if total > self.peak {
            self.peak = total;
        }
    }

    #[inline]
    pub(crate) fn sub(&mut self, small: bool, n: u64) {
        self.class[usize::from(!small)].sub(n);
    }

    /// The small blocks' gauge.
    pub(crate) fn small(&self) -> Gauge {
        self.class[0]
    }

    /// The large blocks' gauge.
    pub(crate) fn large(&self) -> Gauge {
        self.class[1]
    }

    /// Both classes together.
    pub(crate) fn all(&self) -> Gauge {
        let [s, l] = self.class;
        Gauge {
            current: s.current + l.current,
            peak: self.peak,
            allocated: s.allocated.wrapping_add(l.allocated),
            freed: s.freed.wrapping_add(l.freed),
        }
    }

    pub(crate) fn reset_peak(&mut self) {
        self.class.iter_mut().for_each(Gauge::reset_peak);
        self.peak = self.class[0].current + self.class[1].current;
    }

    /// Whether adding `n` to `small`'s class would raise a peak (the class's, or that of both).
    fn would_raise_peak(&self, small: bool, n: u64) -> bool {
        let class = &self.class[usize::from(!small)];
        let total = self.class[0].current.wrapping_add(self.class[1].current);
        class.current.wrapping_add(n) > class.peak || total.wrapping_add(n) > self.peak
    }

    /// Folds in a thread cache's small blocks (see `tcache`): `added` more handed out and
    /// `removed` more given back than the shards counted; the peaks stay the shards'.
    pub(crate) fn fold_small(&mut self, added: u64, removed: u64) {
        let g = &mut self.class[0];
        g.current = g.current.wrapping_add(added).wrapping_sub(removed);
        g.allocated = g.allocated.wrapping_add(added);
        g.freed = g.freed.wrapping_add(removed);
    }

    /// Adds `other` (another shard's gauge), as [`Gauge::absorb`].
    pub(crate) fn absorb(&mut self, other: &SplitGauge) {
        for (a, b) in self.class.iter_mut().zip(&other.class) {
            a.absorb(b);
        }
        self.peak += other.peak;
    }
}

/// Live counters of a pool shard, kept under the shard's lock.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) allocated: SplitGauge,
    pub(crate) requested: SplitGauge,
    pub(crate) reserved: SplitGauge,
    /// Segments held: `[small, large]`.
    pub(crate) segments: [u64; 2],
    /// Blocks handed out, counted.
    pub(crate) block_count: SplitGauge,
    /// Segments held, counted.
    pub(crate) segment_count: SplitGauge,
    pub(crate) allocations: u64,
    pub(crate) frees: u64,
    pub(crate) cache_hits: u64,
    /// Of `cache_hits`, served by threads' caches (folded in on reading: see `tcache`).
    pub(crate) thread_cache_hits: u64,
    /// Bytes in threads' caches now (folded in on reading).
    pub(crate) thread_cached_bytes: u64,
    pub(crate) backend_allocs: u64,
    pub(crate) backend_frees: u64,
    pub(crate) alloc_retries: u64,
    pub(crate) ooms: u64,
    pub(crate) evictions: u64,
    pub(crate) evicted_bytes: u64,
    pub(crate) spills: u64,
    pub(crate) spilled_bytes: u64,
    pub(crate) refills: u64,
    pub(crate) refilled_bytes: u64,
    pub(crate) drops: u64,
    pub(crate) dropped_bytes: u64,
    pub(crate) gc_releases: u64,
    pub(crate) gc_released_bytes: u64,
    pub(crate) preallocated: u64,
}

impl Counters {
    /// Adds the counters of another shard (peaks: the sum of the shards' peaks).
    pub(crate) fn absorb(&mut self, o: &Counters) {
        for (a, b) in [
            (&mut self.allocated, &o.allocated),
            (&mut self.requested, &o.requested),
            (&mut self.reserved, &o.reserved),
            (&mut self.block_count, &o.block_count),
            (&mut self.segment_count, &o.segment_count),
        ] {
            a.absorb(b);
        }
        self.segments[0] += o.segments[0];
        self.segments[1] += o.segments[1];
        for (a, b) in [
            (&mut self.allocations, o.allocations),
            (&mut self.frees, o.frees),
            (&mut self.cache_hits, o.cache_hits),
            (&mut self.thread_cache_hits, o.thread_cache_hits),
            (&mut self.thread_cached_bytes, o.thread_cached_bytes),
            (&mut self.backend_allocs, o.backend_allocs),
            (&mut self.backend_frees, o.backend_frees),
            (&mut self.alloc_retries, o.alloc_retries),
            (&mut self.ooms, o.ooms),
            (&mut self.evictions, o.evictions),
            (&mut self.evicted_bytes, o.evicted_bytes),
            (&mut self.spills, o.spills),
            (&mut self.spilled_bytes, o.spilled_bytes),
            (&mut self.refills, o.refills),
            (&mut self.refilled_bytes, o.refilled_bytes),
            (&mut self.drops, o.drops),
            (&mut self.dropped_bytes, o.dropped_bytes),
            (&mut self.gc_releases, o.gc_releases),
            (&mut self.gc_released_bytes, o.gc_released_bytes),
            (&mut self.preallocated, o.preallocated),
        ] {
            *a = a.saturating_add(b);
        }
    }

    pub(crate) fn reset_peaks(&mut self) {
        self.allocated.reset_peak();
        self.requested.reset_peak();
        self.reserved.reset_peak();
        self.block_count.reset_peak();
        self.segment_count.reset_peak();
    }

    /// Whether handing out a block of `size` bytes (`requested` asked for) of size class
    /// `small` would raise a peak of the blocks handed out.
    pub(crate) fn would_raise_peak(&self, size: u64, requested: u64, small: bool) -> bool {
        self.allocated.would_raise_peak(small, size)
            || self.requested.would_raise_peak(small, requested)
            || self.block_count.would_raise_peak(small, 1)
    }

    /// Counts a block of `size` bytes (`requested` asked for) of size class `small` handed out.
    #[inline]
    pub(crate) fn on_alloc(&mut self, size: u64, requested: u64, small: bool) {
        self.allocated.add(small, size);
        self.requested.add(small, requested);
        self.block_count.add(small, 1);
    }

    /// Counts a block given back (as in [`Counters::on_alloc`]).
    #[inline]
    pub(crate) fn on_free(&mut self, size: u64, requested: u64, small: bool) {
        self.allocated.sub(small, size);
        self.requested.sub(small, requested);
        self.block_count.sub(small, 1);
    }

    /// Counts a segment of `size` bytes made (`add`) or given back.
    pub(crate) fn on_segment(&mut self, size: u64, small: bool, add: bool) {
        let i = usize::from(!small);
        if add {
            self.reserved.add(small, size);
            self.segment_count.add(small, 1);
            self.segments[i] += 1;
        } else {
            self.reserved.sub(small, size);
            self.segment_count.sub(small, 1);
            self.segments[i] -= 1;
        }
    }

    /// The figures of one size class, with `inactive_split` (kept by the core).
    pub(crate) fn size_stats(&self, small: bool, inactive_split: Gauge) -> SizeStats {
        let pick = |g: &SplitGauge| if small { g.small() } else { g.large() };
        SizeStats {
            allocated: pick(&self.allocated),
            requested: pick(&self.requested),
            reserved: pick(&self.reserved),
            inactive_split,
            segments: self.segments[usize::from(!small)],
            block_count: pick(&self.block_count),
            segment_count: pick(&self.segment_count),
        }
    }
}

/// A reading of one pool (see [`crate::stats`], [`crate::Device::pool_stats`]).
///
/// `allocated` counts whole blocks handed out (requests rounded up: 512-B multiples, a bin,
/// or a whole unsplit block); `requested` counts what callers asked for; `reserved` counts
/// segments held from the backend, so `reserved - allocated` is cached free memory, of which
/// `inactive_split` sits in segments that also hold other blocks. [`PoolStats::small`] and
/// [`PoolStats::large`] split the figures by block size (blocks up to
/// [`PoolStats::small_size`] bytes, and larger), as PyTorch's small and large pools;
/// [`PoolStats::summary`] prints them as `torch.cuda.memory_summary()` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolStats {
    /// Memory space: `host`, `opencl:0`, `opencl:0 pinned`, ...
    pub label: String,
    /// Pool kind.
    pub kind: PoolKind,
    /// Bytes in blocks handed out.
    pub allocated: Gauge,
    /// Bytes callers asked for.
    pub requested: Gauge,
    /// Bytes in segments held from the backend.
    pub reserved: Gauge,
    /// Bytes in free blocks inside segments that also hold other blocks: cached, but neither
    /// given back to the backend nor usable by a request larger than the block (PyTorch's
    /// inactive split blocks). Only the caching pool splits segments; elsewhere 0.
    pub inactive_split: Gauge,
    /// The figures of small blocks (the caching pool's small pool; elsewhere blocks up to
    /// [`PoolStats::small_size`]).
    pub small: SizeStats,
    /// The figures of large blocks.
    pub large: SizeStats,
    /// Blocks up to this many bytes are small.
    pub small_size: u64,
    /// Segments held now.
    pub segments: u64,
    /// Blocks handed out, counted: current, peak (of both size classes together), and the
    /// cumulative handed out and given back (PyTorch's `allocation` counts).
    #[serde(default)]
    pub block_count: Gauge,
    /// Segments held, counted: current, peak, and the cumulative made and given back
    /// (PyTorch's `segment` counts).
    #[serde(default)]
    pub segment_count: Gauge,
    /// Blocks handed out.
    pub allocations: u64,
    /// Blocks given back.
    pub frees: u64,
    /// Allocations served from cached memory (no backend call).
    pub cache_hits: u64,
    /// Of `cache_hits`, those served from a thread's own cache (see
    /// [`crate::PoolConfig::thread_cache`]), without touching a shard.
    #[serde(default)]
    pub thread_cache_hits: u64,
    /// Bytes of blocks held in the threads' caches now (free blocks, counted neither in
    /// `allocated` nor in `free_bytes`: they stay in the threads' caches until reused, or
    /// until a release, a snapshot or the thread's end gives them back).
    #[serde(default)]
    pub thread_cached_bytes: u64,
    /// Backend allocations (segments made).
    pub backend_allocs: u64,
    /// Backend frees (segments released).
    pub backend_frees: u64,
    /// Free bytes inside reserved segments (cached).
    pub free_bytes: u64,
    /// Largest free block: the biggest request served without a backend call (a binned pool
    /// only serves it to requests of the same bin).
    pub largest_free_block: u64,
    /// Allocations that failed once and were retried after freeing cache or mirrors.
    pub alloc_retries: u64,
    /// Allocations that failed for good (out of memory).
    pub ooms: u64,
    /// Clean device mirrors dropped to make room.
    pub evictions: u64,
    /// Bytes of the mirrors dropped.
    pub evicted_bytes: u64,
    /// Dirty device mirrors written back to the host and freed to make room (spills).
    pub spills: u64,
    /// Bytes of the mirrors spilled.
    pub spilled_bytes: u64,
    /// Spilled mirrors brought back to the device by their next device access (refills).
    pub refills: u64,
    /// Bytes brought back.
    pub refilled_bytes: u64,
    /// Device mirrors of dead values (a running net's schedule overwrites them next) freed to
    /// make room without a write-back; their head became [`crate::Head::Dropped`].
    #[serde(default)]
    pub drops: u64,
    /// Bytes of the dead mirrors dropped.
    #[serde(default)]
    pub dropped_bytes: u64,
    /// Idle cached segments given back by the garbage collector (see
    /// [`crate::alloc::pool::PoolConfig::gc_threshold`]).
    #[serde(default)]
    pub gc_releases: u64,
    /// Bytes of the segments the garbage collector gave back.
    #[serde(default)]
    pub gc_released_bytes: u64,
    /// Bytes reserved when the pool was made (see
    /// [`crate::alloc::pool::PoolConfig::preallocate`]).
    #[serde(default)]
    pub preallocated_bytes: u64,
    /// Bytes of blocks spilled in place (parked): zero-copy buffers whose memory the host
    /// keeps using while the cap no longer counts it, until their next device access charges
    /// it again (see [`crate::SyncedMemory::offload`]). `reserved` exceeds the bytes charged
    /// to the cap by this much.
    #[serde(default)]
    pub parked_bytes: u64,
    /// Most bytes the pool plus direct allocations may reserve, if capped.
    pub cap: Option<u64>,
    /// Bytes of direct (unpooled) allocations counted against the same cap (devices only).
    pub direct_bytes: u64,
}

/// [`PoolStats`] with its derived figures, as serialized in reports.
#[derive(Serialize)]
pub(crate) struct PoolReport<'a> {
    #[serde(flatten)]
    stats: &'a PoolStats,
    /// [`PoolStats::fragmentation`].
    fragmentation: f64,
}

impl PoolStats {
    /// The statistics and their derived figures (`fragmentation`), ready to serialize.
    pub(crate) fn report(&self) -> PoolReport<'_> {
        PoolReport {
            stats: self,
            fragmentation: self.fragmentation(),
        }
    }

    /// The statistics as one JSON object (every field, and `fragmentation`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.report()).unwrap_or_default()
    }

    /// `1 - largest_free_block / free_bytes`: 0 when the free memory is one block (or nothing
    /// is free), near 1 when it is scattered in small pieces.
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }

    /// Share of allocations served from the cache (0 when none were made).
    pub fn hit_rate(&self) -> f64 {
        if self.allocations == 0 {
            0.0
        } else {
            self.cache_hits as f64 / self.allocations as f64
        }
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cap = self.cap.map_or_else(|| "none".to_string(), human_bytes);
        writeln!(f, "pool {} ({}), cap {cap}", self.label, self.kind)?;
        writeln!(
            f,
            "  allocated {} (peak {}), requested {} (peak {}), reserved {} (peak {}) in {} segment(s)",
            human_bytes(self.allocated.current),
            human_bytes(self.allocated.peak),
            human_bytes(self.requested.current),
            human_bytes(self.requested.peak),
            human_bytes(self.reserved.current),
            human_bytes(self.reserved.peak),
            self.segments
        )?;
        writeln!(
            f,
            "  {} allocations, {} frees, {} cache hits ({:.0} %), backend {} allocs / {} frees",
            self.allocations,
            self.frees,
            self.cache_hits,
            self.hit_rate() * 100.0,
            self.backend_allocs,
            self.backend_frees
        )?;
        write!(
            f,
            "  free {}, largest free block {}, fragmentation {:.2}; {} retries, {} OOMs, \
             {} evictions ({})",
            human_bytes(self.free_bytes),
            human_bytes(self.largest_free_block),
            self.fragmentation(),
            self.alloc_retries,
            self.ooms,
            self.evictions,
            human_bytes(self.evicted_bytes)
        )?;
        if self.drops > 0 {
            write!(
                f,
                "; {} dead dropped ({})",
                self.drops,
                human_bytes(self.dropped_bytes)
            )?;
        }
        if self.spills + self.refills > 0 {
            write!(
                f,
                "; {} spills ({}), {} refills ({})",
                self.spills,
                human_bytes(self.spilled_bytes),
                self.refills,
                human_bytes(self.refilled_bytes)
            )?;
        }
        if self.direct_bytes > 0 {
            write!(f, "; direct {}", human_bytes(self.direct_bytes))?;
        }
        if self.parked_bytes > 0 {
            let parked = human_bytes(self.parked_bytes);
            write!(f, "; parked {parked} (reserved, not charged to the cap)")?;
        }
        if self.preallocated_bytes > 0 {
            write!(f, "; preallocated {}", human_bytes(self.preallocated_bytes))?;
        }
        if self.gc_releases > 0 {
            write!(
                f,
                "; gc released {} segment(s) ({})",
                self.gc_releases,
                human_bytes(self.gc_released_bytes)
            )?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
