//! `train` under the two memory features of a host-unified device: zero-copy mirrors against
//! two mirrors (bytes copied in setup and per step, epoch times), and a memory cap of half the
//! unplanned device peak against no cap (spills and refills per step, epoch times).
//!
//! Each run trains on its own isolated handle of the device (own pools, cap and zero-copy
//! setting) from the same seed; epochs of the two runs of a pair are interleaved and the
//! median epoch is reported.

use serde::Serialize;
use syncmem::alloc::pool::config::device_pool_from_env;
use syncmem::{CopyStats, Device, MemoryCap, Result, ZeroCopy};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer, Transfers};

use crate::rows::median;
use crate::{Row, Samples};

/// Goal of the epoch ratio two mirrors / zero-copy (zero-copy no slower).
pub const ZERO_COPY_EPOCH_GOAL: f64 = 1.0;

/// What one training run moved and how long its epochs took.
#[derive(Debug, Clone, Serialize)]
pub struct TrainMemoryRow {
    /// The device.
    pub device: String,
    /// `"zero-copy"`, `"two mirrors"`, `"uncapped"` or `"capped"`.
    pub run: String,
    /// The memory cap in bytes (`None`: none).
    pub cap: Option<u64>,
    /// Bytes copied between host and device while setting up (parameters, batches).
    pub setup_bytes: u64,
    /// Bytes copied per training step, on average.
    pub step_bytes: f64,
    /// Zero-copy syncs per step, on average (no byte copied).
    pub syncs_per_step: f64,
    /// Spills per step, on average.
    pub spills_per_step: f64,
    /// Bytes written back to the host by spills, per step.
    pub spilled_bytes_per_step: f64,
    /// Refills per step, on average.
    pub refills_per_step: f64,
    /// Bytes brought back to the device by refills, per step.
    pub refilled_bytes_per_step: f64,
    /// Median epoch, milliseconds.
    pub epoch_ms: f64,
    /// Loss of the last epoch.
    pub final_loss: f64,
    /// Whether the final loss is the one of the run it is compared with, bit for bit.
    pub same_loss: bool,
    /// Zero-copy runs: whether setup and steps copied nothing (the goal: 0 and 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_copy_goal_met: Option<bool>,
    /// Capped runs: a lower bound of the bytes a step must move under the cap
    /// ([`crate::bound`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_bytes_per_step: Option<u64>,
}

/// One run being timed.
struct Run {
    trainer: Trainer,
    device: Device,
    epochs_ns: Vec<f64>,
    loss: f64,
}

impl Run {
    fn new(device: Device, data: &Dataset, cfg: &TrainConfig) -> Result<Run> {
        let mut trainer = Trainer::new(&device, data, cfg)?;
        let loss = trainer.run_epoch()?.loss; // kernels built, buffers allocated
        Ok(Run {
            trainer,
            device,
            epochs_ns: Vec::new(),
            loss,
        })
    }

    fn epoch(&mut self) -> Result<()> {
        let e = self.trainer.run_epoch()?;
        self.epochs_ns.push(e.seconds * 1e9);
        self.loss = e.loss;
        Ok(())
    }

    /// The epochs of this run (ours) and of `base`, interleaved.
    fn samples(&self, base: &Run) -> Samples {
        Samples::new(self.epochs_ns.clone(), base.epochs_ns.clone())
    }

    fn row(&self, run: &str, cap: Option<u64>, other_loss: f64) -> TrainMemoryRow {
        let t: Transfers = self.trainer.transfers();
        let steps = t.step_count.max(1) as f64;
        let per = |x: u64| x as f64 / steps;
        let s: CopyStats = t.steps;
        TrainMemoryRow {
            device: self.device.label().to_string(),
            run: run.into(),
            cap,
            setup_bytes: t.setup.total_bytes(),
            step_bytes: per(s.total_bytes()),
            syncs_per_step: per(s.mapped.count),
            spills_per_step: per(s.spilled.count),
            spilled_bytes_per_step: per(s.spilled.bytes),
            refills_per_step: per(s.refilled.count),
            refilled_bytes_per_step: per(s.refilled.bytes),
            epoch_ms: median(self.epochs_ns.clone()) / 1e6,
            final_loss: self.loss,
            same_loss: self.loss.to_bits() == other_loss.to_bits(),
            no_copy_goal_met: None,
            bound_bytes_per_step: None,
        }
    }
}

/// Trains `a` and `b` for `epochs` interleaved epochs after their first.
fn interleave(a: &mut Run, b: &mut Run, epochs: usize) -> Result<()> {
    for _ in 0..epochs {
        a.epoch()?;
        b.epoch()?;
    }
    Ok(())
}

fn data_and_config(plan: bool, fuse: bool) -> (Dataset, TrainConfig) {
    let cfg = TrainConfig::default().with_plan(plan).with_fuse(fuse);
    (Dataset::spirals(1000, 3, 0.2, cfg.seed), cfg)
}

/// Interleaved epochs per run of a pair: an epoch of these rows takes a few milliseconds at
/// hidden 64, so a spread worth a verdict needs a few dozen of them (nine left the capped
/// rows' spread wider than the distance to their goal).
fn epochs(quick: bool) -> usize {
    if quick {
        3
    } else {
        25
    }
}

/// `syncmem train` on `dev` with zero-copy mirrors against two mirrors: `None` where `dev`'s
/// memory is not host memory. The time row's ratio is two mirrors / zero-copy (goal
/// [`ZERO_COPY_EPOCH_GOAL`]).
///
/// # Errors
/// Training errors.
pub fn zero_copy_rows(dev: &Device, quick: bool) -> Result<Option<(Row, [TrainMemoryRow; 2])>> {
    let shared = dev.isolated();
    shared.set_zero_copy(ZeroCopy::Auto);
    if shared.zero_copy_protocol().is_none() {
        return Ok(None);
    }
    let copying = dev.isolated();
    copying.set_zero_copy(ZeroCopy::Off);
    let (data, cfg) = data_and_config(true, true);
    let mut zc = Run::new(shared, &data, &cfg)?;
    let mut off = Run::new(copying, &data, &cfg)?;
    interleave(&mut zc, &mut off, epochs(quick))?;
    let mut z = zc.row("zero-copy", None, off.loss);
    z.no_copy_goal_met = Some(z.setup_bytes == 0 && z.step_bytes == 0.0);
    let o = off.row("two mirrors", None, zc.loss);
    let label = dev.label();
    let row = zc
        .samples(&off)
        .row(
            &format!("train epoch zero-copy/off {label}"),
            "syncmem train epoch, zero-copy mirrors",
            "the same with SYNCMEM_ZERO_COPY=off (two mirrors)",
        )
        .with_goal(ZERO_COPY_EPOCH_GOAL);
    Ok(Some((row, [z, o])))
}

/// The goal of the capped/uncapped epoch row (uncapped / capped time): a capped epoch at most
/// 1.15 x the uncapped one.
pub const CAPPED_EPOCH_GOAL: f64 = 1.0 / 1.15;

/// `syncmem train --no-plan --no-fuse --hidden H` on `dev` with a memory cap of half the
/// unplanned device peak (as measured on an uncapped run; at least 1.25 x the largest
/// operator's working set) against no cap. The time row's ratio
/// is uncapped / capped (below 1: what the cap costs); goal [`CAPPED_EPOCH_GOAL`].
///
/// # Errors
/// Training errors, the cap's configuration error.
pub fn memory_cap_rows(
    dev: &Device,
    quick: bool,
    hidden: usize,
) -> Result<(Row, [TrainMemoryRow; 2])> {
    // Unfused: fused, one operator's working set alone is over half the peak (see the README).
    let (data, cfg) = data_and_config(false, false);
    let cfg = cfg.with_hidden(vec![hidden, hidden]);
    let free_dev = dev.isolated();
    let mut free = Run::new(free_dev.clone(), &data, &cfg)?;
    // Half the peak; at least 1.25 x the largest operator's working set (below it no order of
    // spills runs that operator: FCGradient at hidden 256 holds W and dW, more than half the
    // peak; and the free space is then split between segments that its operands hold).
    let cap =
        (free_dev.memory_stats().peak / 2).max(largest_working_set(&free.trainer, &cfg) * 5 / 4);
    let capped_dev = dev.isolated();
    capped_dev.set_pool(device_pool_from_env()?.with_memory_cap(MemoryCap::Bytes(cap)))?;
    let mut capped = Run::new(capped_dev, &data, &cfg)?;
    interleave(&mut capped, &mut free, epochs(quick))?;
    let mut c = capped.row(&format!("capped h{hidden}"), Some(cap), free.loss);
    let t = &capped.trainer;
    let sizes = t.mlp().blob_bytes(cfg.batch);
    c.bound_bytes_per_step = Some(crate::bound::step_bytes_lower_bound(
        &t.nets().train,
        &sizes,
        cap,
    ));
    let f = free.row(&format!("uncapped h{hidden}"), None, capped.loss);
    let row = capped
        .samples(&free)
        .row(
            &format!("train epoch capped/uncapped {} h{hidden}", dev.label()),
            "syncmem train --no-plan --no-fuse epoch, capped at half the peak",
            "the same uncapped",
        )
        .with_goal(CAPPED_EPOCH_GOAL);
    Ok((row, [c, f]))
}

/// The most bytes one operator of `t`'s training net reads and writes (each blob once).
fn largest_working_set(t: &Trainer, cfg: &TrainConfig) -> u64 {
    let sizes = t.mlp().blob_bytes(cfg.batch);
    t.nets()
        .train
        .ops
        .iter()
        .map(|op| {
            let mut names: Vec<&String> = op.inputs.iter().chain(&op.outputs).collect();
            names.sort();
            names.dedup();
            names
                .iter()
                .map(|n| sizes.get(*n).copied().unwrap_or(0) as u64)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// `syncmem train --optimizer adam` on `dev` with the optimizer on the host
/// (`--offload optimizer`) against on the device. The time row's ratio is on the device /
/// offloaded (below 1: what moving the gradients and the parameters costs); no goal.
///
/// # Errors
/// Training errors.
pub fn offload_rows(dev: &Device, quick: bool) -> Result<(Row, [TrainMemoryRow; 2])> {
    let (_, cfg) = data_and_config(true, true);
    let cfg = cfg.with_optimizer(syncmem_nn::train::Optimizer::Adam);
    let off = cfg.clone().with_offload_optimizer(true);
    let names = [
        "adam, host",
        "adam, device",
        "train epoch adam offloaded/on device",
        "syncmem train --optimizer adam --offload optimizer epoch",
        "the same with the update on the device",
    ];
    offloaded_pair(dev, quick, (&off, &cfg), names)
}

/// `syncmem train --offload activations` on `dev` against the activations kept on the
/// device (the default net, SGD). The time row's ratio is kept / offloaded (below 1: what
/// moving them costs); no goal.
///
/// # Errors
/// Training errors.
pub fn activation_offload_rows(dev: &Device, quick: bool) -> Result<(Row, [TrainMemoryRow; 2])> {
    let (_, cfg) = data_and_config(true, true);
    let off = cfg.clone().with_offload_activations(true);
    let names = [
        "acts, host",
        "acts, device",
        "train epoch activations offloaded/kept",
        "syncmem train --offload activations epoch",
        "the same with the activations kept on the device",
    ];
    offloaded_pair(dev, quick, (&off, &cfg), names)
}

/// Epochs of `off` and `on` on `dev`, interleaved: the time row (`names[2]` and the device;
/// ours `names[3]`, the baseline `names[4]`) and a table row for each (`names[0]`, `names[1]`).
fn offloaded_pair(
    dev: &Device,
    quick: bool,
    (off, on): (&TrainConfig, &TrainConfig),
    names: [&str; 5],
) -> Result<(Row, [TrainMemoryRow; 2])> {
    let (data, _) = data_and_config(true, true);
    let mut on = Run::new(dev.isolated(), &data, on)?;
    let mut off = Run::new(dev.isolated(), &data, off)?;
    interleave(&mut off, &mut on, epochs(quick))?;
    let o = off.row(names[0], None, on.loss);
    let d = on.row(names[1], None, off.loss);
    let name = format!("{} {}", names[2], dev.label());
    let row = off.samples(&on).row(&name, names[3], names[4]);
    Ok((row, [o, d]))
}

/// Writes the table of `rows` (the text form of the report).
///
/// # Errors
/// The formatter's.
pub fn write_table(f: &mut std::fmt::Formatter<'_>, rows: &[TrainMemoryRow]) -> std::fmt::Result {
    use syncmem::alloc::stats::human_bytes;
    writeln!(
        f,
        "{:<10} {:<12} {:>10} {:>10} {:>10} {:>7} {:>8} {:>11} {:>8} {:>11} {:>10}  same loss",
        "train",
        "run",
        "cap",
        "setup",
        "per step",
        "syncs",
        "spills",
        "spilled",
        "refills",
        "refilled",
        "epoch"
    )?;
    for r in rows {
        let copied = |b: f64| human_bytes(b.round() as u64);
        let goal = match (r.no_copy_goal_met, r.bound_bytes_per_step) {
            (Some(true), _) => "  (0 / 0 copied: met)".to_string(),
            (Some(false), _) => "  (0 / 0 copied: NOT met)".to_string(),
            (None, Some(b)) => format!("  (a step must move at least {})", human_bytes(b)),
            (None, None) => String::new(),
        };
        writeln!(
            f,
            "{:<10} {:<12} {:>10} {:>10} {:>10} {:>7.1} {:>8.1} {:>11} {:>8.1} {:>11} {:>7.2} ms  {}{goal}",
            r.device,
            r.run,
            r.cap.map_or_else(|| "-".to_string(), human_bytes),
            human_bytes(r.setup_bytes),
            copied(r.step_bytes),
            r.syncs_per_step,
            r.spills_per_step,
            copied(r.spilled_bytes_per_step),
            r.refills_per_step,
            copied(r.refilled_bytes_per_step),
            r.epoch_ms,
            if r.same_loss { "yes" } else { "no" },
        )?;
    }
    writeln!(
        f,
        "setup, per step: bytes copied between host and device; syncs: zero-copy syncs per step \
         (no byte copied); spills, refills: per step, with their bytes; same loss: the final \
         loss equals the other run's of the pair, bit for bit; at least: a lower bound of the \
         bytes a step must move under the cap, from the net's schedule (syncmem_bench::bound)"
    )
}
