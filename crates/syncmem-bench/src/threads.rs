//! Pools under threads: 4 KiB allocate + free from 1, 2 and 8 threads at once on the host pool
//! and on the device pool, against the system allocator from as many threads in the same run.
//! Each sample starts every thread together (a barrier) and times until the last one ends;
//! the row reports wall time per operation (the sample's time divided by all the operations of
//! all its threads), so perfect scaling halves it when the threads double on free cores.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use syncmem::alloc::pool::{HostPool, PoolConfig, PoolKind};
use syncmem::{Device, Error, OomReport, Result};

use crate::rows::Runs;
use crate::{Row, Samples};

/// Thread counts of the rows.
pub const THREADS: [usize; 3] = [1, 2, 8];
/// Bytes of each allocation.
pub const BYTES: usize = 4096;
/// Goal of the rows at every thread count: at least 1.2 x the system allocator's speed.
pub const THREADS_GOAL: f64 = 1.2;

/// Wall nanoseconds per operation of `threads` threads each calling `op` `per_thread` times,
/// started together: from the first thread's start to the last one's end, as the threads see
/// them (the spawning thread may not run again until they are done).
fn wall_per_op(
    threads: usize,
    per_thread: usize,
    op: &(dyn Fn() -> Result<()> + Sync),
) -> Result<f64> {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(Instant, Instant)> {
                    start.wait();
                    let t0 = Instant::now();
                    (0..per_thread).try_for_each(|_| op())?;
                    Ok((t0, Instant::now()))
                })
            })
            .collect();
        let mut spans = Vec::with_capacity(threads);
        for w in workers {
            spans.push(w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
        }
        let first = spans.iter().map(|s| s.0).min();
        let last = spans.iter().map(|s| s.1).max();
        let wall = match (first, last) {
            (Some(a), Some(b)) => b.duration_since(a).as_nanos() as f64,
            _ => 0.0,
        };
        Ok(wall / (threads * per_thread) as f64)
    })
}

/// Wall time per operation of `ours` and `base` on `threads` threads in each sample, in
/// alternating samples after one warm-up sample of each.
fn compare_threads(
    threads: usize,
    runs: Runs,
    ours: &(dyn Fn() -> Result<()> + Sync),
    base: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Samples> {
    let per_thread = runs.batch.max(1);
    wall_per_op(threads, per_thread, ours)?;
    wall_per_op(threads, per_thread, base)?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs.samples.max(1) {
        a.push(wall_per_op(threads, per_thread, ours)?);
        b.push(wall_per_op(threads, per_thread, base)?);
    }
    Ok(Samples::new(a, b))
}

/// The system allocator's 4 KiB allocate + free at the pools' alignment (64 bytes).
fn system_alloc() -> Result<()> {
    let layout = Layout::from_size_align(BYTES, 64).map_err(|_| Error::SizeOverflow {
        what: format!("{BYTES} bytes at alignment 64"),
    })?;
    // SAFETY: non-zero size; freed at once with the same layout.
    unsafe {
        let p = System.alloc(black_box(layout));
        if p.is_null() {
            return Err(OomReport::new("host", BYTES, "system allocator").into());
        }
        System.dealloc(black_box(p), layout);
    }
    Ok(())
}

fn threads_name(threads: usize) -> String {
    if threads == 1 {
        "1 thread".to_string()
    } else {
        format!("{threads} threads")
    }
}

/// The row `name` of `ours` (described as `how`) against the system allocator, both from
/// `threads` threads.
fn row_against_system(
    name: String,
    how: &str,
    threads: usize,
    runs: Runs,
    ours: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Row> {
    let samples = compare_threads(threads, runs, ours, &system_alloc)?;
    Ok(row(name, how, threads, &samples))
}

fn row(name: String, ours: &str, threads: usize, samples: &Samples) -> Row {
    let baseline = format!("alloc(align 64) + dealloc, {}", threads_name(threads));
    samples.row(&name, ours, &baseline).with_goal(THREADS_GOAL)
}

/// One row per [`THREADS`] count: a caching host pool shared by all the threads.
///
/// # Errors
/// Allocation errors.
pub fn host_pool_rows(runs: Runs) -> Result<Vec<Row>> {
    let pool = HostPool::new("bench threads", PoolConfig::new(PoolKind::Caching))?;
    let ours = || -> Result<()> {
        drop(black_box(pool.alloc(BYTES)?));
        Ok(())
    };
    THREADS
        .iter()
        .map(|&t| {
            row_against_system(
                format!("host pool 4 KiB, {}", threads_name(t)),
                "HostPool::alloc + free, one pool for all threads",
                t,
                runs,
                &ours,
            )
        })
        .collect()
}

/// One row per [`THREADS`] count: `Device::alloc_pooled` + drop on `dev`'s pool (a detached
/// handle: its own pools) from every thread, each on its own stream.
///
/// # Errors
/// Device errors.
pub fn device_pool_rows(dev: &Device, runs: Runs) -> Result<Vec<Row>> {
    let dev = dev.detached();
    let streams = (0..THREADS[THREADS.len() - 1])
        .map(|_| dev.new_stream())
        .collect::<Result<Vec<_>>>()?;
    let next = AtomicUsize::new(0);
    THREADS
        .iter()
        .map(|&t| {
            // Each thread takes the next stream the first time it runs.
            let ours = || -> Result<()> {
                thread_local!(static SLOT: Cell<Option<usize>> = const { Cell::new(None) });
                let i = SLOT.with(|s| match s.get() {
                    Some(i) => i,
                    None => {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        s.set(Some(i));
                        i
                    }
                });
                let stream = &streams[i % streams.len()];
                drop(black_box(dev.alloc_pooled(BYTES, stream)?));
                Ok(())
            };
            row_against_system(
                format!("device pool 4 KiB, {}", threads_name(t)),
                &format!(
                    "Device::alloc_pooled + drop on {}, a stream per thread",
                    dev.label()
                ),
                t,
                runs,
                &ours,
            )
        })
        .collect()
}

/// Thread counts of the rows on one stream that all the threads share.
pub const SHARED_THREADS: [usize; 2] = [2, 8];

/// One row per [`SHARED_THREADS`] count: `Device::alloc_pooled` + drop from every thread on
/// `dev`'s default stream, on `dev` as `Device::open` gives it (the handle the process keeps,
/// and its pools). The threads share the stream and the device: their buffers take no
/// reference count of it, which they would all write.
///
/// # Errors
/// Device errors.
pub fn device_pool_default_rows(dev: &Device, runs: Runs) -> Result<Vec<Row>> {
    let stream = dev.default_stream()?;
    let ours = || -> Result<()> {
        drop(black_box(dev.alloc_pooled(BYTES, &stream)?));
        Ok(())
    };
    let how = format!(
        "Device::alloc_pooled + drop on {}, the default stream of every thread",
        dev.label()
    );
    SHARED_THREADS
        .iter()
        .map(|&t| {
            let name = format!("device pool 4 KiB, {}, one stream", threads_name(t));
            row_against_system(name, &how, t, runs, &ours)
        })
        .collect()
}
