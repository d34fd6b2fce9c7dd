//! The distributed part of the report of `syncmem train`: the ranks, the buckets, and what
//! summing the gradients over the ranks cost per step.

use serde::Serialize;
use syncmem::alloc::stats::human_bytes;
use syncmem_nn::train::{TrainConfig, Trainer};

/// What summing over the ranks cost (per step: means over the training steps).
#[derive(Serialize)]
pub(in crate::commands::train) struct DistReport {
    /// The collective (`MPI: Open MPI v4.1.4, 2 ranks`).
    engine: String,
    ranks: usize,
    /// This rank (the report is rank 0's).
    rank: usize,
    bucket_bytes: usize,
    /// Elements of each bucket, in the order they are summed.
    buckets: Vec<usize>,
    /// Buckets summed while backward runs (else after it).
    overlap: bool,
    steps: u64,
    /// Gradient bytes this rank sent to the all-reduce per step.
    bytes_per_step: f64,
    /// Collective calls per step: the buckets, and one for the loss and accuracy.
    calls_per_step: f64,
    /// Milliseconds inside the all-reduce calls per step.
    allreduce_ms_per_step: f64,
    /// Milliseconds staging the buckets per step (waiting for the gradients' device work,
    /// reading them into the bucket, writing the sums back).
    staging_ms_per_step: f64,
    /// Milliseconds the step waited for the sums after its own work.
    exposed_ms_per_step: f64,
    /// Milliseconds of all-reduce and staging hidden behind backward per step.
    overlapped_ms_per_step: f64,
    /// Bytes staging copied host to device and device to host per step (0 where the
    /// device's memory is host memory).
    staging_to_device_bytes_per_step: f64,
    staging_to_host_bytes_per_step: f64,
}

/// The distributed part of `trainer`'s report (`None` unless distributed).
pub(in crate::commands::train) fn build(
    trainer: &Trainer,
    cfg: &TrainConfig,
) -> Option<DistReport> {
    let (c, s) = (trainer.collective()?, trainer.comm()?);
    let steps = s.steps.max(1) as f64;
    let ms = |secs: f64| secs * 1e3 / steps;
    Some(DistReport {
        engine: c.describe(),
        ranks: c.size(),
        rank: c.rank(),
        bucket_bytes: cfg.bucket_bytes,
        buckets: trainer.bucket_sizes(),
        overlap: cfg.overlap,
        steps: s.steps,
        bytes_per_step: s.bytes as f64 / steps,
        calls_per_step: s.calls as f64 / steps,
        allreduce_ms_per_step: ms(s.reduce_seconds),
        staging_ms_per_step: ms(s.staging_seconds),
        exposed_ms_per_step: ms(s.exposed_seconds),
        overlapped_ms_per_step: ms(s.overlapped_seconds()),
        staging_to_device_bytes_per_step: s.staging_copies.host_to_device.bytes as f64 / steps,
        staging_to_host_bytes_per_step: s.staging_copies.device_to_host.bytes as f64 / steps,
    })
}

impl DistReport {
    /// The text form: two lines.
    pub(in crate::commands::train) fn print(&self) -> anyhow::Result<()> {
        let bucket_bytes: usize = self.buckets.iter().sum::<usize>() * 4;
        outln!(
            "\ndistributed: {} ({} bucket(s) of gradients, {} in all, at most {} each, summed \
             {})",
            self.engine,
            self.buckets.len(),
            human_bytes(bucket_bytes as u64),
            human_bytes(self.bucket_bytes as u64),
            if self.overlap {
                "as backward writes them"
            } else {
                "after backward"
            }
        );
        outln!(
            "  per step: {} all-reduced in {:.1} call(s); all-reduce {:.3} ms, staging {:.3} \
             ms; waited for after the step's own work {:.3} ms, hidden behind it {:.3} ms; \
             staging copied {} to the device, {} to the host",
            human_bytes(self.bytes_per_step as u64),
            self.calls_per_step,
            self.allreduce_ms_per_step,
            self.staging_ms_per_step,
            self.exposed_ms_per_step,
            self.overlapped_ms_per_step,
            human_bytes(self.staging_to_device_bytes_per_step as u64),
            human_bytes(self.staging_to_host_bytes_per_step as u64),
        );
        Ok(())
    }
}
