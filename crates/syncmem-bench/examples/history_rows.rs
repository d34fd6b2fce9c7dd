//! The history rows of `syncmem bench` alone (`device pool 4 KiB, history` and `... history +
//! stacks`): `history_rows [DEVICE] [SAMPLES] [BATCH]` (defaults `cpu`, 11, 200000) prints
//! each row's times, ratio and spread, for measuring the history's cost without the rest of
//! the bench.

use syncmem::Device;
use syncmem_bench::history::history_rows;
use syncmem_bench::rows::{row_line, Runs};

fn main() -> syncmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = Device::open(args.first().map_or("cpu", String::as_str))?;
    let runs = Runs::from_args(&args, 11, 200_000);
    for r in history_rows(&dev, runs)? {
        println!("{}", row_line(&r, "on", "off"));
    }
    Ok(())
}
