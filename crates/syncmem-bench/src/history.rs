//! What the always-on history costs: a pooled 4 KiB allocation + free on the bench device with
//! the history recording (`syncmem::report::record_history`) against the same with it off, and
//! with call stacks captured. Each sample starts a history and fills its rings once before it
//! is timed (an always-on history writes over its oldest events; filling it the first time
//! makes and touches its memory, a cost of starting it).

use std::hint::black_box;
use std::time::Instant;

use syncmem::report::{current_history, record_history, set_trace_stacks, trace_stacks};
use syncmem::{Device, Result};

use crate::rows::Runs;
use crate::spread::Samples;
use crate::Row;

/// Goal of the history row without stacks: at most 1.10 x the cycle with the history off
/// (1 / 1.10, rounded).
pub const HISTORY_GOAL: f64 = 0.91;

/// Events per device of the history while a row runs.
const EVENTS: usize = 100_000;

/// The history rows: on vs off, then on with stacks vs off (a tenth of the calls: a stack
/// costs microseconds). The history and stack settings of the process are put back after.
///
/// # Errors
/// Device errors.
pub fn history_rows(dev: &Device, runs: Runs) -> Result<Vec<Row>> {
    let dev = dev.detached();
    let stream = dev.default_stream()?;
    let cycle = || -> Result<()> {
        drop(black_box(dev.alloc_pooled(4096, &stream)?));
        Ok(())
    };
    let before = (current_history().map(|h| h.max_entries()), trace_stacks());
    let mut rows = Vec::new();
    for stacks in [false, true] {
        let runs = Runs {
            batch: if stacks { runs.batch / 10 } else { runs.batch }.max(1),
            ..runs
        };
        let timed = alternate(runs, &cycle, stacks);
        record_history(before.0);
        set_trace_stacks(before.1);
        let samples = timed?;
        let (name, ours) = if stacks {
            (
                "device pool 4 KiB, history + stacks",
                "alloc_pooled + free, history with stacks",
            )
        } else {
            (
                "device pool 4 KiB, history",
                "alloc_pooled + free, history on",
            )
        };
        let row = samples.row(name, ours, "alloc_pooled + free, history off");
        rows.push(if stacks {
            row
        } else {
            row.with_goal(HISTORY_GOAL)
        });
    }
    Ok(rows)
}

/// The nanoseconds per call of `cycle` with the history on (and stacks when `stacks`) and off,
/// in alternating samples.
fn alternate(runs: Runs, cycle: &dyn Fn() -> Result<()>, stacks: bool) -> Result<Samples> {
    let time = || -> Result<f64> {
        cycle()?;
        let start = Instant::now();
        for _ in 0..runs.batch {
            cycle()?;
        }
        Ok(start.elapsed().as_nanos() as f64 / runs.batch as f64)
    };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..runs.samples.max(1) {
        record_history(Some(EVENTS));
        set_trace_stacks(stacks);
        // The rings filled once, untimed: a history that records all along writes over its
        // oldest events (its rings' memory is made and first touched as they fill, a cost of
        // starting it, not of each event). A ring holds `EVENTS` rounded up to a power of two,
        // and a cycle writes two events.
        if !stacks {
            for _ in 0..EVENTS.next_power_of_two() / 2 {
                cycle()?;
            }
        }
        on.push(time()?);
        record_history(None);
        set_trace_stacks(false);
        off.push(time()?);
    }
    Ok(Samples::new(on, off))
}
