//! `syncmem train`: trains a small MLP classifier with nets of operators, keeping weights and
//! activations on the device, and reports where memory lives and what was copied.

mod data;
mod devices;
mod distributed;

pub use distributed::Mode as DistributedMode;
mod heap;
mod help;
mod oom;
mod optimizer;
mod report;
mod snapshot;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use syncmem::report::{Trace, TraceGuard};
use syncmem::Device;
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{compare_planning, EpochStats, TrainConfig, Trainer};

/// Arguments of `syncmem train`.
#[derive(clap::Args)]
#[command(after_long_help = help::AFTER_HELP)]
pub struct Args {
    /// Device to train on: `cpu`, `opencl:N` or `cuda:N`; several separated by commas
    /// (`opencl:0,opencl:1`) train data-parallel: each batch is split over them, the
    /// gradients are summed on the first, which holds the parameters. Default: the first
    /// OpenCL device, else `cpu` (with a note).
    #[arg(long, value_name = "D[,D...]", value_parser = crate::args::device_list)]
    pub device: Option<crate::args::DeviceList>,

    /// Passes over the data (at most 1000000).
    #[arg(
        long,
        value_name = "N",
        default_value_t = TrainConfig::default().epochs,
        value_parser = crate::args::epochs,
        allow_negative_numbers = true
    )]
    pub epochs: usize,

    /// A safetensors file with `x` (`f32 [N, D]`) and `y` (`i32` or `i64 [N]`, classes 0..C).
    /// Default: 3 spiral arms of 1000 points each, drawn from the seed.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,

    /// A held-out set to evaluate on after each epoch and at the end, never trained on: a
    /// safetensors file as `--data` (the same features per sample; labels among the training
    /// data's classes). Training is the same with it or without it.
    #[arg(long, value_name = "FILE", conflicts_with = "validation_split")]
    pub test_data: Option<PathBuf>,

    /// Hold out this fraction (between 0 and 1) of the data, evaluated on after each epoch and
    /// at the end and never trained on: the last fraction of the samples shuffled by the seed.
    /// Not with `--test-data`.
    #[arg(long, value_name = "F", value_parser = crate::args::open_fraction)]
    pub validation_split: Option<f64>,

    /// Seed of the data, the initial weights and the batch order.
    #[arg(
        long,
        value_name = "S",
        default_value_t = TrainConfig::default().seed,
        value_parser = crate::args::non_negative_int,
        allow_negative_numbers = true
    )]
    pub seed: u64,

    /// Samples per step.
    #[arg(
        long,
        value_name = "B",
        default_value_t = TrainConfig::default().batch,
        value_parser = crate::args::positive_int,
        allow_negative_numbers = true
    )]
    pub batch: usize,

    /// Learning rate. Default: the optimizer's, 0.5 for sgd, 0.05 for momentum, 0.01 for adam.
    #[arg(
        long,
        value_name = "LR",
        value_parser = crate::args::positive_number,
        allow_negative_numbers = true
    )]
    pub lr: Option<f32>,

    /// How the parameters are updated: `sgd` (`p -= lr * grad`), `momentum` (MomentumSGD,
    /// momentum 0.9: `m = 0.9 * m + lr * grad; p -= m`) or `adam` (Adam: beta1 0.9, beta2
    /// 0.999, epsilon 1e-8, bias-corrected). The state of momentum and Adam (one and two
    /// tensors per parameter) lives on the device beside the parameters, zero-filled by the
    /// init net.
    #[arg(
        long,
        value_name = "OPT",
        default_value = "sgd",
        value_parser = optimizer::parse
    )]
    pub optimizer: syncmem_nn::train::Optimizer,

    /// Keep on the host: `optimizer` (the state of momentum or Adam lives in host memory only
    /// and the update runs there), `parameters` (between steps: brought up layer by layer on a
    /// copy stream, each written back after its update), `activations` (between forward and
    /// backward, as vDNN: copied out after their last forward use, brought back one operator
    /// ahead of their backward reader), or several, separated by commas.
    #[arg(long, value_name = "WHAT", value_parser = optimizer::parse_offload)]
    pub offload: Option<optimizer::Offload>,

    /// Width of each of the two hidden layers.
    #[arg(
        long,
        value_name = "H",
        default_value_t = TrainConfig::default().hidden[0],
        value_parser = crate::args::positive_int,
        allow_negative_numbers = true
    )]
    pub hidden: usize,

    /// After training, save the parameters (fc1_w, fc1_b, ...) to this safetensors file with
    /// `Workspace::save`; `syncmem inspect FILE` lists them.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// Plan memory: intermediate blobs whose lifetimes do not overlap share buffers (default).
    #[arg(long, overrides_with = "no_plan")]
    pub plan: bool,

    /// Do not plan memory: every blob keeps its own buffer.
    #[arg(long = "no-plan", overrides_with = "plan")]
    pub no_plan: bool,

    /// Do not fuse operators (fused by default, with the same results bit for bit): FC + Relu
    /// into one FC that applies the ReLU in its GEMM, FCGradient + ReluGradient into one
    /// FCGradient that applies the ReLU mask in its dX GEMM, the SGD updates into one SGD over
    /// every parameter (one launch), SoftmaxWithLoss + Accuracy + SoftmaxWithLossGradient
    /// into one SoftmaxWithLoss, and each FCGradient's bias gradient into its dW GEMM's launch.
    #[arg(long = "no-fuse")]
    pub no_fuse: bool,

    /// Print one JSON object instead of the text report (no progress bar; schema: `--help`).
    #[arg(long)]
    pub json: bool,

    /// Cap the device's memory (units as every size argument: `64KiB`, `1.5M`): the device pool
    /// makes room by dropping clean mirrors and spilling dirty ones to the host, and brings
    /// them back when they are used again; the report counts spills and refills per step. A
    /// cap too small for one step's working set fails with an out-of-memory error naming the
    /// request, the cap and the largest holders. At least 1 byte: 0 is an error, as
    /// `memory_cap=0` in `SYNCMEM_POOL_CONF` is.
    #[arg(long, value_name = "SIZE", value_parser = crate::args::memory_cap)]
    pub memory_cap: Option<u64>,

    /// Write a memory snapshot (every segment and block of every pool, with the tensor or blob
    /// that owns each block) to this JSON file, taken after the step at which the device
    /// pool's peak last rose (schema: `--help`).
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,

    /// Record the run (the device's pools, the host pool, every copy) and write its memory
    /// page to this HTML file, the page `syncmem trace view` draws: the phases of the run
    /// (planning measurement, set-up, training, after training), the live blocks stacked by
    /// owner, the peak of training and the blocks behind it, planner slots named by the blobs
    /// the net's plan puts in them.
    #[arg(long, value_name = "FILE")]
    pub memory_html: Option<PathBuf>,

    /// At an out-of-memory failure, write the report, a PyTorch snapshot and the history here.
    #[arg(long, value_name = "DIR")]
    pub on_oom_dump: Option<PathBuf>,

    /// Train as one rank of a job of several processes: `auto` joins an MPI job when a
    /// launcher (`mpirun`, `srun`) started this process as one of several ranks; `mpi` always;
    /// `none` trains alone. Each rank trains on its share of every batch, on its part of
    /// `--device` (by its rank on the node), the gradients are summed over the ranks; rank 0
    /// prints the report and writes the files. Needs the `mpi` feature.
    #[arg(long, value_name = "HOW", value_enum, default_value_t = distributed::Mode::Auto)]
    pub distributed: distributed::Mode,

    /// Distributed training: the most bytes of gradients summed in one all-reduce call.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "1MiB",
        value_parser = crate::args::size
    )]
    pub bucket_size: u64,

    /// Distributed training: sum the gradients after backward instead of bucket by bucket as
    /// backward writes them.
    #[arg(long)]
    pub no_overlap: bool,
}

/// Runs `syncmem train`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let world = distributed::join(args.distributed)?;
    let root = distributed::World::is_root(world.as_ref());
    let report = match (execute(args, !args.json && root, world.as_ref()), &world) {
        (Ok(r), _) => r,
        // The other ranks may be waiting for this one: end them all, naming this rank.
        (Err(e), Some(w)) => distributed::fail(w, &e),
        (Err(e), None) => return Err(e),
    };
    if !root {
        return Ok(());
    }
    if args.json {
        super::print_json(&report)
    } else {
        report.print_human()
    }
}

/// Trains as `syncmem train` does, printing nothing; returns the label of the device trained
/// on (`syncmem trace record` records this run).
pub fn train_quietly(args: &Args) -> anyhow::Result<String> {
    execute(args, false, None).map(|r| r.device().to_string())
}

/// Trains and builds the report; `human` prints the header, a progress bar on a terminal and a
/// line per epoch. In a distributed job (`world`), as one rank; only rank 0 writes files.
fn execute(
    args: &Args,
    human: bool,
    world: Option<&distributed::World>,
) -> anyhow::Result<report::Report> {
    check_args(args)?;
    let (devices, note) = devices::for_run(args.device.clone(), world)?;
    let root = distributed::World::is_root(world);
    let dev = devices[0].clone();
    let _oom_files = oom::prepare(args, &devices, root)?;
    let mut peak_snapshot = match &args.snapshot {
        Some(path) if root => Some(snapshot::PeakSnapshot::new(path, &dev)?),
        _ => None,
    };
    let (data, source, held_out) = data::datasets(args)?;
    let cfg = config(args);
    if human {
        print_header(
            note.as_deref(),
            &dev,
            &data,
            &source,
            &cfg,
            held_out.as_ref(),
        )?;
        world.map(|w| w.print(&devices)).transpose()?;
    }

    // From before the planning measurement: the page names it as a phase (as `trace record`).
    let recording = args
        .memory_html
        .as_ref()
        .filter(|_| root)
        .map(|_| record_from_empty_pools(&dev));
    let planning = compare_planning(&dev, &data, &cfg).context("measuring memory planning")?;
    let process_before = syncmem::stats().copies;
    dev.reset_peak_stats();
    let start = Instant::now();
    let collective = world.map(|w| w.collective.clone());
    let mut trainer = new_trainer(&devices, &data, &cfg, held_out.as_ref(), collective)?;
    let (epochs, heap) = run_epochs(&mut trainer, &cfg, human, peak_snapshot.as_mut())?;
    let (loss, accuracy) = trainer.evaluate().context("evaluating")?;
    let held_out_final = trainer
        .evaluate_held_out()
        .context("evaluating the held-out data")?;
    let seconds = start.elapsed().as_secs_f64();
    let process = syncmem::stats().copies.since(&process_before);

    let mut report = report::build(report::Run {
        heap,
        device: &dev,
        note,
        source,
        data: &data,
        cfg: &cfg,
        trainer: &trainer,
        epochs: &epochs,
        final_loss: loss,
        final_accuracy: accuracy,
        held_out: held_out_run(held_out.as_ref(), held_out_final),
        seconds,
        process,
        planning: &planning,
    });
    if let Some(p) = peak_snapshot {
        p.write()?;
    }
    if let Some(path) = args.save.as_ref().filter(|_| root) {
        // Rank 0 alone (every rank holds the same parameters). After the report, which shows
        // the parameters where training left them.
        save_parameters(&trainer, path, &mut report)?;
    }
    if let (Some(guard), Some(path)) = (recording, &args.memory_html) {
        write_run_page(guard, trainer, path, &dev, &cfg, human)?;
    }
    Ok(report)
}

/// The held-out set and its final loss and accuracy, for the report.
fn held_out_run(
    held_out: Option<&data::HeldOutData>,
    last: Option<(f64, f64)>,
) -> Option<report::HeldOutRun> {
    let (h, (loss, accuracy)) = held_out.zip(last)?;
    Some(report::HeldOutRun {
        source: h.source.clone(),
        samples: h.data.len(),
        fraction: h.fraction,
        loss,
        accuracy,
    })
}

/// Checks what the value parsers cannot (the arguments may be built by another command), and
/// that the output files can be written, before any work.
fn check_args(args: &Args) -> anyhow::Result<()> {
    ensure!(
        (1..=crate::args::MAX_EPOCHS).contains(&args.epochs),
        "--epochs must be from 1 to {}, got {}",
        crate::args::MAX_EPOCHS,
        args.epochs
    );
    ensure!(args.batch >= 1, "--batch must be at least 1");
    ensure!(args.hidden >= 1, "--hidden must be at least 1");
    if let Some(lr) = args.lr {
        ensure!(
            lr.is_finite() && lr > 0.0,
            "--lr must be a positive number, got {lr}"
        );
    }
    if let Some(path) = &args.save {
        // Fail on a path that cannot be written before training, not after.
        syncmem::file::check_target(path).with_context(|| format!("--save {}", path.display()))?;
    }
    if let Some(path) = &args.memory_html {
        super::trace_files::check_dir("--memory-html", path)?;
    }
    Ok(())
}

/// The training settings of the arguments.
fn config(args: &Args) -> TrainConfig {
    let cfg = optimizer::with_optimizer(TrainConfig::default(), args.optimizer, args.lr)
        .with_hidden(vec![args.hidden; 2])
        .with_epochs(args.epochs)
        .with_batch(args.batch)
        .with_seed(args.seed)
        .with_plan(!args.no_plan)
        .with_fuse(!args.no_fuse)
        .with_bucket_bytes(usize::try_from(args.bucket_size).unwrap_or(usize::MAX))
        .with_overlap(!args.no_overlap);
    optimizer::with_offload(cfg, args.offload)
}

/// The lines of the text report before training: the note on the device, the model, the data
/// and the settings, the held-out set.
fn print_header(
    note: Option<&str>,
    dev: &Device,
    data: &Dataset,
    source: &str,
    cfg: &TrainConfig,
    held_out: Option<&data::HeldOutData>,
) -> anyhow::Result<()> {
    if let Some(n) = note {
        outln!("note: {n}");
    }
    outln!(
        "training an MLP {} -> {h} -> {h} -> {} on {} ({} samples from {source}), {} epochs \
         of batches of {}, {} at lr {}{}, seed {}, memory planning {}",
        data.features,
        data.classes,
        dev.label(),
        data.len(),
        cfg.epochs,
        cfg.batch,
        cfg.optimizer,
        cfg.lr,
        optimizer::offload_note(cfg),
        cfg.seed,
        optimizer::planning_note(cfg),
        h = cfg.hidden[0],
    );
    if let Some(h) = held_out {
        outln!(
            "held out, not trained on: {} samples from {}",
            h.data.len(),
            h.source
        );
    }
    Ok(())
}

/// Starts recording `dev`'s pools for the memory page, before the planning measurement (a
/// phase of the page). The page shows the run from empty pools: what is cached goes back
/// first.
fn record_from_empty_pools(dev: &Device) -> TraceGuard {
    dev.empty_cache();
    if let Ok(host) = syncmem::HostPool::global() {
        host.empty_cache();
    }
    Arc::new(Trace::new()).attach(dev)
}

/// The trainer on one device, or data-parallel over several, or as one rank of a distributed
/// job, with the held-out set uploaded.
fn new_trainer(
    devices: &[Device],
    data: &Dataset,
    cfg: &TrainConfig,
    held_out: Option<&data::HeldOutData>,
    collective: Option<Arc<dyn syncmem_nn::train::collective::Collective>>,
) -> anyhow::Result<Trainer> {
    let mut trainer = if let Some(c) = collective {
        Trainer::distributed(devices, data, cfg, c).context("setting up distributed training")?
    } else if devices.len() > 1 {
        Trainer::data_parallel(devices, data, cfg).context("setting up data-parallel training")?
    } else {
        Trainer::new(&devices[0], data, cfg).context("setting up training")?
    };
    if let Some(h) = held_out {
        trainer
            .set_held_out(&h.data)
            .with_context(|| format!("uploading the held-out data ({})", h.source))?;
    }
    Ok(trainer)
}

/// Each epoch's statistics, with the held-out loss and accuracy after it.
type EpochRows = Vec<(EpochStats, Option<(f64, f64)>)>;

/// Runs every epoch: the heap allocations of each step counted between the hooks around it,
/// the peak snapshot taken after it; the held-out set evaluated after each epoch; `human`
/// prints a line per epoch (and a progress bar on a terminal).
fn run_epochs(
    trainer: &mut Trainer,
    cfg: &TrainConfig,
    human: bool,
    mut peak_snapshot: Option<&mut snapshot::PeakSnapshot>,
) -> anyhow::Result<(EpochRows, report::HeapSteps)> {
    let steps = (trainer.batch_count() as u64).saturating_mul(cfg.epochs as u64);
    let bar = progress_bar(!human, steps);
    // Grown as epochs end: never sized from the user's number up front.
    let mut epochs = Vec::new();
    let mut heap = report::HeapSteps::default();
    for e in 0..cfg.epochs {
        let at_start = std::cell::Cell::new(0);
        let stats = trainer
            .run_epoch_around(
                |_| at_start.set(crate::heap::allocations()),
                |_, _| {
                    heap.record(crate::heap::allocations() - at_start.get());
                    // Outside the step's count: what it allocates is not the step's.
                    if let Some(p) = peak_snapshot.as_deref_mut() {
                        p.after_step();
                    }
                    bar.inc(1);
                },
            )
            .with_context(|| format!("epoch {}", e + 1))?;
        // After the epoch's steps, outside them: it changes nothing training reads.
        let held = trainer
            .evaluate_held_out()
            .with_context(|| format!("evaluating the held-out data after epoch {}", e + 1))?;
        bar.set_message(format!(
            "loss {:.4} acc {:.1}%",
            stats.loss,
            stats.accuracy * 100.0
        ));
        if human {
            bar.suspend(|| print_epoch(&stats, cfg.epochs, held))?;
        }
        epochs.push((stats, held));
    }
    bar.finish_and_clear();
    Ok((epochs, heap))
}

/// The text report's line of one epoch.
fn print_epoch(stats: &EpochStats, epochs: usize, held: Option<(f64, f64)>) -> anyhow::Result<()> {
    outln!(
        "epoch {:>3}/{}  loss {:.4}  accuracy {:>5.1}%  {:.3} s{}",
        stats.epoch,
        epochs,
        stats.loss,
        stats.accuracy * 100.0,
        stats.seconds,
        held.map_or(String::new(), |(l, a)| format!(
            "  held-out loss {l:.4}  accuracy {:>5.1}%",
            a * 100.0
        ))
    );
    Ok(())
}

/// Saves the trained parameters to `path` (`--save`) and notes them in the report.
fn save_parameters(
    trainer: &Trainer,
    path: &std::path::Path,
    report: &mut report::Report,
) -> anyhow::Result<()> {
    let params: Vec<&str> = trainer.nets().params.iter().map(String::as_str).collect();
    let saved = trainer
        .workspace()
        .save(path, Some(&params))
        .with_context(|| format!("--save: saving the parameters to {}", path.display()))?;
    report.set_saved(path.display().to_string(), saved);
    Ok(())
}

/// Writes the memory page of the run recorded by `guard` (`--memory-html`), once `trainer`
/// has given its buffers back: their frees belong on the page.
fn write_run_page(
    guard: TraceGuard,
    trainer: Trainer,
    path: &std::path::Path,
    dev: &Device,
    cfg: &TrainConfig,
    human: bool,
) -> anyhow::Result<()> {
    let slots = planner_slots(trainer.train_net());
    drop(trainer);
    write_memory_page(&guard.detach(), path, dev, cfg, &slots, human)
}

/// The blobs the memory plan of `net` put in each of its slots, in the order the net first
/// uses them (empty without a plan).
fn planner_slots(net: &syncmem::net::Net) -> crate::page::Slots {
    let mut slots = crate::page::Slots::new();
    let Some(plan) = net.plan() else {
        return slots;
    };
    let def = net.rewritten().unwrap_or(net.def());
    let first_use = |blob: &String| {
        def.ops
            .iter()
            .position(|o| o.outputs.contains(blob) || o.inputs.contains(blob))
            .unwrap_or(usize::MAX)
    };
    let mut uses: Vec<(usize, &String, &String)> = plan
        .mapping
        .iter()
        .map(|(blob, slot)| (first_use(blob), blob, slot))
        .collect();
    uses.sort();
    for (_, blob, slot) in uses {
        slots.entry(slot.clone()).or_default().push(blob.clone());
    }
    slots
}

/// Writes the memory page of the recorded run (`--memory-html`); `human` says where.
fn write_memory_page(
    trace: &Trace,
    path: &std::path::Path,
    dev: &Device,
    cfg: &TrainConfig,
    slots: &crate::page::Slots,
    human: bool,
) -> anyhow::Result<()> {
    let title = format!(
        "syncmem train on {}: {} epoch(s) of batches of {}, hidden width {}",
        dev.label(),
        cfg.epochs,
        cfg.batch,
        cfg.hidden[0]
    );
    let size = super::trace_files::write_page(trace, &title, path, slots)?;
    if human {
        outln!(
            "memory page of the run ({} events, {}): {}",
            trace.len(),
            syncmem::alloc::stats::human_bytes(size as u64),
            path.display()
        );
    }
    Ok(())
}

fn progress_bar(quiet: bool, steps: u64) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {elapsed_precise}  {msg}")
    {
        bar.set_style(style);
    }
    bar
}
