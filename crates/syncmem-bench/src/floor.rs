//! The floor of a `train` step on an OpenCL device: the kernels one step of `syncmem train`
//! queues, captured ([`syncmem::device::LaunchCapture`]) and replayed with raw OpenCL calls
//! (`clSetKernelArg` + `clEnqueueNDRangeKernel`) on the train net's queue, then one
//! `clFinish`, against `Trainer::step` (the same kernels through the crate, and the loss and
//! accuracy read back). The replay is what the driver costs for the step's kernels; the crate's
//! step adds its own bookkeeping, but waits only for the kernel that writes the accuracy (the
//! update kernels queued after it overlap the next step), where the plain loop waits for the
//! whole queue.

use syncmem::{Device, Result};

use crate::rows::Runs;
use crate::Row;

/// Goal: syncmem's step at most 1.10 x the raw replay (ratio >= 1 / 1.10).
pub const STEP_FLOOR_GOAL: f64 = 1.0 / 1.10;

/// The step row at hidden width `h`; `None` off OpenCL.
///
/// # Errors
/// Training or backend errors.
#[cfg(feature = "opencl")]
pub fn step_row(dev: &Device, h: usize, runs: Runs) -> Result<Option<Row>> {
    use crate::rows::compare;
    use syncmem::device::LaunchCapture;
    use syncmem_nn::mlp::Dataset;
    use syncmem_nn::train::{TrainConfig, Trainer};
    if dev.backend() != syncmem::BackendKind::OpenCl {
        return Ok(None);
    }
    let cfg = TrainConfig::default().with_hidden(vec![h, h]);
    let data = Dataset::spirals(1000, 3, 0.2, cfg.seed);
    let mut t = Trainer::new(dev, &data, &cfg)?;
    t.run_epoch()?; // kernels built, buffers allocated
    let (_, mut capture) = LaunchCapture::record(|| t.step(0))?;
    let kernels = capture.len();
    // The train net's own stream: the replay queues behind the steps, in order.
    let stream = t.train_net().context().stream().clone();
    let Some(queue) = stream.as_opencl() else {
        return Ok(None);
    };
    let steps = t.batch_count();
    let mut i = 0;
    let samples = compare(
        runs,
        || {
            i = (i + 1) % steps;
            t.step(i).map(drop)
        },
        || {
            capture.replay(queue)?;
            stream.synchronize()
        },
    )?;
    Ok(Some(
        samples
            .row(
                &format!("train step vs raw h{h}"),
                "Trainer::step (the kernels, loss and accuracy read back)",
                &format!("the step's {kernels} kernels replayed with raw opencl3 calls + clFinish"),
            )
            .with_goal(STEP_FLOOR_GOAL),
    ))
}

/// Without the OpenCL backend there is nothing to replay.
#[cfg(not(feature = "opencl"))]
pub fn step_row(_dev: &Device, _h: usize, _runs: Runs) -> Result<Option<Row>> {
    Ok(None)
}
