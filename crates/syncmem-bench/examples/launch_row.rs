//! The user kernel launch row of `syncmem bench` alone: `launch_row [DEVICE] [SAMPLES]
//! [BATCH]` (defaults `opencl:0`, 11, 1000) prints the row's times, ratio and spread, for
//! measuring the launch path without the rest of the bench.

use syncmem::Device;
use syncmem_bench::rows::{row_line, Runs};
use syncmem_bench::user::launch_row;

fn main() -> syncmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = Device::open(args.first().map_or("opencl:0", String::as_str))?;
    let runs = Runs::from_args(&args, 11, 1_000);
    let r = launch_row(&dev, runs)?;
    println!("{}", row_line(&r, "ours", "plain"));
    Ok(())
}
