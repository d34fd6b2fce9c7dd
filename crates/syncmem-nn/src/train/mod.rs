//! A training loop for [`Mlp`] on one device: everything stays on the device, only the loss and
//! accuracy scalars come back each step.
//!
//! [`Trainer::new`] shuffles the dataset once (from the seed), cuts it into batches, uploads
//! every batch once, runs the init net, and creates the train and eval nets (memory-planned
//! when [`TrainConfig::plan`]). A step makes the `data` and `label` blobs share the storage of
//! one uploaded batch (no copy), queues the train net, and reads the two scalars back: with
//! loss fusion (the default), the fused loss writes them side by side and one blocking read
//! brings both (see [`crate::fuse::loss`]); without it, the loss by a copy queued first and
//! the accuracy by a blocking read behind it. So the host waits once per step (on a device that
//! runs asynchronously; never on `cpu`). Per step: zero host-to-device copies, one 8-byte
//! device-to-host copy (two 4-byte ones without fusion), one host wait, which
//! [`Trainer::transfers`] counts from the calling thread's counters
//! ([`syncmem::alloc::stats::thread_copies`]: no walk over the blobs, and the work of other
//! threads, another trainer's say, does not count), and no heap allocation of the library's
//! own once the first step has run (on a `cpu` device with neither AVX-512F nor AVX2, the GEMM
//! library `matrixmultiply` allocates its packing buffers inside each large enough product).
//!
//! Equal seeds give equal data, equal initial weights (fills draw on the host), equal batch
//! order, so every device computes the same steps up to float rounding (kernels sum in
//! different orders); training can amplify that rounding: with batches of a few samples at a
//! large learning rate (0.5), data-parallel and single-device runs end far apart.
//!
//! # Several devices
//!
//! [`Trainer::data_parallel`] trains on several devices: the parameters live once, in the
//! trainer's workspace, on the first device, with the optimizer's state (momentum, Adam's
//! moments) beside them; each device has a shard (a child workspace that sees the parameters
//! through its parent, its rows of every batch uploaded once, the train net without its update
//! operators: `SGD`, `MomentumSGD` or `Adam`). A step runs every shard's net on its rows (their
//! operators read the parameters through replicas on their own devices, copied from the first
//! device when stale); sums the gradients on the first device, each weighted by its shard's
//! share of the batch, reading them through replicas there; runs the update once there (which
//! makes the other replicas stale: the next step's reads copy the parameters out again); and
//! weighs the shards' loss and accuracy the same way. The batch order, initial weights and rows
//! are those of single-device training with the same seed; only the order of the float sums
//! differs (with the caveat above: at the defaults the losses stay within 1e-4, with tiny
//! batches at lr 0.5 they do not).
//! [`Trainer::pair_transfers`] counts the copies between devices.
//!
//! # Several processes
//!
//! [`Trainer::distributed`] trains as one rank of a job of several processes (MPI ranks with
//! the `mpi` feature: [`collective::mpi::Mpi`]), each on its share of every batch, with the
//! gradients summed over the ranks in buckets while backward runs: see its docs and
//! [`collective`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use syncmem::alloc::pairs::{pair_copies, PairCopies};
use syncmem::alloc::stats::CopyStats;
use syncmem::net::memory::{measure_run, RunMemory};
use syncmem::net::Net;
use syncmem::{Device, Error, Result, Tensor, Workspace};

use crate::mlp::{Dataset, Mlp, MlpNets, DATA, LABEL};

pub mod activations;
pub mod collective;
mod config;
mod distributed;
mod held_out;
mod meter;
mod moves;
pub mod offload;
mod parallel;
mod params;
mod planning;
mod reduce;
mod residency;
mod scalars;
mod setup;

use meter::{add, PairMeter, StepMeter};
use scalars::read_scalars;

pub use crate::optimizer::Optimizer;
pub use planning::{compare_planning, PlanningComparison};
pub use reduce::CommStats;
use setup::Setup;

pub use activations::OffloadMoves;
pub use config::TrainConfig;

/// Loss and accuracy of one epoch (means over its samples).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct EpochStats {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f64,
    /// Mean training accuracy (0 to 1).
    pub accuracy: f64,
    /// Steps run.
    pub steps: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Host waits on device work during training steps (see
/// [`syncmem::alloc::stats::host_waits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waits {
    /// During all training steps.
    pub total: u64,
    /// During the last step.
    pub last_step: u64,
    /// The most in any single step.
    pub max_step: u64,
}

impl Waits {
    /// Mean waits per step over `steps` steps.
    pub fn per_step(&self, steps: u64) -> f64 {
        if steps == 0 {
            0.0
        } else {
            self.total as f64 / steps as f64
        }
    }
}

/// Copies between host and device made by the trainer's buffers, and host waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transfers {
    /// During [`Trainer::new`]: batch uploads, initial weights.
    pub setup: CopyStats,
    /// During all training steps: the copies the thread running a step queued while it ran
    /// (a step runs on one thread; what other threads copy meanwhile does not count).
    pub steps: CopyStats,
    /// During the last training step.
    pub last_step: CopyStats,
    /// The most copies in one direction seen in any single step, per direction.
    pub max_step: CopyStats,
    /// Training steps run.
    pub step_count: u64,
    /// During evaluations.
    pub eval: CopyStats,
    /// Every copy the process made while training steps ran, whichever thread made it (other
    /// threads' work included: compare with `steps`).
    pub process_steps: CopyStats,
    /// Host waits on device work of the thread running the steps, during training steps.
    pub waits: Waits,
}

struct Batch {
    x: Tensor,
    y: Tensor,
}

/// An [`Mlp`] being trained on one device, or on several ([`Trainer::data_parallel`]; see
/// the [module docs](self)).
pub struct Trainer {
    device: Device,
    ws: Arc<Workspace>,
    mlp: Mlp,
    nets: MlpNets,
    train: Arc<Net>,
    eval: Arc<Net>,
    /// The batches on `device` (empty when training on several devices: the shards hold
    /// theirs).
    batches: Vec<Batch>,
    /// Rows of each batch.
    sizes: Vec<usize>,
    /// The shards, when training on several devices.
    parallel: Option<parallel::Parallel>,
    /// Copies between devices during the steps: (count, bytes) per entry of
    /// [`pair_copies`], and the readings around a step (kept to reuse their memory).
    pairs: PairMeter,
    samples: usize,
    rng: StdRng,
    /// The batch order of the current epoch (reshuffled in place each epoch).
    order: Vec<usize>,
    epoch: usize,
    transfers: Transfers,
    /// The held-out dataset on `device` ([`Trainer::set_held_out`]).
    held_out: Option<held_out::HeldOut>,
    /// The update on the host, when the optimizer is offloaded.
    offload: Option<offload::Offloaded>,
    /// The parameters, when they leave the device between steps.
    params: Option<params::OffloadedParams>,
    /// The activations' moves, when offloaded.
    activations: Option<activations::OffloadedActivations>,
    /// Whether finished batches leave a capped device.
    residency: residency::BatchResidency,
}

impl Trainer {
    /// Sets up training of an MLP `features -> hidden... -> classes` on `device`.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for a batch size of 0, the errors of [`Mlp::new`], and device
    /// or operator errors from uploading the data and running the init net.
    pub fn new(device: &Device, data: &Dataset, cfg: &TrainConfig) -> Result<Self> {
        let (mlp, nets) = default_mlp(data, cfg)?;
        Self::build(device, data, cfg, mlp, nets)
    }

    /// Sets up training of `mlp` with nets of its own, e.g. read from JSON files
    /// ([`syncmem::net::NetDef::from_file`]) or built with another activation
    /// ([`Mlp::with_activation`]): they must use the blob names of [`Mlp::nets`] (`data`,
    /// `label`, the parameters, `loss`, `accuracy`; the intermediate blobs are the nets' own).
    /// The widths and the learning rate are `mlp`'s (`cfg.hidden` and `cfg.lr` are not used);
    /// the batches, seed, planning and fusion are `cfg`'s.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when `mlp`'s first width is not the data's features or its last
    /// is not the data's classes; as [`Trainer::new`]; the errors of building the nets (an
    /// operator type that is not registered, bad arguments).
    pub fn with_nets(
        device: &Device,
        data: &Dataset,
        cfg: &TrainConfig,
        mlp: Mlp,
        nets: MlpNets,
    ) -> Result<Self> {
        check_widths(&mlp, data)?;
        Self::build(device, data, cfg, mlp, nets)
    }

    fn build(
        device: &Device,
        data: &Dataset,
        cfg: &TrainConfig,
        mlp: Mlp,
        nets: MlpNets,
    ) -> Result<Self> {
        crate::register_operators()?;
        let split = match cfg.offload_optimizer {
            true => Some(offload::split(&mlp, &nets)?),
            false => None,
        };
        let mut nets = split.as_ref().map_or(nets, |s| s.nets.clone());
        if cfg.offload_parameters {
            // Each layer's update as soon as backward is done with it: its weights go back
            // to the host then (with the optimizer offloaded the net has no update).
            let names: BTreeSet<String> = nets.params.iter().cloned().collect();
            nets.train = params::hoist_updates(&nets.train, &names);
        }
        let setup = Setup::new(device, data, cfg, &nets)?;
        let offloaded = match &split {
            Some(s) => Some(s.build(&setup.ws, &setup, cfg, &mlp)?),
            None => None,
        };
        let mut batches = Vec::new();
        for (i, rows) in setup.rows.iter().enumerate() {
            batches.push(parallel::upload(rows, data, device, &format!("batch{i}"))?);
        }
        let opts = setup.options(cfg, &mlp, Vec::new());
        let ws = setup.ws.clone();
        let train_cfg = cfg.clone().with_plan(activations::plan_train_net(cfg));
        let train_opts = setup.options(&train_cfg, &mlp, Vec::new());
        let train = ws.create_net(&nets.train, device, &train_opts)?;
        let eval = ws.create_net(&nets.eval, device, &opts)?;
        let mut t = setup.trainer(device, data, mlp, nets, train, eval);
        t.batches = batches;
        if let Some(s) = &split {
            moves::pin_host(&t.ws, &t.device, &s.staged());
        }
        t.offload = offloaded;
        t.params = params::OffloadedParams::new(cfg, &t.train, &t.device, &t.ws, &t.nets.params)?;
        if cfg.offload_activations {
            let acts = activations::OffloadedActivations::new(&t.train, &t.device, &t.ws)?;
            t.activations = Some(acts);
        }
        for name in [DATA, LABEL] {
            t.ws.create_blob(name)?
                .write()
                .reset(Tensor::new(&t.device).with_label(name));
        }
        t.feed(0)?;
        t.transfers.setup = t.copy_totals();
        Ok(t)
    }

    /// Makes `data` and `label` share the storage of batch `i` (no copy, no allocation).
    fn feed(&self, i: usize) -> Result<()> {
        feed_batch(&self.ws, &self.device, &self.batches[i])
    }

    fn read_scalars(&self, net: &Net) -> Result<(f32, f32)> {
        read_scalars(&self.ws, net)
    }

    /// Runs one training step on batch `i`; returns (loss, accuracy) of the batch before the
    /// update. With [`TrainConfig::offload_parameters`] the parameters come to the device layer
    /// by layer, ahead of their readers, and once the scalars are read they go back to the host
    /// and free their device memory (see `params.rs`); with
    /// [`TrainConfig::offload_activations`] the activations leave between forward and backward
    /// (see [`activations`]).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a batch index past the end; the errors of [`Net::run`].
    pub fn step(&mut self, i: usize) -> Result<(f32, f32)> {
        if i >= self.sizes.len() {
            return Err(Error::OutOfBounds {
                what: "training batches".into(),
                offset: i,
                len: 1,
                size: self.sizes.len(),
            });
        }
        // The events of traces recording the device carry the step (counted from 1).
        self.device
            .mark_trace_step(Some(self.transfers.step_count + 1));
        let parallel = self.parallel.is_some();
        let meter = StepMeter::start(parallel.then_some(&mut self.pairs));
        let (loss, acc) = if parallel {
            self.parallel_step(i)?
        } else {
            self.feed(i)?;
            if let Some(p) = &mut self.params {
                p.bring_in()?;
            }
            self.run_train_net()?;
            if let Some(o) = &self.offload {
                o.run(&self.ws)?;
            }
            // After the read, which waits for the step anyway.
            let scalars = self.read_scalars(&self.train)?;
            if let Some(p) = &self.params {
                p.write_back()?;
            }
            self.after_batch(i)?;
            scalars
        };
        meter.stop(&mut self.transfers, parallel.then_some(&mut self.pairs));
        Ok((loss, acc))
    }

    /// One pass over every batch, in an order drawn from the seed.
    ///
    /// # Errors
    /// As [`Trainer::step`].
    pub fn run_epoch(&mut self) -> Result<EpochStats> {
        self.run_epoch_with(|_, _| {})
    }

    /// As [`Trainer::run_epoch`], calling `progress(step, steps)` after each step.
    ///
    /// # Errors
    /// As [`Trainer::step`].
    pub fn run_epoch_with(&mut self, progress: impl FnMut(usize, usize)) -> Result<EpochStats> {
        self.run_epoch_around(|_| {}, progress)
    }

    /// As [`Trainer::run_epoch_with`], also calling `before(step)` right before each step, so
    /// that a caller can measure exactly one step (its allocations, its time).
    ///
    /// # Errors
    /// As [`Trainer::step`].
    pub fn run_epoch_around(
        &mut self,
        mut before: impl FnMut(usize),
        mut progress: impl FnMut(usize, usize),
    ) -> Result<EpochStats> {
        let start = Instant::now();
        // The same order as a fresh `0..n` shuffled: every epoch starts from the sorted list.
        let steps = self.sizes.len();
        for (k, slot) in self.order.iter_mut().enumerate() {
            *slot = k;
        }
        self.order.shuffle(&mut self.rng);
        let (mut loss, mut acc) = (0.0f64, 0.0f64);
        for k in 0..steps {
            let i = self.order[k];
            let n = self.sizes[i] as f64;
            before(k + 1);
            let (l, a) = self.step(i)?;
            loss += f64::from(l) * n;
            acc += f64::from(a) * n;
            progress(k + 1, steps);
        }
        self.epoch += 1;
        let n = self.samples.max(1) as f64;
        Ok(EpochStats {
            epoch: self.epoch,
            loss: loss / n,
            accuracy: acc / n,
            steps,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Loss and accuracy of the current weights over the whole dataset (the eval net on every
    /// batch).
    ///
    /// # Errors
    /// The errors of [`Net::run`].
    pub fn evaluate(&mut self) -> Result<(f64, f64)> {
        // Not a training step.
        self.device.mark_trace_step(None);
        let before = self.copy_totals();
        let (mut loss, mut acc) = (0.0f64, 0.0f64);
        for i in 0..self.sizes.len() {
            let n = self.sizes[i] as f64;
            let (l, a) = if self.parallel.is_some() {
                self.parallel_eval(i)?
            } else {
                self.feed(i)?;
                self.eval.run(&self.ws)?;
                let scalars = self.read_scalars(&self.eval)?;
                self.after_batch(i)?;
                scalars
            };
            loss += f64::from(l) * n;
            acc += f64::from(a) * n;
        }
        // Distributed: each rank evaluated its rows of every batch.
        let [loss, acc] = self.sum_over_ranks([loss, acc])?;
        let d = self.copy_totals().since(&before);
        self.transfers.eval = add(self.transfers.eval, d);
        let n = self.samples.max(1) as f64;
        Ok((loss / n, acc / n))
    }

    /// Copies made by the trainer's buffers so far, by phase.
    pub fn transfers(&self) -> Transfers {
        self.transfers
    }

    /// Host-device copies made so far by every buffer of the trainer (workspace blobs and
    /// batches, each storage counted once).
    pub fn copy_totals(&self) -> CopyStats {
        let mut seen = BTreeSet::new();
        let mut total = CopyStats::default();
        let mut visit = |t: &Tensor| {
            if let Some(m) = t.synced() {
                if seen.insert(std::ptr::from_ref(m) as usize) {
                    total = add(total, m.copy_stats());
                }
            }
        };
        let shards = self.parallel.iter().flat_map(|p| &p.shards);
        let batches = self
            .batches
            .iter()
            .chain(self.held_out.iter().flat_map(|h| &h.batches))
            .chain(shards.clone().flat_map(|s| s.batches.iter().flatten()));
        for b in batches {
            visit(&b.x);
            visit(&b.y);
        }
        for ws in std::iter::once(&*self.ws).chain(shards.map(|s| &*s.ws)) {
            for name in ws.local_blobs() {
                if let Some(blob) = ws.try_get_blob(&name) {
                    if let Ok(t) = blob.read().get::<Tensor>() {
                        visit(t);
                    }
                }
            }
        }
        total
    }

    /// The workspace (parameters, activations, `data`, `label`, `loss`, `accuracy`).
    pub fn workspace(&self) -> &Workspace {
        &self.ws
    }

    /// The model.
    pub fn mlp(&self) -> &Mlp {
        &self.mlp
    }

    /// The net definitions.
    pub fn nets(&self) -> &MlpNets {
        &self.nets
    }

    /// The train net (its [`Net::plan`] tells how memory was planned).
    pub fn train_net(&self) -> &Arc<Net> {
        &self.train
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Number of batches (steps per epoch).
    pub fn batch_count(&self) -> usize {
        self.sizes.len()
    }

    /// Copies between devices during the training steps, per pair of devices and route
    /// (data-parallel training; empty on one device). Counted by the process's counters
    /// around each step: copies between devices that other threads make meanwhile count too.
    pub fn pair_transfers(&self) -> Vec<PairCopies> {
        pair_copies()
            .into_iter()
            .zip(&self.pairs.totals)
            .filter(|(_, (count, _))| *count > 0)
            .map(|(mut p, &(count, bytes))| {
                p.count = count;
                p.bytes = bytes;
                p
            })
            .collect()
    }

    /// Epochs run so far.
    pub fn epochs_run(&self) -> usize {
        self.epoch
    }

    /// Runs one training step on the first batch and measures its memory (see
    /// [`measure_run`]); counts as a step. On several devices it measures the first device's
    /// shard: its forward and backward on its rows, without the update.
    ///
    /// # Errors
    /// The errors of [`Net::run`].
    pub fn measure_step(&mut self) -> Result<RunMemory> {
        let before = self.copy_totals();
        let m = match &self.parallel {
            // The first device's shard.
            Some(p) => p.measure_first()?,
            None => {
                self.feed(0)?;
                measure_run(&self.train, &self.ws)?
            }
        };
        let d = self.copy_totals().since(&before);
        self.transfers.steps = add(self.transfers.steps, d);
        self.transfers.step_count += 1;
        Ok(m)
    }
}

/// Makes `ws`'s `data` and `label` share the storage of batch `b` (no copy, no allocation).
fn feed_batch(ws: &Workspace, device: &Device, b: &Batch) -> Result<()> {
    for (name, src) in [(DATA, &b.x), (LABEL, &b.y)] {
        let blob = ws.create_blob(name)?;
        let mut blob = blob.write();
        if !blob.is_type::<Tensor>() {
            blob.reset(Tensor::new(device).with_label(name));
        }
        let t = blob.get_mut::<Tensor>()?;
        t.resize(src.dims())?;
        t.share_data(src)?;
    }
    Ok(())
}

/// The MLP and nets of `syncmem train` for `data` and `cfg`.
fn default_mlp(data: &Dataset, cfg: &TrainConfig) -> Result<(Mlp, MlpNets)> {
    let mut widths = vec![data.features];
    widths.extend(&cfg.hidden);
    widths.push(data.classes.max(1));
    let mlp = Mlp::new(&widths, cfg.lr)?.with_optimizer(cfg.optimizer);
    let nets = mlp.nets("mlp");
    Ok((mlp, nets))
}

/// [`Error::InvalidShape`] when `mlp`'s first width is not the data's features or its last is
/// not the data's classes.
fn check_widths(mlp: &Mlp, data: &Dataset) -> Result<()> {
    let (first, last) = (mlp.widths[0], mlp.widths[mlp.widths.len() - 1]);
    if first != data.features || last != data.classes.max(1) {
        return Err(Error::InvalidShape {
            what: "MLP".into(),
            shape: format!("{:?}", mlp.widths),
            reason: format!(
                "the data has {} features and {} classes",
                data.features, data.classes
            ),
        });
    }
    Ok(())
}
