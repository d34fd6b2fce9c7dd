//! Hand-timed comparisons of syncmem, shared by `cargo bench -p syncmem-bench` and
//! `syncmem bench`.
//!
//! Every row times an operation of syncmem ("ours") and the plain equivalent ("baseline") in
//! alternating samples of a batch of calls, and reports the medians per call and
//! `ratio = baseline / ours`: above 1 ours is faster, below 1 it is slower, with the spread of
//! the per-sample ratios ([`spread`]). Rows with a goal say whether it is met, not met, or
//! within noise (the spread straddles the goal). The report has the machine's load at the start
//! and at the end of the run ([`load`]). A second table replays the training traces shipped with syncmem on
//! every pool kind against the memory goals ([`replay`]). The [`compute`] section measures this
//! CPU's FMA peak, GEMM throughput against it, `train` epoch times on the device against
//! `cpu`, and the cost of a trivial kernel. Not a stable API.

pub mod bound;
pub mod compute;
mod display;
pub mod floor;
pub mod heap;
pub mod history;
pub mod load;
pub mod multi;
mod peak;
pub mod raw;
#[cfg(feature = "opencl")]
mod rawcl;
pub mod replay;
pub mod rows;
mod runner;
pub mod spread;
pub mod threads;
pub mod train_memory;
mod trip;
pub mod user;
pub mod zero_copy;

use serde::Serialize;

use syncmem::Result;

pub use load::LoadAverage;
pub use replay::ReplayRow;
pub use spread::{Samples, Verdict};

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
    /// The low end of the ratio's spread: the lower quartile of the per-sample ratios, or the
    /// ratio where that is lower ([`spread`]).
    pub ratio_low: f64,
    /// The high end of the ratio's spread: the upper quartile of the per-sample ratios, or the
    /// ratio where that is higher.
    pub ratio_high: f64,
    /// Samples (pairs of ours and the baseline) behind the spread.
    pub samples: usize,
    /// The ratio this row should reach, if it has a goal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
    /// Whether the ratio of the medians reaches the goal (`None` without a goal); [`Row::verdict`]
    /// says whether the samples back it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal_met: Option<bool>,
    /// The goal met (the whole spread at or above it), not met (the whole spread below), or
    /// within noise (the spread straddles it); `None` without a goal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

impl Row {
    /// A row of one sample (no spread) without a goal; [`Samples::row`] makes a row with its
    /// spread.
    pub fn new(name: &str, ours: &str, baseline: &str, ours_ns: f64, baseline_ns: f64) -> Self {
        let ratio = baseline_ns / ours_ns.max(1e-9);
        Row {
            name: name.into(),
            ours: ours.into(),
            baseline: baseline.into(),
            ours_ns,
            baseline_ns,
            ratio,
            ratio_low: ratio,
            ratio_high: ratio,
            samples: 1,
            goal: None,
            goal_met: None,
            verdict: None,
        }
    }

    /// The row with goal `goal` (a ratio to reach), judged on its spread.
    pub fn with_goal(mut self, goal: f64) -> Self {
        self.goal = Some(goal);
        self.goal_met = Some(self.ratio >= goal);
        self.verdict = Some(Verdict::of(self.ratio_low, self.ratio_high, goal));
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
    /// The CPUs this process may run on.
    pub cpus: usize,
    /// The load averages (`/proc/loadavg`) when the run started (`None`: not readable here).
    pub load_start: Option<LoadAverage>,
    /// The load averages when the run ended.
    pub load_end: Option<LoadAverage>,
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

/// Goal of the host pool's 4 KiB row: at least 1.2 x the system allocator's speed.
pub const HOST_SMALL_GOAL: f64 = 1.2;
/// Goal of the device pool rows against the raw backend call.
pub const DEVICE_RAW_GOAL: f64 = 1.0;
/// Goal of the synced round trips: at least this fraction of raw copy speed.
pub const ROUND_TRIP_GOAL: f64 = 0.95;

/// Number of steps [`run`] reports through its progress callback.
pub fn step_count() -> usize {
    STEPS.len() + compute::STEPS.len()
}

const STEPS: [&str; 30] = [
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
    "device pool 4 KiB, history on/off",
    "host read access",
    "zero-copy cycle 64 MiB",
    "zero-copy map cycle 64 MiB",
    "256 B cycle, 100000 live buffers",
    "user kernel launch",
    "train epoch LeakyRelu vs Relu",
    "train zero-copy vs two mirrors",
    "train memory cap vs uncapped",
    "train adam offloaded vs on the device",
    "device to device 64 MiB",
    "train on two devices",
    "train step vs raw",
    "heap allocations per train step",
    "trace replay train h64",
    "trace replay train h256",
    "trace replay train h1024",
];

/// The notes printed under the table: what the baselines are.
const BASELINES: [&str; 18] = [
    "spread: sample i of ours and of the baseline are taken back to back; a row's spread is \
     the interquartile range of the per-sample ratios (baseline / ours), widened to include the \
     ratio of the medians; a goal is met when the whole spread reaches it, NOT met when the \
     whole spread is below it, within noise when the spread straddles it (goal_met in the JSON \
     compares the ratio of the medians alone)",
    "host pool rows: a private caching HostPool against the system allocator (called directly, \
     not through a counting global allocator) at the pool's alignment (64 B); `vs malloc` at \
     the system's own (16 B), which the pool does not offer",
    "host pool 64 MiB: neither side touches the memory; `touched` writes every page on both \
     sides (the system's fresh pages fault, the pool's cached ones do not)",
    "pool rows with threads: 4 KiB allocate + free from 1, 2 and 8 threads started together, \
     one pool for all (sharded: a shard per core; the device pool: a stream per thread, on an \
     isolated handle of the device; `one stream`: 2 and 8 threads on the default stream of the \
     device as Device::open gives it), a million calls a thread per sample (20,000 with \
     --quick), against the system allocator from as many threads; wall time per operation; \
     goal at every thread count: ratio >= 1.2; both pools serve each thread's own frees from \
     the thread's cache (PoolConfig::thread_cache; the device pool's for the same stream, \
     blocks freed with no work in flight)",
    "device pool rows: the pool against the raw backend call and against Device::alloc (the same \
     call plus the memory cap and statistics)",
    "history rows: a pooled 4 KiB allocate + free on the bench device with the always-on \
     history recording (report::record_history, 100000 events per device) against the same \
     with it off, in alternating samples, each history's rings filled once before they are \
     timed (the steady state of a history that records all along); goal: <= 1.10 x, ratio \
     >= 0.91; with call stacks captured (SYNCMEM_TRACE_STACKS=1) reported without a goal; \
     the thread's cache serves the cycle on both sides, and writes its events into the \
     history while it records",
    "synced round trips: host memory of the same kind on both sides (the host allocator's \
     pageable memory, or the device's pinned memory), and the same memory: two pairs of a host \
     block and a device buffer, the synced buffer adopting one while the raw side copies \
     through the other, then the other way round; a sample of each side is a round trip on \
     each pair (a 64 MiB copy's speed depends on the memory behind it, by up to 10-15% between \
     buffers allocated alike)",
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
    "train epoch capped/uncapped: `syncmem train --no-plan --no-fuse` at hidden 64 and 256, \
     capped at half the unplanned device peak (at least 1.25 x the largest operator's working \
     set: at hidden 256 FCGradient alone holds more than half the peak) against no cap, \
     epochs interleaved: what the cap \
     costs (dead values dropped, the rest spilled by the net's schedule); goal: capped <= 1.15 \
     x, ratio >= 0.87 (spills and refills per step in the table below)",
    "train epoch adam offloaded/on device: `syncmem train --optimizer adam --offload \
     optimizer` (the state on the host, the update there: gradients down and parameters up \
     each step, not overlapped) against the update on the device (no goal; bytes per step in \
     the table below)",
    "train epoch activations offloaded/kept: `syncmem train --offload activations` (values \
     backward reads long after forward wrote them go to the host in between, vDNN-style, and \
     dead values are dropped at once) against the activations kept on the device (no goal; \
     bytes per step in the table below)",
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
     user kernels, declared element-wise with a GEMM epilogue, so fused into the FC and \
     FCGradient GEMMs as Relu is) against the built-in Relu net as syncmem train runs it \
     (fused), and unfused; the same operators without an epilogue (not fused) against the \
     fused Relu net; goal: ratio >= 0.95 x the fused Relu epoch",
];

/// Printed when a device row against the raw call misses its goal.
pub const DEVICE_VIEW_NOTE: &str = "device pool rows below their goal: a pooled block keeps its \
     backend view and goes back without a fence when no work is pending, and a thread's own \
     frees come back from its cache with no lock, so what remains is the buffer's own \
     bookkeeping (its record of uses, its handle, the memory counters); the \
     `vs Device::alloc` rows show the same bookkeeping around the backend call";

pub(crate) fn size_name(bytes: usize) -> String {
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
/// rows and the replays (device errors skip the device rows with a note).
pub fn run(opts: &BenchOptions, progress: &mut dyn FnMut(usize, &str)) -> Result<BenchReport> {
    runner::run(opts, progress)
}

#[cfg(test)]
mod tests {
    use super::display::goal_text;
    use super::*;
    use syncmem::Device;

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
        assert_eq!(
            (r.ratio, r.goal_met, r.verdict),
            (1.0, Some(true), Some(Verdict::Met))
        );
        let r = Row::new("x", "a", "b", 200.0, 100.0).with_goal(0.95);
        assert_eq!(
            (r.goal_met, r.verdict),
            (Some(false), Some(Verdict::NotMet))
        );
        let r = Row::new("x", "a", "b", 1.0, 2.0);
        assert_eq!((r.goal_met, r.verdict), (None, None));
        assert_eq!(
            goal_text(Some(1.0), Some(Verdict::NotMet)),
            "goal >= 1.00: NOT met"
        );
        assert_eq!(goal_text(None, None), "no goal");
    }

    #[test]
    fn a_spread_across_the_goal_is_within_noise() {
        // Ratios 0.9, 1.0, 1.1, 1.2, 1.3 (ours 100 ns): median ratio 1.1, middle 1.0..1.2.
        let s = Samples::new(vec![100.0; 5], vec![90.0, 100.0, 110.0, 120.0, 130.0]);
        let r = s.row("x", "a", "b").with_goal(1.05);
        assert_eq!(r.goal_met, Some(true));
        assert_eq!(r.verdict, Some(Verdict::WithinNoise));
        assert_eq!(goal_text(r.goal, r.verdict), "goal >= 1.05: within noise");
        let r = s.row("x", "a", "b").with_goal(1.0);
        assert_eq!(r.verdict, Some(Verdict::Met));
        let r = s.row("x", "a", "b").with_goal(1.25);
        assert_eq!(
            (r.goal_met, r.verdict),
            (Some(false), Some(Verdict::NotMet))
        );
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
