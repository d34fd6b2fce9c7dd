//! The timed comparisons: each times an operation of syncmem and its plain equivalent in
//! alternating samples of a batch of calls, and reports medians per call and the spread of the
//! per-sample ratios ([`crate::spread`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use syncmem::alloc::pool::{HostPool, PoolConfig, PoolKind};
use syncmem::{Device, Error, OomReport, Result, SyncedMemory};

use crate::raw::raw_cycle;
pub(crate) use crate::spread::median;
pub use crate::trip::round_trip_row;
use crate::{size_name, Row, Samples};

const PAGE: usize = 4096;

/// How many samples and calls per sample a row takes.
#[derive(Debug, Clone, Copy)]
pub struct Runs {
    /// Samples of each side (the median is reported).
    pub samples: usize,
    /// Calls per sample (the time of a sample is divided by it).
    pub batch: usize,
}

impl Runs {
    /// The runs of a command line `[DEVICE] [SAMPLES] [BATCH]` (`args` without the program's
    /// name), as the examples that run rows alone take them: `samples` and `batch` where an
    /// argument is missing or not a number.
    pub fn from_args(args: &[String], samples: usize, batch: usize) -> Runs {
        let num = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
        Runs {
            samples: num(1, samples),
            batch: num(2, batch),
        }
    }
}

/// One line for `r`, as the examples that run rows alone print it: its name, each side's time
/// (`ours` and `baseline` name the sides), the ratio with its spread and samples, and its goal.
pub fn row_line(r: &Row, ours: &str, baseline: &str) -> String {
    format!(
        "{}: {:.1} ns {ours}, {:.1} ns {baseline}, ratio {:.3} ({:.3} to {:.3}, {} samples){}",
        r.name,
        r.ours_ns,
        r.baseline_ns,
        r.ratio,
        r.ratio_low,
        r.ratio_high,
        r.samples,
        r.goal.map_or(String::new(), |g| format!(", goal {g:.3}"))
    )
}

/// Nanoseconds per call of `ours` and of `base` in each sample, timed in alternating samples of
/// `runs.batch` calls after one warm-up call of each.
///
/// # Errors
/// The first error of either side.
pub fn compare(
    runs: Runs,
    mut ours: impl FnMut() -> Result<()>,
    mut base: impl FnMut() -> Result<()>,
) -> Result<Samples> {
    ours()?;
    base()?;
    let batch = runs.batch.max(1);
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let start = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        Ok(start.elapsed().as_nanos() as f64 / batch as f64)
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs.samples.max(1) {
        a.push(time(&mut ours)?);
        b.push(time(&mut base)?);
    }
    Ok(Samples::new(a, b))
}

fn host_oom(bytes: usize) -> Error {
    OomReport::new("host", bytes, "system allocator").into()
}

fn touch_pages(p: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: `p` points to `len` writable bytes.
        unsafe { p.add(off).write_volatile(1) };
        off += PAGE;
    }
}

/// `HostPool::alloc` + drop (a private caching pool) vs the system allocator at `align`
/// (64: the pool's alignment; 16: the system's natural one), touching every page on both
/// sides when `touch`.
///
/// # Errors
/// Allocation errors.
pub fn host_pool_row(
    name: &str,
    bytes: usize,
    align: usize,
    touch: bool,
    runs: Runs,
) -> Result<Row> {
    let pool = HostPool::new("bench", PoolConfig::new(PoolKind::Caching))?;
    let layout = Layout::from_size_align(bytes, align).map_err(|_| Error::SizeOverflow {
        what: format!("{bytes} bytes at alignment {align}"),
    })?;
    let samples = compare(
        runs,
        || {
            let mut a = pool.alloc(bytes)?;
            if touch {
                touch_pages(a.as_mut_slice().as_mut_ptr(), bytes);
            }
            drop(black_box(a));
            Ok(())
        },
        || {
            // SAFETY: non-zero size; freed at once with the same layout.
            unsafe {
                let p = System.alloc(black_box(layout));
                if p.is_null() {
                    return Err(host_oom(bytes));
                }
                if touch {
                    touch_pages(p, bytes);
                }
                System.dealloc(black_box(p), layout);
            }
            Ok(())
        },
    )?;
    let touched = if touch { " + touch" } else { "" };
    Ok(samples.row(
        name,
        &format!("HostPool::alloc{touched} + free"),
        &format!("alloc(align {align}){touched} + dealloc"),
    ))
}

/// `Device::alloc_pooled` + drop vs the raw backend allocation (`raw`) or
/// `Device::alloc` + drop, on a detached handle of `dev` (its own pools).
///
/// # Errors
/// Device errors.
pub fn device_pool_row(dev: &Device, bytes: usize, raw: bool, runs: Runs) -> Result<Row> {
    let dev = dev.detached();
    let stream = dev.default_stream()?;
    let ours = || -> Result<()> {
        drop(black_box(dev.alloc_pooled(bytes, &stream)?));
        Ok(())
    };
    let size = size_name(bytes);
    if raw {
        let mut cycle = raw_cycle(&dev, &stream, bytes)?;
        let name = cycle.name;
        Ok(compare(runs, ours, || cycle.run())?.row(
            &format!("device pool {size}"),
            "Device::alloc_pooled + drop",
            name,
        ))
    } else {
        let samples = compare(runs, ours, || {
            drop(black_box(dev.alloc(bytes)?));
            Ok(())
        })?;
        Ok(samples.row(
            &format!("device pool {size} vs Device::alloc"),
            "Device::alloc_pooled + drop",
            "Device::alloc (direct) + drop",
        ))
    }
}

/// `buf.host()` + read one byte vs indexing a plain slice.
///
/// # Errors
/// Allocation errors.
pub fn host_read_row(runs: Runs) -> Result<Row> {
    let buf = SyncedMemory::host_only(4096);
    buf.host_mut()?.fill(3);
    let plain = vec![3u8; 4096];
    let mut i = 0usize;
    let mut j = 0usize;
    let samples = compare(
        runs,
        || {
            i = i.wrapping_add(1);
            black_box(buf.host()?[black_box(i) & 4095]);
            Ok(())
        },
        || {
            j = j.wrapping_add(1);
            black_box(black_box(&plain[..])[black_box(j) & 4095]);
            Ok(())
        },
    )?;
    Ok(samples.row(
        "host read access",
        "SyncedMemory::host() + read 1 byte",
        "slice[i]",
    ))
}
