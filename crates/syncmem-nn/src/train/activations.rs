//! The activations off the device between forward and backward
//! ([`TrainConfig::offload_activations`]), as vDNN does (Rhu et al., MICRO 2016): a value
//! that forward writes and backward reads long after stays on the host in between, so that
//! the device holds, at the start of backward, the values of the last layers only.
//!
//! The plan comes from the net that runs ([`Net::run_def`]: fused and memory-planned), fixed
//! when the trainer is built. A blob the net writes before it reads it (an intermediate value,
//! not a parameter, an optimizer state or the data) is offloaded across each gap of at least
//! [`MIN_GAP`] operators between one use and the next, when the next use reads it. For a use
//! at operator `a` and the next read at operator `b`:
//! - after operator `a`: its copy to the host is queued on the plan's copy stream
//!   ([`syncmem::SyncedMemory::prefetch_to_host`]; ordered after the work that wrote it);
//! - from operator `a + 1` on: its device memory is freed ([`syncmem::SyncedMemory::offload`])
//!   once that copy is done, with no host wait, or two operators later at the latest, waiting
//!   for the copy then (see `moves.rs`);
//! - after operator `b - 2`: its copy back is queued on the copy stream
//!   ([`syncmem::SyncedMemory::prefetch_to_device`]), one operator ahead of its reader;
//! - after operator `b - 1`: whether the copy back is still running is noted (the reader's
//!   access then waits for it: the copy was not hidden).
//!
//! Nothing depends on the plan for correctness: the buffers' head state machine orders every
//! access after the copies, so a plan that misjudges only moves bytes in vain. Where the host
//! uses the device's memory in place (`cpu`, PoCL's zero-copy buffers) nothing is copied: the
//! block is spilled in place and only leaves the device's memory cap (see
//! [`syncmem::SyncedMemory::offload`]).

use syncmem::net::Net;
use syncmem::{Device, Result, Workspace};

use super::moves::{plan, Mover, Pick};
use super::TrainConfig;

/// The fewest operators between a use of a value and its next read for the value to leave the
/// device in between: one to copy it out under, one to free it after, one to bring it back
/// under.
pub const MIN_GAP: usize = 4;

/// What moving offloaded values during the steps did: the activations'
/// ([`super::Trainer::activation_offload`]) or the parameters' ([`super::Trainer::parameter_offload`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadMoves {
    /// Blob names the plan moves (per step, each may leave more than once).
    pub planned: usize,
    /// Values that left the device (their device memory freed or, shared in place, uncharged).
    pub offloads: u64,
    /// Device bytes those released.
    pub bytes_released: u64,
    /// Bytes copied to the host (0 where the host uses the device's memory in place).
    pub bytes_down: u64,
    /// Values brought back ahead of their reader.
    pub refills: u64,
    /// Bytes copied back to the device.
    pub bytes_up: u64,
    /// Readers that found their value's copy back (or its copy out, which the copy back
    /// follows on the same stream) still running: the copy was not hidden behind the operator
    /// before them, and the device runs the reader after it.
    pub not_ready: u64,
}

/// Whether the training net of `cfg` is memory-planned: as `cfg` says, except with the
/// activations offloaded. A planned buffer is shared by values whose lifetimes do not overlap,
/// and an offloaded value's lifetime runs from its first write to its last read: the room it
/// leaves between forward and backward would serve no other value, and the planner's fixed
/// buffers stay allocated while the values in them are dead. Unplanned, with dead values
/// dropped at once ([`syncmem::net::NetOptions::drop_dead`]), the pool shares the memory among
/// the values live at each moment instead (measured, six hidden layers of 64, batches of 512,
/// two mirrors, on `cpu`: a step's peak of 1,111 KiB planned and kept, 983 KiB planned and
/// offloaded, 668 KiB unplanned and offloaded). The evaluation net stays planned.
pub(super) fn plan_train_net(cfg: &TrainConfig) -> bool {
    cfg.plan && !cfg.offload_activations
}

/// The activations' plan for a training net, with its blobs and copy stream.
pub(super) struct OffloadedActivations(Mover);

impl OffloadedActivations {
    /// The plan of `net`, whose blobs live in `ws`, moved by a new stream of `device`.
    ///
    /// # Errors
    /// The stream's creation; a planned blob missing from `ws` (a net not created in it).
    pub(super) fn new(net: &Net, device: &Device, ws: &Workspace) -> Result<Self> {
        let plan = plan(net.run_def(), &Pick::Produced);
        Ok(Self(Mover::new(plan, ws, device)?))
    }

    /// What the plan did so far.
    pub(super) fn stats(&self) -> OffloadMoves {
        self.0.stats()
    }

    /// The moves due after operator `op` ran.
    ///
    /// # Errors
    /// The copies' and frees' errors (out of memory under a cap included).
    pub(super) fn after(&mut self, op: usize) -> Result<()> {
        self.0.after(op)
    }
}

impl super::Trainer {
    /// What moving the activations to the host between forward and backward did so far
    /// ([`TrainConfig::offload_activations`]; `None` when they stay on the device).
    pub fn activation_offload(&self) -> Option<OffloadMoves> {
        self.activations.as_ref().map(OffloadedActivations::stats)
    }

    /// What bringing the offloaded parameters in layer by layer during the steps did
    /// ([`TrainConfig::offload_parameters`]; `None` when they stay on the device): the moves
    /// within the steps, each weight's copy back after its update included (the write-back
    /// after the step of what is left on the device is not counted here; the transfer report
    /// counts every copy).
    pub fn parameter_offload(&self) -> Option<OffloadMoves> {
        self.params
            .as_ref()
            .map(super::params::OffloadedParams::stats)
    }

    /// Runs the training net, with the moves of the offloaded parameters and activations
    /// after each operator.
    pub(super) fn run_train_net(&mut self) -> Result<()> {
        let (params, acts) = (&mut self.params, &mut self.activations);
        if params.is_none() && acts.is_none() {
            return self.train.run(&self.ws);
        }
        self.train
            .run_observed(&self.ws, self.train.context(), |i, _| {
                if let Some(p) = params.as_mut() {
                    p.after(i)?;
                }
                match acts.as_mut() {
                    Some(a) => a.after(i),
                    None => Ok(()),
                }
            })
    }
}
