//! `syncmem trace`: record the memory traffic of a short training run into a JSON-lines file,
//! and replay such a file against pool configurations to compare them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{ensure, Context as _};
use serde::Serialize;
use syncmem::alloc::stats::{human_bytes, CopyDir};
use syncmem::report::{replay_with, ReplayOptions, ReplayReport, Trace, TraceSummary};
use syncmem::{DeviceSpec, PoolConfig, PoolKind};
use syncmem_nn::train::TrainConfig;

use super::train;

/// Arguments of `syncmem trace`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Train the MLP of `syncmem train` briefly with every device and the host pool traced,
    /// write the trace as JSON lines and print what it holds.
    Record(RecordArgs),
    /// Replay a recorded trace with one fresh pool per recorded device, for each pool kind,
    /// and compare peak memory, backend calls, cache hits and out-of-memory counts.
    Replay(ReplayArgs),
    /// Write a self-contained HTML page of a trace: memory over time per pool, the peak and
    /// the blocks alive at it with their owners, copies and other transfers, failures.
    View(super::trace_files::ViewArgs),
    /// Write a trace as a snapshot in PyTorch's format (a pickle that PyTorch's memory
    /// viewer and `python -m torch.cuda._memory_viz` open).
    ExportTorch(super::trace_files::ExportArgs),
}

/// Arguments of `syncmem trace record`.
#[derive(clap::Args)]
#[command(after_long_help = RECORD_HELP)]
struct RecordArgs {
    /// Device to train on: `cpu`, `opencl:N` or `cuda:N`. Default: the first OpenCL device,
    /// else `cpu`.
    #[arg(long, value_name = "D", value_parser = crate::args::device)]
    device: Option<DeviceSpec>,

    /// Passes over the data (at most 1000000).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = crate::args::epochs,
        allow_negative_numbers = true
    )]
    epochs: usize,

    /// Width of each of the two hidden layers of the MLP (as `syncmem train --hidden`).
    #[arg(
        long,
        value_name = "H",
        default_value_t = TrainConfig::default().hidden[0],
        value_parser = crate::args::positive_int,
        allow_negative_numbers = true
    )]
    hidden: usize,

    /// Cap the device's memory during the run (as `syncmem train --memory-cap`): the trace
    /// records its spills and refills.
    #[arg(long, value_name = "SIZE", value_parser = crate::args::memory_cap)]
    memory_cap: Option<u64>,

    /// The trace file to write (JSON lines).
    #[arg(long, value_name = "FILE", default_value = "syncmem-trace.jsonl")]
    out: PathBuf,

    /// Print one JSON object instead of the text summary.
    #[arg(long)]
    json: bool,
}

const RECORD_HELP: &str = "\
Each line of the file is one event:
  {\"op\":\"alloc\",\"id\",\"size\",\"stream\",\"device\",\"owner\",
   \"place\": {\"segment\",\"offset\",\"size\"}, \"operator\", \"frames\"}
                                                    a block from a pool, the tensor or blob
                                                    it went to, where it lies (rounded size),
                                                    the operator running (NET[I] TYPE -> OUT),
                                                    the call stack ([{\"name\",\"filename\",
                                                    \"line\"}], with SYNCMEM_TRACE_STACKS=1)
  {\"op\":\"free\",\"id\",\"device\"}                      its return
  {\"op\":\"segment_alloc\",\"segment\",\"size\",\"stream\",\"device\"}
  {\"op\":\"segment_free\",\"segment\",\"size\",\"device\"}  memory a pool took from / gave
                                                    back to the system
  {\"op\":\"copy\",\"direction\",\"bytes\",\"device\",\"stream\"}
                                                    host_to_device, device_to_host or
                                                    device_to_device, by a stream of device;
                                                    mapped (a zero-copy sync: no byte copied),
                                                    spill or refill (under a memory cap)
  {\"op\":\"evict\",\"label\",\"bytes\",\"device\"}          a clean device mirror dropped
  {\"op\":\"oom\",\"size\",\"device\"}                     an allocation refused for good
`device` is the pool's label: `opencl:0` (device memory), `opencl:0 pinned`, `host`. Every
line also has \"t_us\" (microseconds since the trace began) and, during a training step,
\"step\" (from 1). `syncmem trace view FILE` draws the trace as a page;
`syncmem trace export-torch FILE` writes it for PyTorch's memory viewer.

JSON output (--json): {\"file\", \"device\", \"epochs\", \"hidden\", \"summary\", \"devices\":
[{\"device\", \"summary\"}]}, each summary {\"events\", \"allocs\", \"alloc_bytes\", \"frees\",
\"segment_allocs\", \"segment_frees\",
\"copies\": {\"host_to_device\": {\"count\", \"bytes\"}, \"device_to_host\",
\"device_to_device\", \"mapped\", \"spilled\", \"refilled\"}, \"evictions\", \"evicted_bytes\",
\"ooms\", \"devices\"}.";

/// Arguments of `syncmem trace replay`.
#[derive(clap::Args)]
#[command(after_long_help = REPLAY_HELP)]
struct ReplayArgs {
    /// A trace written by `syncmem trace record` (or `Trace::save_file`).
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// The pool kinds to compare: `caching`, `binned`, `none` or `all`.
    #[arg(long, value_name = "KIND", default_value = "all", value_parser = crate::args::pool_kinds)]
    pool: crate::args::PoolKinds,

    /// A memory cap for each device pool (`512MiB`, `2G`, bytes): allocations that do not fit
    /// even after releasing the pool's cache count as OOMs.
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = crate::args::size,
        allow_negative_numbers = true
    )]
    cap: Option<u64>,

    /// The same for the host pools (`host`, `... pinned`).
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = crate::args::size,
        allow_negative_numbers = true
    )]
    host_cap: Option<u64>,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

const REPLAY_HELP: &str = "\
Columns (the table ends with the same legend): peak reserved (segments held from the backend),
peak requested (bytes the program asked for, live at once: what the `none` pool reserves),
reserved/requested (the headline: memory held per byte asked for), peak allocated (blocks handed
out, sizes rounded up), reserved/allocated (memory held per byte handed out: it hides what
rounding costs), backend calls (segment allocations and frees), cache hits, retries
(allocations served only after releasing the cache under the cap), OOMs (allocations refused
under the cap). `total` is every device together: peaks of the sums over time. Copies,
evictions and out-of-memory failures of the recorded run are as recorded and do not depend on
the pool.

JSON output (--json): {\"file\", \"cap\", \"host_cap\", \"summary\", \"devices\": [{\"device\",
\"summary\"}], \"rows\": [{\"kind\", \"device\" (a label or \"total\"), \"peak_reserved\",
\"peak_requested\", \"reserved_per_requested\", \"peak_allocated\", \"overhead\" (reserved /
allocated), \"backend_calls\", \"cache_hits\", \"allocations\", \"retries\", \"ooms\",
\"oom_bytes\"}]} (summaries as in `syncmem trace record --help`).";

/// The replay table's legend: one line per column whose meaning is not obvious.
const LEGEND: [&str; 6] = [
    "peak requested: the most bytes the program asked for at once (what the `none` pool reserves)",
    "reserved/requested: peak reserved / peak requested, memory held per byte asked for (1.000: none wasted)",
    "peak allocated: the most bytes of blocks handed out at once, sizes rounded up by the pool",
    "reserved/allocated: peak reserved / peak allocated (rounding waste does not show here)",
    "backend calls: segments asked of and given back to the backend",
    "retries / OOMs: allocations served after releasing the cache / refused, under --cap",
];

/// Runs `syncmem trace`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Record(a) => record(a),
        Command::Replay(a) => replay(a),
        Command::View(a) => super::trace_files::view(a),
        Command::ExportTorch(a) => super::trace_files::export_torch(a),
    }
}

#[derive(Serialize)]
struct DeviceSummary {
    device: String,
    summary: TraceSummary,
}

fn device_summaries(trace: &Trace) -> Vec<DeviceSummary> {
    trace
        .summaries_by_device()
        .into_iter()
        .map(|(device, summary)| DeviceSummary { device, summary })
        .collect()
}

#[derive(Serialize)]
struct RecordReport {
    file: String,
    device: String,
    epochs: usize,
    hidden: usize,
    summary: TraceSummary,
    devices: Vec<DeviceSummary>,
}

fn record(args: &RecordArgs) -> anyhow::Result<()> {
    ensure!(args.epochs >= 1, "--epochs must be at least 1");
    let d = TrainConfig::default();
    let train_args = train::Args {
        device: args.device.map(|d| crate::args::DeviceList(vec![d])),
        epochs: args.epochs,
        data: None,
        test_data: None,
        validation_split: None,
        seed: d.seed,
        batch: d.batch,
        lr: Some(d.lr),
        optimizer: d.optimizer,
        offload: None,
        hidden: args.hidden,
        save: None,
        plan: true,
        no_plan: false,
        no_fuse: !d.fuse,
        json: true,
        snapshot: None,
        memory_cap: args.memory_cap,
        memory_html: None,
        on_oom_dump: None,
        // The recorded run is one process.
        distributed: train::DistributedMode::None,
        bucket_size: d.bucket_bytes as u64,
        no_overlap: !d.overlap,
    };
    // Fail on a path that cannot be written before training (without opening it: a FIFO would
    // block until a reader came).
    syncmem::file::check_target(&args.out)
        .with_context(|| format!("--out {}", args.out.display()))?;
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_all();
    let run = train::train_quietly(&train_args);
    drop(guard);
    // The trace of a failed run is the one to look at: written either way.
    let saved = trace.save_file(&args.out);
    let device = match (run, saved) {
        (Ok(device), saved) => {
            saved.context("writing the trace file")?;
            device
        }
        (Err(e), Ok(())) => {
            eprintln!(
                "syncmem: the traced run failed; its trace up to the failure ({} events) is in {} \
                 (`syncmem trace view {}`)",
                trace.len(),
                args.out.display(),
                args.out.display()
            );
            return Err(e.context("the traced training run"));
        }
        (Err(e), Err(save)) => {
            eprintln!("syncmem: the trace of the failed run was not written: {save}");
            return Err(e.context("the traced training run"));
        }
    };
    let report = RecordReport {
        file: args.out.display().to_string(),
        device,
        epochs: args.epochs,
        hidden: args.hidden,
        summary: trace.summary(),
        devices: device_summaries(&trace),
    };
    if args.json {
        return super::print_json(&report);
    }
    outln!(
        "recorded {} events of {} epoch(s) of training (hidden width {}) on {} into {}",
        report.summary.events,
        report.epochs,
        report.hidden,
        report.device,
        report.file
    );
    print_summaries(&report.summary, &report.devices)
}

fn dir(d: CopyDir) -> String {
    format!("{} ({})", d.count, human_bytes(d.bytes))
}

fn print_summaries(total: &TraceSummary, devices: &[DeviceSummary]) -> anyhow::Result<()> {
    outln!(
        "{:<18} {:>8} {:>8} {:>12} {:>20} {:>20} {:>20} {:>10} {:>6}",
        "device",
        "allocs",
        "frees",
        "alloc bytes",
        "host->device",
        "device->host",
        "device->device",
        "evictions",
        "OOMs"
    );
    let rows = devices
        .iter()
        .map(|d| (d.device.as_str(), &d.summary))
        .chain(std::iter::once(("total", total)));
    for (name, s) in rows {
        outln!(
            "{:<18} {:>8} {:>8} {:>12} {:>20} {:>20} {:>20} {:>10} {:>6}",
            name,
            s.allocs,
            s.frees,
            human_bytes(s.alloc_bytes),
            dir(s.copies.host_to_device),
            dir(s.copies.device_to_host),
            dir(s.copies.device_to_device),
            s.evictions,
            s.ooms
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct Row {
    kind: String,
    device: String,
    peak_reserved: u64,
    peak_requested: u64,
    reserved_per_requested: f64,
    peak_allocated: u64,
    overhead: f64,
    backend_calls: u64,
    cache_hits: u64,
    allocations: u64,
    retries: u64,
    ooms: u64,
    oom_bytes: u64,
}

impl Row {
    fn new(kind: PoolKind, device: &str, r: &ReplayReport) -> Self {
        Row {
            kind: kind.to_string(),
            device: device.to_string(),
            peak_reserved: r.peak_reserved,
            peak_requested: r.peak_requested,
            reserved_per_requested: r.reserved_per_requested(),
            peak_allocated: r.peak_allocated,
            overhead: r.overhead(),
            backend_calls: r.backend_calls,
            cache_hits: r.cache_hits,
            allocations: r.allocations,
            retries: r.retries,
            ooms: r.ooms,
            oom_bytes: r.oom_bytes,
        }
    }
}

#[derive(Serialize)]
struct ReplayOutput {
    file: String,
    cap: Option<u64>,
    host_cap: Option<u64>,
    summary: TraceSummary,
    devices: Vec<DeviceSummary>,
    rows: Vec<Row>,
}

fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let trace = Trace::load_file(&args.file)?;
    let opts = ReplayOptions::new()
        .with_cap(args.cap)
        .with_host_cap(args.host_cap);
    let mut rows = Vec::new();
    for &kind in &args.pool.0 {
        let r = replay_with(&trace, &PoolConfig::new(kind), &opts)
            .with_context(|| format!("replaying {} on {kind} pools", args.file.display()))?;
        for d in &r.devices {
            rows.push(Row::new(kind, &d.device, &d.report));
        }
        rows.push(Row::new(kind, "total", &r.total));
    }
    let out = ReplayOutput {
        file: args.file.display().to_string(),
        cap: args.cap,
        host_cap: args.host_cap,
        summary: trace.summary(),
        devices: device_summaries(&trace),
        rows,
    };
    if args.json {
        return super::print_json(&out);
    }
    print_replay(&out)
}

/// The text form of a replay: what was recorded, then a row per device and pool kind.
fn print_replay(out: &ReplayOutput) -> anyhow::Result<()> {
    let cap = |c: Option<u64>| c.map_or_else(|| "none".to_string(), human_bytes);
    outln!(
        "{}: {} events; cap per device pool {}, per host pool {}",
        out.file,
        out.summary.events,
        cap(out.cap),
        cap(out.host_cap)
    );
    outln!("recorded:");
    print_summaries(&out.summary, &out.devices)?;
    outln!("replayed:");
    print_replay_rows(&out.rows)?;
    for line in LEGEND {
        outln!("{line}");
    }
    Ok(())
}

/// The replay table: a row per device and pool kind, grouped by device.
fn print_replay_rows(rows: &[Row]) -> anyhow::Result<()> {
    outln!(
        "{:<18} {:>8} {:>13} {:>14} {:>9} {:>14} {:>9} {:>13} {:>10} {:>8} {:>6}",
        "device",
        "pool",
        "peak reserved",
        "peak requested",
        "reserved/",
        "peak allocated",
        "reserved/",
        "backend calls",
        "cache hits",
        "retries",
        "OOMs"
    );
    outln!(
        "{:<18} {:>8} {:>13} {:>14} {:>9} {:>14} {:>9}",
        "",
        "",
        "",
        "",
        "requested",
        "",
        "allocated"
    );
    // Grouped by device (in the trace's order, total last), the pool kinds together.
    let mut order: Vec<&str> = Vec::new();
    for r in rows {
        if !order.contains(&r.device.as_str()) {
            order.push(&r.device);
        }
    }
    for device in order {
        for r in rows.iter().filter(|r| r.device == device) {
            outln!(
                "{:<18} {:>8} {:>13} {:>14} {:>9.3} {:>14} {:>9.3} {:>13} {:>10} {:>8} {:>6}",
                r.device,
                r.kind,
                human_bytes(r.peak_reserved),
                human_bytes(r.peak_requested),
                r.reserved_per_requested,
                human_bytes(r.peak_allocated),
                r.overhead,
                r.backend_calls,
                r.cache_hits,
                r.retries,
                r.ooms
            );
        }
    }
    Ok(())
}
