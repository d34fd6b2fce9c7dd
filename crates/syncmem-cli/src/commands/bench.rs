//! `syncmem bench`: the hand-timed comparisons of `cargo bench -p syncmem-bench`, as a table of
//! ratios (ours vs the plain equivalent) or one JSON object.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use syncmem::DeviceSpec;
use syncmem_bench::{self as bench, BenchOptions};

/// Options of `syncmem bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Device of the device-pool and round-trip rows (`opencl:0`, `cuda:0`, `cpu`); skipped
    /// with a note when it cannot be opened (a string that names no device is an error).
    #[arg(long, value_name = "D", default_value = "opencl:0", value_parser = crate::args::device)]
    pub device: DeviceSpec,

    /// Fewer runs per comparison (a few seconds).
    #[arg(long)]
    pub quick: bool,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the comparisons and prints the report.
///
/// # Errors
/// When a host-side comparison fails (device failures only skip the device rows).
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = BenchOptions {
        device: args.device.to_string(),
        quick: args.quick,
        heap_allocations: Some(crate::heap::allocations),
    };
    let bar = if args.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(bench::step_count() as u64);
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len}  {elapsed}  {msg}") {
            bar.set_style(style);
        }
        bar
    };
    let report = bench::run(&opts, &mut |step, name| {
        bar.set_position(step as u64);
        bar.set_message(name.to_string());
    });
    bar.finish_and_clear();
    let report = report?;
    // The rows of distributed training, with two ranks under mpirun.
    #[cfg(feature = "mpi")]
    let report = super::bench_mpi::with_rows(report, args.quick)?;
    if args.json {
        super::print_json(&report)
    } else {
        out!("{report}");
        Ok(())
    }
}
