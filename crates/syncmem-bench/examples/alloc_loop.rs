//! A bare allocation loop for instruction counts: `alloc_loop WHAT BYTES ITERATIONS [DEVICE]`
//! allocates and frees `BYTES` bytes `ITERATIONS` times (after one warm-up cycle) and touches
//! nothing.
//!
//! `WHAT` is `host-pool` (a private caching [`HostPool`]), `host-pool-binned`, `malloc` (the
//! system allocator at its natural alignment, 16), `malloc-64` (the system allocator at the
//! host pool's alignment, 64), `device-pool` (`Device::alloc_pooled` on the default stream),
//! `device-pool-stream` (`Device::alloc_pooled` on a stream of its own, as the benchmark rows
//! with threads), `device-pool-open` (`device-pool` on the device as `Device::open` gives it,
//! which the process keeps, instead of an isolated one with its own pools) or `device-alloc`
//! (`Device::alloc`), on `DEVICE` (when not given, the first
//! accelerator: `Device::first_accelerator()`, else `cpu`). Run
//! it twice under an instruction counter with two loop lengths and divide the difference by
//! the difference of the lengths: that is the cost of one alloc + free, without the start-up.
//!
//! With `SYNCMEM_HISTORY=N` the always-on history records the loop (its cost per cycle), and
//! with `SYNCMEM_TRACE_STACKS=1` too, each allocation's stack.
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=a.out target/release/examples/alloc_loop host-pool 4096 10000
//! valgrind --tool=callgrind --callgrind-out-file=b.out target/release/examples/alloc_loop host-pool 4096 20000
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;

use syncmem::{Device, HostPool, PoolConfig, PoolKind};

/// What to run: `(what, bytes, iterations, device)`.
type LoopArgs<'a> = (&'a str, usize, usize, Option<&'a str>);

/// The arguments, or `None` when they are not `WHAT BYTES ITERATIONS [DEVICE]`.
fn parse(args: &[String]) -> Option<LoopArgs<'_>> {
    match args {
        [what, bytes, n, rest @ ..] if rest.len() <= 1 => bytes
            .parse::<usize>()
            .ok()
            .filter(|&b| b > 0)
            .zip(n.parse::<usize>().ok())
            .map(|(b, n)| (what.as_str(), b, n, rest.first().map(String::as_str))),
        _ => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((what, bytes, n, device)) = parse(&args) else {
        eprintln!(
            "usage: alloc_loop host-pool|host-pool-binned|malloc|malloc-64|device-pool|\
             device-pool-stream|device-alloc BYTES ITERATIONS [DEVICE]"
        );
        return ExitCode::from(2);
    };
    if let Err(e) = syncmem::report::history_from_env() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let result = match what {
        "host-pool" => host_pool_loop(PoolKind::Caching, bytes, n),
        "host-pool-binned" => host_pool_loop(PoolKind::Binned, bytes, n),
        "malloc" => malloc_loop(16, bytes, n),
        "malloc-64" => malloc_loop(64, bytes, n),
        "device-pool" | "device-pool-stream" | "device-pool-open" | "device-alloc" => {
            device_loop(what, device, bytes, n)
        }
        other => {
            eprintln!("unknown WHAT {other:?}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `n + 1` allocations and frees of `bytes` from a private host pool of `kind`.
fn host_pool_loop(kind: PoolKind, bytes: usize, n: usize) -> Result<(), String> {
    let pool = HostPool::new("loop", PoolConfig::new(kind)).map_err(|e| e.to_string())?;
    for _ in 0..=n {
        match pool.alloc(bytes) {
            Ok(a) => drop(black_box(a)),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// `n + 1` allocations and frees of `bytes` from the system allocator at `align`.
fn malloc_loop(align: usize, bytes: usize, n: usize) -> Result<(), String> {
    let layout = Layout::from_size_align(bytes, align).map_err(|e| e.to_string())?;
    for _ in 0..=n {
        // SAFETY: the layout has a non-zero size; the block is freed with it.
        unsafe {
            let p = System.alloc(black_box(layout));
            if p.is_null() {
                return Err(format!("the system allocator refused {bytes} bytes"));
            }
            System.dealloc(black_box(p), layout);
        }
    }
    Ok(())
}

/// `n + 1` device allocations and frees of `bytes` on `device` (the first accelerator, else
/// `cpu`, when `None`): pooled on the default stream or a stream of its own, or direct.
fn device_loop(what: &str, device: Option<&str>, bytes: usize, n: usize) -> Result<(), String> {
    let dev = match device {
        Some(spec) => Device::open(spec).map_err(|e| e.to_string())?,
        None => Device::first_accelerator().unwrap_or_else(Device::cpu),
    };
    let dev = if what == "device-pool-open" {
        dev
    } else {
        dev.detached()
    };
    let stream = if what == "device-pool-stream" {
        dev.new_stream()
    } else {
        dev.default_stream()
    }
    .map_err(|e| e.to_string())?;
    for _ in 0..=n {
        let b = if what != "device-alloc" {
            dev.alloc_pooled(bytes, &stream)
        } else {
            dev.alloc(bytes)
        };
        match b {
            Ok(b) => drop(black_box(b)),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}
