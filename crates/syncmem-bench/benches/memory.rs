//! Memory benchmarks: first a hand-timed table of ratios (ours vs the plain equivalent, same
//! run), then divan's timings of the same operations.
//!
//! `cargo bench -p syncmem-bench` (set `SYNCMEM_BENCH_DEVICE` to choose the device of the device rows;
//! default `opencl:0`, skipped with a note when absent; `SYNCMEM_BENCH_QUICK=1` for fewer runs).

use std::hint::black_box;
use std::sync::{Arc, OnceLock};

use syncmem::alloc::pool::HostPool;
use syncmem::report::{replay, Trace};
use syncmem::{Device, PoolConfig, PoolKind, SyncedMemory};
use syncmem_bench::{self as bench, BenchOptions};

const SIZES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];

fn device() -> Option<&'static Device> {
    static DEV: OnceLock<Option<Device>> = OnceLock::new();
    DEV.get_or_init(|| {
        let spec = std::env::var("SYNCMEM_BENCH_DEVICE").unwrap_or_else(|_| "opencl:0".into());
        Device::open(&spec).ok().map(|d| d.detached())
    })
    .as_ref()
}

fn main() {
    let opts = BenchOptions {
        device: std::env::var("SYNCMEM_BENCH_DEVICE").unwrap_or_else(|_| "opencl:0".into()),
        quick: std::env::var_os("SYNCMEM_BENCH_QUICK").is_some(),
        // No allocation counter here: the heap rows are `syncmem bench`'s.
        heap_allocations: None,
    };
    // `cargo test --benches` runs this with `--test`: skip the table there.
    if !std::env::args().any(|a| a == "--test") {
        match bench::run(&opts, &mut |_, name| eprintln!("timing {name} ...")) {
            Ok(report) => println!("{report}"),
            Err(e) => eprintln!("ratio table failed: {e}"),
        }
    }
    divan::main();
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn host_pool_alloc_touch(bencher: divan::Bencher, bytes: usize) {
    let pool = HostPool::new("divan", PoolConfig::default()).unwrap();
    bencher.bench_local(|| {
        let mut a = pool.alloc(bytes).unwrap();
        for b in a.as_mut_slice().iter_mut().step_by(4096) {
            *b = 1;
        }
        black_box(a)
    });
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn system_alloc_zeroed_touch(bencher: divan::Bencher, bytes: usize) {
    let layout = std::alloc::Layout::from_size_align(bytes, 64).unwrap();
    bencher.bench_local(|| {
        // SAFETY: non-zero size; freed with the same layout.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout);
            assert!(!p.is_null());
            for off in (0..bytes).step_by(4096) {
                p.add(off).write_volatile(1);
            }
            std::alloc::dealloc(black_box(p), layout);
        }
    });
}

#[divan::bench(args = [4 << 10, 64 << 20], sample_count = 10, sample_size = 1)]
fn device_alloc_pooled(bencher: divan::Bencher, bytes: usize) {
    let Some(dev) = device() else { return };
    let stream = dev.default_stream().unwrap();
    bencher.bench_local(|| black_box(dev.alloc_pooled(bytes, &stream).unwrap()));
}

#[divan::bench(args = [4 << 10, 64 << 20], sample_count = 10, sample_size = 1)]
fn device_alloc_direct(bencher: divan::Bencher, bytes: usize) {
    let Some(dev) = device() else { return };
    bencher.bench_local(|| black_box(dev.alloc(bytes).unwrap()));
}

#[divan::bench(sample_count = 5, sample_size = 1)]
fn synced_round_trip_64mib(bencher: divan::Bencher) {
    let Some(dev) = device() else { return };
    let n = 64 << 20;
    let buf = SyncedMemory::new(n, dev);
    bencher.bench_local(|| {
        buf.host_mut().unwrap()[0] = 1;
        drop(buf.device().unwrap());
        drop(buf.device_mut().unwrap());
        black_box(buf.host().unwrap()[n - 1]);
    });
}

#[divan::bench(sample_count = 5, sample_size = 1)]
fn raw_write_read_64mib(bencher: divan::Bencher) {
    let Some(dev) = device() else { return };
    let n = 64 << 20;
    let stream = dev.default_stream().unwrap();
    let mut host = vec![1u8; n];
    let mut d = dev.alloc(n).unwrap();
    bencher.bench_local(|| {
        stream.write(&mut d, 0, &host).unwrap();
        stream.read(&d, 0, &mut host).unwrap();
    });
}

#[divan::bench(sample_count = 20)]
fn synced_host_read(bencher: divan::Bencher) {
    let buf = SyncedMemory::host_only(4096);
    buf.host_mut().unwrap().fill(3);
    bencher.bench_local(|| black_box(buf.host().unwrap()[black_box(7)]));
}

#[divan::bench(sample_count = 20)]
fn slice_read(bencher: divan::Bencher) {
    let v = vec![3u8; 4096];
    bencher.bench_local(|| black_box(black_box(&v[..])[black_box(7)]));
}

#[divan::bench(args = [PoolKind::Caching, PoolKind::Binned, PoolKind::None], sample_count = 5)]
fn trace_replay(bencher: divan::Bencher, kind: PoolKind) {
    let trace = Trace::synthetic(16);
    let cfg = PoolConfig::new(kind);
    bencher.bench_local(|| black_box(replay(&trace, &cfg).unwrap()));
}

/// Cost of the trace hook on a 64-byte host-to-device copy on a `cpu` device: with no trace
/// attached (one relaxed atomic load), with a trace attached to another device only (the list
/// of attachments is read), and with a trace recording this device (an event is pushed).
#[divan::bench(args = ["off", "other device", "this device"], sample_count = 100, sample_size = 1000)]
fn copy_64b_traced(bencher: divan::Bencher, mode: &str) {
    let dev = Device::cpu().detached();
    let other = Device::cpu().detached();
    let stream = dev.new_stream().unwrap();
    let mut d = dev.alloc(64).unwrap();
    let host = [1u8; 64];
    let trace = Arc::new(Trace::new());
    let _guard = match mode {
        "other device" => Some(trace.attach_device_only(&other)),
        "this device" => Some(trace.attach_device_only(&dev)),
        _ => None,
    };
    // Warm up (the first benchmark of a run otherwise pays for cold caches).
    for _ in 0..10_000 {
        stream.write(&mut d, 0, &host).unwrap();
    }
    trace.clear();
    bencher.bench_local(|| stream.write(&mut d, 0, black_box(&host)).unwrap());
}
