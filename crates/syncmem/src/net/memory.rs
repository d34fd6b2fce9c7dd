//! Where blobs live and how much memory a net uses: per-blob heads and copy counts, bytes per
//! side, and peaks measured while a net runs.
//!
//! Two measurements of a run's peak are offered by [`measure_run`]:
//! - the **tensor peak**: the bytes of the workspace's tensor storages (each storage counted
//!   once, shared or not), summed after every operator. It sees only this workspace, so it is
//!   exact and repeatable even while other threads allocate (tests use it);
//! - the **device peak**: the device's allocation counters ([`Device::memory_stats`]) after
//!   [`Device::reset_peak_stats`], minus the use before the run. It also sees temporaries
//!   inside operators, and everything else allocated on the device meanwhile (the CLI, which
//!   runs alone, reports it).

use std::collections::{BTreeMap, BTreeSet};

use super::Net;
use crate::alloc::stats::CopyStats;
use crate::device::Device;
use crate::error::Result;
use crate::synced::{Head, SyncedMemory};
use crate::tensor::Tensor;
use crate::workspace::Workspace;

/// Where one tensor blob lives.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BlobInfo {
    /// The blob's name.
    pub name: String,
    /// Element type name (`None` before the type is known).
    pub dtype: Option<&'static str>,
    /// Dims (empty for a scalar or an uninitialised tensor).
    pub dims: Vec<usize>,
    /// Bytes of the elements.
    pub bytes: usize,
    /// Bytes of the storage (at least `bytes`; more after a shrink or in a shared slot).
    pub capacity: usize,
    /// Which mirror is current (`None` without byte storage).
    pub head: Option<Head>,
    /// The host mirror exists.
    pub host_allocated: bool,
    /// The device mirror exists.
    pub device_allocated: bool,
    /// Copies made by the storage since it was created.
    pub copies: CopyStats,
}

impl BlobInfo {
    /// `host`, `device`, `synced`, `uninitialized`, or `none` (no byte storage).
    pub fn head_str(&self) -> &'static str {
        self.head.map_or("none", Head::as_str)
    }
}

/// Bytes of tensor storage on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SideBytes {
    /// Bytes of host mirrors.
    pub host: u64,
    /// Bytes of device mirrors.
    pub device: u64,
}

impl SideBytes {
    /// Host plus device.
    pub fn total(&self) -> u64 {
        self.host.saturating_add(self.device)
    }

    fn max(self, o: SideBytes) -> SideBytes {
        SideBytes {
            host: self.host.max(o.host),
            device: self.device.max(o.device),
        }
    }
}

/// Every local blob of `ws` that holds a [`Tensor`], sorted by name.
pub fn blob_report(ws: &Workspace) -> Vec<BlobInfo> {
    let mut out = Vec::new();
    for name in ws.local_blobs() {
        let Some(blob) = ws.try_get_blob(&name) else {
            continue;
        };
        let guard = blob.read();
        let Ok(t) = guard.get::<Tensor>() else {
            continue;
        };
        let synced = t.synced();
        out.push(BlobInfo {
            name,
            dtype: t.dtype().map(|d| d.name()),
            dims: t.dims().to_vec(),
            bytes: t.nbytes(),
            capacity: t.capacity_bytes(),
            head: t.head(),
            host_allocated: synced.is_some_and(SyncedMemory::host_allocated),
            device_allocated: synced.is_some_and(SyncedMemory::device_allocated),
            copies: t.copy_stats(),
        });
    }
    out
}

/// Bytes of the tensor storages of `ws`'s local blobs, each storage counted once.
pub fn tensor_bytes(ws: &Workspace) -> SideBytes {
    let mut seen = BTreeSet::new();
    let mut total = SideBytes::default();
    for name in ws.local_blobs() {
        let Some(blob) = ws.try_get_blob(&name) else {
            continue;
        };
        let guard = blob.read();
        let Some(mem) = guard.get::<Tensor>().ok().and_then(Tensor::synced) else {
            continue;
        };
        if !seen.insert(std::ptr::from_ref(mem) as usize) {
            continue;
        }
        let len = mem.len() as u64;
        if mem.host_allocated() {
            total.host += len;
        }
        if mem.device_allocated() {
            total.device += len;
        }
    }
    total
}

/// Storage bytes of the named tensor blobs of `ws` (missing or non-tensor blobs are left out):
/// size hints for [`super::PlanOptions::sizes`].
pub fn blob_sizes<S: AsRef<str>>(ws: &Workspace, names: &[S]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in names {
        let n = n.as_ref();
        if let Some(b) = ws.try_get_blob(n) {
            if let Ok(t) = b.read().get::<Tensor>() {
                out.insert(n.to_string(), t.capacity_bytes());
            }
        }
    }
    out
}

/// The memory of one measured run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunMemory {
    /// Tensor storage bytes before the run.
    pub before: SideBytes,
    /// Highest tensor storage bytes seen after an operator (including `before`).
    pub tensor_peak: SideBytes,
    /// The device's allocation peak during the run minus its use before the run.
    pub device_peak: u64,
}

/// Runs `net` once in `ws` with its context and measures its memory (see the
/// [module docs](self)).
///
/// # Errors
/// The run errors of [`Net::run`].
pub fn measure_run(net: &Net, ws: &Workspace) -> Result<RunMemory> {
    let dev: &Device = net.device();
    dev.synchronize()?;
    let before = tensor_bytes(ws);
    let in_use = dev.memory_stats().in_use;
    dev.reset_peak_stats();
    let mut peak = before;
    net.run_observed(ws, net.context(), |_, _| {
        peak = peak.max(tensor_bytes(ws));
        Ok(())
    })?;
    dev.synchronize()?;
    Ok(RunMemory {
        before,
        tensor_peak: peak,
        device_peak: dev.memory_stats().peak.saturating_sub(in_use),
    })
}
