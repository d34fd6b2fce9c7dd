//! A bare allocation loop for instruction counts: `alloc_loop WHAT BYTES ITERATIONS [DEVICE]`
//! allocates and frees `BYTES` bytes `ITERATIONS` times (after one warm-up cycle) and touches
//! nothing.
//!
//! `WHAT` is `host-pool` (a private caching [`HostPool`]), `host-pool-binned`, `malloc` (the
//! system allocator at its natural alignment, 16), `malloc-64` (the system allocator at the
//! host pool's alignment, 64), `device-pool` (`Device::alloc_pooled` on the default stream),
//! `device-pool-stream` (`Device::alloc_pooled` on a stream of its own, as the benchmark rows
//! with threads) or `device-alloc` (`Device::alloc`), on `DEVICE` (`cpu` when not given). Run
//! it twice under an instruction counter with two loop lengths and divide the difference by
//! the difference of the lengths: that is the cost of one alloc + free, without the start-up.
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=a.out target/release/examples/alloc_loop host-pool 4096 10000
//! valgrind --tool=callgrind --callgrind-out-file=b.out target/release/examples/alloc_loop host-pool 4096 20000
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;

use syncmem::{Device, HostPool, PoolConfig, PoolKind};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [what, bytes, n, rest @ ..] if rest.len() <= 1 => bytes
            .parse::<usize>()
            .ok()
            .filter(|&b| b > 0)
            .zip(n.parse::<usize>().ok())
            .map(|(b, n)| {
                (
                    what.as_str(),
                    b,
                    n,
                    rest.first().map_or("cpu", String::as_str),
                )
            }),
        _ => None,
    };
    let Some((what, bytes, n, device)) = parsed else {
        eprintln!(
            "usage: alloc_loop host-pool|host-pool-binned|malloc|malloc-64|device-pool|\
             device-pool-stream|device-alloc BYTES ITERATIONS [DEVICE]"
        );
        return ExitCode::from(2);
    };
    match what {
        "host-pool" | "host-pool-binned" => {
            let kind = if what == "host-pool" {
                PoolKind::Caching
            } else {
                PoolKind::Binned
            };
            let pool = match HostPool::new("loop", PoolConfig::new(kind)) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            for _ in 0..=n {
                match pool.alloc(bytes) {
                    Ok(a) => drop(black_box(a)),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        "malloc" | "malloc-64" => {
            let align = if what == "malloc" { 16 } else { 64 };
            let Ok(layout) = Layout::from_size_align(bytes, align) else {
                return ExitCode::FAILURE;
            };
            for _ in 0..=n {
                // SAFETY: the layout has a non-zero size; the block is freed with it.
                unsafe {
                    let p = System.alloc(black_box(layout));
                    if p.is_null() {
                        return ExitCode::FAILURE;
                    }
                    System.dealloc(black_box(p), layout);
                }
            }
        }
        "device-pool" | "device-pool-stream" | "device-alloc" => {
            let dev = match Device::open(device) {
                Ok(d) => d.detached(),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let stream = match if what == "device-pool-stream" {
                dev.new_stream()
            } else {
                dev.default_stream()
            } {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            for _ in 0..=n {
                let r = if what != "device-alloc" {
                    dev.alloc_pooled(bytes, &stream)
                } else {
                    dev.alloc(bytes)
                };
                match r {
                    Ok(b) => drop(black_box(b)),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        other => {
            eprintln!("unknown WHAT {other:?}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
