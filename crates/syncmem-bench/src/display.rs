//! The text form of the report.

use std::fmt;

use syncmem::alloc::stats::human_bytes;

use crate::load::load_line;
use crate::multi::MultiTrainRow;
use crate::{train_memory, BenchReport, ReplayRow, Verdict};

/// A duration for the tables: `ns`, `µs`, `ms` or `s` (the JSON output has nanoseconds).
fn time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

pub(crate) fn goal_text(goal: Option<f64>, verdict: Option<Verdict>) -> String {
    match (goal, verdict) {
        (Some(g), Some(v)) => format!("goal >= {g:.2}: {}", v.text()),
        (Some(g), None) => format!("goal >= {g:.2}"),
        _ => "no goal".to_string(),
    }
}

/// The spread of a ratio, `low-high`, with as many digits as the ratio.
fn spread_text(low: f64, high: f64) -> String {
    format!("{low:.3}-{high:.3}")
}

/// The text form: times and sizes in human units (`µs`, `MiB`); the JSON form (`Serialize`)
/// has raw numbers (nanoseconds, bytes).
impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", load_line("start", self.load_start, self.cpus))?;
        writeln!(
            f,
            "{:<36} {:>11} {:>11} {:>8} {:>13}  goal",
            "comparison", "ours", "baseline", "ratio", "spread"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<36} {:>11} {:>11} {:>8.3} {:>13}  {}",
                r.name,
                time(r.ours_ns),
                time(r.baseline_ns),
                r.ratio,
                spread_text(r.ratio_low, r.ratio_high),
                goal_text(r.goal, r.verdict)
            )?;
        }
        writeln!(
            f,
            "ratio = baseline / ours per call (> 1: ours is faster); spread: the middle half of \
             the per-sample ratios; a goal within noise: the spread straddles it"
        )?;
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        writeln!(f)?;
        if !self.train_memory.is_empty() {
            train_memory::write_table(f, &self.train_memory)?;
            writeln!(f)?;
        }
        if !self.heap.is_empty() {
            crate::heap::write_table(f, &self.heap)?;
            writeln!(f)?;
        }
        if let Some(m) = &self.multi_device {
            write_multi_device(f, m)?;
        }
        write_replay(f, &self.replay)?;
        for s in &self.skipped {
            writeln!(f, "note: skipped {s}")?;
        }
        writeln!(f)?;
        write!(f, "{}", self.compute)?;
        writeln!(f, "{}", load_line("end", self.load_end, self.cpus))
    }
}

/// The legend of the replay table.
const REPLAY_LEGEND: [&str; 5] = [
    "trace: `syncmem train --hidden H`, one epoch on opencl:0, recorded with `syncmem trace record`",
    "peak requested: the most bytes the program asked for at once (what the `none` pool reserves)",
    "reserved/requested: peak reserved / peak requested, memory held per byte asked for",
    "peak allocated: the most bytes of blocks handed out at once (sizes rounded up by the pool)",
    "reserved/allocated: peak reserved / peak allocated (rounding waste does not show here)",
];

/// `train` data-parallel on two devices against one, and the copies between them.
fn write_multi_device(f: &mut fmt::Formatter<'_>, m: &MultiTrainRow) -> fmt::Result {
    writeln!(
        f,
        "train on {}: epoch {:.2} ms against {:.2} ms on {} alone (ratio {:.3}; no \
         speedup expected on a 2-core machine: the figure is the reduction's cost), {} \
         between devices per step, final loss {:+.2e} from one device's",
        m.devices.join(" + "),
        m.many_ms,
        m.one_ms,
        m.devices[0],
        m.ratio,
        human_bytes(m.bytes_per_step.round() as u64),
        m.loss_difference
    )?;
    for p in &m.pairs {
        writeln!(
            f,
            "  {} -> {} {}: {} copies, {} per step",
            p.from,
            p.to,
            if p.direct { "direct" } else { "via host" },
            p.count,
            human_bytes(p.bytes)
        )?;
    }
    writeln!(f)?;
    Ok(())
}

/// The replay table, with its legend.
fn write_replay(f: &mut fmt::Formatter<'_>, rows: &[ReplayRow]) -> fmt::Result {
    writeln!(
        f,
        "{:<12} {:<9} {:<8} {:>13} {:>14} {:>9} {:>14} {:>9}  goal",
        "trace",
        "pool",
        "kind",
        "peak reserved",
        "peak requested",
        "reserved/",
        "peak allocated",
        "reserved/"
    )?;
    writeln!(
        f,
        "{:<12} {:<9} {:<8} {:>13} {:>14} {:>9} {:>14} {:>9}",
        "", "", "", "", "", "requested", "", "allocated"
    )?;
    for r in rows {
        writeln!(
            f,
            "{:<12} {:<9} {:<8} {:>13} {:>14} {:>9.3} {:>14} {:>9.3}  {}: {}",
            r.trace,
            r.pool,
            r.kind,
            human_bytes(r.peak_reserved),
            human_bytes(r.peak_requested),
            r.reserved_per_requested,
            human_bytes(r.peak_allocated),
            r.overhead,
            r.goal,
            if r.goal_met { "met" } else { "NOT met" }
        )?;
    }
    for line in REPLAY_LEGEND {
        writeln!(f, "{line}")?;
    }
    Ok(())
}
