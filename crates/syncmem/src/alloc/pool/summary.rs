//! [`MemorySummary`]: the figures of one pool as `torch.cuda.memory_summary()` shows them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::PoolKind;
use super::stats::{Gauge, PoolStats};
use crate::alloc::stats::human_bytes;

/// One byte statistic for all blocks, and for small and large blocks apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizeSplit {
    /// All blocks.
    pub all: Gauge,
    /// Small blocks (up to [`MemorySummary::small_size`]).
    pub small: Gauge,
    /// Large blocks.
    pub large: Gauge,
}

/// A count for all segments, and for those of small and large blocks apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CountSplit {
    /// All.
    pub all: u64,
    /// Serving small blocks.
    pub small: u64,
    /// Serving large blocks.
    pub large: u64,
}

/// The memory summary of one pool, built from its [`PoolStats`] ([`PoolStats::summary`]):
/// allocated, requested, reserved and inactive-split bytes, each current, peak and
/// cumulative (allocated and freed), for all blocks and for small and large blocks apart, then
/// the counts. `Display` prints it as a table with a legend; it serializes to the same figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemorySummary {
    /// The pool's label.
    pub label: String,
    /// The pool's kind.
    pub kind: PoolKind,
    /// Blocks up to this many bytes are small.
    pub small_size: u64,
    /// Bytes in blocks handed out (requests rounded up to the pool's block sizes).
    pub allocated: SizeSplit,
    /// Bytes callers asked for.
    pub requested: SizeSplit,
    /// Bytes in segments held from the backend.
    pub reserved: SizeSplit,
    /// Bytes in cached free blocks inside segments that also hold other blocks (see
    /// [`PoolStats::inactive_split`]).
    pub inactive_split: SizeSplit,
    /// Segments held now.
    pub segments: CountSplit,
    /// Blocks handed out.
    pub allocations: u64,
    /// Blocks given back.
    pub frees: u64,
    /// Allocations served from cached memory.
    pub cache_hits: u64,
    /// Segments made by the backend.
    pub backend_allocs: u64,
    /// Segments given back to the backend.
    pub backend_frees: u64,
    /// Allocations retried after freeing cached blocks or clean mirrors.
    pub alloc_retries: u64,
    /// Allocations that failed for good.
    pub ooms: u64,
    /// Free bytes inside reserved segments.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    /// The memory cap, if any.
    pub cap: Option<u64>,
    /// Bytes of direct (unpooled) allocations counted against the same cap.
    pub direct_bytes: u64,
    /// Bytes of blocks spilled in place ([`PoolStats::parked_bytes`]): reserved, not charged
    /// to the cap.
    #[serde(default)]
    pub parked_bytes: u64,
}

impl PoolStats {
    /// The figures as `torch.cuda.memory_summary()` shows them (`Display` prints the table).
    pub fn summary(&self) -> MemorySummary {
        let split = |all: Gauge, small: Gauge, large: Gauge| SizeSplit { all, small, large };
        MemorySummary {
            label: self.label.clone(),
            kind: self.kind,
            small_size: self.small_size,
            allocated: split(self.allocated, self.small.allocated, self.large.allocated),
            requested: split(self.requested, self.small.requested, self.large.requested),
            reserved: split(self.reserved, self.small.reserved, self.large.reserved),
            inactive_split: split(
                self.inactive_split,
                self.small.inactive_split,
                self.large.inactive_split,
            ),
            segments: CountSplit {
                all: self.segments,
                small: self.small.segments,
                large: self.large.segments,
            },
            allocations: self.allocations,
            frees: self.frees,
            cache_hits: self.cache_hits,
            backend_allocs: self.backend_allocs,
            backend_frees: self.backend_frees,
            alloc_retries: self.alloc_retries,
            ooms: self.ooms,
            free_bytes: self.free_bytes,
            largest_free_block: self.largest_free_block,
            cap: self.cap,
            direct_bytes: self.direct_bytes,
            parked_bytes: self.parked_bytes,
        }
    }
}

impl MemorySummary {
    /// The summary as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Width of the table, between its borders.
const WIDTH: usize = 76;

fn rule(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    writeln!(f, "|{}|", c.to_string().repeat(WIDTH))
}

fn line(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    writeln!(f, "| {text:<w$} |", w = WIDTH - 2)
}

fn row(f: &mut fmt::Formatter<'_>, name: &str, g: Gauge) -> fmt::Result {
    let cells = [g.current, g.peak, g.allocated, g.freed].map(human_bytes);
    line(
        f,
        &format!(
            "{name:<22}{:>13}{:>13}{:>13}{:>13}",
            cells[0], cells[1], cells[2], cells[3]
        ),
    )
}

impl fmt::Display for MemorySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        rule(f, '=')?;
        line(
            f,
            &format!("memory summary of pool {} ({})", self.label, self.kind),
        )?;
        rule(f, '-')?;
        self.write_gauges(f)?;
        rule(f, '-')?;
        self.write_counts(f)?;
        rule(f, '=')?;
        self.write_legend(f)
    }
}

impl MemorySummary {
    /// The table of bytes: current, peak, allocated and freed, of every kind of byte, in all
    /// and for small and large blocks.
    fn write_gauges(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        line(
            f,
            &format!(
                "{:<22}{:>13}{:>13}{:>13}{:>13}",
                "", "current", "peak", "allocated", "freed"
            ),
        )?;
        for (name, s) in [
            ("allocated bytes", self.allocated),
            ("requested bytes", self.requested),
            ("reserved bytes", self.reserved),
            ("inactive split bytes", self.inactive_split),
        ] {
            rule(f, '-')?;
            row(f, name, s.all)?;
            row(f, "  small blocks", s.small)?;
            row(f, "  large blocks", s.large)?;
        }
        Ok(())
    }

    /// The counts under the table: segments, blocks, cache hits, backend calls, free memory,
    /// retries, out-of-memory failures, the cap, direct allocations.
    fn write_counts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hits = if self.allocations == 0 {
            0.0
        } else {
            100.0 * self.cache_hits as f64 / self.allocations as f64
        };
        line(
            f,
            &format!(
                "segments {} (small {}, large {}); blocks handed out {}, given back {}",
                self.segments.all,
                self.segments.small,
                self.segments.large,
                self.allocations,
                self.frees
            ),
        )?;
        line(
            f,
            &format!(
                "cache hits {} ({hits:.0} %); backend allocations {}, frees {}",
                self.cache_hits, self.backend_allocs, self.backend_frees
            ),
        )?;
        line(
            f,
            &format!(
                "free {}; largest free block {}",
                human_bytes(self.free_bytes),
                human_bytes(self.largest_free_block),
            ),
        )?;
        let cap = self.cap.map_or_else(|| "none".to_string(), human_bytes);
        line(
            f,
            &format!(
                "retries {}; out of memory {}; cap {cap}",
                self.alloc_retries, self.ooms
            ),
        )?;
        if self.direct_bytes > 0 {
            line(
                f,
                &format!(
                    "direct allocations outside the pool: {}",
                    human_bytes(self.direct_bytes)
                ),
            )?;
        }
        if self.parked_bytes > 0 {
            let parked = human_bytes(self.parked_bytes);
            line(
                f,
                &format!("spilled in place (reserved, not charged): {parked}"),
            )?;
        }
        Ok(())
    }

    /// The legend under the table.
    fn write_legend(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let small = human_bytes(self.small_size);
        let legend = [
            (
                "current, peak",
                "bytes now; the most at once since the pool was made or its peak reset".to_string(),
            ),
            (
                "allocated, freed",
                "bytes added and removed in all since the pool was made (never reset)".into(),
            ),
            (
                "allocated bytes",
                "blocks handed out: requests rounded up to the pool's block sizes".into(),
            ),
            ("requested bytes", "what the callers asked for".into()),
            (
                "reserved bytes",
                "segments held from the backend: blocks handed out and cached".into(),
            ),
            (
                "inactive split bytes",
                "cached free blocks in segments that also hold other blocks: not given back \
                 to the backend, and usable only by requests they fit"
                    .into(),
            ),
            (
                "small, large blocks",
                format!("blocks up to {small} (the small pool), and larger ones"),
            ),
        ];
        writeln!(f, "legend:")?;
        for (name, text) in legend {
            legend_entry(f, name, &text)?;
        }
        Ok(())
    }
}

/// One entry of the legend: `text` wrapped to the table's width, continuation lines under the
/// text.
fn legend_entry(f: &mut fmt::Formatter<'_>, name: &str, text: &str) -> fmt::Result {
    let mut first = true;
    let mut cur = String::new();
    for word in text.split(' ') {
        if !cur.is_empty() && cur.len() + 1 + word.len() > WIDTH - 22 {
            let label = if first { name } else { "" };
            writeln!(f, "  {label:<21} {cur}")?;
            first = false;
            cur.clear();
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    let label = if first { name } else { "" };
    writeln!(f, "  {label:<21} {cur}")
}
