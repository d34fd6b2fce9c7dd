//! Heap allocations per steady `train` step: `syncmem train`'s default net on `cpu` and on the
//! bench device, one warm-up epoch, then every step of the next epoch counted with the
//! process's allocation counter (the `syncmem` binary counts every allocation of its global
//! allocator; a program without one skips the rows with a note). Goal: 0 on every device.

use std::cell::Cell;
use std::fmt;

use serde::Serialize;
use syncmem::{Device, Result};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

/// Goal of the rows: no heap allocation in a steady step.
pub const GOAL: f64 = 0.0;

/// Heap allocations of the steady train steps of one device.
#[derive(Debug, Clone, Serialize)]
pub struct HeapRow {
    /// The device.
    pub device: String,
    /// Mean allocations per step over an epoch after a warm-up epoch.
    pub per_step: f64,
    /// The most allocations of one step of that epoch.
    pub max_step: u64,
    /// Whether the goal (0 per step) was met.
    pub goal_met: bool,
}

/// The heap row of `dev`, counting with `allocations` (the process's allocations so far).
///
/// # Errors
/// Training errors.
pub fn heap_row(dev: &Device, allocations: fn() -> u64) -> Result<HeapRow> {
    let data = Dataset::spirals(1000, 3, 0.2, 0);
    let mut trainer = Trainer::new(dev, &data, &TrainConfig::default())?;
    trainer.run_epoch()?;
    let at_start = Cell::new(0);
    let (total, max, steps) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    trainer.run_epoch_around(
        |_| at_start.set(allocations()),
        |_, _| {
            let n = allocations() - at_start.get();
            total.set(total.get() + n);
            max.set(max.get().max(n));
            steps.set(steps.get() + 1);
        },
    )?;
    let per_step = total.get() as f64 / steps.get().max(1) as f64;
    Ok(HeapRow {
        device: dev.label().to_string(),
        per_step,
        max_step: max.get(),
        goal_met: total.get() == 0,
    })
}

/// Writes the rows as a table.
pub(crate) fn write_table(f: &mut fmt::Formatter<'_>, rows: &[HeapRow]) -> fmt::Result {
    writeln!(
        f,
        "{:<36} {:>11} {:>11}  goal",
        "heap allocations per train step", "mean", "most"
    )?;
    for r in rows {
        writeln!(
            f,
            "{:<36} {:>11.2} {:>11}  goal {GOAL}: {}",
            r.device,
            r.per_step,
            r.max_step,
            if r.goal_met { "met" } else { "NOT met" }
        )?;
    }
    Ok(())
}
