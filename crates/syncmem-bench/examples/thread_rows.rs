//! The pool rows under threads of `syncmem bench` alone (`host pool 4 KiB, N threads` and
//! `device pool 4 KiB, N threads` at 1, 2 and 8 threads, and `device pool 4 KiB, N threads,
//! one stream` at 2 and 8, against the system allocator from as many threads):
//! `thread_rows [DEVICE] [SAMPLES] [BATCH]` (defaults `cpu`, 11, 1000000) prints each row's
//! times, ratio and spread, with the machine's load before and after, for measuring the pools
//! without the rest of the bench.

use syncmem::Device;
use syncmem_bench::load::LoadAverage;
use syncmem_bench::rows::Runs;
use syncmem_bench::threads::{device_pool_default_rows, device_pool_rows, host_pool_rows};

/// The machine's load averages, or why there are none.
fn load() -> String {
    LoadAverage::read().map_or_else(|e| e, |l| l.to_string())
}

fn main() -> syncmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = Device::open(args.first().map_or("cpu", String::as_str))?;
    let runs = Runs::from_args(&args, 11, 1_000_000);
    println!("load before: {}", load());
    let mut rows = host_pool_rows(runs)?;
    rows.extend(device_pool_rows(&dev, runs)?);
    rows.extend(device_pool_default_rows(&dev, runs)?);
    for r in rows {
        println!(
            "{}: {:.1} ns, system allocator {:.1} ns, ratio {:.3} ({:.3} to {:.3}, {} samples)",
            r.name, r.ours_ns, r.baseline_ns, r.ratio, r.ratio_low, r.ratio_high, r.samples,
        );
    }
    println!("load after: {}", load());
    Ok(())
}
