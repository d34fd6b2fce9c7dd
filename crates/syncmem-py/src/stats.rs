//! Memory introspection in PyTorch's shape: `memory_stats()`, `memory_summary()`,
//! `memory_snapshot()`, and `copy_stats()`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::alloc::pool::{Gauge, SizeStats};
use syncmem::{HostPool, PoolStats, Snapshot, Tensor};

use crate::device::{device_arg, opened};
use crate::tensor::copy_stats_dict;
use crate::{dtypes, views, workspace};

/// The statistics of the pools and memory spaces of `device` (all of them for `None`).
fn filtered(device: Option<&str>) -> Snapshot {
    let mut s = syncmem::stats();
    if let Some(dev) = device {
        let keep = |label: &str| label == dev || label.starts_with(&format!("{dev} "));
        s.devices.retain(|m| keep(&m.label));
        s.pools.retain(|p| keep(&p.label));
    }
    s
}

fn key_label(label: &str) -> String {
    label.replace(' ', "_")
}

/// The four figures of each byte gauge (`current`, `peak`, cumulative `allocated` and
/// `freed`) of `pools`, summed, under `"{stat}.{scope}.{figure}"`. A sum of peaks bounds the
/// peak of the sum from above when pools peaked at different times; for one pool it is exact.
fn add_gauges(
    out: &mut BTreeMap<String, u64>,
    scope: &str,
    pools: &[&PoolStats],
    class: &dyn Fn(&PoolStats) -> [Gauge; 4],
) {
    let stats = [
        "allocated_bytes",
        "requested_bytes",
        "reserved_bytes",
        "inactive_split_bytes",
    ];
    for (i, stat) in stats.iter().enumerate() {
        let sum = |f: &dyn Fn(&Gauge) -> u64| pools.iter().map(|p| f(&class(p)[i])).sum::<u64>();
        out.insert(format!("{stat}.{scope}.current"), sum(&|g| g.current));
        out.insert(format!("{stat}.{scope}.peak"), sum(&|g| g.peak));
        out.insert(format!("{stat}.{scope}.allocated"), sum(&|g| g.allocated));
        out.insert(format!("{stat}.{scope}.freed"), sum(&|g| g.freed));
    }
}

fn all_gauges(p: &PoolStats) -> [Gauge; 4] {
    [p.allocated, p.requested, p.reserved, p.inactive_split]
}

fn size_gauges(s: &SizeStats) -> [Gauge; 4] {
    [s.allocated, s.requested, s.reserved, s.inactive_split]
}

fn add_pool(out: &mut BTreeMap<String, u64>, scope: &str, pools: &[&PoolStats]) {
    add_gauges(out, scope, pools, &all_gauges);
    let sum = |f: &dyn Fn(&PoolStats) -> u64| pools.iter().map(|p| f(p)).sum::<u64>();
    let mut put = |k: &str, v: u64| {
        out.insert(k.replace("{}", scope), v);
    };
    put("cached_free_bytes.{}.current", sum(&|p| p.free_bytes));
    put("segment.{}.current", sum(&|p| p.segments));
    put("allocation.{}.allocated", sum(&|p| p.allocations));
    put("allocation.{}.freed", sum(&|p| p.frees));
    put(
        "allocation.{}.current",
        sum(&|p| p.allocations.saturating_sub(p.frees)),
    );
    put("num_cache_hits.{}", sum(&|p| p.cache_hits));
    put("num_device_alloc.{}", sum(&|p| p.backend_allocs));
    put("num_device_free.{}", sum(&|p| p.backend_frees));
    put("num_alloc_retries.{}", sum(&|p| p.alloc_retries));
    put("num_ooms.{}", sum(&|p| p.ooms));
    put("num_evictions.{}", sum(&|p| p.evictions));
    put("evicted_bytes.{}", sum(&|p| p.evicted_bytes));
    let largest = pools
        .iter()
        .map(|p| p.largest_free_block)
        .max()
        .unwrap_or(0);
    put("largest_free_block.{}", largest);
}

/// The memory statistics of every pool (or of `device`'s pools) as a flat dict, in the shape
/// of `torch.cuda.memory_stats()`: `"allocated_bytes.all.current"`, `"reserved_bytes.all.peak"`,
/// `"num_alloc_retries.all"`, `"num_ooms.all"`, ... summed over the pools. Each byte statistic
/// (`allocated_bytes`, `requested_bytes`, `reserved_bytes`, `inactive_split_bytes`) has
/// `current`, `peak`, and the cumulative `allocated` and `freed`, also for small and large
/// blocks apart (`"allocated_bytes.small_pool.current"`, `"reserved_bytes.large_pool.freed"`);
/// `"cached_free_bytes.all.current"` counts every free cached byte (whole free segments too).
/// The same keys per pool with its label in place of `all` (`"allocated_bytes.opencl:0.current"`,
/// `"allocated_bytes.host.current"`, `"allocated_bytes.opencl:0_pinned.current"`), the bytes
/// each memory space holds (`"in_use_bytes.host.current"`, `".peak"`, `"num_allocs.host"`,
/// `"num_frees.host"`), and the copies by direction (`"copies.host_to_device.count"`,
/// `"copies.host_to_device.bytes"`, ...). Every value is an int.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn memory_stats(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    let label = match device {
        Some(d) if !d.is_none() => Some(device_arg(Some(d), None)?.label().to_string()),
        _ => None,
    };
    let s = py.detach(|| filtered(label.as_deref()));
    let mut out = BTreeMap::new();
    let all: Vec<&PoolStats> = s.pools.iter().collect();
    add_pool(&mut out, "all", &all);
    add_gauges(&mut out, "small_pool", &all, &|p| size_gauges(&p.small));
    add_gauges(&mut out, "large_pool", &all, &|p| size_gauges(&p.large));
    for p in &s.pools {
        add_pool(&mut out, &key_label(&p.label), &[p]);
    }
    let spaces = if label.is_none() {
        std::iter::once(&s.host)
            .chain(s.devices.iter())
            .collect::<Vec<_>>()
    } else {
        s.devices.iter().collect()
    };
    for m in spaces {
        let l = key_label(&m.label);
        out.insert(format!("in_use_bytes.{l}.current"), m.in_use);
        out.insert(format!("in_use_bytes.{l}.peak"), m.peak);
        out.insert(format!("num_allocs.{l}"), m.allocs);
        out.insert(format!("num_frees.{l}"), m.frees);
    }
    for (name, dir) in [
        ("host_to_device", s.copies.host_to_device),
        ("device_to_host", s.copies.device_to_host),
        ("device_to_device", s.copies.device_to_device),
    ] {
        out.insert(format!("copies.{name}.count"), dir.count);
        out.insert(format!("copies.{name}.bytes"), dir.bytes);
    }
    let d = PyDict::new(py);
    for (k, v) in out {
        d.set_item(k, v)?;
    }
    Ok(d.into_any().unbind())
}

/// A readable report: memory in use and peak per memory space, copies, every pool (allocated,
/// reserved, hits, backend calls, fragmentation), the device mirrors alive, and the host views
/// alive. `device` keeps only that device's lines.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn memory_summary(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let dev = match device {
        Some(d) if !d.is_none() => Some(device_arg(Some(d), None)?),
        _ => None,
    };
    let label = dev.as_ref().map(|d| d.label().to_string());
    let s = py.detach(|| filtered(label.as_deref()));
    let mut out = String::new();
    let title = match &label {
        Some(l) => format!("syncmem memory summary ({l})"),
        None => "syncmem memory summary".to_string(),
    };
    let _ = writeln!(out, "{title}\n{}", "=".repeat(title.len()));
    let _ = write!(out, "{s}");
    let devices = match &dev {
        Some(d) => vec![d.clone()],
        None => opened(),
    };
    let _ = writeln!(out, "device mirrors alive");
    let mut any = false;
    for d in &devices {
        for b in py.detach(|| d.live_buffers()) {
            any = true;
            let _ = writeln!(out, "  {:<10} {b}", d.label());
        }
    }
    if !any {
        let _ = writeln!(out, "  none");
    }
    let live = views::live_views();
    let (ro, rw) = live
        .iter()
        .fold((0, 0), |(r, w), (_, e)| (r + e.read_only, w + e.writable));
    let _ = writeln!(
        out,
        "host views alive: {ro} read-only, {rw} writable, over {} buffer(s)",
        live.len()
    );
    for (_, e) in &live {
        let _ = writeln!(
            out,
            "  {} ({} bytes, {}): {} read-only, {} writable",
            e.label,
            e.bytes,
            e.device.as_deref().unwrap_or("host only"),
            e.read_only,
            e.writable
        );
    }
    Ok(out)
}

/// One buffer of the snapshot, while it is being assembled.
struct Entry {
    owners: Vec<String>,
    dict: Py<PyDict>,
}

/// Every live buffer the process can name, as a list of dicts (the buffers' view; the pools'
/// view, block by block, is `pool_snapshot()`): each tensor buffer reachable from a workspace made in Python (`owners`:
/// `"workspace:blob"` names; `label`, `device`, `dtype`, `shape`, `nbytes`, `capacity_bytes`,
/// `head`, `host_allocated`, `device_allocated`, `views`), buffers kept alive only by host
/// views (`owners`: `["host view"]`), and device mirrors no workspace names (`owners`: `[]`).
#[pyfunction]
pub fn memory_snapshot(py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut by_key: HashMap<usize, usize> = HashMap::new();
    // (device, label) of the device mirrors accounted for, to subtract from the registry.
    let mut mirrors: HashMap<(String, String), usize> = HashMap::new();
    for (ws_name, ws) in workspace::live() {
        for blob in ws.local_blobs() {
            let Some(b) = ws.try_get_blob(&blob) else {
                continue;
            };
            let b = b.read();
            let Ok(t) = b.get::<Tensor>() else {
                continue;
            };
            let owner = format!("{ws_name}:{blob}");
            let Some(mem) = t.synced() else {
                continue;
            };
            let k = views::key(mem);
            if let Some(&i) = by_key.get(&k) {
                entries[i].owners.push(owner);
                continue;
            }
            let d = PyDict::new(py);
            d.set_item("label", mem.label())?;
            d.set_item("device", t.target().map(|x| x.label().to_string()))?;
            d.set_item("dtype", t.dtype().map(dtypes::name))?;
            d.set_item("shape", t.dims().to_vec())?;
            d.set_item("nbytes", t.nbytes())?;
            d.set_item("capacity_bytes", mem.len())?;
            d.set_item("head", mem.head().as_str())?;
            d.set_item("host_allocated", mem.host_allocated())?;
            d.set_item("device_allocated", mem.device_allocated())?;
            let (ro, rw) = views::view_counts(mem);
            let v = PyDict::new(py);
            v.set_item("read_only", ro)?;
            v.set_item("writable", rw)?;
            d.set_item("views", v)?;
            if mem.device_allocated() {
                if let Some(dev) = t.target() {
                    *mirrors
                        .entry((dev.label().to_string(), mem.label().to_string()))
                        .or_insert(0) += 1;
                }
            }
            by_key.insert(k, entries.len());
            entries.push(Entry {
                owners: vec![owner],
                dict: d.unbind(),
            });
        }
    }
    for (k, e) in views::live_views() {
        if by_key.contains_key(&k) {
            continue;
        }
        let d = PyDict::new(py);
        d.set_item("label", &e.label)?;
        d.set_item("device", &e.device)?;
        d.set_item("capacity_bytes", e.bytes)?;
        let v = PyDict::new(py);
        v.set_item("read_only", e.read_only)?;
        v.set_item("writable", e.writable)?;
        d.set_item("views", v)?;
        entries.push(Entry {
            owners: vec!["host view".to_string()],
            dict: d.unbind(),
        });
    }
    for dev in opened() {
        for b in dev.live_buffers() {
            let key = (dev.label().to_string(), b.label.clone());
            if let Some(n) = mirrors.get_mut(&key) {
                if *n > 0 {
                    *n -= 1;
                    continue;
                }
            }
            let d = PyDict::new(py);
            d.set_item("label", &b.label)?;
            d.set_item("device", dev.label())?;
            d.set_item("capacity_bytes", b.bytes)?;
            d.set_item("head", b.head.map(|h| h.as_str()))?;
            d.set_item("device_allocated", true)?;
            entries.push(Entry {
                owners: Vec::new(),
                dict: d.unbind(),
            });
        }
    }
    entries
        .into_iter()
        .map(|e| {
            e.dict.bind(py).set_item("owners", e.owners)?;
            Ok(e.dict)
        })
        .collect()
}

/// Every block of every pool, as `torch.cuda.memory._snapshot()` lists them: `{"pools":
/// [{"label", "kind", "stats", "segments": [{"id", "size", "class", "blocks":
/// [{"offset", "size", "requested", "state", "stream", "owner"}]}]}]}`, with `state` one of
/// `"allocated"`, `"free"`, `"pending"` (cached, with queued work that may still use it) and
/// `owner` the name of the tensor or blob that holds the block when known. `device` keeps only
/// that device's pools. It walks every block under each pool's lock: a tool for reports.
#[pyfunction]
#[pyo3(signature = (device = None))]
pub fn pool_snapshot(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    let label = match device {
        Some(d) if !d.is_none() => Some(device_arg(Some(d), None)?.label().to_string()),
        _ => None,
    };
    let json = py.detach(|| {
        let mut snap = syncmem::memory_snapshot();
        if let Some(dev) = &label {
            snap.pools
                .retain(|p| p.label == *dev || p.label.starts_with(&format!("{dev} ")));
        }
        snap.to_json()
    });
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
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

/// Resets the peak counters of every device opened (and of its pools) to the current use.
#[pyfunction]
pub fn reset_peak_memory_stats(py: Python<'_>) {
    py.detach(|| {
        if let Ok(p) = HostPool::global() {
            p.reset_peak();
        }
        for d in opened() {
            d.reset_peak_stats();
        }
    })
}
