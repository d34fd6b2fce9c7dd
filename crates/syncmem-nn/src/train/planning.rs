//! Memory planning measured: the first training step with and without it.

use super::{TrainConfig, Trainer};
use crate::mlp::Dataset;
use syncmem::net::memory::RunMemory;
use syncmem::Device;
use syncmem::Result;

/// Peak memory of the first training step with and without planning, each in a fresh
/// workspace on one batch of `data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanningComparison {
    /// Without planning.
    pub unplanned: RunMemory,
    /// With planning.
    pub planned: RunMemory,
    /// Shared slots of the planned train net.
    pub slots: usize,
    /// Intermediate blobs mapped to slots.
    pub planned_blobs: usize,
}

impl PlanningComparison {
    /// Device bytes saved by planning, from the tensor peaks (0 if planning saved nothing).
    pub fn saved_bytes(&self) -> u64 {
        self.unplanned
            .tensor_peak
            .device
            .saturating_sub(self.planned.tensor_peak.device)
    }
}

/// Measures [`PlanningComparison`] for `cfg` (its `plan` flag is ignored) on the first
/// `cfg.batch` samples of `data`.
///
/// # Errors
/// As [`Trainer::new`] and [`Trainer::measure_step`].
pub fn compare_planning(
    device: &Device,
    data: &Dataset,
    cfg: &TrainConfig,
) -> Result<PlanningComparison> {
    let n = cfg.batch.min(data.len());
    let one = Dataset {
        x: data.x[..n * data.features].to_vec(),
        y: data.y[..n].to_vec(),
        features: data.features,
        classes: data.classes,
    };
    let run = |plan: bool| -> Result<(RunMemory, usize, usize)> {
        let cfg = TrainConfig {
            plan,
            ..cfg.clone()
        };
        let mut t = Trainer::new(device, &one, &cfg)?;
        let m = t.measure_step()?;
        let (slots, blobs) = t
            .train_net()
            .plan()
            .map_or((0, 0), |p| (p.slots, p.planned_blobs()));
        Ok((m, slots, blobs))
    };
    let (unplanned, _, _) = run(false)?;
    let (planned, slots, planned_blobs) = run(true)?;
    Ok(PlanningComparison {
        unplanned,
        planned,
        slots,
        planned_blobs,
    })
}
