//! Hand-timed comparisons of syncmem, shared by `cargo bench -p syncmem-bench` and
//! `syncmem bench`.
//!
//! Every row times an operation of syncmem ("ours") and the plain equivalent ("baseline") in
//! alternating samples of a batch of calls, and reports the medians per call and
//! `ratio = baseline / ours`: above 1 ours is faster, below 1 it is slower. Rows with a goal
//! say whether it is met. A second table replays the training traces shipped with syncmem on
//! every pool kind against the memory goals ([`replay`]). The [`compute`] section measures this
//! CPU's FMA peak, GEMM throughput against it, `train` epoch times on the device against
//! `cpu`, and the cost of a trivial kernel. Not a stable API.

pub mod compute;
mod display;
pub mod floor;
pub mod heap;
pub mod multi;
mod peak;
pub mod raw;
#[cfg(feature = "opencl")]
mod rawcl;
pub mod replay;
pub mod rows;
pub mod threads;
pub mod train_memory;
pub mod user;
pub mod zero_copy;

use serde::Serialize;

use syncmem::{Device, Result};

pub use replay::ReplayRow;
use rows::Runs;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The device of the device rows (`"opencl:0"`, `"cpu"`, ...). When it cannot be opened
    /// those rows are skipped with a note; a string that is not a device is an error.
    pub device: String,
    /// Fewer runs per row (a few seconds in all).
    pub quick: bool,
    /// The process's heap allocations so far, for the heap rows (`None`: skipped with a note).
    /// The `syncmem` binary passes the counter of its global allocator.
    pub heap_allocations: Option<fn() -> u64>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            device: "opencl:0".into(),
            quick: false,
            heap_allocations: None,
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

impl Row {
    /// A row without a goal.
    pub fn new(name: &str, ours: &str, baseline: &str, ours_ns: f64, baseline_ns: f64) -> Self {
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

    /// The row with goal `goal` (a ratio to reach).
    pub fn with_goal(mut self, goal: f64) -> Self {
        self.goal = Some(goal);
        self.goal_met = Some(self.ratio >= goal);
        self
    }
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
    /// Replays of the training traces, per trace, pool and pool kind.
    pub replay: Vec<ReplayRow>,
    /// What the rows compare and why some miss their goal.
    pub notes: Vec<String>,
    /// Rows skipped and why.
    pub skipped: Vec<String>,
    /// Bytes copied, spilled and refilled by `train` runs with zero-copy on and off, capped
    /// and uncapped.
    pub train_memory: Vec<train_memory::TrainMemoryRow>,
    /// `syncmem train` data-parallel on two devices against one (`None` without a second
    /// device).
    pub multi_device: Option<multi::MultiTrainRow>,
    /// FMA peak, GEMM throughput, train epoch times, trivial kernel.
    pub compute: compute::ComputeReport,
    /// Heap allocations per steady train step, on `cpu` and on the bench device.
    pub heap: Vec<heap::HeapRow>,
}

impl BenchReport {
    /// The row named `name`.
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// Goal of the host pool's 4 KiB row: at least as fast as the system allocator.
pub const HOST_SMALL_GOAL: f64 = 1.0;
/// Goal of the device pool rows against the raw backend call.
pub const DEVICE_RAW_GOAL: f64 = 1.0;
/// Goal of the synced round trips: at least this fraction of raw copy speed.
pub const ROUND_TRIP_GOAL: f64 = 0.95;

/// Number of steps [`run`] reports through its progress callback.
pub fn step_count() -> usize {
    STEPS.len() + compute::STEPS.len()
}

const STEPS: [&str; 28] = [
    "host pool 4 KiB",
    "host pool 4 KiB vs malloc",
    "host pool 1 MiB",
    "host pool 64 MiB",
    "host pool 64 MiB touched",
    "host pool 4 KiB, 1/2/8 threads",
    "device pool 4 KiB",
    "device pool 4 KiB vs Device::alloc",
    "device pool 64 MiB",
    "device pool 64 MiB vs Device::alloc",
    "synced round trip 64 MiB",
    "synced round trip 64 MiB pinned",
    "device pool 4 KiB, 1/2/8 threads",
    "host read access",
    "zero-copy cycle 64 MiB",
    "zero-copy map cycle 64 MiB",
    "256 B cycle, 100000 live buffers",
    "user kernel launch",
    "train epoch LeakyRelu vs Relu",
    "train zero-copy vs two mirrors",
    "train memory cap vs uncapped",
    "device to device 64 MiB",
    "train on two devices",
    "train step vs raw",
    "heap allocations per train step",
    "trace replay train h64",
    "trace replay train h256",
    "trace replay train h1024",
];

/// The notes printed under the table: what the baselines are.
const BASELINES: [&str; 14] = [
    "host pool rows: a private caching HostPool against the system allocator (called directly, \
     not through a counting global allocator) at the pool's alignment (64 B); `vs malloc` at \
     the system's own (16 B), which the pool does not offer",
    "host pool 64 MiB: neither side touches the memory; `touched` writes every page on both \
     sides (the system's fresh pages fault, the pool's cached ones do not)",
    "pool rows with threads: 4 KiB allocate + free from 1, 2 and 8 threads started together, \
     one pool for all (sharded: a shard per core; the device pool: a stream per thread), \
     against the system allocator from as many threads; wall time per operation; goal at 8 \
     threads: ratio >= 1.0",
    "device pool rows: the pool against the raw backend call and against Device::alloc (the same \
     call plus the memory cap and statistics)",
    "synced round trips: the same host memory on both sides (the host allocator's pageable \
     memory, or the device's pinned memory)",
    "host read access: per call, through SyncedMemory::host() against indexing a slice",
    "zero-copy cycles (devices whose memory is host memory): host write of a byte, device read, \
     device write, host read of a byte on one 64 MiB buffer shared by host and device, against \
     two mirrors (an upload and a read-back each cycle; goal >= 50), and with the map protocol \
     forced against the raw clEnqueueMapBuffer/Unmap calls it makes (goal >= 0.9)",
    "256 B cycle: the same cycle on 256-byte buffers, 100 of them in turn among 100,000 live \
     ones against 100 among 100; goal: flat (ratio >= 0.9)",
    "train epoch zero-copy/off: `syncmem train` (default net) on each device with zero-copy \
     mirrors against SYNCMEM_ZERO_COPY=off, epochs interleaved; goal: zero-copy no slower \
     (ratio >= 1.0) and 0 bytes copied in setup and per step (table below)",
    "train epoch capped/uncapped: `syncmem train --no-plan --no-fuse` capped at half the \
     unplanned device peak against no cap: what spilling costs (no goal; spills and refills \
     per step in the table below)",
    "device to device: a buffer written on the device read on the next device of its backend \
     through its replica there (one device command between OpenCL devices of a context), \
     waited for, against a blocking read into host memory and a blocking write (no goal)",
    "train step vs raw: one step of `syncmem train` (hidden 64 and 1024) through the crate \
     against the same kernels captured from a step and replayed with raw opencl3 calls on the \
     train net's queue + clFinish (the crate's step waits only for the kernel writing the \
     accuracy: the update kernels overlap the next step); goal: <= 1.10 x, ratio >= 0.91",
    "user kernel launch: a one-float kernel through UserKernel::launch (checks, ordering, the \
     launch recorded on its buffer) against clSetKernelArg + clEnqueueNDRangeKernel on the same \
     queue (cpu: the closure called directly), never waited for, the queue held behind a user \
     event while a sample is timed (queuing cost only); goal: ours <= 1.2 x plain, ratio >= 0.83",
    "epoch LeakyRelu: the custom_operator example's epoch (LeakyRelu and its gradient as \
     user kernels, which no fusion pass knows) against the built-in Relu net as syncmem train \
     runs it (fused), and unfused; goal: <= 1.3 x the fused Relu epoch, ratio >= 0.77",
];

/// Printed when a device row against the raw call misses its goal.
pub const DEVICE_VIEW_NOTE: &str = "device pool rows below their goal: a pooled block keeps its \
     backend view and goes back without a fence when no work is pending, so what remains is the \
     buffer's own bookkeeping (the pool's lock, the memory counters, reference counts); the \
     `vs Device::alloc` rows show the same bookkeeping around the backend call";

pub(crate) fn size_name(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

/// Reports the steps of [`run`].
struct Progress<'a> {
    step: usize,
    progress: &'a mut dyn FnMut(usize, &str),
}

impl Progress<'_> {
    fn next(&mut self) {
        (self.progress)(self.step, STEPS[self.step]);
        self.step += 1;
    }
}

/// Runs every comparison; `progress(step, name)` is called before each of the
/// [`step_count`] steps.
///
/// # Errors
/// [`syncmem::Error::InvalidDeviceSpec`] when `opts.device` names no device; errors of the host
/// rows and the replays (device errors skip the device rows with a note).
pub fn run(opts: &BenchOptions, progress: &mut dyn FnMut(usize, &str)) -> Result<BenchReport> {
    // A string that names no device is the caller's mistake; a device that is absent (or whose
    // backend is missing) skips its rows with a note.
    let spec: syncmem::DeviceSpec = opts.device.parse()?;
    let samples = if opts.quick { 5 } else { 21 };
    let few = if opts.quick { 3 } else { 7 };
    let small = Runs {
        samples,
        batch: if opts.quick { 200 } else { 1000 },
    };
    let medium = Runs { samples, batch: 10 };
    let large = Runs {
        samples: few,
        batch: 1,
    };
    // Calls per thread of a sample of the rows with threads.
    let threaded = Runs {
        samples,
        batch: if opts.quick { 20_000 } else { 100_000 },
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut p = Progress { step: 0, progress };
    p.next();
    rows.push(
        rows::host_pool_row("host pool 4 KiB", 4 * KIB, 64, false, small)?
            .with_goal(HOST_SMALL_GOAL),
    );
    p.next();
    rows.push(rows::host_pool_row(
        "host pool 4 KiB vs malloc",
        4 * KIB,
        16,
        false,
        small,
    )?);
    p.next();
    rows.push(rows::host_pool_row(
        "host pool 1 MiB",
        MIB,
        64,
        false,
        medium,
    )?);
    p.next();
    rows.push(rows::host_pool_row(
        "host pool 64 MiB",
        64 * MIB,
        64,
        false,
        medium,
    )?);
    p.next();
    rows.push(rows::host_pool_row(
        "host pool 64 MiB touched",
        64 * MIB,
        64,
        true,
        large,
    )?);
    p.next();
    rows.extend(threads::host_pool_rows(threaded)?);
    let device_rows = |dev: &Device, rows: &mut Vec<Row>, p: &mut Progress| -> Result<()> {
        for bytes in [4 * KIB, 64 * MIB] {
            p.next();
            rows.push(rows::device_pool_row(dev, bytes, true, medium)?.with_goal(DEVICE_RAW_GOAL));
            p.next();
            rows.push(rows::device_pool_row(dev, bytes, false, medium)?);
        }
        for pinned in [false, true] {
            p.next();
            rows.push(
                rows::round_trip_row(dev, 64 * MIB, pinned, large)?.with_goal(ROUND_TRIP_GOAL),
            );
        }
        p.next();
        rows.extend(threads::device_pool_rows(dev, threaded)?);
        Ok(())
    };
    // The device rows are the next 7 steps, whether they run or not.
    let after_device = p.step + 7;
    let dev = Device::open_spec(spec);
    match &dev {
        Ok(d) => {
            if let Err(e) = device_rows(d, &mut rows, &mut p) {
                skipped.push(format!("device rows on {}: {e}", opts.device));
            }
        }
        Err(e) => skipped.push(format!(
            "device pool, round trip and user kernel rows ({spec}): {e}"
        )),
    }
    while p.step < after_device {
        p.next();
    }
    p.next();
    rows.push(rows::host_read_row(Runs {
        samples,
        batch: if opts.quick { 10_000 } else { 100_000 },
    })?);
    let zero_copy_rows = |d: &Device, rows: &mut Vec<Row>, p: &mut Progress| -> Result<()> {
        p.next();
        rows.extend(zero_copy::vs_copies_row(d, 64 * MIB, large)?);
        p.next();
        rows.extend(zero_copy::vs_raw_map_row(d, 64 * MIB, large)?);
        p.next();
        rows.push(zero_copy::live_buffers_row(d, small)?);
        Ok(())
    };
    let zero_copy_end = p.step + 3;
    if let Ok(d) = &dev {
        if let Err(e) = zero_copy_rows(d, &mut rows, &mut p) {
            skipped.push(format!("zero-copy rows on {}: {e}", opts.device));
        }
    }
    while p.step < zero_copy_end {
        p.next();
    }
    p.next();
    // Without the device, the note above covers these rows too.
    if let Ok(d) = &dev {
        match user::launch_row(d, small) {
            Ok(r) => rows.push(r),
            Err(e) => skipped.push(format!("user kernel launch row on {}: {e}", opts.device)),
        }
    }
    p.next();
    if let Ok(d) = &dev {
        match user::epoch_rows(d, opts.quick) {
            Ok(r) => rows.extend(r),
            Err(e) => skipped.push(format!("LeakyRelu epoch rows on {}: {e}", opts.device)),
        }
    }
    // The train rows run on the device and, where it is another, on `cpu`.
    let mut train_devices = vec![Device::cpu()];
    if let Ok(d) = &dev {
        if d.backend() != syncmem::BackendKind::Cpu {
            train_devices.insert(0, d.clone());
        }
    }
    let mut train_memory = Vec::new();
    p.next();
    for d in &train_devices {
        match train_memory::zero_copy_rows(d, opts.quick) {
            Ok(Some((row, table))) => {
                rows.push(row);
                train_memory.extend(table);
            }
            Ok(None) => skipped.push(format!(
                "train zero-copy rows on {}: its memory is not host memory",
                d.label()
            )),
            Err(e) => skipped.push(format!("train zero-copy rows on {}: {e}", d.label())),
        }
    }
    p.next();
    for d in &train_devices {
        match train_memory::memory_cap_rows(d, opts.quick) {
            Ok((row, table)) => {
                rows.push(row);
                train_memory.extend(table);
            }
            Err(e) => skipped.push(format!("train memory cap rows on {}: {e}", d.label())),
        }
    }
    // Two devices: the bench device and the next one of its backend.
    let second = dev.as_ref().ok().and_then(multi::second_device);
    p.next();
    match (&dev, &second) {
        (Ok(a), Some(b)) => match multi::copy_row(a, b, 64 * MIB, large) {
            Ok(r) => rows.push(r),
            Err(e) => skipped.push(format!("device to device row: {e}")),
        },
        // There is one `cpu` device: nothing to say on it; an absent device has its note.
        (Ok(a), None) if a.backend() == syncmem::BackendKind::Cpu => {}
        (Err(_), _) => {}
        (Ok(_), None) => skipped.push(format!(
            "device to device and two-device train rows: no second device of {}'s backend \
             (with PoCL, POCL_DEVICES=\"pthread pthread\" gives two)",
            opts.device
        )),
    }
    p.next();
    let mut multi_device = None;
    if let (Ok(a), Some(b)) = (&dev, &second) {
        match multi::train_row(&[a.clone(), b.clone()], opts.quick) {
            Ok(r) => multi_device = Some(r),
            Err(e) => skipped.push(format!("two-device train row: {e}")),
        }
    }
    p.next();
    if let Ok(d) = &dev {
        for h in [64, 1024] {
            let runs = Runs {
                samples: few,
                batch: if h >= 1024 { 2 } else { 20 },
            };
            match floor::step_row(d, h, runs) {
                Ok(r) => rows.extend(r),
                Err(e) => skipped.push(format!("train step vs raw row on {}: {e}", opts.device)),
            }
        }
    }
    let mut replay = Vec::new();
    for (name, text) in replay::TRACES {
        p.next();
        replay.extend(replay::replay_rows(name, text)?);
    }
    let mut notes: Vec<String> = BASELINES.iter().map(|s| s.to_string()).collect();
    let device_miss = rows
        .iter()
        .any(|r| r.name.starts_with("device pool") && r.goal_met == Some(false));
    if device_miss {
        notes.push(DEVICE_VIEW_NOTE.to_string());
    }
    p.next();
    let mut heap = Vec::new();
    match opts.heap_allocations {
        Some(count) => {
            let mut devices = vec![Device::cpu()];
            if let Ok(d) = &dev {
                if d.backend() != syncmem::BackendKind::Cpu {
                    devices.push(d.clone());
                }
            }
            for d in devices {
                match heap::heap_row(&d, count) {
                    Ok(r) => heap.push(r),
                    Err(e) => skipped.push(format!("heap row on {}: {e}", d.label())),
                }
            }
        }
        None => skipped.push(
            "heap allocation rows: no allocation counter (the syncmem binary counts them)"
                .to_string(),
        ),
    }
    let mut step = p.step;
    let compute = compute::run(dev.as_ref().ok(), &opts.device, opts.quick, &mut |name| {
        (p.progress)(step, name);
        step += 1;
    })?;
    Ok(BenchReport {
        device: opts.device.clone(),
        quick: opts.quick,
        rows,
        replay,
        notes,
        skipped,
        train_memory,
        multi_device,
        compute,
        heap,
    })
}

#[cfg(test)]
mod tests {
    use super::display::goal_text;
    use super::*;

    #[test]
    fn a_string_that_names_no_device_is_an_error() {
        let opts = BenchOptions {
            device: "bogus".into(),
            quick: true,
            heap_allocations: None,
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

    #[test]
    fn goals_are_met_at_or_above_the_ratio() {
        let r = Row::new("x", "a", "b", 100.0, 100.0).with_goal(1.0);
        assert_eq!((r.ratio, r.goal_met), (1.0, Some(true)));
        let r = Row::new("x", "a", "b", 200.0, 100.0).with_goal(0.95);
        assert_eq!(r.goal_met, Some(false));
        assert_eq!(Row::new("x", "a", "b", 1.0, 2.0).goal_met, None);
        assert_eq!(goal_text(Some(1.0), Some(false)), "goal >= 1.00: NOT met");
        assert_eq!(goal_text(None, None), "no goal");
    }

    #[test]
    fn the_shipped_traces_replay_within_their_goals() {
        for (name, text) in replay::TRACES {
            let rows = replay::replay_rows(name, text).unwrap();
            assert_eq!(rows.len(), 6, "{name}: 2 pools x 3 kinds");
            for r in rows {
                assert!(r.goal_met, "{r:?}");
            }
        }
    }

    #[test]
    fn the_raw_cpu_allocation_runs() {
        let dev = Device::cpu().detached();
        let stream = dev.default_stream().unwrap();
        let mut c = raw::raw_cycle(&dev, &stream, 4096).unwrap();
        c.run().unwrap();
        assert!(c.name.contains("alloc_zeroed"));
    }
}
