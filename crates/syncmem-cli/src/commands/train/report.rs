//! The report of `syncmem train`: JSON rows and the text form.

use std::collections::BTreeMap;

use serde::Serialize;
use syncmem::alloc::stats::CopyDir;
use syncmem::net::memory::{blob_report, BlobInfo};
use syncmem::{CopyStats, Device, MemorySummary};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{
    EpochStats, OffloadMoves, PlanningComparison, TrainConfig, Trainer, Transfers,
};

pub(super) use super::heap::HeapSteps;

mod distributed;
mod text;

/// Everything a report is made from.
pub(super) struct Run<'a> {
    /// Heap allocations of each step.
    pub heap: HeapSteps,
    pub device: &'a Device,
    pub note: Option<String>,
    pub source: String,
    pub data: &'a Dataset,
    pub cfg: &'a TrainConfig,
    pub trainer: &'a Trainer,
    /// Each epoch, with the held-out loss and accuracy after it (with a held-out set).
    pub epochs: &'a [(EpochStats, Option<(f64, f64)>)],
    pub final_loss: f64,
    pub final_accuracy: f64,
    pub held_out: Option<HeldOutRun>,
    pub seconds: f64,
    /// Every copy of the process during the run.
    pub process: CopyStats,
    pub planning: &'a PlanningComparison,
}

/// The held-out set and its loss and accuracy at the end.
pub(super) struct HeldOutRun {
    /// The file of `--test-data`, or `validation split`.
    pub source: String,
    pub samples: usize,
    /// `--validation-split`'s fraction.
    pub fraction: Option<f64>,
    pub loss: f64,
    pub accuracy: f64,
}

/// The report (the JSON schema is in `syncmem train --help`).
#[derive(Serialize)]
pub(super) struct Report {
    device: String,
    /// Every device trained on (one, or several for data-parallel training; the first holds
    /// the parameters).
    devices: Vec<String>,
    note: Option<String>,
    data: DataInfo,
    model: ModelInfo,
    settings: Settings,
    epochs: Vec<EpochRow>,
    #[serde(rename = "final")]
    final_: Final,
    /// The held-out set at the end (`--test-data`, `--validation-split`).
    held_out: Option<HeldOutReport>,
    seconds: f64,
    transfers: TransferReport,
    /// Copies between devices during the steps, per pair and route (data-parallel training).
    device_pairs: Vec<PairRow>,
    memory_cap: CapReport,
    /// What `--offload activations` moved (`None` without it).
    activations: Option<MovesReport>,
    /// What `--offload parameters` moved within the steps (`None` without it).
    parameters: Option<MovesReport>,
    waits: WaitReport,
    heap_allocations: HeapReport,
    blobs: Vec<BlobRow>,
    memory: Vec<MemRow>,
    saved: Option<Saved>,
    planning: PlanningRow,
    /// The device pool's figures (the summary printed in the human report).
    memory_summary: Option<MemorySummary>,
    /// The ranks and what summing over them cost (distributed training).
    distributed: Option<distributed::DistReport>,
}

/// Copies from one device to another during the steps.
#[derive(Serialize)]
struct PairRow {
    from: String,
    to: String,
    /// One device command (`true`) or through the host.
    direct: bool,
    count: u64,
    bytes: u64,
    count_per_step: f64,
    bytes_per_step: f64,
}

/// The parameters written by `--save`.
#[derive(Serialize)]
struct Saved {
    file: String,
    tensors: Vec<String>,
}

#[derive(Serialize)]
struct DataInfo {
    source: String,
    samples: usize,
    features: usize,
    classes: usize,
}

#[derive(Serialize)]
struct ModelInfo {
    widths: Vec<usize>,
    parameters: usize,
}

#[derive(Serialize)]
struct Settings {
    epochs: usize,
    batch: usize,
    lr: f32,
    /// `sgd`, `momentum` or `adam`.
    optimizer: String,
    /// The optimizer's state and update on the host (`--offload optimizer`).
    offload_optimizer: bool,
    /// The parameters on the host between steps (`--offload parameters`).
    offload_parameters: bool,
    /// The activations on the host from forward to backward (`--offload activations`).
    offload_activations: bool,
    seed: u64,
    plan: bool,
    fuse: bool,
}

#[derive(Serialize)]
struct EpochRow {
    epoch: usize,
    loss: f64,
    accuracy: f64,
    steps: usize,
    seconds: f64,
    /// The held-out set after the epoch.
    held_out: Option<Final>,
}

#[derive(Serialize)]
struct HeldOutReport {
    source: String,
    samples: usize,
    fraction: Option<f64>,
    loss: f64,
    accuracy: f64,
}

#[derive(Serialize, Clone, Copy)]
struct Final {
    loss: f64,
    accuracy: f64,
}

#[derive(Serialize, Clone, Copy)]
struct Dir {
    count: u64,
    bytes: u64,
}

#[derive(Serialize, Clone, Copy)]
struct Copies {
    host_to_device: Dir,
    device_to_host: Dir,
    device_to_device: Dir,
    mapped: Dir,
    spilled: Dir,
    refilled: Dir,
}

/// The memory cap and what it cost during the steps.
#[derive(Serialize)]
struct CapReport {
    cap: Option<u64>,
    spills_per_step: f64,
    spilled_bytes_per_step: f64,
    refills_per_step: f64,
    refilled_bytes_per_step: f64,
    spills: u64,
    refills: u64,
}

/// The values moved during the steps by `--offload activations` (between forward and
/// backward) or `--offload parameters` (in layer by layer, back after their update).
#[derive(Serialize)]
struct MovesReport {
    /// Blobs the plan moves.
    planned: usize,
    /// Values that left the device, per step.
    offloads_per_step: f64,
    /// Device bytes they released, per step.
    released_bytes_per_step: f64,
    /// Bytes copied down and up, per step (0 where the host uses the device's memory in
    /// place).
    down_bytes_per_step: f64,
    up_bytes_per_step: f64,
    /// Values brought back, and those whose copy back was still running when their reader
    /// started (not hidden behind the operator before it).
    refills: u64,
    not_ready: u64,
}

/// Host waits on device work during the steps, counted by the library.
#[derive(Serialize)]
struct WaitReport {
    per_step: f64,
    max_step: u64,
    total: u64,
}

/// Heap allocations of the steps (the first step warms caches up: it is apart).
#[derive(Serialize)]
struct HeapReport {
    /// Mean over the steps after the first.
    per_step: f64,
    /// The most in one step after the first.
    max_step: u64,
    first_step: u64,
    steps: u64,
}

#[derive(Serialize)]
struct TransferReport {
    steps: u64,
    setup: Copies,
    training: Copies,
    per_step: Copies,
    max_step: Copies,
    eval: Copies,
    process_training: Copies,
    process: Copies,
}

#[derive(Serialize)]
struct BlobRow {
    name: String,
    dtype: Option<&'static str>,
    dims: Vec<usize>,
    bytes: usize,
    capacity: usize,
    head: &'static str,
    host: bool,
    device: bool,
    host_to_device: Dir,
    device_to_host: Dir,
    mapped: Dir,
}

#[derive(Serialize)]
struct MemRow {
    label: String,
    in_use: u64,
    peak: u64,
}

#[derive(Serialize)]
struct PlanningRow {
    enabled: bool,
    unplanned_peak: u64,
    planned_peak: u64,
    saved: u64,
    device_peak_unplanned: u64,
    device_peak_planned: u64,
    planned_blobs: usize,
    slots: usize,
    /// Shared buffer -> the blobs of the train net it holds, in order.
    shared: BTreeMap<String, Vec<String>>,
}

fn dir(d: CopyDir) -> Dir {
    Dir {
        count: d.count,
        bytes: d.bytes,
    }
}

fn copies(c: CopyStats) -> Copies {
    Copies {
        host_to_device: dir(c.host_to_device),
        device_to_host: dir(c.device_to_host),
        device_to_device: dir(c.device_to_device),
        mapped: dir(c.mapped),
        spilled: dir(c.spilled),
        refilled: dir(c.refilled),
    }
}

fn per_step(c: CopyStats, steps: u64) -> Copies {
    let d = |x: CopyDir| Dir {
        count: x.count / steps.max(1),
        bytes: x.bytes / steps.max(1),
    };
    Copies {
        host_to_device: d(c.host_to_device),
        device_to_host: d(c.device_to_host),
        device_to_device: d(c.device_to_device),
        mapped: d(c.mapped),
        spilled: d(c.spilled),
        refilled: d(c.refilled),
    }
}

fn cap_report(cap: Option<u64>, t: &Transfers) -> CapReport {
    let steps = t.step_count.max(1) as f64;
    let s = &t.steps;
    CapReport {
        cap,
        spills_per_step: s.spilled.count as f64 / steps,
        spilled_bytes_per_step: s.spilled.bytes as f64 / steps,
        refills_per_step: s.refilled.count as f64 / steps,
        refilled_bytes_per_step: s.refilled.bytes as f64 / steps,
        spills: s.spilled.count,
        refills: s.refilled.count,
    }
}

/// Builds the report of a finished run.
pub(super) fn build(r: Run<'_>) -> Report {
    Report {
        device: r.device.label().to_string(),
        devices: r
            .trainer
            .devices()
            .iter()
            .map(|d| d.label().to_string())
            .collect(),
        device_pairs: pair_rows(r.trainer),
        note: r.note,
        data: DataInfo {
            source: r.source,
            samples: r.data.len(),
            features: r.data.features,
            classes: r.data.classes,
        },
        model: ModelInfo {
            widths: r.trainer.mlp().widths.clone(),
            parameters: r.trainer.mlp().parameter_count(),
        },
        settings: Settings {
            epochs: r.cfg.epochs,
            batch: r.cfg.batch,
            lr: r.cfg.lr,
            optimizer: r.cfg.optimizer.to_string(),
            offload_optimizer: r.cfg.offload_optimizer,
            offload_parameters: r.cfg.offload_parameters,
            offload_activations: r.cfg.offload_activations,
            seed: r.cfg.seed,
            plan: r.cfg.plan,
            fuse: r.cfg.fuse,
        },
        epochs: r.epochs.iter().map(epoch_row).collect(),
        final_: Final {
            loss: r.final_loss,
            accuracy: r.final_accuracy,
        },
        held_out: r.held_out.map(|h| HeldOutReport {
            source: h.source,
            samples: h.samples,
            fraction: h.fraction,
            loss: h.loss,
            accuracy: h.accuracy,
        }),
        seconds: r.seconds,
        transfers: transfer_report(r.trainer.transfers(), r.process),
        memory_cap: cap_report(r.device.memory_cap(), &r.trainer.transfers()),
        activations: moves_report(r.trainer, r.trainer.activation_offload()),
        parameters: moves_report(r.trainer, r.trainer.parameter_offload()),
        waits: wait_report(&r.trainer.transfers()),
        heap_allocations: heap_report(&r.heap),
        blobs: blob_report(r.trainer.workspace())
            .iter()
            .map(blob_row)
            .collect(),
        memory: memory_rows(),
        saved: None,
        planning: planning_row(r.trainer, r.planning),
        memory_summary: r.device.pool_stats().map(|s| s.summary()),
        distributed: distributed::build(r.trainer, r.cfg),
    }
}

/// Copies between devices during the steps, per pair and route.
fn pair_rows(trainer: &Trainer) -> Vec<PairRow> {
    let steps = trainer.transfers().step_count.max(1) as f64;
    trainer
        .pair_transfers()
        .iter()
        .map(|p| PairRow {
            from: p.from.clone(),
            to: p.to.clone(),
            direct: p.direct,
            count: p.count,
            bytes: p.bytes,
            count_per_step: p.count as f64 / steps,
            bytes_per_step: p.bytes as f64 / steps,
        })
        .collect()
}

/// One epoch, with the held-out loss and accuracy after it.
fn epoch_row((e, held): &(EpochStats, Option<(f64, f64)>)) -> EpochRow {
    EpochRow {
        epoch: e.epoch,
        loss: e.loss,
        accuracy: e.accuracy,
        steps: e.steps,
        seconds: e.seconds,
        held_out: held.map(|(loss, accuracy)| Final { loss, accuracy }),
    }
}

/// Host waits on device work during the steps.
fn wait_report(t: &Transfers) -> WaitReport {
    WaitReport {
        per_step: t.waits.per_step(t.step_count),
        max_step: t.waits.max_step,
        total: t.waits.total,
    }
}

/// Heap allocations of the steps: the first apart, the others per step.
fn heap_report(h: &HeapSteps) -> HeapReport {
    HeapReport {
        per_step: if h.steps > 1 {
            h.rest as f64 / (h.steps - 1) as f64
        } else {
            0.0
        },
        max_step: h.max_rest,
        first_step: h.first,
        steps: h.steps,
    }
}

fn transfer_report(t: Transfers, process: CopyStats) -> TransferReport {
    TransferReport {
        steps: t.step_count,
        setup: copies(t.setup),
        training: copies(t.steps),
        per_step: per_step(t.steps, t.step_count),
        max_step: copies(t.max_step),
        eval: copies(t.eval),
        process_training: copies(t.process_steps),
        process: copies(process),
    }
}

fn blob_row(b: &BlobInfo) -> BlobRow {
    BlobRow {
        name: b.name.clone(),
        dtype: b.dtype,
        dims: b.dims.clone(),
        bytes: b.bytes,
        capacity: b.capacity,
        head: b.head_str(),
        host: b.host_allocated,
        device: b.device_allocated,
        host_to_device: dir(b.copies.host_to_device),
        device_to_host: dir(b.copies.device_to_host),
        mapped: dir(b.copies.mapped),
    }
}

fn memory_rows() -> Vec<MemRow> {
    let s = syncmem::stats();
    std::iter::once(&s.host)
        .chain(s.devices.iter())
        .map(|m| MemRow {
            label: m.label.clone(),
            in_use: m.in_use,
            peak: m.peak,
        })
        .collect()
}

fn planning_row(trainer: &Trainer, p: &PlanningComparison) -> PlanningRow {
    let plan = trainer.train_net().plan();
    let mut shared: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Some(plan) = plan {
        // In the order the net first writes them (the fused def is the one planned).
        let net = trainer.train_net();
        let planned = net.rewritten().unwrap_or(&trainer.nets().train);
        for op in &planned.ops {
            for o in &op.outputs {
                if let Some(slot) = plan.mapping.get(o) {
                    let v = shared.entry(slot.clone()).or_default();
                    if !v.contains(o) {
                        v.push(o.clone());
                    }
                }
            }
        }
    }
    PlanningRow {
        enabled: plan.is_some(),
        shared,
        unplanned_peak: p.unplanned.tensor_peak.device,
        planned_peak: p.planned.tensor_peak.device,
        saved: p.saved_bytes(),
        device_peak_unplanned: p.unplanned.device_peak,
        device_peak_planned: p.planned.device_peak,
        planned_blobs: p.planned_blobs,
        slots: p.slots,
    }
}

impl Report {
    /// Records the file `--save` wrote and the tensors in it.
    pub(super) fn set_saved(&mut self, file: String, tensors: Vec<String>) {
        self.saved = Some(Saved { file, tensors });
    }

    /// The device trained on.
    pub(super) fn device(&self) -> &str {
        &self.device
    }
}

/// What an offload moved (`moves`), per step of `t`.
fn moves_report(t: &Trainer, moves: Option<OffloadMoves>) -> Option<MovesReport> {
    let a = moves?;
    let steps = t.transfers().step_count.max(1) as f64;
    Some(MovesReport {
        planned: a.planned,
        offloads_per_step: a.offloads as f64 / steps,
        released_bytes_per_step: a.bytes_released as f64 / steps,
        down_bytes_per_step: a.bytes_down as f64 / steps,
        up_bytes_per_step: a.bytes_up as f64 / steps,
        refills: a.refills,
        not_ready: a.not_ready,
    })
}
