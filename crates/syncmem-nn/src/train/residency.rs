//! The batches under a memory cap. [`super::Trainer::new`] uploads every batch once, so that
//! without a cap a step copies nothing. Under a cap that cannot hold them all beside the net's
//! working set, the batch of the step just run is the buffer needed furthest ahead (the next
//! epoch): it is offloaded ([`syncmem::SyncedMemory::offload`]) right after its step, and the
//! room it frees serves the next step's allocations with no out-of-memory path. Each step then
//! moves one batch up and one down, the least a step can move once the batches do not fit.
//!
//! Which case holds is measured, not guessed: the batches stay while the device pool has made
//! no out-of-memory retry. At the end of the step that made the first one, every batch leaves
//! (each comes back for its step), so that the steps that follow find the room they will keep
//! using; from then on, each batch leaves after its step.

use std::ops::Range;

use syncmem::{Device, Result, Tensor};

use super::Trainer;

impl Trainer {
    /// Batch `i` is done with: it leaves a capped device that cannot hold every batch (see the
    /// [module docs](self)).
    pub(super) fn after_batch(&mut self, i: usize) -> Result<()> {
        let Some(range) = self
            .residency
            .after_step(&self.device, i, self.batches.len())
        else {
            return Ok(());
        };
        for b in &self.batches[range] {
            offload(&b.x)?;
            offload(&b.y)?;
        }
        Ok(())
    }
}

/// Moves `t`'s data to the host and frees its device memory.
fn offload(t: &Tensor) -> Result<()> {
    if let Some(m) = t.synced() {
        m.offload()?;
    }
    Ok(())
}

/// Whether finished batches leave the device (see the [module docs](self)).
#[derive(Debug, Default)]
pub(super) struct BatchResidency {
    offloading: bool,
}

impl BatchResidency {
    /// After a step (or an evaluation) on batch `i` of `batches`: the batches to offload, if
    /// any: none while the device has no cap or its pool has not had to retry an allocation;
    /// all of them when it first has; then batch `i`.
    fn after_step(&mut self, device: &Device, i: usize, batches: usize) -> Option<Range<usize>> {
        if self.offloading {
            return Some(i..i + 1);
        }
        device.memory_cap()?;
        let retries = device.pool_stats().map_or(0, |s| s.alloc_retries);
        if retries == 0 {
            return None;
        }
        self.offloading = true;
        Some(0..batches)
    }
}
