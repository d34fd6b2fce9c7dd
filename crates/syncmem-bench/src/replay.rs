//! Replays of the training traces shipped with syncmem (`syncmem train`, one epoch, hidden
//! widths 64, 256 and 1024, on `opencl:0`): how much memory each pool kind reserves for what
//! the program asked for, against the goals (device pool: at most 1.10x; host pool: at most
//! 128 KiB beyond).

use serde::Serialize;

use syncmem::report::{replay_with, ReplayOptions, Trace};
use syncmem::{PoolConfig, PoolKind, Result};

/// Goal of a device pool: peak reserved / peak requested at most this.
pub const DEVICE_RATIO_GOAL: f64 = 1.10;
/// Goal of a host pool: peak reserved at most this many bytes beyond the peak requested.
pub const HOST_SLACK_GOAL: u64 = 128 << 10;

/// The traces: a name and the JSON lines.
pub const TRACES: [(&str, &str); 3] = [
    (
        "train h64",
        include_str!("../../syncmem/tests/fixtures/traces/train-h64-opencl0.jsonl"),
    ),
    (
        "train h256",
        include_str!("../../syncmem/tests/fixtures/traces/train-h256-opencl0.jsonl"),
    ),
    (
        "train h1024",
        include_str!("../../syncmem/tests/fixtures/traces/train-h1024-opencl0.jsonl"),
    ),
];

/// One pool of one trace replayed on one pool kind.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayRow {
    /// The trace (`train h64`: `syncmem train --hidden 64`, one epoch on `opencl:0`).
    pub trace: String,
    /// The pool as recorded: `opencl:0` (device memory) or `host`.
    pub pool: String,
    /// The pool kind replayed.
    pub kind: String,
    /// Peak bytes reserved from the backend.
    pub peak_reserved: u64,
    /// Peak bytes the program asked for (live at once).
    pub peak_requested: u64,
    /// Peak bytes of blocks handed out (sizes rounded up).
    pub peak_allocated: u64,
    /// `peak_reserved / peak_requested`: the headline.
    pub reserved_per_requested: f64,
    /// `peak_reserved / peak_allocated`.
    pub overhead: f64,
    /// Segment allocations and frees.
    pub backend_calls: u64,
    /// Allocations served from cache.
    pub cache_hits: u64,
    /// The goal, in words: `<= 1.10` (device) or `<= need + 128 KiB` (host).
    pub goal: String,
    /// Whether the goal is met.
    pub goal_met: bool,
}

/// Replays trace `name` (`text`: JSON lines) on every pool kind.
///
/// # Errors
/// A trace that does not load or replay.
pub fn replay_rows(name: &str, text: &str) -> Result<Vec<ReplayRow>> {
    let trace = Trace::load(text.as_bytes())?;
    let mut rows = Vec::new();
    for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
        let r = replay_with(&trace, &PoolConfig::new(kind), &ReplayOptions::default())?;
        for d in r.devices {
            let rep = d.report;
            let host = d.device == "host" || d.device.ends_with(" pinned");
            let (goal, goal_met) = if host {
                (
                    "<= need + 128 KiB".to_string(),
                    rep.peak_reserved <= rep.peak_requested + HOST_SLACK_GOAL,
                )
            } else {
                (
                    format!("<= {DEVICE_RATIO_GOAL:.2}"),
                    rep.reserved_per_requested() <= DEVICE_RATIO_GOAL,
                )
            };
            rows.push(ReplayRow {
                trace: name.to_string(),
                pool: d.device,
                kind: kind.to_string(),
                peak_reserved: rep.peak_reserved,
                peak_requested: rep.peak_requested,
                peak_allocated: rep.peak_allocated,
                reserved_per_requested: rep.reserved_per_requested(),
                overhead: rep.overhead(),
                backend_calls: rep.backend_calls,
                cache_hits: rep.cache_hits,
                goal,
                goal_met,
            });
        }
    }
    Ok(rows)
}
