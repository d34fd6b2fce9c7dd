//! The capped/uncapped epoch rows of `syncmem bench` alone: `capped_epoch [DEVICE] [HIDDEN...]`
//! trains `syncmem train --no-plan --no-fuse` at each hidden width (default 64 and 256) on
//! `DEVICE` (default `cpu`) under a cap of half its unplanned peak and without one, epochs
//! interleaved, and prints the ratio (uncapped / capped epoch time) with its spread, the
//! bytes spilled and refilled per step, and the least a step must move under the cap.

use std::process::ExitCode;

use syncmem::Device;
use syncmem_bench::train_memory::memory_cap_rows;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let label = args.first().map_or("cpu", String::as_str);
    let widths: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let widths = if widths.is_empty() {
        vec![64, 256]
    } else {
        widths
    };
    let dev = match Device::open(label) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("capped_epoch: {label}: {e}");
            return ExitCode::FAILURE;
        }
    };
    for hidden in widths {
        match memory_cap_rows(&dev, false, hidden) {
            Ok((row, runs)) => {
                println!(
                    "{}: ratio {:.3} ({:.3}-{:.3}, {} samples), verdict {:?}",
                    row.name, row.ratio, row.ratio_low, row.ratio_high, row.samples, row.verdict
                );
                for r in runs {
                    println!(
                        "  {:<14} epoch {:.3} ms, spilled {:.0} B and refilled {:.0} B per step, \
                         {:.2} spills per step, a step must move at least {:?} B",
                        r.run,
                        r.epoch_ms,
                        r.spilled_bytes_per_step,
                        r.refilled_bytes_per_step,
                        r.spills_per_step,
                        r.bound_bytes_per_step
                    );
                }
            }
            Err(e) => {
                eprintln!("capped_epoch: h{hidden}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
