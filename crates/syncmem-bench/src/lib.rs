//! Hand-timed comparisons of syncmem, shared by `cargo bench -p syncmem-bench` and
//! `syncmem bench`.
//!
//! Every row times an operation of syncmem ("ours") and the plain equivalent ("baseline")
//! as the median of a few runs, and reports `ratio = baseline / ours`: above 1 ours is faster,
//! below 1 it is slower. The [`compute`] section measures this CPU's FMA peak, GEMM
//! throughput against it, `train` epoch times on the device against `cpu`, and the cost of a
//! trivial kernel. Not a stable API.

pub mod compute;
mod peak;
#[cfg(feature = "opencl")]
mod rawcl;

use std::alloc::Layout;
use std::fmt;
use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;

use syncmem::alloc::pool::{HostPool, PoolConfig, PoolKind};
use syncmem::alloc::stats::human_bytes;
use syncmem::alloc::trace::{replay, Trace};
use syncmem::{Device, Result, SyncedMemory};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The device of the device rows (`"opencl:0"`, `"cpu"`, ...). When it cannot be opened
    /// those rows are skipped with a note; a string that is not a device is an error.
    pub device: String,
    /// Fewer runs per row (a few seconds in all).
    pub quick: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            device: "opencl:0".into(),
            quick: false,
        }
    }
}

/// One comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What is compared.
    pub name: String,
    /// The operation of this crate.
    pub ours: String,
    /// The plain equivalent.
    pub baseline: String,
    /// Median time of ours, in nanoseconds (per call).
    pub ours_ns: f64,
    /// Median time of the baseline, in nanoseconds (per call).
    pub baseline_ns: f64,
    /// `baseline_ns / ours_ns` (above 1: ours is faster).
    pub ratio: f64,
    /// The ratio this row should reach, if it has a goal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
    /// Whether the goal was met (`None` without a goal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal_met: Option<bool>,
}

/// A trace replay on one pool kind.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayRow {
    /// The pool kind.
    pub kind: String,
    /// Peak bytes reserved from the backend.
    pub peak_reserved: u64,
    /// Peak bytes handed out.
    pub peak_allocated: u64,
    /// `peak_reserved / peak_allocated`.
    pub ratio: f64,
    /// Segment allocations and frees.
    pub backend_calls: u64,
    /// Allocations served from cache.
    pub cache_hits: u64,
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The device of the device rows, as asked.
    pub device: String,
    /// Quick mode.
    pub quick: bool,
    /// The timed comparisons.
    pub rows: Vec<Row>,
    /// Trace replay of the synthetic training loop, per pool kind.
    pub replay: Vec<ReplayRow>,
    /// Rows skipped and why.
    pub skipped: Vec<String>,
    /// FMA peak, GEMM throughput, train epoch times, trivial kernel.
    pub compute: compute::ComputeReport,
}

impl BenchReport {
    /// The row named `name`.
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// Number of steps [`run`] reports through its progress callback.
pub fn step_count() -> usize {
    STEPS.len() + compute::STEPS.len()
}

const STEPS: [&str; 10] = [
    "host pool 4 KiB",
    "host pool 1 MiB",
    "host pool 64 MiB",
    "device pool 4 KiB",
    "device pool 64 MiB",
    "synced round trip 64 MiB",
    "host read access",
    "trace replay caching",
    "trace replay binned",
    "trace replay none",
];

/// Median of `runs` timings of `f` (nanoseconds), after one warm-up call.
fn median_ns(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_nanos() as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn row(name: &str, ours: &str, baseline: &str, ours_ns: f64, baseline_ns: f64) -> Row {
    Row {
        name: name.into(),
        ours: ours.into(),
        baseline: baseline.into(),
        ours_ns,
        baseline_ns,
        ratio: baseline_ns / ours_ns.max(1e-9),
        goal: None,
        goal_met: None,
    }
}

fn touch_pages(p: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: `p` points to `len` writable bytes.
        unsafe { p.add(off).write_volatile(1) };
        off += PAGE;
    }
}

/// Host pool alloc + first touch of every page + free vs `alloc_zeroed` (align 64) + touch +
/// `dealloc`.
///
/// # Errors
/// Allocation errors of the pool.
pub fn host_pool_row(bytes: usize, runs: usize) -> Result<Row> {
    let pool = HostPool::new("bench", PoolConfig::new(PoolKind::Caching))?;
    let mut err = None;
    let ours = median_ns(runs, || match pool.alloc(bytes) {
        Ok(mut a) => {
            touch_pages(a.as_mut_slice().as_mut_ptr(), bytes);
            black_box(&a);
        }
        Err(e) => err = Some(e),
    });
    if let Some(e) = err {
        return Err(e);
    }
    let layout = Layout::from_size_align(bytes, 64).expect("valid layout");
    let base = median_ns(runs, || {
        // SAFETY: non-zero size; freed with the same layout.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout);
            assert!(!p.is_null(), "out of memory");
            touch_pages(p, bytes);
            black_box(p);
            std::alloc::dealloc(p, layout);
        }
    });
    Ok(row(
        &format!("host pool {}", size_name(bytes)),
        "HostPool::alloc + touch + free",
        "alloc_zeroed(align 64) + touch + dealloc",
        ours,
        base,
    ))
}

/// `Device::alloc_pooled` + drop vs `Device::alloc` + drop on a detached `dev`.
///
/// # Errors
/// Device errors.
pub fn device_pool_row(dev: &Device, bytes: usize, runs: usize) -> Result<Row> {
    let dev = dev.detached();
    let stream = dev.default_stream()?;
    let mut err = None;
    let ours = median_ns(runs, || match dev.alloc_pooled(bytes, &stream) {
        Ok(b) => drop(black_box(b)),
        Err(e) => err = Some(e),
    });
    let base = median_ns(runs, || match dev.alloc(bytes) {
        Ok(b) => drop(black_box(b)),
        Err(e) => err = Some(e),
    });
    if let Some(e) = err {
        return Err(e);
    }
    Ok(row(
        &format!("device pool {}", size_name(bytes)),
        "Device::alloc_pooled + drop",
        "Device::alloc (direct) + drop",
        ours,
        base,
    ))
}

/// Goal of the synced round trip: at least this fraction of raw copy speed.
pub const ROUND_TRIP_GOAL: f64 = 0.95;

/// A `SyncedMemory` round trip (host write, `device()` copies up, `device_mut()` marks the
/// device current, `host()` copies back) vs blocking `Stream::write` + `Stream::read`.
///
/// # Errors
/// Device errors.
pub fn round_trip_row(dev: &Device, bytes: usize, runs: usize) -> Result<Row> {
    let dev = dev.detached();
    let stream = dev.default_stream()?;
    let buf = SyncedMemory::new(bytes, &dev);
    let mut err = None;
    let one = || -> Result<()> {
        buf.host_mut()?[0] = 1;
        drop(black_box(buf.device()?));
        drop(black_box(buf.device_mut()?));
        black_box(buf.host()?[bytes - 1]);
        Ok(())
    };
    let ours = median_ns(runs, || {
        if let Err(e) = one() {
            err = Some(e);
        }
    });
    let mut host = vec![1u8; bytes];
    let mut dbuf = dev.alloc(bytes)?;
    let base = median_ns(runs, || {
        let r = stream
            .write(&mut dbuf, 0, &host)
            .and_then(|()| stream.read(&dbuf, 0, &mut host));
        if let Err(e) = r {
            err = Some(e);
        }
        black_box(&host);
    });
    if let Some(e) = err {
        return Err(e);
    }
    let mut r = row(
        &format!("synced round trip {}", size_name(bytes)),
        "SyncedMemory host->device->host",
        "Stream::write + Stream::read (blocking)",
        ours,
        base,
    );
    r.goal = Some(ROUND_TRIP_GOAL);
    r.goal_met = Some(r.ratio >= ROUND_TRIP_GOAL);
    Ok(r)
}

/// `buf.host()` + read one byte vs indexing a plain slice (ns per call, `calls` per run).
///
/// # Errors
/// Allocation errors.
pub fn host_read_row(calls: usize, runs: usize) -> Result<Row> {
    let buf = SyncedMemory::host_only(4096);
    buf.host_mut()?.fill(3);
    let plain = vec![3u8; 4096];
    let mut err = None;
    let ours = median_ns(runs, || {
        for i in 0..calls {
            match buf.host() {
                Ok(g) => {
                    black_box(g[black_box(i) & 4095]);
                }
                Err(e) => err = Some(e),
            }
        }
    }) / calls as f64;
    let base = median_ns(runs, || {
        let s = black_box(&plain[..]);
        for i in 0..calls {
            black_box(s[black_box(i) & 4095]);
        }
    }) / calls as f64;
    if let Some(e) = err {
        return Err(e);
    }
    Ok(row(
        "host read access",
        "SyncedMemory::host() + read 1 byte",
        "slice[i]",
        ours,
        base,
    ))
}

/// Replays [`Trace::synthetic`] on a pool of `kind`.
///
/// # Errors
/// Replay errors.
pub fn replay_row(trace: &Trace, kind: PoolKind) -> Result<ReplayRow> {
    let r = replay(trace, &PoolConfig::new(kind))?;
    Ok(ReplayRow {
        kind: kind.to_string(),
        peak_reserved: r.peak_reserved,
        peak_allocated: r.peak_allocated,
        ratio: r.overhead(),
        backend_calls: r.backend_calls,
        cache_hits: r.cache_hits,
    })
}

fn size_name(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

/// Runs every comparison; `progress(step, name)` is called before each of the
/// [`step_count`] steps.
///
/// # Errors
/// [`syncmem::Error::InvalidDeviceSpec`] when `opts.device` names no device; errors of the host
/// rows and the replay (device errors skip the device rows with a note).
pub fn run(opts: &BenchOptions, progress: &mut dyn FnMut(usize, &str)) -> Result<BenchReport> {
    // A string that names no device is the caller's mistake; a device that is absent (or whose
    // backend is missing) skips its rows with a note.
    let spec: syncmem::DeviceSpec = opts.device.parse()?;
    let (small, large) = if opts.quick { (5, 3) } else { (21, 7) };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut step = 0;
    let mut next = |progress: &mut dyn FnMut(usize, &str)| {
        progress(step, STEPS[step]);
        step += 1;
    };
    for (bytes, runs) in [(4 * KIB, small * 10), (MIB, small), (64 * MIB, large)] {
        next(progress);
        rows.push(host_pool_row(bytes, runs)?);
    }
    let dev = Device::open_spec(spec);
    let device_rows = |dev: &Device, rows: &mut Vec<Row>| -> Result<()> {
        rows.push(device_pool_row(dev, 4 * KIB, small * 10)?);
        rows.push(device_pool_row(dev, 64 * MIB, small)?);
        rows.push(round_trip_row(dev, 64 * MIB, large)?);
        Ok(())
    };
    match &dev {
        Ok(d) => {
            next(progress);
            next(progress);
            next(progress);
            if let Err(e) = device_rows(d, &mut rows) {
                skipped.push(format!("device rows on {}: {e}", opts.device));
            }
        }
        Err(e) => {
            for _ in 0..3 {
                next(progress);
            }
            skipped.push(format!("device pool and round trip rows ({spec}): {e}"));
        }
    }
    next(progress);
    rows.push(host_read_row(
        if opts.quick { 10_000 } else { 100_000 },
        small,
    )?);
    let trace = Trace::synthetic(if opts.quick { 16 } else { 64 });
    let mut replay = Vec::new();
    for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
        next(progress);
        replay.push(replay_row(&trace, kind)?);
    }
    let compute = compute::run(dev.as_ref().ok(), &opts.device, opts.quick, &mut |name| {
        progress(step, name);
        step += 1;
    })?;
    Ok(BenchReport {
        device: opts.device.clone(),
        quick: opts.quick,
        rows,
        replay,
        skipped,
        compute,
    })
}

/// A duration for the tables: `ns`, `µs`, `ms` or `s` (the JSON output has nanoseconds).
fn time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// The text form: times and sizes in human units (`µs`, `MiB`); the JSON form (`Serialize`)
/// has raw numbers (nanoseconds, bytes).
impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<26} {:>11} {:>11} {:>8}  (ratio = baseline / ours; > 1: ours faster)",
            "comparison", "ours", "baseline", "ratio"
        )?;
        for r in &self.rows {
            write!(
                f,
                "{:<26} {:>11} {:>11} {:>8.3}",
                r.name,
                time(r.ours_ns),
                time(r.baseline_ns),
                r.ratio
            )?;
            if let (Some(g), Some(met)) = (r.goal, r.goal_met) {
                write!(f, "  goal >= {g}: {}", if met { "met" } else { "NOT met" })?;
            }
            writeln!(f)?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<10} {:>14} {:>14} {:>8} {:>10} {:>10}",
            "pool kind", "peak reserved", "peak alloc'd", "ratio", "backend", "hits"
        )?;
        for r in &self.replay {
            writeln!(
                f,
                "{:<10} {:>14} {:>14} {:>8.3} {:>10} {:>10}",
                r.kind,
                human_bytes(r.peak_reserved),
                human_bytes(r.peak_allocated),
                r.ratio,
                r.backend_calls,
                r.cache_hits
            )?;
        }
        for s in &self.skipped {
            writeln!(f, "note: skipped {s}")?;
        }
        writeln!(f)?;
        write!(f, "{}", self.compute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_that_names_no_device_is_an_error() {
        let opts = BenchOptions {
            device: "bogus".into(),
            quick: true,
        };
        let mut steps = 0;
        let r = run(&opts, &mut |_, _| steps += 1);
        assert!(
            matches!(r, Err(syncmem::Error::InvalidDeviceSpec { .. })),
            "{r:?}"
        );
        assert_eq!(
            steps, 0,
            "nothing is timed before the device string is checked"
        );
    }
}
