//! Memory statistics with `torch.cuda`'s names: `memory_stats()` (a flat dict whose keys come
//! from one table, [`STATS`]), `memory_allocated()`, `max_memory_allocated()`,
//! `memory_reserved()`, `max_memory_reserved()`, `reset_peak_memory_stats()`,
//! `empty_cache()`, and `copy_stats()`.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::alloc::pool::{Gauge, SizeStats};
use syncmem::{HostPool, MemStats, PoolStats, Snapshot};

use crate::device::{device_arg, opened};
use crate::tensor::copy_stats_dict;

/// Where the figures of one statistic come from, and the keys they make. `SCOPE` is `all`,
/// `small_pool`, `large_pool` (the scope's pools summed, for all their blocks, the small ones
/// and the large ones) or a pool's label; `POOL` a pool's label; `SPACE` a memory space's.
enum Source {
    /// A gauge of each pool: `{name}.{SCOPE}.{current,peak,allocated,freed}`.
    Gauge(fn(&PoolStats) -> Gauge, fn(&SizeStats) -> Gauge),
    /// A cumulative count of each pool: `{name}` (the scope's pools summed), `{name}.{POOL}`.
    Count(fn(&PoolStats) -> u64),
    /// A value now of each pool: `{name}.all.current`, `{name}.{POOL}.current`.
    Current(fn(&PoolStats) -> u64),
    /// The largest value of the pools: `{name}.all`, `{name}.{POOL}`.
    Max(fn(&PoolStats) -> u64),
    /// A gauge of each memory space: `{name}.{SPACE}.current`, `{name}.{SPACE}.peak`.
    SpaceGauge(fn(&MemStats) -> (u64, u64)),
    /// A count of each memory space: `{name}.{SPACE}`.
    SpaceCount(fn(&MemStats) -> u64),
    /// The process's copies and zero-copy syncs:
    /// `{name}.{host_to_device,device_to_host,device_to_device,mapped}.{count,bytes}`.
    Copies,
    /// A count of the whole process: `{name}`.
    Process(fn(&Snapshot) -> u64),
}

/// Every statistic of `memory_stats()`, in the order of the README's table of keys (which a
/// test compares with the dict). A statistic added here goes there too.
const STATS: &[(&str, Source)] = &[
    (
        "allocated_bytes",
        Source::Gauge(|p| p.allocated, |s| s.allocated),
    ),
    // A block freed with work queued on it is cached at once (reused by its own stream first),
    // not held as active: active bytes and blocks are the allocated ones.
    (
        "active_bytes",
        Source::Gauge(|p| p.allocated, |s| s.allocated),
    ),
    (
        "requested_bytes",
        Source::Gauge(|p| p.requested, |s| s.requested),
    ),
    (
        "reserved_bytes",
        Source::Gauge(|p| p.reserved, |s| s.reserved),
    ),
    (
        "inactive_split_bytes",
        Source::Gauge(|p| p.inactive_split, |s| s.inactive_split),
    ),
    (
        "allocation",
        Source::Gauge(|p| p.block_count, |s| s.block_count),
    ),
    (
        "active",
        Source::Gauge(|p| p.block_count, |s| s.block_count),
    ),
    (
        "segment",
        Source::Gauge(|p| p.segment_count, |s| s.segment_count),
    ),
    ("num_alloc_retries", Source::Count(|p| p.alloc_retries)),
    ("num_ooms", Source::Count(|p| p.ooms)),
    ("num_device_alloc", Source::Count(|p| p.backend_allocs)),
    ("num_device_free", Source::Count(|p| p.backend_frees)),
    ("num_cache_hits", Source::Count(|p| p.cache_hits)),
    ("num_evictions", Source::Count(|p| p.evictions)),
    ("evicted_bytes", Source::Count(|p| p.evicted_bytes)),
    ("num_dead_drops", Source::Count(|p| p.drops)),
    ("dead_dropped_bytes", Source::Count(|p| p.dropped_bytes)),
    ("cached_free_bytes", Source::Current(|p| p.free_bytes)),
    ("largest_free_block", Source::Max(|p| p.largest_free_block)),
    ("parked_bytes", Source::Current(|p| p.parked_bytes)),
    ("in_use_bytes", Source::SpaceGauge(|m| (m.in_use, m.peak))),
    ("num_allocs", Source::SpaceCount(|m| m.allocs)),
    ("num_frees", Source::SpaceCount(|m| m.frees)),
    ("copies", Source::Copies),
    ("num_host_waits", Source::Process(|s| s.host_waits)),
    ("num_spills", Source::Process(|s| s.copies.spilled.count)),
    ("spilled_bytes", Source::Process(|s| s.copies.spilled.bytes)),
    ("num_refills", Source::Process(|s| s.copies.refilled.count)),
    (
        "refilled_bytes",
        Source::Process(|s| s.copies.refilled.bytes),
    ),
];

/// The label of the device `arg` names, or `None` for all of them.
pub fn label_arg(arg: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match arg {
        Some(d) if !d.is_none() => Ok(Some(device_arg(Some(d), None)?.label().to_string())),
        _ => Ok(None),
    }
}

/// What one call covers: the statistics of the process, and the pools and memory spaces of one
/// device (or of all of them).
pub struct Scope {
    /// The statistics of the process.
    pub snapshot: Snapshot,
    /// The device, `None` for all.
    pub device: Option<String>,
}

impl Scope {
    /// Reads the statistics (call it without the GIL).
    pub fn read(device: Option<String>) -> Scope {
        Scope {
            snapshot: syncmem::stats(),
            device,
        }
    }

    /// The device's own memory or pinned memory (`"opencl:0"`, `"opencl:0 pinned"`).
    fn of_device(&self, label: &str) -> bool {
        match &self.device {
            None => true,
            Some(d) => label == d || label.strip_prefix(d.as_str()) == Some(" pinned"),
        }
    }

    /// The pools listed one by one: the device's (device memory and pinned memory), or all.
    pub fn pools(&self) -> Vec<&PoolStats> {
        let pools = self.snapshot.pools.iter();
        pools.filter(|p| self.of_device(&p.label)).collect()
    }

    /// The pools of the per-pool keys, by key label: one per memory space (and any pool
    /// without one), `None` for a pool not used yet, whose keys are then zeros. A pool is made
    /// on its first use; its keys are there from the start, so that the dict's keys do not
    /// depend on what ran before.
    fn pool_slots(&self) -> Vec<(String, Option<&PoolStats>)> {
        let key = |l: &str| l.replace(' ', "_");
        let pools = self.pools();
        let mut slots: Vec<(String, Option<&PoolStats>)> = self
            .spaces()
            .iter()
            .map(|m| {
                (
                    key(&m.label),
                    pools.iter().copied().find(|p| p.label == m.label),
                )
            })
            .collect();
        for p in pools {
            if !slots.iter().any(|(l, _)| *l == key(&p.label)) {
                slots.push((key(&p.label), Some(p)));
            }
        }
        slots
    }

    /// The pools summed under `all`: the device's memory pool (as `torch.cuda` counts device
    /// memory only), or every pool.
    fn summed(&self) -> Vec<&PoolStats> {
        let pools = self.snapshot.pools.iter();
        match &self.device {
            None => pools.collect(),
            Some(d) => pools.filter(|p| p.label == *d).collect(),
        }
    }

    /// The memory spaces: the device's (device memory, pinned memory), or all with the host.
    fn spaces(&self) -> Vec<&MemStats> {
        let s = &self.snapshot;
        let all = std::iter::once(&s.host).chain(&s.devices);
        match &self.device {
            None => all.collect(),
            Some(_) => all.filter(|m| self.of_device(&m.label)).collect(),
        }
    }

    /// The statistics of the memory spaces and copies alone (no pools): `Display` prints them.
    pub fn spaces_only(&self) -> Snapshot {
        let mut s = self.snapshot.clone();
        s.devices.retain(|m| self.of_device(&m.label));
        s.pools.clear();
        s
    }

    /// Every key of `memory_stats()` with its value.
    pub fn keys(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (name, source) in STATS {
            self.add(&mut out, name, source);
        }
        out
    }

    fn add(&self, out: &mut BTreeMap<String, u64>, name: &str, source: &Source) {
        let summed = self.summed();
        let pools = self.pool_slots();
        let mut put = |k: String, v: u64| {
            out.insert(k, v);
        };
        match source {
            Source::Gauge(all, size) => {
                put_gauge(&mut put, name, "all", &summed, all);
                put_gauge(&mut put, name, "small_pool", &summed, |p| size(&p.small));
                put_gauge(&mut put, name, "large_pool", &summed, |p| size(&p.large));
                for (l, p) in &pools {
                    put_gauge(&mut put, name, l, p.as_slice(), all);
                }
            }
            Source::Count(f) => {
                put(name.to_string(), summed.iter().map(|p| f(p)).sum());
                for (l, p) in &pools {
                    put(format!("{name}.{l}"), p.map_or(0, f));
                }
            }
            Source::Current(f) => {
                put(
                    format!("{name}.all.current"),
                    summed.iter().map(|p| f(p)).sum(),
                );
                for (l, p) in &pools {
                    put(format!("{name}.{l}.current"), p.map_or(0, f));
                }
            }
            Source::Max(f) => {
                let max = summed.iter().map(|p| f(p)).max().unwrap_or(0);
                put(format!("{name}.all"), max);
                for (l, p) in &pools {
                    put(format!("{name}.{l}"), p.map_or(0, f));
                }
            }
            Source::SpaceGauge(f) => {
                for m in self.spaces() {
                    let (current, peak) = f(m);
                    let l = m.label.replace(' ', "_");
                    put(format!("{name}.{l}.current"), current);
                    put(format!("{name}.{l}.peak"), peak);
                }
            }
            Source::SpaceCount(f) => {
                for m in self.spaces() {
                    put(format!("{name}.{}", m.label.replace(' ', "_")), f(m));
                }
            }
            Source::Copies => {
                let c = &self.snapshot.copies;
                for (dir, d) in [
                    ("host_to_device", c.host_to_device),
                    ("device_to_host", c.device_to_host),
                    ("device_to_device", c.device_to_device),
                    ("mapped", c.mapped),
                ] {
                    put(format!("{name}.{dir}.count"), d.count);
                    put(format!("{name}.{dir}.bytes"), d.bytes);
                }
            }
            Source::Process(f) => put(name.to_string(), f(&self.snapshot)),
        }
    }
}

/// The four figures of a gauge of `pools`, summed, under `{name}.{scope}.{figure}`. A sum of
/// peaks bounds the peak of the sum from above when pools peaked at different times; for one
/// pool it is exact.
fn put_gauge(
    put: &mut impl FnMut(String, u64),
    name: &str,
    scope: &str,
    pools: &[&PoolStats],
    gauge: impl Fn(&PoolStats) -> Gauge,
) {
    let sum = |f: fn(&Gauge) -> u64| pools.iter().map(|p| f(&gauge(p))).sum::<u64>();
    put(format!("{name}.{scope}.current"), sum(|g| g.current));
    put(format!("{name}.{scope}.peak"), sum(|g| g.peak));
    put(format!("{name}.{scope}.allocated"), sum(|g| g.allocated));
    put(format!("{name}.{scope}.freed"), sum(|g| g.freed));
}

fn read(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Scope> {
    let label = label_arg(device)?;
    Ok(py.detach(|| Scope::read(label)))
}

/// The memory statistics as a flat dict of ints, with `torch.cuda.memory_stats()`'s keys:
/// `"allocated_bytes.all.current"`, `"reserved_bytes.all.peak"`, `"allocation.all.peak"`,
/// `"num_ooms"`, `"num_alloc_retries"`, ... (the README's Python section lists every key).
///
/// With `device` (a `Device` or a string), the `all`, `small_pool` and `large_pool` figures
/// and the unscoped counts cover that device's memory pool, and the keys per pool and per
/// memory space its pools and spaces (device memory and pinned host memory). Without, they
/// cover every pool and memory space of the process (the host pool, each device's); a peak
/// summed over several pools is the sum of their peaks, which bounds the peak of the sum from
/// above.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn memory_stats(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    let keys = read(py, device)?.keys();
    let d = PyDict::new(py);
    for (k, v) in keys {
        d.set_item(k, v)?;
    }
    Ok(d.into_any().unbind())
}

fn one(py: Python<'_>, device: Option<&Bound<'_, PyAny>>, key: &str) -> PyResult<u64> {
    Ok(read(py, device)?.keys().get(key).copied().unwrap_or(0))
}

/// Bytes in blocks handed out now (`memory_stats(device)["allocated_bytes.all.current"]`): of
/// the device's memory pool, or of every pool without `device`.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn memory_allocated(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    one(py, device, "allocated_bytes.all.current")
}

/// The most bytes in blocks handed out at once since the start or the last
/// `reset_peak_memory_stats()` (`"allocated_bytes.all.peak"`).
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn max_memory_allocated(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    one(py, device, "allocated_bytes.all.peak")
}

/// Bytes in segments held from the backend now, blocks handed out and cached
/// (`"reserved_bytes.all.current"`).
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn memory_reserved(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    one(py, device, "reserved_bytes.all.current")
}

/// The most bytes held in segments at once since the start or the last
/// `reset_peak_memory_stats()` (`"reserved_bytes.all.peak"`).
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn max_memory_reserved(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    one(py, device, "reserved_bytes.all.peak")
}

/// Resets every peak (`"*.peak"` keys) to the current value: of `device` (its memory, pinned
/// memory and their pools), or of the whole process without it (host memory and the host pool
/// too). Cumulative figures are kept.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn reset_peak_memory_stats(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let dev = match device {
        Some(d) if !d.is_none() => Some(device_arg(Some(d), None)?),
        _ => None,
    };
    py.detach(|| match dev {
        Some(d) => d.reset_peak_stats(),
        None => syncmem::reset_peak_stats(),
    });
    Ok(())
}

/// Every copy the process made between host and device memory, by direction:
/// `{"host_to_device": {"count": n, "bytes": b}, "device_to_host": ..., "device_to_device": ...}`.
#[pyfunction]
pub fn copy_stats(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let c = syncmem::stats().copies;
    copy_stats_dict(py, &c)
}

/// Gives the cached free blocks of every pool (host, and each device opened) back to the
/// system; returns the bytes released.
#[pyfunction]
pub fn empty_cache(py: Python<'_>) -> u64 {
    py.detach(|| {
        let host = HostPool::global().map(HostPool::empty_cache).unwrap_or(0);
        host + opened().iter().map(|d| d.empty_cache()).sum::<u64>()
    })
}
