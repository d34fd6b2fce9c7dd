//! `syncmem trace view` (the memory page of a trace) and `syncmem trace export-torch` (a
//! snapshot PyTorch's memory tools open).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context as _};
use syncmem::alloc::stats::human_bytes;
use syncmem::report::torch::{At, TorchSnapshot};
use syncmem::report::Trace;

/// Arguments of `syncmem trace view`.
#[derive(clap::Args)]
#[command(after_long_help = VIEW_HELP)]
pub struct ViewArgs {
    /// A trace written by `syncmem trace record`, `SYNCMEM_TRACE` or `Trace::save_file`.
    #[arg(value_name = "TRACE")]
    file: PathBuf,

    /// The page to write.
    #[arg(short, long, value_name = "FILE", default_value = "memory.html")]
    out: PathBuf,

    /// The page's title (default: `memory of TRACE`).
    #[arg(long, value_name = "TEXT")]
    title: Option<String>,
}

const VIEW_HELP: &str = "\
The page is one HTML file that needs nothing else (no network, no external scripts or fonts):
open it in any browser. It is the page `syncmem train --memory-html` writes. It names the
phases of the run (planning measurement, set-up, training, after training: from the steps the
events carry) and opens on training; the buttons show another phase or the whole run. Per
memory pool (each device, its pinned host pool, the host pool): the live blocks stacked by
owner (the tensor or blob each went to) over time, the reserved bytes, the steps, the peak of
training; copies, zero-copy syncs, spills, refills, evictions and out-of-memory failures as
marks. Wheel or +/- to zoom, drag to pan; hover for a block's owner, size, stream and any other
field its event carries; click a moment for the blocks alive then and the pool's segments with
their blocks and free gaps. A trace of more than 100000 blocks keeps those alive at a peak and
then the largest, and says how many it left out; marks are counted in 20000 spans of the run.";

/// Arguments of `syncmem trace export-torch`.
#[derive(clap::Args)]
#[command(after_long_help = EXPORT_HELP)]
pub struct ExportArgs {
    /// A trace written by `syncmem trace record`, `SYNCMEM_TRACE` or `Trace::save_file`.
    #[arg(value_name = "TRACE")]
    file: PathBuf,

    /// The snapshot to write (a pickle).
    #[arg(short, long, value_name = "FILE", default_value = "snapshot.pickle")]
    out: PathBuf,

    /// The instant whose segments and blocks the snapshot holds (the history ends there):
    /// `peak` (the most bytes handed out, over every pool), `oom` (the first out-of-memory
    /// failure), `step N` (the end of step N) or `end`.
    #[arg(long, value_name = "WHEN", default_value = "peak", value_parser = parse_at)]
    at: At,
}

fn parse_at(s: &str) -> Result<At, String> {
    s.parse()
        .map_err(|_: syncmem::Error| format!("{s:?}: expected peak, oom, end or step N"))
}

const EXPORT_HELP: &str = "\
Writes what torch.cuda.memory._dump_snapshot() writes: a pickle (protocol 3) of the dict of
torch.cuda.memory._snapshot(), with the segments and blocks alive at the instant --at names
(default: the peak of bytes handed out; `oom`, `step N`, `end`) and the history of each device
up to it (alloc, free_requested, free_completed, segment_alloc, segment_free, oom). Open it in PyTorch's memory viewer (drag it onto pytorch.org/memory_viz)
or run `python -m torch.cuda._memory_viz stats FILE`. Each memory pool is a device: device
pools first, then pinned pools, then the host pool (the command prints the mapping, and the
file lists it under `device_labels`). Addresses are made up (OpenCL buffers have none);
sizes, offsets, streams, times and owners are the trace's. Each block's first frame is
{filename: pool, line: step, name: owner}; the operator running at its allocation follows as
{filename: \"(operator)\", line: step, name: op}, then its call stack when the trace was
recorded with SYNCMEM_TRACE_STACKS=1.";

/// Fails early, before any work, when the directory of `path` does not exist or `path` is
/// not a file that can be replaced (a directory, a device node, a FIFO).
pub fn check_dir(flag: &str, path: &Path) -> anyhow::Result<()> {
    syncmem::file::check_target(path).with_context(|| format!("{flag} {}", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    ensure!(
        dir.is_dir(),
        "{flag} {}: the directory {} does not exist",
        path.display(),
        dir.display()
    );
    Ok(())
}

/// Writes the memory page of `trace` into `path`; `slots`: the blobs of each planner slot,
/// when known.
pub fn write_page(
    trace: &Trace,
    title: &str,
    path: &Path,
    slots: &crate::page::Slots,
) -> anyhow::Result<usize> {
    let html = crate::page::render(trace, title, slots);
    syncmem::file::write_atomic(path, |out| out.write_all(html.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(html.len())
}

/// Runs `syncmem trace view`.
pub fn view(args: &ViewArgs) -> anyhow::Result<()> {
    check_dir("--out", &args.out)?;
    let trace = Trace::load_file(&args.file)?;
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| format!("memory of {}", args.file.display()));
    // Planner slots are named from the plans the trace recorded (none in older traces).
    let size = write_page(&trace, &title, &args.out, &crate::page::slots_of(&trace))?;
    outln!(
        "wrote {} ({}) from {} events of {}",
        args.out.display(),
        human_bytes(size as u64),
        trace.len(),
        args.file.display()
    );
    Ok(())
}

/// Runs `syncmem trace export-torch`.
pub fn export_torch(args: &ExportArgs) -> anyhow::Result<()> {
    check_dir("--out", &args.out)?;
    let trace = Trace::load_file(&args.file)?;
    let (snap, index) = TorchSnapshot::from_trace_at(&trace, args.at)
        .with_context(|| format!("converting {} at {}", args.file.display(), args.at))?;
    snap.save_file(&args.out)?;
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    let stamp = trace.with_stamped(|_, s| s.get(index).copied().unwrap_or_default());
    let step = stamp
        .step
        .map_or_else(String::new, |s| format!(", step {s}"));
    outln!(
        "wrote {}: {} segment(s) alive at {} (event {} of {}, {:.3} s{step}), {} history entries",
        args.out.display(),
        snap.segments.len(),
        args.at,
        index + 1,
        trace.len(),
        stamp.t_us as f64 / 1e6,
        entries
    );
    for (i, label) in snap.device_labels.iter().enumerate() {
        outln!("  device {i}: {label}");
    }
    Ok(())
}
