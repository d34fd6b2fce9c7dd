//! The process-wide reading of every counter: [`Snapshot`], what [`crate::stats`] returns
//! (host memory, each device's memory, copies, waits, and the statistics of every pool).
//!
//! It sits above both the counters ([`super::stats`]) and the pools ([`super::pool`]): neither
//! of them names it.

use std::fmt;

use serde::Serialize;

use super::pool::PoolStats;
use super::stats::{human_bytes, CopyStats, MemStats};

#[cfg(doc)]
use super::stats::host_waits;

/// A reading of every counter in the process: see [`crate::stats`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Snapshot {
    /// Host memory (aligned host allocator).
    pub host: MemStats,
    /// One entry per device memory space opened so far (device memory, then pinned host memory).
    pub devices: Vec<MemStats>,
    /// All copies made through syncmem streams.
    pub copies: CopyStats,
    /// Host waits on device work so far ([`host_waits`]).
    pub host_waits: u64,
    /// Caching pools: the host pool, then each device's device pool and pinned host pool
    /// (pools not used yet are left out).
    #[serde(serialize_with = "pool_reports")]
    pub pools: Vec<PoolStats>,
}

/// Serializes the pools with their derived figures (see [`PoolStats::to_json`]).
fn pool_reports<S: serde::Serializer>(pools: &[PoolStats], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(pools.iter().map(PoolStats::report))
}

impl Snapshot {
    /// Every counter as one JSON object: `host`, `devices`, `copies`, `pools`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<22} {:>12} {:>12} {:>9} {:>9}",
            "memory", "in use", "peak", "allocs", "frees"
        )?;
        for m in std::iter::once(&self.host).chain(self.devices.iter()) {
            writeln!(
                f,
                "{:<22} {:>12} {:>12} {:>9} {:>9}",
                m.label,
                human_bytes(m.in_use),
                human_bytes(m.peak),
                m.allocs,
                m.frees
            )?;
        }
        writeln!(f, "copies")?;
        write!(f, "{}", self.copies)?;
        writeln!(f, "host waits on device work: {}", self.host_waits)?;
        if self.pools.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "{:<16} {:>7} {:>21} {:>21} {:>8} {:>8} {:>8} {:>11} {:>10} {:>5}",
            "pool",
            "kind",
            "allocated (peak)",
            "reserved (peak)",
            "allocs",
            "frees",
            "hits",
            "backend a/f",
            "largest",
            "frag"
        )?;
        for p in &self.pools {
            writeln!(
                f,
                "{:<16} {:>7} {:>21} {:>21} {:>8} {:>8} {:>8} {:>11} {:>10} {:>5.2}",
                p.label,
                p.kind.as_str(),
                format!(
                    "{} ({})",
                    human_bytes(p.allocated.current),
                    human_bytes(p.allocated.peak)
                ),
                format!(
                    "{} ({})",
                    human_bytes(p.reserved.current),
                    human_bytes(p.reserved.peak)
                ),
                p.allocations,
                p.frees,
                p.cache_hits,
                format!("{}/{}", p.backend_allocs, p.backend_frees),
                human_bytes(p.largest_free_block),
                p.fragmentation()
            )?;
        }
        for line in POOL_LEGEND {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The legend under the pool table of [`Snapshot`]'s `Display`.
const POOL_LEGEND: [&str; 5] = [
    "  hits: allocations served from cached blocks, without a backend call",
    "  backend a/f: segments made by the backend / given back to it",
    "  largest: the largest free block in the pool (the biggest request it serves without",
    "    a backend call); frag: fragmentation of the free bytes, 1 - largest / free",
    "    (0: the free memory is one block; near 1: it is scattered in small blocks)",
];
