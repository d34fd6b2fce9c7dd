//! The `cuda` backend: the CUDA driver API through `cudarc` (feature `cuda`), with `libcuda`
//! loaded at run time.
//!
//! **Status: compile-checked only.** This backend was written against the source of cudarc
//! 0.19.10 and builds, passes clippy and runs its no-driver tests on a machine without a GPU;
//! it has never been run against a real CUDA driver. The device tests at the bottom of this file
//! print a `SKIPPED` line when no CUDA device is present and run on a GPU machine
//! (`SYNCMEM_REQUIRE_CUDA=1` turns a skip into a failure).
//!
//! # Design
//!
//! - Discovery ([`discover`]) first checks that `libcuda` can be loaded at all: without it,
//!   cudarc's dynamic loader panics, so absence becomes [`Error::RuntimeUnavailable`] before any
//!   driver call. The rest of discovery also runs under `catch_unwind` as a second line of
//!   defence. One primary context ([`CudaContext::new`]) is retained per device for the life of
//!   the process, and peer access is enabled once between every pair of devices that support it
//!   (Caffe2's one-time CUDA initialisation).
//! - cudarc's automatic per-buffer event tracking is **disabled** on every context, before any
//!   memory is allocated: the backend contract puts ordering between streams in the caller's
//!   hands (explicit [`Event`](super::Event)s, as in Caffe2), and the tracking could not be used
//!   soundly anyway because the contract writes through `&CuMem`, not `&mut`.
//! - Device memory comes from `cuMemAlloc` (synchronous, usable from every stream at once and
//!   covered by `cuCtxEnablePeerAccess`) and is wrapped in a [`CudaSlice`] so that kernels can
//!   use it through cudarc. Freeing it first synchronizes its context (what `cudaFree` does in
//!   Caffe2) and every stream of another device that copied from or into it, then calls
//!   `cuMemFree`.
//! - Copies and fills go through the `result`/`sys` layers on raw device pointers, ordered on
//!   the stream they are issued on; `blocking` host copies synchronize that stream afterwards.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use parking_lot::Mutex;

use super::backend::{
    BackendDevice, BackendEvent, BackendMem, BackendPinned, BackendStream, KeepAlive,
};
use super::DeviceInfo;
use crate::error::{BackendKind, Error, Result};

/// The `reason` of [`Error::RuntimeUnavailable`] when `libcuda` cannot be loaded.
const NO_DRIVER: &str = "CUDA driver library (libcuda) not found";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Readable text for a driver status: `CUDA_ERROR_X: description` when the driver can say.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .ok()
        .map(|s| s.to_string_lossy().into_owned());
    let text = e
        .error_string()
        .ok()
        .map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(s), None) | (None, Some(s)) => s,
        (None, None) => format!("{:?}", e.0),
    }
}

/// Maps a failed driver call `op` (the CUDA API name) on device `label` to [`Error::Backend`].
pub(crate) fn driver_error(label: &str, op: &'static str, e: DriverError) -> Error {
    Error::Backend {
        backend: BackendKind::Cuda,
        device: label.to_string(),
        op,
        code: e.0 as i64,
        message: describe(e),
    }
}

/// The text of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Makes `ctx` current on the calling thread for a `Drop` path, returning whether it worked.
///
/// cudarc's `bind_to_thread` first returns (and clears) any error stored by an earlier `Drop`,
/// *without* binding; a free that relied on it could then skip the synchronize that keeps
/// queued work from using freed memory. This clears the stored error (frees may fail silently,
/// by the backend contract) and calls `cuCtxSetCurrent` directly.
fn force_current(ctx: &CudaContext) -> bool {
    let _ = ctx.check_err();
    // SAFETY: `ctx` is borrowed, so alive, and its CUcontext is a primary context it retains.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }.is_ok()
}

/// Blocks until all work queued on `stream` is done, for `Drop` paths (errors ignored).
fn drain_stream(stream: &CudaStream) {
    if force_current(stream.context()) {
        // SAFETY: `stream` is borrowed, so its CUstream is alive, and belongs to the context
        // made current just above.
        let _ = unsafe { result::stream::synchronize(stream.cu_stream()) };
    }
}

// ---------------------------------------------------------------------------------------------
// Shared per-device state
// ---------------------------------------------------------------------------------------------

/// A cudarc object whose `Drop` may record a driver error in its context (cudarc stores errors
/// of `Drop` in the context and returns them from the *next* call that checks). Frees are
/// allowed to fail silently by the backend contract, so this wrapper drops the object and then
/// clears the stored error, instead of letting it surface from an unrelated later operation.
struct Quiet<T> {
    inner: ManuallyDrop<T>,
    ctx: Arc<CudaContext>,
}

impl<T> Quiet<T> {
    fn new(inner: T, ctx: &Arc<CudaContext>) -> Self {
        Self {
            inner: ManuallyDrop::new(inner),
            ctx: ctx.clone(),
        }
    }
}

impl<T> Deref for Quiet<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Drop for Quiet<T> {
    fn drop(&mut self) {
        // SAFETY: `inner` is dropped exactly once, here, and never touched afterwards.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        let _ = self.ctx.check_err();
    }
}

/// What every object of one device shares: the context, the label for errors, the peer table.
struct CuShared {
    /// The device's primary context, retained for the life of the process.
    ctx: Arc<CudaContext>,
    /// Device ordinal (`cuda:N`).
    ordinal: usize,
    /// `cuda:N`.
    label: String,
    /// The legacy default stream of the context (a non-owning handle): the "home" stream of
    /// every [`CudaSlice`] this backend makes. No work of this backend is queued on it.
    home: Arc<CudaStream>,
    /// Ordinals of the devices whose memory this device's context can access directly
    /// (peer access enabled, or found already enabled, at discovery).
    peers: Vec<usize>,
    /// Peers where checking (`cuDeviceCanAccessPeer`) or enabling peer access failed, with why.
    peer_failures: Vec<(usize, String)>,
    /// The kernels loaded into the context, built on first use.
    kernels: crate::backend::cuda::KernelCache,
}

impl CuShared {
    fn err(&self, op: &'static str, e: DriverError) -> Error {
        driver_error(&self.label, op, e)
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("cuCtxSetCurrent", e))
    }

    /// Maps an allocation failure: `CUDA_ERROR_OUT_OF_MEMORY` becomes [`Error::OutOfMemory`]
    /// (with the device's free memory when `what` is device memory).
    fn alloc_err(
        &self,
        op: &'static str,
        what: &str,
        device_memory: bool,
        requested: usize,
        e: DriverError,
    ) -> Error {
        if e.0 != CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return self.err(op, e);
        }
        let free = match self.ctx.mem_get_info() {
            Ok((free, total)) if device_memory => format!(", {free} of {total} bytes free"),
            _ => String::new(),
        };
        Error::OutOfMemory {
            device: self.label.clone(),
            requested,
            detail: format!(" of {what} ({op}{free})"),
        }
    }

    /// How this device's context reaches the memory of device `other`, for error messages.
    fn peer_status(&self, other: usize) -> String {
        if other == self.ordinal || self.peers.contains(&other) {
            format!("peer access {} -> cuda:{other} enabled", self.label)
        } else if let Some((_, why)) = self.peer_failures.iter().find(|(o, _)| *o == other) {
            format!(
                "enabling peer access {} -> cuda:{other} failed: {why}",
                self.label
            )
        } else {
            format!("no peer access {} -> cuda:{other}", self.label)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------------------------

/// Finds every CUDA device, retains its primary context and enables peer access between every
/// pair of devices that can use it. Runs once per process (the registry keeps the result).
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when `libcuda` cannot be loaded, `cuInit` fails, or the driver
/// panics inside cudarc (a missing symbol in an old driver); [`Error::Backend`] when a device
/// cannot be set up. A machine with the driver but no device gives an empty list.
pub(crate) fn discover() -> Result<Vec<CuDevice>> {
    // SAFETY: `is_culib_present` only tries to open the shared library with `libloading` (and
    // closes it again); it calls no CUDA function and has no preconditions.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: NO_DRIVER.to_string(),
        });
    }
    match catch_unwind(AssertUnwindSafe(discover_devices)) {
        Ok(found) => found,
        Err(payload) => Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: format!(
                "the CUDA driver could not be used (cudarc panicked: {})",
                panic_text(payload.as_ref())
            ),
        }),
    }
}

/// One device while discovery is still setting up the others.
struct Found {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
}

fn discover_devices() -> Result<Vec<CuDevice>> {
    match result::init() {
        Ok(()) => {}
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                reason: format!("cuInit failed: {}", describe(e)),
            })
        }
    }
    let count =
        result::device::get_count().map_err(|e| driver_error("cuda", "cuDeviceGetCount", e))?;
    let count = usize::try_from(count).unwrap_or(0);

    let mut found = Vec::with_capacity(count);
    for ordinal in 0..count {
        let label = format!("cuda:{ordinal}");
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver_error(&label, "cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: no CudaSlice has been made on this context yet, so none is left tracked by
        // events while others are not. From here on, ordering between streams is explicit
        // (the backend contract: events recorded and waited for by the caller), and freeing
        // memory synchronizes every stream that may still use it (see `CuMem`'s Drop).
        unsafe { ctx.disable_event_tracking() };
        let name = ctx
            .name()
            .map_err(|e| driver_error(&label, "cuDeviceGetName", e))?;
        let total = ctx
            .total_mem()
            .map_err(|e| driver_error(&label, "cuDeviceTotalMem", e))? as u64;
        let integrated = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .map(|v| v != 0)
            .unwrap_or(false);
        found.push(Found {
            ctx,
            info: DeviceInfo {
                backend: BackendKind::Cuda,
                ordinal,
                name,
                vendor: "NVIDIA".to_string(),
                total_memory: total,
                max_alloc: total,
                host_unified: integrated,
            },
        });
    }

    let peers = enable_peer_access(&found);

    Ok(found
        .into_iter()
        .zip(peers)
        .map(|(f, (peers, peer_failures))| {
            let home = f.ctx.default_stream();
            CuDevice {
                shared: Arc::new(CuShared {
                    label: f.info.label(),
                    ordinal: f.info.ordinal,
                    ctx: f.ctx,
                    home,
                    peers,
                    peer_failures,
                    kernels: Default::default(),
                }),
                info: f.info,
            }
        })
        .collect())
}

/// For one device: the ordinals it has peer access to, and the peers where enabling failed (why).
type PeerTable = (Vec<usize>, Vec<(usize, String)>);

/// Enables peer access from every device to every other device that it can access, tolerating
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (primary contexts are shared with other libraries
/// of the process). Never fails: for each device, returns the peers enabled and the failures.
fn enable_peer_access(found: &[Found]) -> Vec<PeerTable> {
    found
        .iter()
        .map(|me| {
            let mut peers = Vec::new();
            let mut failures = Vec::new();
            for other in found {
                let o = other.info.ordinal;
                if o == me.info.ordinal {
                    continue;
                }
                let mut can: c_int = 0;
                // SAFETY: `can` is a valid out-pointer; both devices come from cuDeviceGet
                // (through CudaContext::new) and stay valid for the process.
                let r = unsafe {
                    sys::cuDeviceCanAccessPeer(&mut can, me.ctx.cu_device(), other.ctx.cu_device())
                }
                .result();
                match r {
                    Ok(()) if can != 0 => {}
                    Ok(()) => continue,
                    Err(e) => {
                        failures.push((o, format!("cuDeviceCanAccessPeer: {}", describe(e))));
                        continue;
                    }
                }
                // cuCtxEnablePeerAccess acts on the *current* context: make `me` current.
                if let Err(e) = me.ctx.bind_to_thread() {
                    failures.push((o, format!("cuCtxSetCurrent: {}", describe(e))));
                    continue;
                }
                // SAFETY: `me`'s context is current on this thread; the peer context is a live
                // primary context retained by `other.ctx`; flags must be 0.
                let r = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) }.result();
                match r {
                    Ok(()) | Err(DriverError(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => {
                        peers.push(o)
                    }
                    Err(e) => failures.push((o, format!("cuCtxEnablePeerAccess: {}", describe(e)))),
                }
            }
            (peers, failures)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------------------------------

/// One CUDA device: its primary context, facts, and peer-access table.
pub(crate) struct CuDevice {
    info: DeviceInfo,
    shared: Arc<CuShared>,
}

impl CuDevice {
    /// `cuda:N`.
    pub(crate) fn label(&self) -> &str {
        &self.shared.label
    }

    /// The device's primary context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// The kernels loaded into the context.
    pub(crate) fn kernel_cache(&self) -> &crate::backend::cuda::KernelCache {
        &self.shared.kernels
    }

    /// A second backend device for the same CUDA device (same context), with its own counters
    /// and pools once wrapped in a `Device` (see `Device::isolated`).
    pub(crate) fn duplicate(&self) -> CuDevice {
        CuDevice {
            info: self.info.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl BackendDevice for CuDevice {
    type Mem = CuMem;
    type Pinned = CuPinned;
    type Stream = CuStream;
    type Event = CuEvent;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<CuMem> {
        let sh = &self.shared;
        if sh.ctx.is_event_tracking() {
            // Only possible if a user re-enabled tracking through `as_cuda().context()`:
            // cudarc would then create events with `unwrap` in `upgrade_device_ptr`.
            return Err(Error::Unsupported {
                device: sh.label.clone(),
                what: "allocating while cudarc event tracking is enabled on the context \
                       (syncmem disables it; do not re-enable it)"
                    .to_string(),
            });
        }
        sh.bind()?;
        // SAFETY: the context is current; the memory is left uninitialised, which the contract
        // allows ("no zero fill"); it is only ever accessed by the device or copied as bytes.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| sh.alloc_err("cuMemAlloc", "device memory", true, bytes, e))?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation of `bytes` bytes (u8: any length is
        // valid). Event tracking is disabled (checked above), so cudarc creates no events and
        // reaches no `unwrap`. The slice is never dropped as such: `CuMem::drop` takes it back
        // with `leak` and frees `ptr` with cuMemFree, the API that made it.
        let slice = unsafe { sh.home.upgrade_device_ptr::<u8>(ptr, bytes) };
        Ok(CuMem {
            slice: ManuallyDrop::new(slice),
            ptr,
            len: bytes,
            shared: sh.clone(),
            foreign: Mutex::new(Vec::new()),
            parent: None,
        })
    }

    fn sub_align(&self) -> usize {
        // cuMemAlloc returns 256-byte aligned memory; pool blocks keep that alignment.
        256
    }

    fn sub_mem(&self, parent: &CuMem, off: usize, len: usize, keep: KeepAlive) -> Result<CuMem> {
        let sh = &self.shared;
        if sh.ctx.is_event_tracking() {
            // As in `alloc`: `upgrade_device_ptr` would create events with `unwrap`.
            return Err(Error::Unsupported {
                device: sh.label.clone(),
                what: "pooled allocation while cudarc event tracking is enabled on the context"
                    .to_string(),
            });
        }
        let ptr = parent.at(off);
        // SAFETY: `ptr .. ptr + len` lies inside the parent's live cuMemAlloc allocation
        // (caller's contract: `off + len <= parent.len`), which `keep` keeps alive as long as
        // this view. Event tracking is disabled (checked above), so cudarc creates no events.
        // The slice is never dropped as such: `CuMem::drop` takes it back with `leak` and, for
        // a view, frees nothing.
        let slice = unsafe { sh.home.upgrade_device_ptr::<u8>(ptr, len) };
        Ok(CuMem {
            slice: ManuallyDrop::new(slice),
            ptr,
            len,
            shared: sh.clone(),
            foreign: Mutex::new(Vec::new()),
            parent: Some(keep),
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<CuPinned> {
        let sh = &self.shared;
        sh.bind()?;
        // SAFETY: the context is current. PORTABLE: the memory counts as pinned for every
        // context, since pinned buffers may be used with streams of any device.
        let raw = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| sh.alloc_err("cuMemHostAlloc", "pinned host memory", false, bytes, e))?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(Error::Backend {
                backend: BackendKind::Cuda,
                device: sh.label.clone(),
                op: "cuMemHostAlloc",
                code: 0,
                message: "the driver returned a null pointer".to_string(),
            });
        };
        // SAFETY: cuMemHostAlloc returned `bytes` writable host bytes at `ptr`; nothing else
        // knows the pointer yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
        Ok(CuPinned {
            ptr,
            len: bytes,
            shared: sh.clone(),
        })
    }

    fn new_stream(&self) -> Result<CuStream> {
        let sh = &self.shared;
        let stream = sh
            .ctx
            .new_stream()
            .map_err(|e| sh.err("cuStreamCreate", e))?;
        Ok(CuStream {
            stream: Quiet::new(stream, &sh.ctx),
            shared: sh.clone(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

/// Device memory (`cuMemAlloc`), also exposed to kernels as a cudarc [`CudaSlice<u8>`].
pub(crate) struct CuMem {
    /// Taken back (`leak`) and freed with cuMemFree in `Drop`, never dropped as a slice.
    slice: ManuallyDrop<CudaSlice<u8>>,
    /// The device address of the first byte (the same as the slice's).
    ptr: sys::CUdeviceptr,
    len: usize,
    shared: Arc<CuShared>,
    /// Streams of *other* devices that copied from or into this memory (peer copies): they are
    /// synchronized before the memory is freed, as this context's synchronize does not cover
    /// them.
    foreign: Mutex<Vec<Arc<CudaStream>>>,
    /// For a view into a pool segment: the segment (kept alive; this value frees nothing).
    parent: Option<KeepAlive>,
}

impl CuMem {
    /// The memory as a cudarc slice, to pass to kernels.
    ///
    /// cudarc's event tracking is disabled for it: order kernel launches against syncmem's
    /// copies with [`Event`](crate::Event)s / stream synchronization, not with cudarc's implicit
    /// tracking. Its [`CudaSlice::stream`] is the context's legacy default stream.
    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    /// The device address of the first byte, to pass to kernels.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address of byte `off`.
    fn at(&self, off: usize) -> sys::CUdeviceptr {
        self.ptr + off as sys::CUdeviceptr
    }

    /// Remembers that `stream` (of another device) has queued work on this memory.
    fn note_foreign(&self, stream: &Arc<CudaStream>) {
        if stream.context().ordinal() == self.shared.ordinal {
            return;
        }
        let mut users = self.foreign.lock();
        if !users.iter().any(|s| Arc::ptr_eq(s, stream)) {
            users.push(stream.clone());
        }
    }
}

impl BackendMem for CuMem {
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CuMem {
    fn drop(&mut self) {
        if self.parent.is_some() {
            // A view: its memory goes back to the pool, which orders reuse on the allocation
            // stream with events. Peer streams are not covered by those events: drain them.
            for stream in self.foreign.get_mut().drain(..) {
                drain_stream(&stream);
                let other = stream.context().clone();
                drop(stream);
                let _ = other.check_err();
            }
            // SAFETY: `slice` is taken exactly once, here, and never used again.
            let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
            // `leak` hands back the pointer without freeing it (the segment owns the memory).
            let _ = slice.leak();
            let _ = self.shared.ctx.check_err();
            return;
        }
        let ctx = &self.shared.ctx;
        // Work queued on any stream of this context may still use the memory: wait for it
        // (cudaFree does the same in Caffe2). Errors are ignored: the contract says frees never
        // fail, and the runtime may be shutting down.
        if force_current(ctx) {
            let _ = result::ctx::synchronize();
        }
        for stream in self.foreign.get_mut().drain(..) {
            drain_stream(&stream);
            let other = stream.context().clone();
            drop(stream);
            let _ = other.check_err();
        }
        force_current(ctx);
        // SAFETY: `slice` is taken exactly once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // `leak` hands back the pointer without freeing it; with event tracking disabled it
        // has no events to wait on.
        let ptr = slice.leak();
        // SAFETY: `ptr` came from cuMemAlloc in `CuDevice::alloc`, is freed only here, and no
        // queued work can still use it (every stream that could was synchronized above).
        let _ = unsafe { result::free_sync(ptr) };
        let _ = ctx.check_err();
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable), zero-filled.
pub(crate) struct CuPinned {
    ptr: NonNull<u8>,
    len: usize,
    shared: Arc<CuShared>,
}

// SAFETY: `CuPinned` owns its allocation exclusively, like a `Box<[u8]>`: it hands out only the
// raw pointer, and the public `PinnedBuffer` forms slices from it under `&self` / `&mut self`.
// cuMemFreeHost may be called from any thread.
unsafe impl Send for CuPinned {}
// SAFETY: as above; `&CuPinned` allows no mutation by itself.
unsafe impl Sync for CuPinned {}

impl BackendPinned for CuPinned {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CuPinned {
    fn drop(&mut self) {
        force_current(&self.shared.ctx);
        // SAFETY: the pointer came from cuMemHostAlloc and is freed once. Copies that use it
        // asynchronously must have completed by now (the caller's contract on async copies).
        let _ = unsafe { result::free_host(self.ptr.as_ptr().cast::<c_void>()) };
        let _ = self.shared.ctx.check_err();
    }
}

// ---------------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------------

/// A non-blocking CUDA stream of one device.
pub(crate) struct CuStream {
    stream: Quiet<Arc<CudaStream>>,
    shared: Arc<CuShared>,
}

impl CuStream {
    /// The cudarc stream, for kernel launches.
    pub(crate) fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Blocks until the stream has no queued work.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        self.synchronize()
    }

    /// The raw stream handle, for driver calls.
    fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Checks that `mem` lives on this stream's device (host copies and fills need that).
    fn same_device(&self, mem: &CuMem, op: &'static str) -> Result<()> {
        if mem.shared.ordinal == self.shared.ordinal {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                expected: self.shared.label.clone(),
                actual: mem.shared.label.clone(),
            })
        }
    }

    fn sync_if(&self, blocking: bool) -> Result<()> {
        if blocking {
            self.synchronize()
        } else {
            Ok(())
        }
    }

    /// Queues a device-to-device copy of `len` bytes, between contexts when needed.
    fn raw_copy(
        &self,
        dst: sys::CUdeviceptr,
        dst_sh: &CuShared,
        src: sys::CUdeviceptr,
        src_sh: &CuShared,
        len: usize,
    ) -> Result<()> {
        let me = self.shared.ordinal;
        if src_sh.ordinal == me && dst_sh.ordinal == me {
            // SAFETY: both ranges lie inside live allocations of this context (checked by the
            // caller, kept alive by `&CuMem` or the staging guard), the context is current
            // (bound by the caller) and the stream belongs to it.
            unsafe { result::memcpy_dtod_async(dst, src, len, self.raw()) }
                .map_err(|e| self.shared.err("cuMemcpyDtoDAsync", e))
        } else {
            // SAFETY: as above, with each pointer in its own live context; cuMemcpyPeerAsync
            // takes both contexts explicitly and works with or without peer access.
            unsafe {
                result::memcpy_peer_async(
                    dst_sh.ctx.cu_ctx(),
                    dst,
                    src_sh.ctx.cu_ctx(),
                    src,
                    len,
                    self.raw(),
                )
            }
            .map_err(|e| {
                let mut err = self.shared.err("cuMemcpyPeerAsync", e);
                if let Error::Backend { message, .. } = &mut err {
                    message.push_str(&format!(
                        " (copy {} -> {}; {})",
                        src_sh.label,
                        dst_sh.label,
                        src_sh.peer_status(dst_sh.ordinal)
                    ));
                }
                err
            })
        }
    }
}

/// A temporary device buffer of the stream's device, freed after the stream has drained.
struct Staging<'a> {
    ptr: sys::CUdeviceptr,
    stream: &'a CuStream,
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        // Queued copies may still use the buffer: wait for them before freeing.
        drain_stream(&self.stream.stream);
        // SAFETY: the pointer came from cuMemAlloc in this context (made current by
        // `drain_stream`) and is freed once, after all work using it has completed.
        let _ = unsafe { result::free_sync(self.ptr) };
        let _ = self.stream.shared.ctx.check_err();
    }
}

impl BackendStream for CuStream {
    type Mem = CuMem;
    type Event = CuEvent;

    unsafe fn write(
        &self,
        dst: &CuMem,
        dst_off: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.same_device(dst, "write")?;
        self.shared.bind()?;
        // SAFETY: `dst_off + len <= dst.len()` (checked by the caller) inside a live allocation
        // of this (current) context; `src` is valid for `len` reads, and when not blocking stays
        // valid until an event recorded after this call completes (the caller's contract).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.at(dst_off), src.cast::<c_void>(), len, self.raw())
        }
        .result()
        .map_err(|e| self.shared.err("cuMemcpyHtoDAsync", e))?;
        self.sync_if(blocking)
    }

    unsafe fn read(
        &self,
        src: &CuMem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.same_device(src, "read")?;
        self.shared.bind()?;
        // SAFETY: mirror of `write`: the device range is checked and live, `dst` is valid for
        // `len` writes and untouched by anyone else until the copy completes (caller's
        // contract). No Rust reference to `dst` is formed.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src.at(src_off), len, self.raw())
        }
        .result()
        .map_err(|e| self.shared.err("cuMemcpyDtoHAsync", e))?;
        self.sync_if(blocking)
    }

    fn copy(
        &self,
        src: &CuMem,
        src_off: usize,
        dst: &CuMem,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        self.shared.bind()?;
        src.note_foreign(&self.stream);
        dst.note_foreign(&self.stream);
        let same_buffer = src.ptr == dst.ptr;
        if same_buffer && src_off == dst_off {
            return Ok(());
        }
        let overlap = same_buffer && src_off < dst_off + len && dst_off < src_off + len;
        if !overlap {
            return self.raw_copy(
                dst.at(dst_off),
                &dst.shared,
                src.at(src_off),
                &src.shared,
                len,
            );
        }
        // CUDA copies do not handle overlapping ranges: stage through a temporary buffer.
        // SAFETY: the context is current (bound above).
        let tmp = unsafe { result::malloc_sync(len) }.map_err(|e| {
            self.shared.alloc_err(
                "cuMemAlloc",
                "a staging buffer for an overlapping copy",
                true,
                len,
                e,
            )
        })?;
        let tmp = Staging {
            ptr: tmp,
            stream: self,
        };
        self.raw_copy(tmp.ptr, &self.shared, src.at(src_off), &src.shared, len)?;
        self.raw_copy(dst.at(dst_off), &dst.shared, tmp.ptr, &self.shared, len)?;
        drop(tmp);
        Ok(())
    }

    fn fill(&self, dst: &CuMem, off: usize, len: usize, value: u8) -> Result<()> {
        self.same_device(dst, "fill")?;
        self.shared.bind()?;
        // SAFETY: the range is checked by the caller and lies in a live allocation of this
        // (current) context; the stream belongs to it.
        unsafe { result::memset_d8_async(dst.at(off), value, len, self.raw()) }
            .map_err(|e| self.shared.err("cuMemsetD8Async", e))
    }

    fn record(&self) -> Result<CuEvent> {
        // Default flags of cudarc: CU_EVENT_DISABLE_TIMING (cudaEventDisableTiming in Caffe2).
        let event = self
            .stream
            .context()
            .new_event(None)
            .map_err(|e| self.shared.err("cuEventCreate", e))?;
        let event = Quiet::new(event, &self.shared.ctx);
        event
            .record(&self.stream)
            .map_err(|e| self.shared.err("cuEventRecord", e))?;
        Ok(CuEvent {
            event: Arc::new(event),
            shared: self.shared.clone(),
        })
    }

    fn wait_for(&self, event: &CuEvent) -> Result<()> {
        // cuStreamWaitEvent accepts an event of another context or device.
        self.stream
            .wait(&event.event)
            .map_err(|e| self.shared.err("cuStreamWaitEvent", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.shared.err("cuStreamSynchronize", e))
    }
}

/// An event recorded on a [`CuStream`] (timing disabled). Clones share the event.
#[derive(Clone)]
pub(crate) struct CuEvent {
    event: Arc<Quiet<CudaEvent>>,
    shared: Arc<CuShared>,
}

impl BackendEvent for CuEvent {
    fn wait(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(|e| self.shared.err("cuEventSynchronize", e))
    }

    fn is_complete(&self) -> Result<bool> {
        // CUDA_SUCCESS -> true, CUDA_ERROR_NOT_READY -> false, anything else is an error.
        self.event
            .try_is_complete()
            .map_err(|e| self.shared.err("cuEventQuery", e))
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<CuDevice>();
    send_sync::<CuMem>();
    send_sync::<CuPinned>();
    send_sync::<CuStream>();
    send_sync::<CuEvent>();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Event};

    fn driver_present() -> bool {
        // SAFETY: only tries to open the shared library; see `discover`.
        unsafe { sys::is_culib_present() }
    }

    #[test]
    fn cuda_without_driver_is_runtime_unavailable_not_a_panic() {
        if driver_present() {
            eprintln!("SKIPPED cuda_without_driver_is_runtime_unavailable_not_a_panic: libcuda is present");
            return;
        }
        let first = Device::open("cuda:0");
        let second = Device::open("cuda:0");
        for r in [&first, &second] {
            match r {
                Err(Error::RuntimeUnavailable {
                    backend: BackendKind::Cuda,
                    reason,
                }) => assert_eq!(reason, NO_DRIVER),
                other => panic!("expected RuntimeUnavailable, got {other:?}"),
            }
        }
        assert_eq!(
            first.err().map(|e| e.to_string()),
            second.err().map(|e| e.to_string())
        );
        // Discovery itself, called directly and repeatedly, never panics either.
        for _ in 0..2 {
            assert!(matches!(
                discover(),
                Err(Error::RuntimeUnavailable {
                    backend: BackendKind::Cuda,
                    ..
                })
            ));
        }
        assert!(Device::all(BackendKind::Cuda).is_err());
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + 7) as u8).collect()
    }

    #[test]
    fn cuda_info_and_default_stream() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_info_and_default_stream") else {
            return;
        };
        let info = dev.info();
        assert_eq!(info.backend, BackendKind::Cuda);
        assert_eq!(info.vendor, "NVIDIA");
        assert!(info.total_memory > 0);
        assert_eq!(info.max_alloc, info.total_memory);
        assert_eq!(dev.label(), "cuda:0");
        dev.synchronize().unwrap();
        assert!(Device::open("cuda:0").unwrap().same(&dev));
    }

    #[test]
    fn cuda_round_trip() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_round_trip") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let data = pattern(100_000);
        let mut buf = dev.alloc(data.len()).unwrap();
        s.write(&mut buf, 0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read(&buf, 0, &mut back).unwrap();
        assert_eq!(back, data);
        // Partial ranges at offsets.
        s.write(&mut buf, 1000, &[1, 2, 3, 4]).unwrap();
        let mut part = [0u8; 6];
        s.read(&buf, 999, &mut part).unwrap();
        assert_eq!(part, [data[999], 1, 2, 3, 4, data[1004]]);
        // Out-of-range requests are refused before reaching the driver.
        assert!(s.read(&buf, data.len(), &mut part).is_err());
    }

    #[test]
    fn cuda_fill() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_fill") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(4096).unwrap();
        s.fill(&mut buf, 0, 4096, 0).unwrap();
        s.fill(&mut buf, 100, 50, 0xAB).unwrap();
        let mut back = vec![1u8; 4096];
        s.read(&buf, 0, &mut back).unwrap();
        for (i, b) in back.iter().enumerate() {
            let want = if (100..150).contains(&i) { 0xAB } else { 0 };
            assert_eq!(*b, want, "byte {i}");
        }
    }

    #[test]
    fn cuda_copy_including_overlap() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_copy_including_overlap") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let data = pattern(1024);
        let mut a = dev.alloc(1024).unwrap();
        let mut b = dev.alloc(1024).unwrap();
        s.write(&mut a, 0, &data).unwrap();
        s.fill(&mut b, 0, 1024, 0).unwrap();
        s.copy(&a, 10, &mut b, 500, 300).unwrap();
        let mut back = vec![0u8; 1024];
        s.read(&b, 0, &mut back).unwrap();
        let mut want = vec![0u8; 1024];
        want[500..800].copy_from_slice(&data[10..310]);
        assert_eq!(back, want);

        // Overlapping ranges of one buffer (crate-internal path), both directions.
        let mut model = data.clone();
        s.copy_raw(&a, 0, &a, 3, 600).unwrap();
        model.copy_within(0..600, 3);
        s.copy_raw(&a, 300, &a, 200, 500).unwrap();
        model.copy_within(300..800, 200);
        s.read(&a, 0, &mut back).unwrap();
        assert_eq!(back, model);
    }

    #[test]
    fn cuda_events_order_two_streams() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_events_order_two_streams") else {
            return;
        };
        let s1 = dev.new_stream().unwrap();
        let s2 = dev.new_stream().unwrap();
        let n = 8 << 20;
        let mut buf = dev.alloc(n).unwrap();
        s1.fill(&mut buf, 0, n, 0x5A).unwrap();
        let e: Event = s1.record().unwrap();
        s2.wait_for(&e).unwrap();
        let mut back = vec![0u8; n];
        s2.read(&buf, 0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5A));
        e.wait().unwrap();
        assert!(e.is_complete().unwrap());
        let e2 = e.clone();
        assert!(e2.is_complete().unwrap());
        let done = s2.record().unwrap();
        s2.synchronize().unwrap();
        assert!(done.is_complete().unwrap());
    }

    #[test]
    fn cuda_pinned_memory() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_pinned_memory") else {
            return;
        };
        let mut p = dev.alloc_pinned(1 << 16).unwrap();
        assert!(
            p.as_slice().iter().all(|&b| b == 0),
            "pinned memory is zero-filled"
        );
        let data = pattern(1 << 16);
        p.as_mut_slice().copy_from_slice(&data);
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(1 << 16).unwrap();
        // SAFETY: `p` outlives the copy: the event is waited for before `p` is touched again.
        unsafe { s.write_async(&mut buf, 0, p.as_slice()) }.unwrap();
        s.record().unwrap().wait().unwrap();
        let mut q = dev.alloc_pinned(1 << 16).unwrap();
        // SAFETY: as above.
        unsafe { s.read_async(&buf, 0, q.as_mut_slice()) }.unwrap();
        s.record().unwrap().wait().unwrap();
        assert_eq!(q.as_slice(), &data[..]);
        assert!(dev.pinned_stats().in_use >= 2 << 16);
    }

    #[test]
    fn cuda_out_of_memory_is_typed() {
        let Some(dev) = crate::testing::cuda_or_skip("cuda_out_of_memory_is_typed") else {
            return;
        };
        let too_much = dev.info().total_memory as usize;
        let e = dev.alloc(too_much).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
    }

    #[test]
    fn cuda_copy_between_devices() {
        let Some(dev0) = crate::testing::cuda_or_skip("cuda_copy_between_devices") else {
            return;
        };
        let all = Device::all(BackendKind::Cuda).unwrap();
        let Some(dev1) = all.get(1) else {
            eprintln!("SKIPPED cuda_copy_between_devices: fewer than two CUDA devices");
            return;
        };
        let data = pattern(10_000);
        let s0 = dev0.new_stream().unwrap();
        let s1 = dev1.new_stream().unwrap();
        let mut a = dev0.alloc(data.len()).unwrap();
        let mut b = dev1.alloc(data.len()).unwrap();
        s0.write(&mut a, 0, &data).unwrap();
        // Queued on device 1's stream, reading device 0's memory.
        s1.copy(&a, 0, &mut b, 0, data.len()).unwrap();
        s1.synchronize().unwrap();
        let mut back = vec![0u8; data.len()];
        s1.read(&b, 0, &mut back).unwrap();
        assert_eq!(back, data);
        // A host copy through a stream of the wrong device is refused, not attempted.
        let mut tmp = [0u8; 4];
        assert!(matches!(
            s0.read(&b, 0, &mut tmp),
            Err(Error::DeviceMismatch { .. })
        ));
        drop(a); // synchronizes s1, which used `a` as a peer.
    }
}
