//! The parameters off the device between steps ([`TrainConfig::offload_parameters`]): each
//! step queues every parameter's copy to the device on a copy stream of its own before the
//! forward pass (the operators' first reads wait for their parameter's copy, not for all of
//! them), and once the update has run writes each parameter back to the host and frees its
//! device memory ([`syncmem::SyncedMemory::offload`]). Between steps the device holds none of them: the
//! room is there for whatever else the device holds (under a memory cap, the values of the next
//! step) without an out-of-memory path. A step moves the parameters' bytes up and down once
//! each; the transfer report counts them.
//!
//! With the optimizer offloaded as well ([`TrainConfig::offload_optimizer`]) the update writes
//! the parameters on its own host device: the parameters come to their buffers' host memory
//! from there (a host copy) and their stale device copies are freed with no copy back, so a
//! step moves the parameters up and the gradients down, as with the optimizer offloaded alone,
//! and the parameters no longer stay on the device between steps.
//!
//! On a device whose memory the host shares (zero-copy), the copies are what that device's
//! buffers do: none where the host and the device use one allocation.

use syncmem::workspace::BlobRef;
use syncmem::{Device, Head, Result, Stream, Tensor, Workspace};

use super::TrainConfig;

/// The parameters' blobs and the stream their copies to the device are queued on.
pub(super) struct OffloadedParams {
    stream: Stream,
    params: Vec<BlobRef>,
}

impl OffloadedParams {
    /// The parameters named `names` in `ws`, moved by a new stream of `device`, when `cfg`
    /// offloads them.
    ///
    /// # Errors
    /// A parameter not in `ws` ([`syncmem::Error::NotFound`]); the stream's creation.
    pub(super) fn new(
        cfg: &TrainConfig,
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
        Ok(Some(Self {
            stream: device.new_stream()?,
            params,
        }))
    }

    /// Queues every parameter's copy to the device (those not there yet), without waiting.
    ///
    /// # Errors
    /// The copies' errors (out of memory under a cap included).
    pub(super) fn bring_in(&self) -> Result<()> {
        self.each(|t| {
            if let Some(m) = t.synced() {
                m.prefetch_to_device(Some(&self.stream))?;
            }
            Ok(())
        })
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
