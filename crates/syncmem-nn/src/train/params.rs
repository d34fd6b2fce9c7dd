//! The parameters off the device between steps ([`TrainConfig::offload_parameters`]), brought
//! in layer by layer: each parameter's copy to the device is queued on a copy stream of its own
//! two operators ahead of its first reader (before the run for the first operators' own), so
//! the device holds at the start of a step only the parameters of the first layers, and each
//! operator waits for its own parameter's copy only (the plan is that of the net that runs:
//! `moves.rs`). Once the update has run, each parameter is written back to the host and its
//! device memory freed ([`syncmem::SyncedMemory::offload`]). Between steps the device holds
//! none of them: the room is there for whatever else the device holds (under a memory cap, the
//! values of the next step) without an out-of-memory path. A step moves the parameters' bytes
//! up and down once each; the transfer report counts them. Within the step they stay: the
//! step's peak comes at the update, when every parameter and gradient is live, so freeing the
//! weights between forward and backward would move them twice for nothing (measured).
//!
//! With the optimizer offloaded as well ([`TrainConfig::offload_optimizer`]) the update writes
//! the parameters on its own host device: the parameters come to their buffers' host memory
//! from there (a host copy) and their stale device copies are freed with no copy back, so a
//! step moves the parameters up and the gradients down, as with the optimizer offloaded alone,
//! and the parameters no longer stay on the device between steps.
//!
//! On a device whose memory the host shares (zero-copy), the copies are what that device's
//! buffers do: none where the host and the device use one allocation.

use std::collections::BTreeSet;

use syncmem::net::Net;
use syncmem::workspace::BlobRef;
use syncmem::{Device, Head, Result, Tensor, Workspace};

use super::moves::{plan, Mover, Pick};
use super::TrainConfig;

/// The parameters' blobs and the plan of their moves during a step.
pub(super) struct OffloadedParams {
    mover: Mover,
    params: Vec<BlobRef>,
}

impl OffloadedParams {
    /// The parameters named `names` in `ws`, moved by a new stream of `device` as `net` (the
    /// training net) uses them, when `cfg` offloads them.
    ///
    /// # Errors
    /// A parameter not in `ws` ([`syncmem::Error::NotFound`]); the stream's creation.
    pub(super) fn new(
        cfg: &TrainConfig,
        net: &Net,
        device: &Device,
        ws: &Workspace,
        names: &[String],
    ) -> Result<Option<Self>> {
        if !cfg.offload_parameters {
            return Ok(None);
        }
        let params = names
            .iter()
            .map(|n| ws.get_blob(n))
            .collect::<Result<Vec<_>>>()?;
        let named: BTreeSet<String> = names.iter().cloned().collect();
        let plan = plan(net.run_def(), &Pick::Named(&named));
        Ok(Some(Self {
            mover: Mover::new(plan, ws, device.new_stream()?)?,
            params,
        }))
    }

    /// Queues the copies to the device of the parameters the first operators read (those not
    /// there yet), without waiting; the others come up during the run ([`Self::after`]).
    ///
    /// # Errors
    /// The copies' errors (out of memory under a cap included).
    pub(super) fn bring_in(&mut self) -> Result<()> {
        self.mover.before()
    }

    /// What the moves within the steps did so far.
    pub(super) fn stats(&self) -> super::OffloadMoves {
        self.mover.stats()
    }

    /// The moves due after operator `op` of the training net ran.
    ///
    /// # Errors
    /// The copies' and frees' errors (out of memory under a cap included).
    pub(super) fn after(&mut self, op: usize) -> Result<()> {
        self.mover.after(op)
    }

    /// Writes every parameter back to the host (where only the device holds it) and frees its
    /// device memory.
    ///
    /// # Errors
    /// As [`syncmem::SyncedMemory::offload`].
    pub(super) fn write_back(&self) -> Result<()> {
        self.each(|t| {
            if let Some(m) = t.synced() {
                if m.head() == Head::Elsewhere {
                    // Updated on the host's update device: the data comes to this buffer's
                    // own host memory first, and the device's stale copy is freed.
                    m.prefetch_to_host(None)?;
                }
                m.offload()?;
            }
            Ok(())
        })
    }

    /// Runs `f` on each parameter's tensor (a blob holding something else is passed over).
    fn each(&self, f: impl Fn(&Tensor) -> Result<()>) -> Result<()> {
        for blob in &self.params {
            if let Ok(t) = blob.read().get::<Tensor>() {
                f(t)?;
            }
        }
        Ok(())
    }
}
