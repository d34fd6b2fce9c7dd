//! The synced round-trip rows of `syncmem bench` alone: `round_trip_rows [DEVICE] [MIB]
//! [SAMPLES]` (defaults `opencl:0`, 64, 11) times a `SyncedMemory` host -> device -> host round
//! trip against blocking `Stream::write` + `Stream::read` of the same bytes through the same
//! memory, from pageable and from pinned host memory, and prints each row's times, ratio and
//! spread with the machine's load before and after.

use syncmem::Device;
use syncmem_bench::load::LoadAverage;
use syncmem_bench::rows::{round_trip_row, Runs};

/// The machine's load averages, or why there are none.
fn load() -> String {
    LoadAverage::read().map_or_else(|e| e, |l| l.to_string())
}

fn main() -> syncmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = Device::open(args.first().map_or("opencl:0", String::as_str))?;
    let num = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let bytes = num(1, 64) << 20;
    let runs = Runs {
        samples: num(2, 11),
        batch: 1,
    };
    println!("load before: {}", load());
    for pinned in [false, true] {
        let r = round_trip_row(&dev, bytes, pinned, runs)?;
        println!(
            "{}: {:.3} ms, raw {:.3} ms, ratio {:.3} ({:.3} to {:.3}, {} samples)",
            r.name,
            r.ours_ns / 1e6,
            r.baseline_ns / 1e6,
            r.ratio,
            r.ratio_low,
            r.ratio_high,
            r.samples,
        );
    }
    println!("load after: {}", load());
    Ok(())
}
