//! Memory reports: `memory_summary()` (PyTorch's table for each pool, then memory spaces,
//! copies, device mirrors and host views), `memory_snapshot()` (the buffers' view) and
//! `pool_snapshot()` (the pools' view, block by block).

use std::collections::HashMap;
use std::fmt::Write as _;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::Tensor;

use crate::device::{device_arg, opened};
use crate::stats::{label_arg, Scope};
use crate::{dtypes, views, workspace};

/// The report `torch.cuda.memory_summary()` prints, for each pool, then what syncmem adds.
///
/// First the table of each pool (the same as the library's `MemorySummary`): allocated,
/// requested, reserved and inactive-split bytes, each current, peak, allocated and freed in
/// all, for all blocks and for small and large blocks apart (`abbreviated` leaves those
/// out), then segments, blocks, cache hits, backend calls, free memory, retries and
/// out-of-memory failures; the legend once. Then memory in use and peak per memory space,
/// copies, the device mirrors alive and the host views alive. `device` keeps that device's
/// pools and lines (device memory and pinned host memory); without it, every pool.
#[pyfunction]
#[pyo3(signature = (device = None, abbreviated = false))]
pub fn memory_summary(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
    abbreviated: bool,
) -> PyResult<String> {
    let dev = match device {
        Some(d) if !d.is_none() => Some(device_arg(Some(d), None)?),
        _ => None,
    };
    let label = dev.as_ref().map(|d| d.label().to_string());
    let scope = py.detach(|| Scope::read(label.clone()));
    let mut out = String::new();
    let title = match &label {
        Some(l) => format!("syncmem memory summary ({l})"),
        None => "syncmem memory summary".to_string(),
    };
    let _ = writeln!(out, "{title}\n{}", "=".repeat(title.len()));
    let mut legend = String::new();
    for (i, pool) in scope.pools().into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let table = pool.summary().to_string();
        // The table, then "legend:" and its lines: the legend is printed once, at the end.
        let (table, rest) = table.split_at(table.find("\nlegend:").map_or(table.len(), |i| i + 1));
        for line in table.lines() {
            let size_row =
                line.starts_with("|   small blocks") || line.starts_with("|   large blocks");
            if !(abbreviated && size_row) {
                let _ = writeln!(out, "{line}");
            }
        }
        legend = rest.to_string();
    }
    if scope.pools().is_empty() {
        let _ = writeln!(out, "no pool has allocated yet");
    }
    out.push_str(&legend);
    let _ = write!(out, "{}", scope.spaces_only());
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
/// view, block by block, is `pool_snapshot()`): each tensor buffer reachable from a workspace
/// made in Python (`owners`:
/// `"workspace:blob"` names; `label`, `device`, `dtype`, `shape`, `nbytes`, `capacity_bytes`,
/// `head`, `host_allocated`, `device_allocated`, `views`, `busy`: false), buffers kept alive
/// only by host views (`owners`: `["host view"]`), and device mirrors no workspace names
/// (`owners`: `[]`). It waits for no blob: a blob locked for writing (the output of an
/// operator running now) is listed with its name as `label`, its owner and `busy`: true only.
#[pyfunction]
pub fn memory_snapshot(py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
    let mut snap = Snapshot::default();
    for (ws_name, ws) in workspace::live() {
        for blob in ws.local_blobs() {
            let Some(b) = ws.try_get_blob(&blob) else {
                continue;
            };
            let owner = format!("{ws_name}:{blob}");
            // Never waits for a blob: one locked for writing (a running operator's output,
            // possibly that of the operator calling this) is listed as busy.
            let Some(b) = b.try_read_recursive() else {
                snap.add_busy(py, &blob, owner)?;
                continue;
            };
            if let Ok(t) = b.get::<Tensor>() {
                snap.add_tensor(py, t, owner)?;
            }
        }
    }
    snap.add_host_views(py)?;
    snap.add_unnamed_mirrors(py)?;
    snap.entries
        .into_iter()
        .map(|e| {
            e.dict.bind(py).set_item("owners", e.owners)?;
            Ok(e.dict)
        })
        .collect()
}

/// The buffers of [`memory_snapshot`] so far.
#[derive(Default)]
struct Snapshot {
    entries: Vec<Entry>,
    /// The entry of each buffer listed (by [`views::key`]).
    by_key: HashMap<usize, usize>,
    /// (device, label) of the device mirrors accounted for, to subtract from the registry.
    mirrors: HashMap<(String, String), usize>,
}

impl Snapshot {
    fn push(&mut self, owners: Vec<String>, dict: Bound<'_, PyDict>) {
        self.entries.push(Entry {
            owners,
            dict: dict.unbind(),
        });
    }

    /// A blob locked for writing: its name and owner only.
    fn add_busy(&mut self, py: Python<'_>, blob: &str, owner: String) -> PyResult<()> {
        let d = PyDict::new(py);
        d.set_item("label", blob)?;
        d.set_item("busy", true)?;
        self.push(vec![owner], d);
        Ok(())
    }

    /// The buffer of tensor `t`, or one more owner of a buffer already listed.
    fn add_tensor(&mut self, py: Python<'_>, t: &Tensor, owner: String) -> PyResult<()> {
        let Some(mem) = t.synced() else {
            return Ok(());
        };
        let k = views::key(mem);
        if let Some(&i) = self.by_key.get(&k) {
            self.entries[i].owners.push(owner);
            return Ok(());
        }
        let d = PyDict::new(py);
        d.set_item("label", mem.label())?;
        d.set_item("busy", false)?;
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
                *self
                    .mirrors
                    .entry((dev.label().to_string(), mem.label().to_string()))
                    .or_insert(0) += 1;
            }
        }
        self.by_key.insert(k, self.entries.len());
        self.push(vec![owner], d);
        Ok(())
    }

    /// Buffers kept alive only by host views.
    fn add_host_views(&mut self, py: Python<'_>) -> PyResult<()> {
        for (k, e) in views::live_views() {
            if self.by_key.contains_key(&k) {
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
            self.push(vec!["host view".to_string()], d);
        }
        Ok(())
    }

    /// Device mirrors that no workspace names (those of the tensors listed are subtracted).
    fn add_unnamed_mirrors(&mut self, py: Python<'_>) -> PyResult<()> {
        for dev in opened() {
            for b in dev.live_buffers() {
                let key = (dev.label().to_string(), b.label.clone());
                if let Some(n) = self.mirrors.get_mut(&key) {
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
                self.push(Vec::new(), d);
            }
        }
        Ok(())
    }
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
    let label = label_arg(device)?;
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
