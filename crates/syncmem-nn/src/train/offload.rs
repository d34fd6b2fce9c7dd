//! The optimizer off the device ([`TrainConfig::offload_optimizer`]), as ZeRO-Offload does:
//! the optimizer's state (momentum, Adam's two moments) lives in host memory only, and the
//! update runs on the host.
//!
//! The training net loses its update operators (as in data-parallel training): they form a net
//! of their own, built for a host device (a `cpu` handle of its own, uncapped), run after the
//! training net in each step.
//! The update reads each gradient on the host (a replica of it there: its bytes come down once
//! a step) and writes each parameter there (the replica becomes the only current copy: the
//! next forward brings it up, once a step). The state never reaches the device. Per step that
//! moves the gradients down and the parameters up, 2 x the parameters' bytes whatever the
//! optimizer, where updating on the device with the state kept on the host would move the
//! state both ways (4 x for Adam, 2 x for momentum) and hold it on the device meanwhile; SGD
//! has no state and gains nothing but the bytes of the update's work.
//!
//! Where the training device keeps two mirrors, the host mirrors of the gradients and the
//! parameters are pinned memory of the device (`moves::pin_host`): each step's copies through
//! them run at full speed.
//!
//! The host update computes what the device's does, bit for bit, on every backend: the
//! device's update kernels round each operation on its own, never contracted into a fused
//! multiply-add, with correctly rounded division and square root, as the host does (see the
//! tests).

use std::collections::BTreeSet;
use std::sync::Arc;

use syncmem::net::{Net, NetDef};
use syncmem::{Device, Error, Result, Workspace};

use super::setup::Setup;
use super::TrainConfig;
use crate::mlp::{Mlp, MlpNets};

/// The update net on its host device.
pub(super) struct Offloaded {
    /// The host device the update runs on.
    pub(super) host: Device,
    /// The update net.
    update: Arc<Net>,
    /// The gradients the update reads (its inputs that it does not write).
    gradients: Vec<String>,
}

impl Offloaded {
    /// Runs the update on the host. The gradients' copies to the host are queued first, all
    /// at once, on their buffers' streams (behind the backward pass that writes them), and
    /// waited for once: the update then reads each with no wait of its own (one host wait a
    /// step, not one per gradient).
    ///
    /// # Errors
    /// The copies' and the update's errors.
    pub(super) fn run(&self, ws: &Workspace) -> Result<()> {
        let mut last = None;
        for g in &self.gradients {
            let queued = ws.with_tensor(g, |t| match t.synced() {
                Some(m) if m.head() == syncmem::Head::AtDevice => m.prefetch_to_host(None),
                _ => Ok(None),
            })?;
            last = queued.or(last);
        }
        if let Some(event) = last {
            event.wait()?;
        }
        self.update.run(ws)
    }
}

/// `nets` split for an offloaded optimizer: the training net without its update operators,
/// the init net without the state's fills; with the update net and the state's fills.
pub(super) struct Split {
    pub(super) nets: MlpNets,
    update: NetDef,
    state_init: NetDef,
}

/// Refuses an offloaded optimizer, parameters or activations for `what` (training on several
/// devices or ranks).
pub(super) fn refuse(cfg: &TrainConfig, what: &str) -> Result<()> {
    let offloaded = if cfg.offload_optimizer {
        "the optimizer"
    } else if cfg.offload_parameters {
        "the parameters"
    } else if cfg.offload_activations {
        "the activations"
    } else {
        return Ok(());
    };
    Err(Error::InvalidState {
        op: "Trainer",
        buffer: "training configuration".into(),
        reason: format!("offloading {offloaded} is not supported with {what}"),
    })
}

/// Splits `nets` (see [`Split`]): the update operators (`SGD`, `MomentumSGD`, `Adam`) leave
/// the training net, as in data-parallel training, whose gradients become its outputs; the
/// state is `mlp`'s optimizer's.
pub(super) fn split(mlp: &Mlp, nets: &MlpNets) -> Result<Split> {
    let (mut train, update, pairs) = super::parallel::split_update(&nets.train);
    if pairs.is_empty() {
        return Err(Error::InvalidState {
            op: "Trainer",
            buffer: nets.train.name.clone(),
            reason: "offloading the optimizer needs update operators (SGD, MomentumSGD, Adam) \
                     in the training net"
                .into(),
        });
    }
    let state: BTreeSet<String> = nets
        .params
        .iter()
        .flat_map(|p| mlp.optimizer().state_blobs(p))
        .collect();
    train.name.clone_from(&nets.train.name);
    if let Some(inputs) = &mut train.external_inputs {
        inputs.retain(|i| !state.contains(i));
    }
    let mut nets = nets.clone();
    nets.train = train;
    let mut state_init = NetDef::new(format!("{}_state", nets.init.name));
    let (fills, kept) = nets
        .init
        .ops
        .drain(..)
        .partition(|op| !op.outputs.is_empty() && op.outputs.iter().all(|o| state.contains(o)));
    state_init.ops = fills;
    nets.init.ops = kept;
    if let Some(outputs) = &mut nets.init.external_outputs {
        outputs.retain(|o| !state.contains(o));
    }
    Ok(Split {
        nets,
        update,
        state_init,
    })
}

impl Split {
    /// The training net's blobs the update reads or writes (the gradients and the
    /// parameters; not the state, which lives on the update's host device): each step they go
    /// through their host mirrors.
    pub(super) fn staged(&self) -> Vec<String> {
        let state: BTreeSet<&String> = self
            .state_init
            .ops
            .iter()
            .flat_map(|o| &o.outputs)
            .collect();
        let names: BTreeSet<&String> = self
            .update
            .ops
            .iter()
            .flat_map(|o| o.inputs.iter().chain(&o.outputs))
            .filter(|n| !state.contains(n))
            .collect();
        names.into_iter().cloned().collect()
    }

    /// Creates the state on a new host device and builds the update net there.
    pub(super) fn build(
        &self,
        ws: &Arc<Workspace>,
        setup: &Setup,
        cfg: &TrainConfig,
        mlp: &Mlp,
    ) -> Result<Offloaded> {
        // A handle of its own: no cap of the training device's, and a device other than a
        // `cpu` training device (the update works on replicas).
        let host = Device::cpu().isolated();
        let opts = setup.options(cfg, mlp, Vec::new());
        if !self.state_init.ops.is_empty() {
            ws.run_net_once(&self.state_init, &host, &opts)?;
        }
        let update = ws.create_net(&self.update, &host, &opts)?;
        let written: BTreeSet<&String> = self.update.ops.iter().flat_map(|o| &o.outputs).collect();
        let gradients: BTreeSet<String> = self
            .update
            .ops
            .iter()
            .flat_map(|o| &o.inputs)
            .filter(|n| !written.contains(n))
            .cloned()
            .collect();
        Ok(Offloaded {
            host,
            update,
            gradients: gradients.into_iter().collect(),
        })
    }
}

impl super::Trainer {
    /// The host device the update runs on, when the optimizer is offloaded
    /// ([`TrainConfig::offload_optimizer`]): its memory holds the optimizer's state.
    pub fn update_device(&self) -> Option<&Device> {
        self.offload.as_ref().map(|o| &o.host)
    }
}
