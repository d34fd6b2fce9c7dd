//! Replaying a trace against fresh pools, one per recorded device.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::event::{check_event_size, invalid, TraceEvent};
use super::summary::add_copy;
use super::trace::Trace;
use crate::alloc::pool::{Budget, Lease, Pool, PoolConfig, StreamId};
use crate::alloc::stats::CopyStats;
use crate::error::Result;

/// Options of [`replay_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// A memory cap in bytes for the pool of each device (any label but `host` and those
    /// ending in ` pinned`): an allocation the capped pool cannot serve, even after releasing
    /// its cache, counts as an out-of-memory in the report and its free is skipped.
    pub cap: Option<u64>,
    /// The same for host memory pools (`host`, `... pinned`).
    pub host_cap: Option<u64>,
}

impl ReplayOptions {
    /// No caps (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options with a cap for each device pool.
    #[must_use]
    pub fn with_cap(mut self, cap: Option<u64>) -> Self {
        self.cap = cap;
        self
    }

    /// The same options with a cap for each host pool.
    #[must_use]
    pub fn with_host_cap(mut self, cap: Option<u64>) -> Self {
        self.host_cap = cap;
        self
    }
}

/// What a replay measured, for one device or in total.
///
/// Two ratios say how well a pool kind fits the program: [`ReplayReport::reserved_per_requested`]
/// (the headline: memory held for memory asked for) and [`ReplayReport::overhead`] (memory
/// held for blocks handed out, which hides what rounding to block sizes costs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Highest bytes of segments held from the backend (in total: of all pools at once).
    pub peak_reserved: u64,
    /// Highest bytes of blocks handed out, rounded block sizes (in total: of all pools at
    /// once).
    pub peak_allocated: u64,
    /// Highest bytes asked for by the live allocations: what the program needed at its peak,
    /// the `none` pool's peak reserve (but for zero-byte requests, which it rounds to one).
    #[serde(default)]
    pub peak_requested: u64,
    /// Segment allocations and frees asked of the backend (including the final release).
    pub backend_calls: u64,
    /// Allocations served from cached memory.
    pub cache_hits: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations served only after releasing the pool's cache (the first step of the
    /// out-of-memory path).
    pub retries: u64,
    /// Allocations refused under the cap ([`ReplayOptions`]).
    pub ooms: u64,
    /// Bytes asked for by the refused allocations.
    pub oom_bytes: u64,
    /// Copies recorded (they do not depend on the pool).
    pub copies: CopyStats,
    /// Device mirrors dropped in the recorded run (the replay has no buffers to drop).
    pub evictions: u64,
    /// Bytes of those mirrors.
    pub evicted_bytes: u64,
    /// Out-of-memory failures in the recorded run (the replay's own are [`ReplayReport::ooms`]).
    #[serde(default)]
    pub recorded_ooms: u64,
}

impl ReplayReport {
    /// `peak_reserved / peak_requested`: memory held from the backend at the peak for the
    /// memory the program asked for at its peak (1.0 when nothing was asked for). Rounding,
    /// unused segment tails, cached blocks and fragmentation all raise it.
    pub fn reserved_per_requested(&self) -> f64 {
        if self.peak_requested == 0 {
            1.0
        } else {
            self.peak_reserved as f64 / self.peak_requested as f64
        }
    }

    /// `peak_reserved / peak_allocated` (1.0 when nothing was allocated): memory held for the
    /// blocks handed out, whose sizes are already rounded (so a pool that rounds every request
    /// up to twice its size can still show 1.0 here; see
    /// [`ReplayReport::reserved_per_requested`]).
    pub fn overhead(&self) -> f64 {
        if self.peak_allocated == 0 {
            1.0
        } else {
            self.peak_reserved as f64 / self.peak_allocated as f64
        }
    }

    /// Adds the counts of `o` (saturating: statistics never wrap).
    fn add_counts(&mut self, o: &ReplayReport) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.backend_calls, o.backend_calls);
        add(&mut self.cache_hits, o.cache_hits);
        add(&mut self.allocations, o.allocations);
        add(&mut self.retries, o.retries);
        add(&mut self.ooms, o.ooms);
        add(&mut self.oom_bytes, o.oom_bytes);
        for (a, b) in [
            (&mut self.copies.host_to_device, o.copies.host_to_device),
            (&mut self.copies.device_to_host, o.copies.device_to_host),
            (&mut self.copies.device_to_device, o.copies.device_to_device),
        ] {
            add(&mut a.count, b.count);
            add(&mut a.bytes, b.bytes);
        }
        add(&mut self.evictions, o.evictions);
        add(&mut self.evicted_bytes, o.evicted_bytes);
        add(&mut self.recorded_ooms, o.recorded_ooms);
    }
}

/// The replay of one recorded device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceReplay {
    /// The device (pool label) as recorded: `opencl:0`, `opencl:0 pinned`, `host`.
    pub device: String,
    /// What its pool did.
    pub report: ReplayReport,
}

/// The result of [`replay_with`]: one report per recorded device and the total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplaySummary {
    /// One entry per device, in order of first appearance in the trace.
    pub devices: Vec<DeviceReplay>,
    /// Every device together: peaks of the sums over time, sums of the counts.
    pub total: ReplayReport,
}

impl ReplaySummary {
    /// The report of device `label`.
    pub fn device(&self, label: &str) -> Option<&ReplayReport> {
        self.devices
            .iter()
            .find(|d| d.device == label)
            .map(|d| &d.report)
    }
}

/// A segment that is only a size: replays need no memory behind the blocks.
#[derive(Debug)]
struct SizeOnly(#[allow(dead_code)] usize);

/// True for the labels of host memory pools.
fn is_host_pool(label: &str) -> bool {
    label == "host" || label.ends_with(" pinned")
}

struct DevState {
    label: String,
    pool: Arc<Pool<SizeOnly>>,
    report: ReplayReport,
    /// (allocated, reserved) now.
    now: (u64, u64),
    /// Bytes asked for by the live allocations.
    requested: u64,
}

/// Replays `trace` with every device merged into one pool's statistics: [`replay_with`]
/// without caps, returning the total.
///
/// # Errors
/// As [`replay_with`].
pub fn replay(trace: &Trace, config: &PoolConfig) -> Result<ReplayReport> {
    Ok(replay_with(trace, config, &ReplayOptions::default())?.total)
}

/// Replays `trace` with one fresh pool of configuration `config` per recorded device (pool
/// label), on the streams recorded. Segments are sizes only (no memory is touched); the
/// configuration's own `memory_cap` is ignored, the caps of `options` apply. An allocation that
/// fails under a cap is retried once after releasing the pool's cache, then counted as an
/// out-of-memory. Blocks still live at the end are freed, then every cache is emptied.
///
/// # Errors
/// [`crate::Error::InvalidConfig`] for an invalid configuration or a trace that frees an
/// unknown id, allocates an id twice, carries an event above [`super::MAX_EVENT_BYTES`] or
/// allocates more than [`MAX_REPLAY_BYTES`] in all (no real program's trace does; the pools'
/// statistics could not count it); [`crate::Error::SizeOverflow`] for a size that cannot be
/// rounded.
pub fn replay_with(
    trace: &Trace,
    config: &PoolConfig,
    options: &ReplayOptions,
) -> Result<ReplaySummary> {
    config.validate()?;
    trace.with_events(|events| run(events, config, options))
}

/// Most bytes a replayed trace may allocate in all (4 EiB): the pools' cumulative statistics
/// stay far from overflowing.
pub const MAX_REPLAY_BYTES: u64 = 1 << 62;

/// Rejects a trace whose sizes no real program has (see [`replay_with`]).
fn check_sizes(events: &[TraceEvent]) -> Result<()> {
    let mut allocated: u128 = 0;
    for (k, e) in events.iter().enumerate() {
        check_event_size(e)
            .map_err(|reason| invalid(format!("trace event {}: {reason}", k + 1)))?;
        if let TraceEvent::Alloc { size, .. } = e {
            allocated += *size as u128;
        }
    }
    if allocated > u128::from(MAX_REPLAY_BYTES) {
        return Err(invalid(format!(
            "the trace allocates {allocated} bytes in all, more than the {MAX_REPLAY_BYTES} \
             bytes a replay counts"
        )));
    }
    Ok(())
}

fn run(
    events: &[TraceEvent],
    config: &PoolConfig,
    options: &ReplayOptions,
) -> Result<ReplaySummary> {
    check_sizes(events)?;
    let mut r = Replay::new(config, options);
    for e in events {
        match e {
            TraceEvent::Alloc {
                id,
                size,
                stream,
                device,
                ..
            } => r.alloc(*id, *size, *stream, device)?,
            TraceEvent::Free { id, .. } => r.free(*id)?,
            // The replay's pools make their own segments.
            TraceEvent::SegmentAlloc { .. } | TraceEvent::SegmentFree { .. } => {}
            TraceEvent::Copy {
                direction,
                bytes,
                device,
                ..
            } => {
                let k = r.dev_of(device)?;
                add_copy(&mut r.devs[k].report.copies, *direction, *bytes);
            }
            TraceEvent::Evict { bytes, device, .. } => {
                let k = r.dev_of(device)?;
                let d = &mut r.devs[k].report;
                d.evictions += 1;
                d.evicted_bytes = d.evicted_bytes.saturating_add(*bytes as u64);
            }
            TraceEvent::Oom { device, .. } => {
                let k = r.dev_of(device)?;
                r.devs[k].report.recorded_ooms += 1;
            }
            // A plan moves no memory.
            TraceEvent::Plan { .. } => {}
        }
    }
    Ok(r.finish())
}

/// A replay under way: one pool per device, the live blocks, the running totals.
struct Replay<'a> {
    config: &'a PoolConfig,
    options: &'a ReplayOptions,
    devs: Vec<DevState>,
    /// Device label -> index in `devs`.
    index: HashMap<String, usize>,
    /// Live blocks: trace id -> (device index, lease).
    live: HashMap<u64, (usize, Lease<SizeOnly>)>,
    /// Allocations refused under the cap (their frees are skipped).
    refused: HashSet<u64>,
    total: ReplayReport,
    /// (allocated, reserved) of all pools now.
    total_now: (u64, u64),
    /// Bytes asked for by the live allocations of all pools.
    total_requested: u64,
}

impl<'a> Replay<'a> {
    fn new(config: &'a PoolConfig, options: &'a ReplayOptions) -> Self {
        Self {
            config,
            options,
            devs: Vec::new(),
            index: HashMap::new(),
            live: HashMap::new(),
            refused: HashSet::new(),
            total: ReplayReport::default(),
            total_now: (0, 0),
            total_requested: 0,
        }
    }

    /// The index of device `label`, with a fresh pool the first time (capped as `options`
    /// say for its kind of memory).
    fn dev_of(&mut self, label: &str) -> Result<usize> {
        if let Some(&k) = self.index.get(label) {
            return Ok(k);
        }
        let cap = if is_host_pool(label) {
            self.options.host_cap
        } else {
            self.options.cap
        };
        let mut cfg = self.config.clone();
        cfg.memory_cap = None;
        let pool = Pool::new(label, cfg, Arc::new(Budget::new(cap)), isize::MAX as usize)?;
        self.devs.push(DevState {
            label: label.to_string(),
            pool,
            report: ReplayReport::default(),
            now: (0, 0),
            requested: 0,
        });
        self.index.insert(label.to_string(), self.devs.len() - 1);
        Ok(self.devs.len() - 1)
    }

    /// Replays the allocation of block `id`.
    fn alloc(&mut self, id: u64, size: usize, stream: StreamId, device: &str) -> Result<()> {
        if self.live.contains_key(&id) || self.refused.contains(&id) {
            return Err(invalid(format!("trace allocates block {id} twice")));
        }
        let k = self.dev_of(device)?;
        let d = &mut self.devs[k];
        let source = |b: usize| -> Result<SizeOnly> { Ok(SizeOnly(b)) };
        match alloc(&d.pool, size, stream, &source)? {
            Some((lease, retried)) => {
                d.report.allocations += 1;
                d.report.retries += u64::from(retried);
                d.requested = d.requested.saturating_add(size as u64);
                d.report.peak_requested = d.report.peak_requested.max(d.requested);
                self.total_requested = self.total_requested.saturating_add(size as u64);
                self.total.peak_requested = self.total.peak_requested.max(self.total_requested);
                self.live.insert(id, (k, lease));
            }
            None => {
                d.report.ooms += 1;
                d.report.oom_bytes = d.report.oom_bytes.saturating_add(size as u64);
                self.refused.insert(id);
            }
        }
        self.update(k);
        Ok(())
    }

    /// Replays the free of block `id` (skipped for an allocation refused under the cap).
    fn free(&mut self, id: u64) -> Result<()> {
        if let Some((k, lease)) = self.live.remove(&id) {
            let size = lease.len() as u64;
            drop(lease);
            self.devs[k].requested = self.devs[k].requested.saturating_sub(size);
            self.total_requested = self.total_requested.saturating_sub(size);
            self.update(k);
        } else if !self.refused.remove(&id) {
            return Err(invalid(format!("trace frees unknown block {id}")));
        }
        Ok(())
    }

    /// Follows the gauges of device `k` into the running totals.
    fn update(&mut self, k: usize) {
        let d = &mut self.devs[k];
        let (a, r) = d.pool.gauges();
        self.total_now.0 = self.total_now.0 - d.now.0 + a;
        self.total_now.1 = self.total_now.1 - d.now.1 + r;
        d.now = (a, r);
        self.total.peak_allocated = self.total.peak_allocated.max(self.total_now.0);
        self.total.peak_reserved = self.total.peak_reserved.max(self.total_now.1);
    }

    /// Frees the blocks still live, empties every cache, and reports each device and the
    /// total.
    fn finish(mut self) -> ReplaySummary {
        self.live.clear();
        let mut out = Vec::with_capacity(self.devs.len());
        for d in self.devs {
            d.pool.empty_cache();
            let s = d.pool.stats();
            let report = ReplayReport {
                peak_reserved: s.reserved.peak,
                peak_allocated: s.allocated.peak,
                backend_calls: s.backend_allocs + s.backend_frees,
                cache_hits: s.cache_hits,
                ..d.report
            };
            self.total.add_counts(&report);
            out.push(DeviceReplay {
                device: d.label,
                report,
            });
        }
        ReplaySummary {
            devices: out,
            total: self.total,
        }
    }
}

/// One allocation with the first step of the out-of-memory path: `None` when refused for good;
/// the flag says whether the cache had to be released.
fn alloc(
    pool: &Arc<Pool<SizeOnly>>,
    size: usize,
    stream: StreamId,
    source: &dyn Fn(usize) -> Result<SizeOnly>,
) -> Result<Option<(Lease<SizeOnly>, bool)>> {
    match pool.alloc(size, stream, &source) {
        Ok(l) => Ok(Some((l, false))),
        Err(e) if e.is_out_of_memory() => {
            if pool.empty_cache() > 0 {
                match pool.alloc(size, stream, &source) {
                    Ok(l) => return Ok(Some((l, true))),
                    Err(e) if e.is_out_of_memory() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
