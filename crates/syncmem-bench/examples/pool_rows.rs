//! The device pool rows of `syncmem bench` alone (`device pool 4 KiB` and `device pool 64
//! MiB`, against the raw backend allocation): `pool_rows [DEVICE] [SAMPLES] [BATCH]`
//! (defaults `cpu`, 11, 100000) prints each row's times, ratio and spread, for measuring the
//! pool's single-thread cycle without the rest of the bench.

use syncmem::Device;
use syncmem_bench::rows::{device_pool_row, row_line, Runs};

fn main() -> syncmem::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = Device::open(args.first().map_or("cpu", String::as_str))?;
    let runs = Runs::from_args(&args, 11, 100_000);
    for bytes in [4096, 64 << 20] {
        let r = device_pool_row(&dev, bytes, true, runs)?;
        println!("{}", row_line(&r, "pool", "raw"));
    }
    Ok(())
}
