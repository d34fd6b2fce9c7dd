//! Pool configuration: the pool kinds, their sizes and limits, and the environment variables
//! that select them (in the spirit of `PYTORCH_CUDA_ALLOC_CONF`).
//!
//! | variable | applies to | value |
//! |---|---|---|
//! | `SYNCMEM_DEVICE_POOL` | every device pool | `none`, `binned` or `caching` (default) |
//! | `SYNCMEM_POOL_CONF` | every device pool | `key=value` list, see [`PoolConfig::apply`] |
//! | `SYNCMEM_HOST_POOL` / `SYNCMEM_HOST_POOL_CONF` | the host pool | as above |
//! | `SYNCMEM_PINNED_POOL` / `SYNCMEM_PINNED_POOL_CONF` | every pinned host pool | as above |
//!
//! Example: `SYNCMEM_DEVICE_POOL=caching SYNCMEM_POOL_CONF="memory_cap=64MiB,max_split_size_mb=256"`.
//!
//! Two keys act when the pool is made and after it grows rather than on each request:
//!
//! - `preallocate=SIZE|PERCENT` ([`PoolConfig::preallocate`]): reserves that much at once, as
//!   cached free segments that later allocations are served from (JAX's preallocation).
//!   A percentage is of the cap when the pool has one (its own `memory_cap`, or for a
//!   [`crate::device::MemPool`] its device's), else of the device's total memory. Caching
//!   pools only.
//! - `gc_threshold=F` ([`PoolConfig::gc_threshold`], `0 < F < 1`): after an allocation that
//!   made a segment, while the bytes reserved under the cap exceed `F x cap`, idle cached
//!   segments are given back, largest first (PyTorch's `garbage_collection_threshold`). It
//!   needs a cap: in the environment, a `memory_cap` in the same list.
//!
//! All six variables are checked once per process, when the first device opens
//! ([`crate::Device::open`], [`crate::Device::all`]) or a device builds its first pool: an
//! invalid one is an [`Error::InvalidConfig`] naming it, even if its pool is never used.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

mod env;
mod parse;

pub use env::{check_env, device_pool_from_env};
pub use parse::parse_size;

/// Selects the device pool kind (`none`, `binned`, `caching`).
pub const DEVICE_POOL_ENV: &str = "SYNCMEM_DEVICE_POOL";
/// Options of the device pools (`key=value,key=value`).
pub const DEVICE_POOL_CONF_ENV: &str = "SYNCMEM_POOL_CONF";
/// Selects the host pool kind.
pub const HOST_POOL_ENV: &str = "SYNCMEM_HOST_POOL";
/// Options of the host pool.
pub const HOST_POOL_CONF_ENV: &str = "SYNCMEM_HOST_POOL_CONF";
/// Selects the pinned host pool kind.
pub const PINNED_POOL_ENV: &str = "SYNCMEM_PINNED_POOL";
/// Options of the pinned host pools.
pub const PINNED_POOL_CONF_ENV: &str = "SYNCMEM_PINNED_POOL_CONF";

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// How a pool serves requests.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PoolKind {
    /// No caching: every request is one backend allocation, freed when released.
    None,
    /// CUB's caching allocator: geometric bins, reuse within a bin, no splitting.
    Binned,
    /// PyTorch's caching allocator: best fit with block splitting and merging.
    #[default]
    Caching,
}

impl PoolKind {
    /// `none`, `binned` or `caching`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::None => "none",
            PoolKind::Binned => "binned",
            PoolKind::Caching => "caching",
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PoolKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "direct" => Ok(PoolKind::None),
            "binned" | "cub" => Ok(PoolKind::Binned),
            "caching" | "native" | "thc" | "" => Ok(PoolKind::Caching),
            other => Err(invalid(
                "pool kind",
                format!("{other:?}: expected none, binned or caching"),
            )),
        }
    }
}

/// A limit on the memory a device (or the host) may reserve.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum MemoryCap {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction (0, 1] of the memory the device reports.
    Fraction(f64),
}

impl MemoryCap {
    /// The cap in bytes for a device with `total` bytes of memory.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            MemoryCap::Bytes(b) => b,
            MemoryCap::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

/// Everything a pool can be told. Build with [`PoolConfig::new`] (or `default()`, a caching
/// pool) and the `with_*` methods, or from a `key=value` list with [`PoolConfig::apply`].
///
/// The defaults are PyTorch's where they fit a pool that starts small: caching rounds to 512 B
/// and splits at 1 MiB as PyTorch does, but its segments grow from 16 KiB with demand (up to
/// PyTorch's 2 MiB and 20 MiB); binned has bins of 256 B to 1 GiB with 4 steps per power of
/// two (PyTorch's `roundup_power2_divisions`), and keeps at most 10 GiB cached, as CUB's.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// The kind of pool.
    pub kind: PoolKind,
    /// Caching: every request is rounded up to a multiple of this (a power of two; devices raise
    /// it to their sub-buffer alignment). Default 512 B.
    pub round: usize,
    /// Caching: requests up to this size use the small pool. Default 1 MiB.
    pub small_size: usize,
    /// Caching: freed blocks up to this size go on exact-size free lists per stream, reused in
    /// O(1) by the next request of the same size on that stream (capped at
    /// [`PoolConfig::small_size`]; 0: every block goes through the best-fit arena). Default
    /// 1 MiB.
    pub size_class_limit: usize,
    /// Caching: the smallest segment asked of the backend (the first segments of a pool that
    /// starts small), capped by [`PoolConfig::small_segment`] and
    /// [`PoolConfig::large_segment`] and rounded up to [`PoolConfig::round`]: set it to
    /// `large_segment` or more for PyTorch's fixed segment sizes. Default 16 KiB.
    pub min_segment: usize,
    /// Caching: a new segment is at least this percentage of what its pool (small or large)
    /// already reserves, so segments grow with demand (0: every segment is
    /// [`PoolConfig::min_segment`], capped). Default 6.
    pub segment_growth_percent: u32,
    /// Before a pool grows, it gives back idle memory the request cannot use (caching: wholly
    /// free segments of the request's pool; binned: cached blocks of other bins) that no
    /// pending work needs, while that memory exceeds this percentage of the bytes handed out.
    /// `None`: never (PyTorch and CUB keep it). Default 6.
    pub max_idle_percent: Option<u32>,
    /// Caching: the largest segment made for small requests (segments grow up to it).
    /// Default 2 MiB.
    pub small_segment: usize,
    /// Caching: the largest segment made for large requests below
    /// [`PoolConfig::large_segment_limit`] (segments grow up to it). Default 20 MiB.
    pub large_segment: usize,
    /// Caching: large requests from this size get a segment of their own size rounded up to
    /// [`PoolConfig::segment_round`]. Default 10 MiB.
    pub large_segment_limit: usize,
    /// Caching: rounding of segments for big requests. Default 2 MiB.
    pub segment_round: usize,
    /// Caching: blocks larger than this are never split (`None`: no limit, the default). Must
    /// exceed [`PoolConfig::large_segment`].
    pub max_split_size: Option<usize>,
    /// Caching: with a split limit, a request above it may take an unsplittable block at most
    /// this much larger than itself. Default 20 MiB.
    pub max_non_split_rounding: usize,
    /// Binned: ratio between consecutive main bin sizes. Default 2.
    pub bin_growth: u32,
    /// Binned: smallest bin is `bin_growth^min_bin` bytes. Default 8 (256 B).
    pub min_bin: u32,
    /// Binned: largest bin is `bin_growth^max_bin` bytes; larger requests are not cached.
    /// Default 30 (1 GiB).
    pub max_bin: u32,
    /// Binned: each step from `bin_growth^k` to `bin_growth^(k+1)` is divided into this many
    /// equal steps, as PyTorch's `roundup_power2_divisions` (4: 1024, 1280, 1536, 1792, 2048,
    /// ...; 1: CUB's geometric bins). Default 4.
    pub bin_divisions: u32,
    /// Most bytes kept in free cached blocks; above it, freed memory goes back to the backend.
    /// `None`: the kind's default (binned 10 GiB, caching unlimited).
    pub max_cached_bytes: Option<u64>,
    /// Most bytes the pool (plus direct allocations of the same device) may reserve. `None`:
    /// only the backend limits it. A cap of 0 bytes (or 0%) is invalid.
    pub memory_cap: Option<MemoryCap>,
    /// Bytes reserved when the pool is made, as cached free segments that allocations are
    /// served from (JAX's preallocation): split evenly over the shards; in each, one small
    /// segment of [`PoolConfig::small_segment`] when the share is at least four of them, and
    /// the rest in large segments no larger than the device's largest allocation. Counted in
    /// the statistics ([`crate::alloc::pool::PoolStats::preallocated_bytes`], `reserved`,
    /// `backend_allocs`); [`crate::alloc::pool::Pool::empty_cache`] gives it back like any
    /// cached memory. Caching pools only. `None` (the default): nothing.
    pub preallocate: Option<Preallocation>,
    /// After an allocation that made a new segment, while the bytes reserved under the cap
    /// exceed this fraction of it (`0 < F < 1`), the pool gives back its idle cached segments,
    /// largest first (PyTorch's `garbage_collection_threshold`), counted in
    /// [`crate::alloc::pool::PoolStats::gc_releases`]. Needs a cap. `None` (the default): never.
    pub gc_threshold: Option<f64>,
    /// Shards: independent parts of the pool, each with its own lock, segments and cache; a
    /// thread allocates from the shard of its index (see [`crate::alloc::pool::Pool`]'s
    /// notes on shards). One shard: one lock for all threads and exact peaks under any
    /// threading. `0` (the default): one per core the process may use, at most
    /// [`MAX_AUTO_SHARDS`]. `max_cached_bytes` applies to each shard; the memory cap to all
    /// of them together.
    pub shards: usize,
    /// Bytes each thread may keep of its own frees, to serve its next requests of the same
    /// length without touching a shard (see `alloc::pool::tcache`'s notes): allocations of
    /// caching pools, small blocks only, at most 32 blocks; on the host, allocations without
    /// an owner's name; a device block, named or not, only when freed with no work in
    /// flight, for its own stream's requests.
    /// Blocks a thread keeps read as free in the statistics. While the pool's events are seen
    /// (an observer, a trace) the caches stand aside; while only the history records, a device
    /// pool's keep serving and write their events into it, a host pool's stand aside. `0`: no
    /// thread cache.
    /// Default 256 KiB.
    pub thread_cache: usize,
}

/// The most shards `shards = 0` gives a pool.
pub const MAX_AUTO_SHARDS: usize = 8;
/// The most shards a pool may have.
pub const MAX_SHARDS: usize = 1024;

impl Default for PoolConfig {
    fn default() -> Self {
        Self::new(PoolKind::Caching)
    }
}

impl PoolConfig {
    /// The defaults for a pool of `kind`.
    pub fn new(kind: PoolKind) -> Self {
        Self {
            kind,
            round: 512,
            small_size: MIB as usize,
            size_class_limit: MIB as usize,
            min_segment: 16 * KIB as usize,
            segment_growth_percent: 6,
            max_idle_percent: Some(6),
            small_segment: 2 * MIB as usize,
            large_segment: 20 * MIB as usize,
            large_segment_limit: 10 * MIB as usize,
            segment_round: 2 * MIB as usize,
            max_split_size: None,
            max_non_split_rounding: 20 * MIB as usize,
            bin_growth: 2,
            min_bin: 8,
            max_bin: 30,
            bin_divisions: 4,
            max_cached_bytes: None,
            memory_cap: None,
            preallocate: None,
            gc_threshold: None,
            shards: 0,
            thread_cache: 256 * KIB as usize,
        }
    }

    /// Sets the memory reserved when the pool is made (see [`PoolConfig::preallocate`]).
    pub fn with_preallocate(mut self, amount: Preallocation) -> Self {
        self.preallocate = Some(amount);
        self
    }

    /// Sets the garbage-collection threshold, a fraction of the cap in `(0, 1)` (see
    /// [`PoolConfig::gc_threshold`]).
    pub fn with_gc_threshold(mut self, fraction: f64) -> Self {
        self.gc_threshold = Some(fraction);
        self
    }

    /// Sets the memory cap.
    pub fn with_memory_cap(mut self, cap: MemoryCap) -> Self {
        self.memory_cap = Some(cap);
        self
    }

    /// Sets the split limit of the caching pool.
    pub fn with_max_split_size(mut self, bytes: usize) -> Self {
        self.max_split_size = Some(bytes);
        self
    }

    /// Sets the number of shards (`0`: one per core, at most [`MAX_AUTO_SHARDS`]).
    pub fn with_shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// Sets the bytes of each thread's cache (`0`: none; see [`PoolConfig::thread_cache`]).
    pub fn with_thread_cache(mut self, bytes: usize) -> Self {
        self.thread_cache = bytes;
        self
    }

    /// The number of shards in effect: [`PoolConfig::shards`], or one per core the process
    /// may use (at most [`MAX_AUTO_SHARDS`]) when it is 0.
    pub fn effective_shards(&self) -> usize {
        match self.shards {
            0 => std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(MAX_AUTO_SHARDS),
            n => n.min(MAX_SHARDS),
        }
    }

    /// Sets the cap on cached free bytes.
    pub fn with_max_cached_bytes(mut self, bytes: u64) -> Self {
        self.max_cached_bytes = Some(bytes);
        self
    }

    /// Sets geometric bins for the binned pool, as CUB's: `growth^min_bin` to
    /// `growth^max_bin` bytes, no divisions between them (see [`PoolConfig::with_bin_divisions`]).
    pub fn with_bins(mut self, growth: u32, min_bin: u32, max_bin: u32) -> Self {
        self.bin_growth = growth;
        self.min_bin = min_bin;
        self.max_bin = max_bin;
        self.bin_divisions = 1;
        self
    }

    /// Divides each step between the binned pool's geometric bins into `divisions` equal steps.
    pub fn with_bin_divisions(mut self, divisions: u32) -> Self {
        self.bin_divisions = divisions;
        self
    }

    /// Sets the largest block the caching pool keeps on exact-size free lists (0: none).
    pub fn with_size_class_limit(mut self, bytes: usize) -> Self {
        self.size_class_limit = bytes;
        self
    }

    /// Sets how the caching pool's segments grow: the smallest segment, and the percentage of
    /// the pool's reserved bytes a new segment has at least.
    pub fn with_segment_growth(mut self, min_segment: usize, percent: u32) -> Self {
        self.min_segment = min_segment;
        self.segment_growth_percent = percent;
        self
    }

    /// Sets how much idle memory a pool keeps when it grows (`None`: all of it).
    pub fn with_max_idle_percent(mut self, percent: Option<u32>) -> Self {
        self.max_idle_percent = percent;
        self
    }

    /// The cap on cached free bytes in effect (the kind's default when unset).
    pub fn effective_max_cached_bytes(&self) -> u64 {
        match (self.max_cached_bytes, self.kind) {
            (Some(b), _) => b,
            (None, PoolKind::Binned) => 10 * GIB,
            (None, _) => u64::MAX,
        }
    }

    /// Checks that the sizes fit together.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the offending option.
    pub fn validate(&self) -> Result<()> {
        let pow2 = |v: usize, what: &str| {
            if v == 0 || !v.is_power_of_two() {
                Err(invalid(what, format!("{v} is not a power of two")))
            } else {
                Ok(())
            }
        };
        pow2(self.round, "round")?;
        for (v, what) in [
            (self.small_segment, "small_segment"),
            (self.large_segment, "large_segment"),
            (self.segment_round, "segment_round"),
        ] {
            if v == 0 || v % self.round != 0 {
                return Err(invalid(
                    what,
                    format!("{v} is not a positive multiple of round ({})", self.round),
                ));
            }
        }
        if self.small_segment < self.small_size {
            return Err(invalid("small_segment", "smaller than small_size".into()));
        }
        if self.large_segment < self.large_segment_limit {
            return Err(invalid(
                "large_segment",
                "smaller than large_segment_limit".into(),
            ));
        }
        if let Some(m) = self.max_split_size {
            if m <= self.large_segment {
                return Err(invalid(
                    "max_split_size",
                    format!("{m} must exceed large_segment ({})", self.large_segment),
                ));
            }
        }
        if self.bin_growth < 2 {
            return Err(invalid("bin_growth", "must be at least 2".into()));
        }
        if !(1..=64).contains(&self.bin_divisions) {
            return Err(invalid("bin_divisions", "must be 1 to 64".into()));
        }
        if self.min_bin > self.max_bin {
            return Err(invalid("min_bin", "greater than max_bin".into()));
        }
        if u64::from(self.bin_growth)
            .checked_pow(self.max_bin)
            .is_none_or(|b| b > isize::MAX as u64)
        {
            return Err(invalid("max_bin", "bin_growth^max_bin overflows".into()));
        }
        match self.memory_cap {
            Some(MemoryCap::Fraction(f)) if !(f > 0.0 && f <= 1.0) => {
                return Err(invalid("memory_cap", format!("fraction {f} not in (0, 1]")));
            }
            // As `0%`: no memory at all is not a cap anyone means (`none` is no cap).
            Some(MemoryCap::Bytes(0)) => {
                return Err(invalid("memory_cap", "0 bytes: must be at least 1".into()));
            }
            _ => {}
        }
        self.validate_reserve()?;
        if self.shards > MAX_SHARDS {
            return Err(invalid(
                "shards",
                format!("{} is more than {MAX_SHARDS}", self.shards),
            ));
        }
        Ok(())
    }
}

impl PoolConfig {
    /// Checks `preallocate` and `gc_threshold` (a cap for the threshold is checked where the
    /// pool is made: see [`PoolConfig::check_gc_cap`]).
    fn validate_reserve(&self) -> Result<()> {
        match self.preallocate {
            Some(Preallocation::Fraction(f)) if !(f > 0.0 && f <= 1.0) => {
                return Err(invalid(
                    "preallocate",
                    format!("{}% not in (0, 100]", f * 100.0),
                ));
            }
            Some(_) if self.kind != PoolKind::Caching => {
                return Err(invalid(
                    "preallocate",
                    format!(
                        "needs the caching pool: a {} pool has no free segments to serve from",
                        self.kind
                    ),
                ));
            }
            _ => {}
        }
        match self.gc_threshold {
            Some(f) if !(f > 0.0 && f < 1.0) => Err(invalid(
                "gc_threshold",
                format!("{f} not in (0, 1): a fraction of the memory cap"),
            )),
            _ => Ok(()),
        }
    }

    /// Checks that a `gc_threshold` has a cap to be a fraction of: `cap` is the cap the pool
    /// is made under (its own, or its device's), `None` when it has none.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `gc_threshold` when it is set without a cap.
    pub fn check_gc_cap(&self, cap: Option<u64>) -> Result<()> {
        if self.gc_threshold.is_some() && cap.is_none() {
            return Err(invalid(
                "gc_threshold",
                "needs a memory cap (memory_cap=SIZE|PERCENT): the threshold is a fraction of it"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// How much memory a pool reserves when it is made (see [`PoolConfig::preallocate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Preallocation {
    /// This many bytes.
    Bytes(u64),
    /// This fraction (0, 1] of the cap, or of the device's memory when there is no cap.
    Fraction(f64),
}

impl Preallocation {
    /// The bytes to reserve under `cap` (the cap in effect, if any) on a device with `total`
    /// bytes of memory.
    pub fn resolve(self, cap: Option<u64>, total: u64) -> u64 {
        match self {
            Preallocation::Bytes(b) => b,
            Preallocation::Fraction(f) => (cap.unwrap_or(total) as f64 * f) as u64,
        }
    }
}

/// An invalid option `what`, for `reason`.
fn invalid(what: &str, reason: String) -> Error {
    Error::InvalidConfig {
        what: what.to_string(),
        reason,
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
