//! Choosing and configuring a device pool, and reading its statistics.
//!
//! ```sh
//! cargo run -p syncmem --example pools             # first accelerator, else cpu
//! cargo run -p syncmem --example pools -- cpu      # or opencl:0, cuda:0
//! ```
//!
//! Device mirrors come from the device's pool. There are three kinds: `caching` (PyTorch's
//! caching allocator, the default: best fit, blocks split and merged), `binned` (CUB's:
//! geometric bins, no splitting) and `none` (every request goes to the backend). Without code,
//! the environment chooses and configures them before the first device opens:
//! `SYNCMEM_DEVICE_POOL=binned SYNCMEM_POOL_CONF="memory_cap=64MiB"` (see
//! `syncmem::alloc::pool::config`). This example does it in code with `Device::set_pool`,
//! which applies to every user of the device in the process.

use syncmem::alloc::pool::MemoryCap;
use syncmem::alloc::stats::human_bytes;
use syncmem::{Device, PoolConfig, PoolKind, PoolStats, SyncedMemory};

/// The device named by the first argument (`cpu`, `opencl:0`, `cuda:0`), else the first
/// accelerator (an OpenCL device, else a CUDA one), else the cpu (host memory standing in for
/// device memory).
fn pick_device() -> syncmem::Result<Device> {
    match std::env::args().nth(1) {
        Some(spec) => Device::open(&spec),
        None => Ok(Device::first_accelerator().unwrap_or_else(Device::cpu)),
    }
}

const MIB: usize = 1 << 20;
const STEPS: usize = 10;

/// A training loop's pattern: each step allocates buffers of a few sizes on the device, uses
/// them and frees them.
fn run_steps(dev: &Device) -> syncmem::Result<PoolStats> {
    for step in 0..STEPS {
        let buffers: Vec<SyncedMemory> = [MIB, 3 * MIB, 12 * MIB, 300]
            .iter()
            .map(|&n| SyncedMemory::new(n, dev))
            .collect();
        for b in &buffers {
            b.device_mut()?.fill(step as u8)?;
        }
    } // The buffers are dropped here: their blocks go back to the pool, not to the backend.
    Ok(dev.pool_stats().expect("the pool was used"))
}

fn main() -> syncmem::Result<()> {
    let dev = pick_device()?;
    println!("device {dev}: {}", dev.info().name);

    // A caching pool that may hold at most 64 MiB of device memory. The same configuration as
    // a key=value list, the form SYNCMEM_POOL_CONF takes:
    let caching = PoolConfig::new(PoolKind::Caching).with_memory_cap(MemoryCap::Bytes(64 << 20));
    assert_eq!(
        caching,
        PoolConfig::new(PoolKind::Caching).apply("memory_cap=64MiB")?
    );
    dev.set_pool(caching)?;

    let stats = run_steps(&dev)?;
    print!("\n{stats}");
    // The first step made the segments; the later ones reused them.
    assert!(stats.cache_hits > 0 && stats.backend_allocs < stats.allocations);
    assert_eq!(
        stats.allocated.current, 0,
        "every block is back in the pool"
    );
    assert_eq!(stats.cap, Some(64 << 20));

    // Under the cap, a request that cannot fit is an error to handle, not an abort.
    let too_big = SyncedMemory::new(128 * MIB, &dev);
    match too_big.device() {
        Err(e) if e.is_out_of_memory() => println!("\n128 MiB under a 64 MiB cap: {e}"),
        Err(e) => return Err(e),
        Ok(_) => panic!("128 MiB fit under a 64 MiB cap"),
    }

    // Cached segments go back to the backend on request (e.g. before another library needs
    // the memory).
    let released = dev.empty_cache();
    println!("empty_cache released {}", human_bytes(released));
    assert_eq!(dev.pool_stats().map(|s| s.reserved.current), Some(0));

    // The same loop on a binned pool (allowed now: no block of the old pool is in use).
    dev.set_pool(PoolConfig::new(PoolKind::Binned))?;
    let binned = run_steps(&dev)?;
    print!("\n{binned}");
    assert!(binned.cache_hits > 0);
    println!(
        "\npeak reserved for the same loop: caching {}, binned {} (bins round sizes up)",
        human_bytes(stats.reserved.peak),
        human_bytes(binned.reserved.peak)
    );
    Ok(())
}
