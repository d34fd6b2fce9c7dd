//! Devices, device memory, streams and events.
//!
//! A [`Device`] is a cheap handle (`Clone`, `Send + Sync`) to one device of one backend:
//!
//! | string      | backend | needs                                   |
//! |-------------|---------|-----------------------------------------|
//! | `cpu`       | host    | nothing                                 |
//! | `opencl:N`  | OpenCL  | feature `opencl`, an OpenCL ICD (PoCL)  |
//! | `cuda:N`    | CUDA    | feature `cuda`, the CUDA driver         |
//!
//! Discovery runs once per process and backend, behind a lock (some OpenCL platforms break when
//! several threads enumerate devices at once); every later [`Device::open`] returns a handle to
//! the same device object, with the same statistics counters.
//!
//! The `cpu` device is a real backend whose "device memory" is separate host memory: it runs
//! every device-side code path (allocation, copies, events) without an accelerator.
//!
//! # Memory pools
//!
//! Each device has a caching device pool and a caching pinned host pool
//! ([`crate::alloc::pool`]). [`crate::SyncedMemory`] takes its device mirrors from the device
//! pool and, when asked for pinned host memory, its host mirrors from the pinned pool.
//! [`Device::alloc`] stays a direct backend allocation (never cached: dropping it while
//! asynchronous work still uses it is as safe as before), but it counts against the device's
//! memory cap and goes through the same out-of-memory path; [`Device::alloc_pooled`] is the
//! stream-ordered pooled allocation. Select the pool with [`Device::set_pool`] or with the
//! `SYNCMEM_DEVICE_POOL` / `SYNCMEM_POOL_CONF` environment variables.

// The backends' tests open `Device`s and streams: they live in the device layer.
mod buffer;
#[cfg(all(test, feature = "cuda"))]
mod cuda_backend_tests;
#[cfg(test)]
mod device_tests;
mod handle;
mod in_place;
pub(crate) mod inject;
mod isolated;
mod kernels;
mod mem_pool;
mod memory;
mod mirror;
mod oom_observer;
#[cfg(all(test, feature = "opencl"))]
mod opencl_backend_tests;
#[cfg(all(test, feature = "opencl"))]
mod opencl_elementwise_tests;
#[cfg(test)]
mod ordering_tests;
mod pinned;
mod registry;
mod stream;
mod trace;
mod usage;
mod user_kernel;
pub mod zero_copy;

/// Captured OpenCL launches, for a raw replay (see the type).
#[cfg(feature = "opencl")]
#[cfg_attr(docsrs, doc(cfg(feature = "opencl")))]
pub use crate::backend::opencl::capture::LaunchCapture;

pub use crate::backend::DeviceInfo;
pub use crate::error::{OomReport, OomRetry};
pub use buffer::DeviceBuffer;
pub(crate) use buffer::Release;
pub(crate) use in_place::MapAccess;
pub use mem_pool::{MemPool, MemPoolScope};
#[cfg(test)]
pub(crate) use mirror::Inert;
pub(crate) use mirror::{Evictable, Freed, Mirrors, NextUse};
pub use mirror::{Head, LiveBuffer};
pub(crate) use oom_observer::{notify as notify_oom, unobserved as without_oom_observers};
pub use oom_observer::{on_out_of_memory, OomObserverHandle};
pub use pinned::PinnedBuffer;
pub(crate) use registry::discovered as registry_discovered;
pub use registry::{probe, BackendReport};
pub(crate) use stream::LentStream;
use stream::UnboundStream;
pub use stream::{Event, Stream};
pub(crate) use usage::Point;
pub use user_kernel::{
    Grid, HostArgs, HostKernelFn, KernelArg, KernelParam, ScalarArg, ScalarType, UserKernel,
};
pub use zero_copy::{ZeroCopy, ZeroCopyProtocol};

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use crate::alloc::pool::{PoolConfig, PoolSnapshot, PoolStats};
use crate::alloc::stats::{MemCounters, MemStats};
use crate::backend::dispatch::RawDevice;
use crate::error::{BackendKind, Error, Result};
use memory::DeviceMemory;

/// A parsed device string (`cpu`, `opencl:N`, `cuda:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DeviceSpec {
    /// The backend.
    pub backend: BackendKind,
    /// Device index (0 for `cpu`).
    pub ordinal: usize,
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidDeviceSpec {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim().to_ascii_lowercase();
        let (name, ord) = match t.split_once(':') {
            Some((n, o)) => (n, Some(o)),
            None => (t.as_str(), None),
        };
        let backend = match name {
            "cpu" | "host" => BackendKind::Cpu,
            "opencl" | "ocl" | "cl" => BackendKind::OpenCl,
            "cuda" | "gpu" => BackendKind::Cuda,
            "" => return Err(bad("empty")),
            _ => return Err(bad("expected cpu, opencl:N or cuda:N")),
        };
        let ordinal = match ord {
            None => 0,
            Some(o) => o
                .parse::<usize>()
                .map_err(|_| bad("the device index must be a non-negative integer"))?,
        };
        if backend == BackendKind::Cpu && ordinal != 0 {
            return Err(bad(ONE_CPU));
        }
        Ok(Self { backend, ordinal })
    }
}

/// Why `cpu:N` with `N > 0` is not a device.
const ONE_CPU: &str = "there is one cpu device, cpu:0";

impl DeviceSpec {
    /// The device `ordinal` of `backend`, as `"opencl:1"` parses: [`Error::InvalidDeviceSpec`]
    /// for a `cpu` ordinal other than 0 (there is one `cpu` device). Whether the device exists
    /// is known only when it is opened.
    pub fn new(backend: BackendKind, ordinal: usize) -> Result<Self> {
        if backend == BackendKind::Cpu && ordinal != 0 {
            return Err(Error::InvalidDeviceSpec {
                spec: format!("cpu:{ordinal}"),
                reason: ONE_CPU.to_string(),
            });
        }
        Ok(Self { backend, ordinal })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backend {
            BackendKind::Cpu => f.write_str("cpu"),
            b => write!(f, "{b}:{}", self.ordinal),
        }
    }
}

pub(crate) struct DeviceShared {
    pub(crate) info: DeviceInfo,
    pub(crate) label: String,
    pub(crate) raw: RawDevice,
    pub(crate) mem: MemCounters,
    pub(crate) pinned: MemCounters,
    pub(crate) memory: DeviceMemory,
    /// Kept without a device handle: a [`Stream`] here would keep the device alive forever.
    default_stream: OnceLock<std::result::Result<UnboundStream, String>>,
    /// Allocation failures on demand ([`Device::fail_allocation`]).
    #[cfg(feature = "testing")]
    pub(crate) faults: inject::Faults,
    /// The registry's handle, which the process keeps ([`handle::DeviceHandle::Process`]).
    pub(crate) process: OnceLock<&'static Device>,
}

/// A handle to one device. Cheap to clone; all clones share the device's state and counters.
#[derive(Clone)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
}

impl Device {
    pub(crate) fn from_raw(raw: RawDevice) -> Device {
        let info = raw.info().clone();
        Device {
            shared: Arc::new(DeviceShared {
                label: info.label(),
                info,
                raw,
                mem: MemCounters::new(),
                pinned: MemCounters::new(),
                memory: DeviceMemory::default(),
                default_stream: OnceLock::new(),
                #[cfg(feature = "testing")]
                faults: inject::Faults::default(),
                process: OnceLock::new(),
            }),
        }
    }

    /// Opens a device from a string: `"cpu"`, `"opencl:0"`, `"cuda:0"`.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceSpec`] for a malformed string, [`Error::BackendNotCompiled`] when
    /// the backend's feature is off, [`Error::RuntimeUnavailable`] when its runtime cannot be
    /// loaded, [`Error::NoSuchDevice`] when the index is too large, [`Error::InvalidConfig`]
    /// naming the variable when a pool environment variable (`SYNCMEM_DEVICE_POOL`,
    /// `SYNCMEM_POOL_CONF`, `SYNCMEM_PINNED_POOL[_CONF]`, `SYNCMEM_HOST_POOL[_CONF]`) is
    /// invalid: all of them are checked when the first device opens, whichever pools are used.
    pub fn open(spec: &str) -> Result<Device> {
        Self::open_spec(spec.parse()?)
    }

    /// Opens a device from a parsed [`DeviceSpec`].
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn open_spec(spec: DeviceSpec) -> Result<Device> {
        let list = registry::devices(spec.backend)?;
        list.get(spec.ordinal).cloned().ok_or(Error::NoSuchDevice {
            backend: spec.backend,
            ordinal: spec.ordinal,
            available: list.len(),
        })
    }

    /// The host device (always present). It cannot fail: invalid pool environment variables
    /// (see [`Device::open`]) are reported by its first pool allocation instead.
    pub fn cpu() -> Device {
        registry::cpu()
    }

    /// All devices of one backend.
    ///
    /// # Errors
    /// As [`Device::open`], except that an empty list is not an error.
    pub fn all(backend: BackendKind) -> Result<Vec<Device>> {
        registry::devices(backend)
    }

    /// The preferred accelerator: the first OpenCL device, else the first CUDA device, else
    /// `None`.
    pub fn first_accelerator() -> Option<Device> {
        [BackendKind::OpenCl, BackendKind::Cuda]
            .into_iter()
            .find_map(|b| registry::devices(b).ok()?.into_iter().next())
    }

    /// Facts about the device.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// The backend.
    pub fn backend(&self) -> BackendKind {
        self.shared.info.backend
    }

    /// The device string (`cpu`, `opencl:0`).
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// True when both handles name the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether this device copies a buffer of `other` into one of its own with one device
    /// command: OpenCL devices of one context (one per platform). Elsewhere a copy between
    /// devices goes through the host (see [`crate::SyncedMemory::device_on`]).
    pub fn copies_directly_from(&self, other: &Device) -> bool {
        self.shared.raw.copies_directly_from(&other.shared.raw)
    }

    /// Allocates `bytes` of device memory directly from the backend (not cached; see the
    /// [module docs](self)). The contents are unspecified (no zero fill); `bytes == 0`
    /// allocates nothing. The allocation counts against the device's memory cap; when memory
    /// is short, cached pool blocks and clean [`crate::SyncedMemory`] mirrors are freed first.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device cannot supply the memory (including requests above
    /// [`DeviceInfo::max_alloc`] or the cap), [`Error::InvalidConfig`] when the pool
    /// environment variables are invalid, or a backend error.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::new(self, bytes)
    }

    /// Allocates `bytes` of device memory from the device pool, for work on `stream`
    /// (stream-ordered, as in PyTorch and RMM): the block may be reused at once by later work on
    /// `stream`. When the buffer is dropped an event is recorded on `stream`, and other streams
    /// reuse the block only once it has completed. Contents unspecified.
    ///
    /// The buffer is a sub-buffer (OpenCL) or an offset pointer (CUDA, `cpu`) of a larger
    /// segment: `DeviceBuffer::as_opencl` (feature `opencl`) gives a `cl_mem` whose offset 0
    /// is the block.
    ///
    /// # Errors
    /// As [`Device::alloc`]; [`Error::DeviceMismatch`] for a stream of another device.
    pub fn alloc_pooled(&self, bytes: usize, stream: &Stream) -> Result<DeviceBuffer> {
        DeviceBuffer::pooled(self, bytes, stream, None)
    }

    /// Replaces the device pool by one built from `config` (kind, sizes, memory cap). Use it
    /// before the first allocation, or when nothing allocated from the pool is alive; cached
    /// memory of the old pool is released. The old pool's counts stay in
    /// [`Device::memory_stats`]. Its empty shell (a few hundred bytes per shard) stays
    /// allocated until the device is dropped: pooled allocations read the pool without taking
    /// a reference count, so a replaced pool is never freed under one. A [`crate::alloc::pool::MemoryCap::Fraction`] is of
    /// [`DeviceInfo::total_memory`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid configuration, [`Error::InvalidState`] while
    /// blocks of the current pool are in use.
    pub fn set_pool(&self, config: PoolConfig) -> Result<()> {
        self.shared.memory.set_pool(self, config)
    }

    /// Statistics of the device pool (`None` before its first use).
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.shared.memory.stats()
    }

    /// Snapshots of the device pool and of the pinned host pool (those used so far): every
    /// segment and block, with its state, stream and owner (see
    /// [`crate::alloc::pool::snapshot`]). [`crate::memory_snapshot`] takes them for every device
    /// opened; this one also serves detached devices.
    pub fn pool_snapshots(&self) -> Vec<PoolSnapshot> {
        self.shared.memory.snapshots()
    }

    /// Statistics of the pinned host pool (`None` before its first use).
    pub fn pinned_pool_stats(&self) -> Option<PoolStats> {
        self.shared.memory.current_pinned_pool().map(|p| p.stats())
    }

    /// Releases cached device and pinned memory whose pending work has completed (no waiting).
    /// Returns the bytes released.
    pub fn trim_pools(&self) -> u64 {
        let m = &self.shared.memory;
        m.current_pool().map_or(0, |p| p.trim()) + m.current_pinned_pool().map_or(0, |p| p.trim())
    }

    /// Waits for pending work on cached blocks, then releases all cached device and pinned
    /// memory (`empty_cache`). Returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        let m = &self.shared.memory;
        m.current_pool().map_or(0, |p| p.empty_cache())
            + m.current_pinned_pool().map_or(0, |p| p.empty_cache())
    }

    /// Sets whether the buffers of this device share one allocation between host and device
    /// where its memory is host memory (see [`zero_copy`]): for the mirrors allocated from now
    /// on (a buffer keeps the way it was allocated until its device mirror goes). The default
    /// is `SYNCMEM_ZERO_COPY`'s value, or [`ZeroCopy::Auto`].
    ///
    /// Shared buffers need pool segments the host can use in place. A change between sharing
    /// and two mirrors therefore empties the device pool's cache ([`Device::empty_cache`]),
    /// so that new buffers get segments of the new kind; a buffer placed later in a segment of
    /// the old kind that still held live blocks keeps two mirrors (correct, with copies). Set
    /// it before the device's first allocations to avoid that.
    pub fn set_zero_copy(&self, setting: ZeroCopy) {
        let before = self.zero_copy_protocol().is_some();
        self.shared.memory.zero_copy.set(setting);
        if before != self.zero_copy_protocol().is_some() {
            self.empty_cache();
        }
    }

    /// The zero-copy setting of this device (see [`Device::set_zero_copy`]).
    pub fn zero_copy(&self) -> ZeroCopy {
        self.shared.memory.zero_copy.get()
    }

    /// How buffers allocated now share memory between host and device on this device, or
    /// `None` when they keep two mirrors (zero-copy off, or a device whose memory is not host
    /// memory).
    pub fn zero_copy_protocol(&self) -> Option<ZeroCopyProtocol> {
        self.zero_copy().protocol_for(self.info())
    }

    /// Installs the schedule whose next uses order the out-of-memory path's victims (`None`:
    /// least recently used first); returns the one it replaces.
    pub(crate) fn swap_next_use(
        &self,
        schedule: Option<Arc<dyn NextUse>>,
    ) -> Option<Arc<dyn NextUse>> {
        std::mem::replace(&mut *self.shared.memory.next_use.write(), schedule)
    }

    /// The memory cap in bytes, if one is set (by [`Device::set_pool`] or `SYNCMEM_POOL_CONF`).
    /// A cap from `SYNCMEM_POOL_CONF` is reported before the first allocation too.
    pub fn memory_cap(&self) -> Option<u64> {
        self.shared.memory.cap(self)
    }

    /// Bytes the memory cap counts now, capped or not: the segments of the device pool and of
    /// the device's [`MemPool`]s, and its direct allocations, less the blocks spilled in place
    /// ([`PoolStats::parked_bytes`]: the host holds them, the cap does not count them).
    pub fn reserved_bytes(&self) -> u64 {
        self.shared.memory.reserved()
    }

    /// The device mirrors of live [`crate::SyncedMemory`] buffers: label, size and head, in
    /// the order the out-of-memory path tries to evict them (largest first, then the mirror
    /// allocated longest ago first).
    pub fn live_buffers(&self) -> Vec<LiveBuffer> {
        self.shared.memory.live_buffers()
    }

    /// The report of the last allocation on this device that failed for lack of memory.
    pub fn last_oom_report(&self) -> Option<OomReport> {
        self.shared.memory.last_oom()
    }

    /// The registry of evictable mirrors of this device, installed by `init` on first use
    /// (the synced layer's).
    pub(crate) fn mirrors_hook(
        &self,
        init: impl FnOnce() -> std::sync::Arc<dyn Mirrors>,
    ) -> &std::sync::Arc<dyn Mirrors> {
        self.shared.memory.mirrors_hook(init)
    }

    /// Allocates `bytes` of zero-filled page-locked host memory that this device copies to and
    /// from at full speed (CUDA page-locked memory; OpenCL `CL_MEM_ALLOC_HOST_PTR`, mapped;
    /// on the `cpu` device, ordinary aligned host memory).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] or a backend error.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        PinnedBuffer::new(self, bytes)
    }

    /// The device's default stream, created on first use and shared by every handle.
    ///
    /// # Errors
    /// A backend error when the stream cannot be created.
    pub fn default_stream(&self) -> Result<Stream> {
        self.default_stream_lent().map(|s| s.to_stream())
    }

    /// The device's default stream lent for as long as the device handle is borrowed (no
    /// reference count taken): [`Device::default_stream`] for the paths of every access.
    pub(crate) fn default_stream_lent(&self) -> Result<LentStream<'_>> {
        let s = self.shared.default_stream.get_or_init(|| {
            self.new_stream()
                .map(Stream::unbind)
                .map_err(|e| e.to_string())
        });
        s.as_ref()
            .map(|s| s.lend(self))
            .map_err(|reason| Error::Backend {
                backend: self.backend(),
                device: self.label().to_string(),
                op: "create default stream",
                code: -1,
                message: reason.clone(),
            })
    }

    /// The default stream without its device handle, once made.
    pub(crate) fn default_unbound(&self) -> Option<&UnboundStream> {
        self.shared
            .default_stream
            .get()
            .and_then(|r| r.as_ref().ok())
    }

    /// Creates a new stream (an in-order queue).
    ///
    /// # Errors
    /// A backend error.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// Blocks until all work queued on the default stream is done (Caffe2's
    /// `FinishDeviceComputation`).
    ///
    /// # Errors
    /// A backend error.
    pub fn synchronize(&self) -> Result<()> {
        self.default_stream_lent()?.synchronize()
    }

    /// Device-memory counters of this device: the bytes of its live buffers (their lengths),
    /// allocations and frees. Direct allocations ([`Device::alloc`]) are counted as they are
    /// made, pooled ones by the device pool, under the lock of the shard that serves them (a
    /// pooled allocation writes nothing that other threads write). The current use and the
    /// counts are exact. The peak adds the peaks of the direct and pooled allocations and of
    /// threads that count apart (see [`MemStats::peak`]): exact while one thread allocates
    /// one kind, an upper bound otherwise.
    pub fn memory_stats(&self) -> MemStats {
        self.shared
            .memory
            .stats_with(&self.shared.mem, self.label())
    }

    /// Pinned-host-memory counters of this device.
    pub fn pinned_stats(&self) -> MemStats {
        self.shared
            .pinned
            .snapshot(format!("{} pinned", self.label()))
    }

    /// Resets the peak counters of this device (and of its pools) to the current use.
    pub fn reset_peak_stats(&self) {
        self.shared.mem.reset_peak();
        self.shared.pinned.reset_peak();
        self.shared.memory.reset_pool_peaks();
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("label", &self.label())
            .field("name", &self.info().name)
            .finish()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}
impl Eq for Device {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_device_strings() {
        let p = |s: &str| s.parse::<DeviceSpec>();
        assert_eq!(
            p("cpu").unwrap(),
            DeviceSpec {
                backend: BackendKind::Cpu,
                ordinal: 0
            }
        );
        assert_eq!(p("opencl:2").unwrap().ordinal, 2);
        assert_eq!(p("OpenCL:1").unwrap().backend, BackendKind::OpenCl);
        assert_eq!(p("cuda").unwrap().ordinal, 0);
        assert_eq!(p("cuda:3").unwrap().to_string(), "cuda:3");
        for bad in ["", "tpu:0", "opencl:-1", "opencl:x", "cpu:1"] {
            let e = p(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidDeviceSpec { .. }), "{bad}: {e}");
        }
        assert_eq!(
            DeviceSpec::new(BackendKind::OpenCl, 2).unwrap(),
            p("opencl:2").unwrap()
        );
        assert_eq!(
            DeviceSpec::new(BackendKind::Cpu, 0).unwrap(),
            p("cpu").unwrap()
        );
        let e = DeviceSpec::new(BackendKind::Cpu, 1).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidDeviceSpec { spec, .. } if spec == "cpu:1"),
            "{e}"
        );
    }

    #[test]
    fn cpu_device_is_a_singleton() {
        let a = Device::cpu();
        let b = Device::open("cpu").unwrap();
        assert!(a.same(&b));
        assert_eq!(a.label(), "cpu");
        assert!(a.info().host_unified);
    }

    #[test]
    fn missing_index_is_an_error() {
        let e = Device::open("cpu").and_then(|_| {
            Device::open_spec(DeviceSpec {
                backend: BackendKind::Cpu,
                ordinal: 5,
            })
        });
        assert!(matches!(e, Err(Error::NoSuchDevice { available: 1, .. })));
    }
}
