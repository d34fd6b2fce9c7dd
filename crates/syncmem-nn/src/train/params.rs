//! The parameters off the device between steps ([`TrainConfig::offload_parameters`]), brought
//! in layer by layer and sent back layer by layer, as ZeRO-3 and FSDP do:
//! - the training net's updates are hoisted ([`hoist_updates`]): each layer's update runs as
//!   soon as backward is done with its weights, instead of all after backward;
//! - each parameter's copy to the device is queued on a copy stream of its own two operators
//!   ahead of its first reader (before the run for the first operators' own), so each operator
//!   waits for its own parameter's copy only;
//! - right after its update, each parameter's copy back to the host is queued and its device
//!   memory freed once that copy is done (the plan is that of the net that runs: `moves.rs`); the
//!   net drops dead values at once (`NetOptions::drop_dead`), its gradient among them.
//!
//! So the device never holds every weight and gradient at once: on three hidden layers of 256
//! with batches of 16 (520 KiB of parameters, two mirrors) the step's peak falls from 1,140 KiB
//! to 883 KiB. What is left is written back after the step ([`OffloadedParams::write_back`]).
//! Between steps the device holds none of them: the room is there for whatever else the device
//! holds (under a memory cap, the values of the next step) without an out-of-memory path. A
//! step moves the parameters' bytes up and down once each; the transfer report counts them.
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

use syncmem::net::{Net, NetDef};
use syncmem::ops::OperatorDef;
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
            mover: Mover::new(plan, ws, device)?,
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
    /// device memory. A parameter only the device holds is copied out on the copy stream and
    /// its device memory freed ordered after the copy, with no host wait; the next step brings
    /// it back on the same stream, behind that copy.
    ///
    /// # Errors
    /// As [`syncmem::SyncedMemory::offload`].
    pub(super) fn write_back(&self) -> Result<()> {
        let stream = self.mover.stream();
        self.each(|t| {
            if let Some(m) = t.synced() {
                match m.head() {
                    // Updated on the host's update device: the data comes to this buffer's
                    // own host memory first, and the device's stale copy is freed.
                    Head::Elsewhere => {
                        m.prefetch_to_host(None)?;
                    }
                    Head::AtDevice => {
                        m.prefetch_to_host(Some(stream))?;
                    }
                    _ => {}
                }
                // Freed ordered after the copy out: the next step brings it back behind it.
                m.offload_ordered()?;
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

/// `def` with each update of a parameter of `params` (an operator writing one) moved up to
/// just after the last operator before it that uses any blob it reads or writes: each layer's
/// weights are updated as soon as backward is done with them, instead of all after backward.
/// Every operator reads the values it read before (the operators an update moves past use
/// none of its blobs), so training computes the same values, bit for bit; the updates no
/// longer run back to back, so they no longer merge into one operator (`crate::fuse::sgd`).
pub(super) fn hoist_updates(def: &NetDef, params: &BTreeSet<String>) -> NetDef {
    let mut ops: Vec<OperatorDef> = Vec::with_capacity(def.ops.len());
    for op in &def.ops {
        let updates = op.outputs.iter().any(|o| params.contains(o));
        let at = if updates {
            let mine: BTreeSet<&String> = op.inputs.iter().chain(&op.outputs).collect();
            let touches = |other: &OperatorDef| {
                other
                    .inputs
                    .iter()
                    .chain(&other.outputs)
                    .any(|b| mine.contains(b))
            };
            ops.iter().rposition(touches).map_or(0, |j| j + 1)
        } else {
            ops.len()
        };
        ops.insert(at, op.clone());
    }
    let mut out = def.clone();
    out.ops = ops;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_move_up_to_the_last_operator_using_their_blobs() {
        let op = |t: &str, i: &[&str], o: &[&str]| OperatorDef::new(t, i, o);
        let mut def = NetDef::new("t");
        def.ops = vec![
            op("FC", &["x", "w1"], &["h"]),
            op("FC", &["h", "w2"], &["y"]),
            op("Loss", &["y"], &["dy"]),
            op("FCGradient", &["h", "w2", "dy"], &["dw2", "dh"]),
            op("FCGradient", &["x", "w1", "dh"], &["dw1"]),
            op("SGD", &["w1", "dw1"], &["w1"]),
            op("SGD", &["w2", "dw2"], &["w2"]),
            op("Adam", &["t", "s"], &["t"]),
        ];
        let params: BTreeSet<String> = ["w1", "w2", "t"].map(String::from).into();
        let got: Vec<String> = hoist_updates(&def, &params)
            .ops
            .iter()
            .map(|o| format!("{}:{}", o.op_type, o.outputs.join(",")))
            .collect();
        assert_eq!(
            got,
            [
                // `t` is used by nothing else: its update goes first.
                "Adam:t",
                "FC:h",
                "FC:y",
                "Loss:dy",
                "FCGradient:dw2,dh",
                "SGD:w2",
                "FCGradient:dw1",
                "SGD:w1",
            ]
        );
    }
}
