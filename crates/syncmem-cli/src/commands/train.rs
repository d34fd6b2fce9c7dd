//! `syncmem train`: trains a small MLP classifier with nets of operators, keeping weights and
//! activations on the device, and reports where memory lives and what was copied.

mod data;
mod heap;
mod help;
mod report;
mod snapshot;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use syncmem::report::{Trace, TraceGuard};
use syncmem::{BackendKind, Device};
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

    /// SGD learning rate.
    #[arg(
        long,
        value_name = "LR",
        default_value_t = TrainConfig::default().lr,
        value_parser = crate::args::positive_number,
        allow_negative_numbers = true
    )]
    pub lr: f32,

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
    /// page to this HTML file, as `syncmem trace view` draws it: memory over time, the peak
    /// and the blocks alive at it with their owners, the steps, the copies.
    #[arg(long, value_name = "FILE")]
    pub memory_html: Option<PathBuf>,
}

/// Runs `syncmem train`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let report = execute(args, !args.json)?;
    if args.json {
        super::print_json(&report)
    } else {
        report.print_human()
    }
}

/// Trains as `syncmem train` does, printing nothing; returns the label of the device trained
/// on (`syncmem trace record` records this run).
pub fn train_quietly(args: &Args) -> anyhow::Result<String> {
    execute(args, false).map(|r| r.device().to_string())
}

/// Trains and builds the report; `human` prints the header, a progress bar on a terminal and a
/// line per epoch.
fn execute(args: &Args, human: bool) -> anyhow::Result<report::Report> {
    check_args(args)?;
    let (devices, note) = pick_devices(args.device.clone())?;
    let dev = devices[0].clone();
    if let Some(cap) = args.memory_cap {
        cap_devices(&devices, cap)?;
    }
    let mut peak_snapshot = match &args.snapshot {
        Some(path) => Some(snapshot::PeakSnapshot::new(path, &dev)?),
        None => None,
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
    }

    let planning = compare_planning(&dev, &data, &cfg).context("measuring memory planning")?;
    let recording = args
        .memory_html
        .as_ref()
        .map(|_| record_from_empty_pools(&dev));
    let process_before = syncmem::stats().copies;
    dev.reset_peak_stats();
    let start = Instant::now();
    let mut trainer = new_trainer(&devices, &data, &cfg, held_out.as_ref())?;
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
        held_out: held_out
            .as_ref()
            .zip(held_out_final)
            .map(|(h, (loss, accuracy))| report::HeldOutRun {
                source: h.source.clone(),
                samples: h.data.len(),
                fraction: h.fraction,
                loss,
                accuracy,
            }),
        seconds,
        process,
        planning: &planning,
    });
    if let Some(p) = peak_snapshot {
        p.write()?;
    }
    if let Some(path) = &args.save {
        // After the report, which shows the parameters where training left them.
        save_parameters(&trainer, path, &mut report)?;
    }
    if let (Some(guard), Some(path)) = (recording, &args.memory_html) {
        // The run's buffers go back with the trainer: their frees belong on the page.
        drop(trainer);
        write_memory_page(&guard.detach(), path, &dev, &cfg, human)?;
    }
    Ok(report)
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
    ensure!(
        args.lr.is_finite() && args.lr > 0.0,
        "--lr must be a positive number, got {}",
        args.lr
    );
    if let Some(path) = &args.save {
        // Fail on a path that cannot be written before training, not after.
        syncmem::file::check_target(path).with_context(|| format!("--save {}", path.display()))?;
    }
    if let Some(path) = &args.memory_html {
        super::trace_files::check_dir("--memory-html", path)?;
    }
    Ok(())
}

/// Caps the device memory of every device trained on at `cap` bytes (`--memory-cap`), with the
/// pool the environment asks for.
fn cap_devices(devices: &[Device], cap: u64) -> anyhow::Result<()> {
    // The pools' rule (`memory_cap=0` in SYNCMEM_POOL_CONF is refused as well).
    ensure!(
        cap > 0,
        "--memory-cap: 0 bytes: must be at least 1 (no cap: leave it out)"
    );
    let config = syncmem::alloc::pool::config::device_pool_from_env()
        .context("--memory-cap: the device pool settings")?;
    for d in devices {
        d.set_pool(
            config
                .clone()
                .with_memory_cap(syncmem::MemoryCap::Bytes(cap)),
        )
        .with_context(|| format!("--memory-cap on {}", d.label()))?;
    }
    Ok(())
}

/// The training settings of the arguments.
fn config(args: &Args) -> TrainConfig {
    TrainConfig::default()
        .with_hidden(vec![args.hidden; 2])
        .with_epochs(args.epochs)
        .with_batch(args.batch)
        .with_lr(args.lr)
        .with_seed(args.seed)
        .with_plan(!args.no_plan)
        .with_fuse(!args.no_fuse)
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
         of batches of {}, lr {}, seed {}, memory planning {}",
        data.features,
        data.classes,
        dev.label(),
        data.len(),
        cfg.epochs,
        cfg.batch,
        cfg.lr,
        cfg.seed,
        if cfg.plan { "on" } else { "off" },
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

/// Starts recording `dev`'s pools for the memory page. The page shows the run from empty
/// pools: what the planning measurement left cached goes back first.
fn record_from_empty_pools(dev: &Device) -> TraceGuard {
    dev.empty_cache();
    if let Ok(host) = syncmem::HostPool::global() {
        host.empty_cache();
    }
    Arc::new(Trace::new()).attach(dev)
}

/// The trainer on one device, or data-parallel over several, with the held-out set uploaded.
fn new_trainer(
    devices: &[Device],
    data: &Dataset,
    cfg: &TrainConfig,
    held_out: Option<&data::HeldOutData>,
) -> anyhow::Result<Trainer> {
    let mut trainer = if devices.len() > 1 {
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

/// Writes the memory page of the recorded run (`--memory-html`); `human` says where.
fn write_memory_page(
    trace: &Trace,
    path: &std::path::Path,
    dev: &Device,
    cfg: &TrainConfig,
    human: bool,
) -> anyhow::Result<()> {
    let title = format!(
        "syncmem train on {}: {} epoch(s) of batches of {}, hidden width {}",
        dev.label(),
        cfg.epochs,
        cfg.batch,
        cfg.hidden[0]
    );
    let size = super::trace_files::write_page(trace, &title, path)?;
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

/// The devices asked for, each opened (an absent one is an error naming it), or the default
/// device with a note when it is not the first OpenCL device.
fn pick_devices(
    specs: Option<crate::args::DeviceList>,
) -> anyhow::Result<(Vec<Device>, Option<String>)> {
    let Some(crate::args::DeviceList(specs)) = specs else {
        let (d, note) = pick_device()?;
        return Ok((vec![d], note));
    };
    let several = specs.len() > 1;
    let devices = specs
        .into_iter()
        .map(|s| {
            Device::open_spec(s).with_context(|| {
                if several && s.backend == BackendKind::OpenCl {
                    format!(
                        "opening device {s} (with PoCL, POCL_DEVICES=\"pthread pthread\" gives \
                         two OpenCL devices; `syncmem devices` lists those present)"
                    )
                } else {
                    format!("opening device {s}")
                }
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((devices, None))
}

fn pick_device() -> anyhow::Result<(Device, Option<String>)> {
    match Device::all(BackendKind::OpenCl) {
        Ok(list) if !list.is_empty() => Ok((list[0].clone(), None)),
        Ok(_) => Ok((
            Device::cpu(),
            Some("no OpenCL device found; training on cpu".into()),
        )),
        // A bad setting is the user's to fix, not a reason to train somewhere else.
        Err(e @ syncmem::Error::InvalidConfig { .. }) => Err(e.into()),
        Err(e) => Ok((
            Device::cpu(),
            Some(format!("OpenCL unavailable ({e}); training on cpu")),
        )),
    }
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
