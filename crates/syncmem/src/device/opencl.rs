//! The `opencl` backend, through `opencl3` (libOpenCL is loaded at run time).
//!
//! - Discovery ([`discover`]) lists every device of every platform; the ordinal is the index in
//!   that order. One OpenCL context per platform holds all of the platform's devices, so buffers
//!   of two devices of one platform can be copied into each other with `clEnqueueCopyBuffer`.
//! - Device memory is a `CL_MEM_READ_WRITE` buffer. Pinned memory is a `CL_MEM_ALLOC_HOST_PTR`
//!   buffer mapped for its whole life on an internal queue of the device.
//! - A stream is an in-order command queue without profiling; an event is a marker.
//!
//! The `opencl3` wrappers call `expect` when a release fails in their `Drop`. This module keeps
//! them in [`ManuallyDrop`] and releases the handles itself, ignoring errors, so that no `Drop`
//! here can panic (the runtime may already be shutting down).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::{Arc, OnceLock};

use opencl3::command_queue::{self as cq, CommandQueue};
use opencl3::context::Context;
use opencl3::device::{Device as ClDeviceId, CL_DEVICE_TYPE_ALL};
use opencl3::error_codes::ClError;
use opencl3::memory::{
    Buffer, ClMem as _, CL_MAP_READ, CL_MAP_WRITE, CL_MEM_ALLOC_HOST_PTR, CL_MEM_READ_WRITE,
};
use opencl3::platform::{get_platforms, Platform};
use opencl3::types::{cl_bool, cl_event, cl_int, cl_mem, CL_BLOCKING, CL_NON_BLOCKING};

use super::backend::{
    BackendDevice, BackendEvent, BackendMem, BackendPinned, BackendStream, KeepAlive,
};
use super::DeviceInfo;
use crate::error::{BackendKind, Error, Result};

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

const CL_MEM_OBJECT_ALLOCATION_FAILURE: cl_int = -4;
const CL_OUT_OF_RESOURCES: cl_int = -5;
const CL_OUT_OF_HOST_MEMORY: cl_int = -6;
const CL_INVALID_BUFFER_SIZE: cl_int = -61;
const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;
const DLOPEN_RUNTIME_LOAD_FAILED: cl_int = -2000;
const DLOPEN_FUNCTION_NOT_AVAILABLE: cl_int = -2001;

/// A readable message for an OpenCL status code: its name and, for the common ones, what it
/// means.
pub(crate) fn cl_error_message(code: cl_int) -> String {
    let (name, meaning) = match code {
        -1 => ("CL_DEVICE_NOT_FOUND", "no device of the requested type"),
        -2 => ("CL_DEVICE_NOT_AVAILABLE", "the device is not available"),
        -4 => (
            "CL_MEM_OBJECT_ALLOCATION_FAILURE",
            "could not allocate memory for a buffer",
        ),
        -5 => ("CL_OUT_OF_RESOURCES", "the device ran out of resources"),
        -6 => (
            "CL_OUT_OF_HOST_MEMORY",
            "the OpenCL runtime ran out of host memory",
        ),
        -8 => (
            "CL_MEM_COPY_OVERLAP",
            "source and destination regions overlap",
        ),
        -12 => (
            "CL_MAP_FAILURE",
            "the buffer could not be mapped into host memory",
        ),
        -14 => (
            "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
            "an earlier command this one waited for failed",
        ),
        -30 => ("CL_INVALID_VALUE", "an argument is invalid"),
        -32 => ("CL_INVALID_PLATFORM", "invalid platform"),
        -33 => ("CL_INVALID_DEVICE", "invalid device"),
        -34 => (
            "CL_INVALID_CONTEXT",
            "invalid context, or objects of different contexts",
        ),
        -35 => (
            "CL_INVALID_QUEUE_PROPERTIES",
            "unsupported command-queue properties",
        ),
        -36 => ("CL_INVALID_COMMAND_QUEUE", "invalid command queue"),
        -37 => ("CL_INVALID_HOST_PTR", "invalid host pointer"),
        -38 => ("CL_INVALID_MEM_OBJECT", "not a valid memory object"),
        -57 => ("CL_INVALID_EVENT_WAIT_LIST", "invalid event wait list"),
        -58 => ("CL_INVALID_EVENT", "invalid event"),
        -59 => ("CL_INVALID_OPERATION", "operation not valid here"),
        -61 => (
            "CL_INVALID_BUFFER_SIZE",
            "buffer size is 0 or above the device's limit",
        ),
        CL_PLATFORM_NOT_FOUND_KHR => ("CL_PLATFORM_NOT_FOUND_KHR", "no OpenCL platform found"),
        DLOPEN_RUNTIME_LOAD_FAILED => (
            "DLOPEN_RUNTIME_LOAD_FAILED",
            "libOpenCL could not be loaded",
        ),
        DLOPEN_FUNCTION_NOT_AVAILABLE => (
            "DLOPEN_FUNCTION_NOT_AVAILABLE",
            "the loaded libOpenCL lacks this function",
        ),
        _ => match opencl3::error_codes::error_text(code) {
            "UNKNOWN_ERROR" => return "OpenCL error".to_string(),
            name => return name.to_string(),
        },
    };
    format!("{name} ({meaning})")
}

/// True for the status codes that mean "not enough memory".
fn is_oom_code(code: cl_int) -> bool {
    matches!(
        code,
        CL_MEM_OBJECT_ALLOCATION_FAILURE
            | CL_OUT_OF_RESOURCES
            | CL_OUT_OF_HOST_MEMORY
            | CL_INVALID_BUFFER_SIZE
    )
}

/// A failed OpenCL call as an [`Error::Backend`].
pub(crate) fn backend_error(device: &str, op: &'static str, code: cl_int) -> Error {
    Error::Backend {
        backend: BackendKind::OpenCl,
        device: device.to_string(),
        op,
        code: i64::from(code),
        message: cl_error_message(code),
    }
}

/// A failed allocation call: [`Error::OutOfMemory`] for the memory codes, else
/// [`Error::Backend`].
pub(crate) fn alloc_error(device: &str, op: &'static str, code: cl_int, requested: usize) -> Error {
    if is_oom_code(code) {
        Error::OutOfMemory {
            device: device.to_string(),
            requested,
            detail: format!(" ({op}: {})", cl_error_message(code)),
        }
    } else {
        backend_error(device, op, code)
    }
}

/// A failed enqueue. `CL_MEM_OBJECT_ALLOCATION_FAILURE` there means the runtime could not back
/// the buffer `mem_len` bytes long on first use (OpenCL may allocate lazily): an
/// [`Error::OutOfMemory`]. Anything else is an [`Error::Backend`].
fn enqueue_error(device: &str, op: &'static str, code: cl_int, mem_len: usize) -> Error {
    if code == CL_MEM_OBJECT_ALLOCATION_FAILURE {
        Error::OutOfMemory {
            device: device.to_string(),
            requested: mem_len,
            detail: format!(
                " (the buffer is allocated on first use; {op}: {})",
                cl_error_message(code)
            ),
        }
    } else {
        backend_error(device, op, code)
    }
}

/// Why the OpenCL runtime cannot be used, for a failed `clGetPlatformIDs`.
fn unavailable(code: cl_int) -> Error {
    let reason = match code {
        DLOPEN_RUNTIME_LOAD_FAILED => {
            "libOpenCL could not be loaded (install an OpenCL ICD loader \
             such as ocl-icd-libopencl1, and a driver such as PoCL)"
                .to_string()
        }
        CL_PLATFORM_NOT_FOUND_KHR => "the OpenCL ICD loader found no platform (no driver is \
             registered in /etc/OpenCL/vendors; install one such as PoCL)"
            .to_string(),
        DLOPEN_FUNCTION_NOT_AVAILABLE => {
            "the loaded libOpenCL does not export clGetPlatformIDs".to_string()
        }
        c => format!(
            "clGetPlatformIDs failed: {} (code {c})",
            cl_error_message(c)
        ),
    };
    Error::RuntimeUnavailable {
        backend: BackendKind::OpenCl,
        reason,
    }
}

fn cl_bool_of(blocking: bool) -> cl_bool {
    if blocking {
        CL_BLOCKING
    } else {
        CL_NON_BLOCKING
    }
}

/// Releases an event returned by an enqueue call that nobody waits on. Releasing an event does
/// not cancel its command.
fn release_event_quietly(event: cl_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: `event` was returned by a successful enqueue call; this function takes over the
    // one reference that call gave us and nothing uses the handle afterwards.
    let _ = unsafe { opencl3::event::release_event(event) };
}

// ---------------------------------------------------------------------------------------------
// Owned handles whose Drop never panics
// ---------------------------------------------------------------------------------------------

/// The context of one platform, shared by its devices, buffers and queues.
struct ClContext {
    ctx: ManuallyDrop<Context>,
}

impl Drop for ClContext {
    fn drop(&mut self) {
        // SAFETY: `ctx` is never dropped by `opencl3` (ManuallyDrop), so its one reference is
        // released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::context::context::release_context(self.ctx.get()) };
    }
}

/// A command queue released (without panicking) on drop.
struct Queue {
    queue: ManuallyDrop<CommandQueue>,
}

impl Queue {
    /// An in-order queue without profiling on `device` of `ctx`.
    fn new(ctx: &ClContext, device: ClDeviceId, label: &str) -> Result<Self> {
        // SAFETY: `device` is one of the devices `ctx` was created with (both come from the
        // same platform in `discover`).
        #[allow(deprecated)]
        let queue = unsafe { CommandQueue::create(&ctx.ctx, device.id(), 0) }
            .map_err(|ClError(c)| backend_error(label, "clCreateCommandQueue", c))?;
        Ok(Self {
            queue: ManuallyDrop::new(queue),
        })
    }

    fn raw(&self) -> opencl3::types::cl_command_queue {
        self.queue.get()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the `CommandQueue` is never dropped (ManuallyDrop), so its reference is
        // released exactly once, here. OpenCL finishes already queued commands on its own.
        let _ = unsafe { cq::release_command_queue(self.queue.get()) };
    }
}

/// A buffer released (without panicking) on drop.
struct OwnedBuffer {
    buf: ManuallyDrop<Buffer<u8>>,
}

impl OwnedBuffer {
    fn new(ctx: &ClContext, flags: u64, bytes: usize, label: &str) -> Result<Self> {
        // SAFETY: no host pointer is passed (flags never contain CL_MEM_USE_HOST_PTR or
        // CL_MEM_COPY_HOST_PTR), so the runtime reads no host memory.
        let buf = unsafe { Buffer::<u8>::create(&ctx.ctx, flags, bytes, ptr::null_mut()) }
            .map_err(|ClError(c)| alloc_error(label, "clCreateBuffer", c, bytes))?;
        Ok(Self {
            buf: ManuallyDrop::new(buf),
        })
    }

    fn raw(&self) -> cl_mem {
        self.buf.get()
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        // SAFETY: the `Buffer` is never dropped (ManuallyDrop), so its reference is released
        // exactly once, here. OpenCL frees the memory only once queued commands using it are
        // done, so pending asynchronous copies stay valid.
        let _ = unsafe { opencl3::memory::release_mem_object(self.buf.get()) };
    }
}

/// An event we hold a reference to.
struct OwnedEvent {
    event: cl_event,
    label: Arc<str>,
}

// SAFETY: an OpenCL event handle may be used from any thread: every OpenCL API call except
// clSetKernelArg is thread-safe (OpenCL 3.0 spec, "Multiple Host Threads"). The handle is
// released once, in Drop.
unsafe impl Send for OwnedEvent {}
// SAFETY: as for Send; `&OwnedEvent` only allows clWaitForEvents / clGetEventInfo.
unsafe impl Sync for OwnedEvent {}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        release_event_quietly(self.event);
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------------------------

/// Lists every device of every OpenCL platform, with one context per platform.
///
/// A platform whose devices cannot be listed, or whose context cannot be created, is skipped;
/// if every platform fails that way the first failure is returned.
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when libOpenCL cannot be loaded or has no platform driver.
pub(crate) fn discover() -> Result<Vec<ClDevice>> {
    let platforms = get_platforms().map_err(|ClError(c)| unavailable(c))?;
    let mut out = Vec::new();
    let mut first_failure = None;
    for platform in platforms {
        match platform_devices(platform, out.len()) {
            Ok(mut list) => out.append(&mut list),
            Err(e) => {
                first_failure.get_or_insert(e);
            }
        }
    }
    match first_failure {
        Some(e) if out.is_empty() => Err(Error::RuntimeUnavailable {
            backend: BackendKind::OpenCl,
            reason: e.to_string(),
        }),
        _ => Ok(out),
    }
}

/// The devices of one platform, numbered from `first_ordinal`.
fn platform_devices(platform: Platform, first_ordinal: usize) -> Result<Vec<ClDevice>> {
    let ids = platform
        .get_devices(CL_DEVICE_TYPE_ALL)
        .map_err(|ClError(c)| backend_error("opencl", "clGetDeviceIDs", c))?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let ctx = Context::from_devices(&ids, &[], None, ptr::null_mut())
        .map_err(|ClError(c)| backend_error("opencl", "clCreateContext", c))?;
    let ctx = Arc::new(ClContext {
        ctx: ManuallyDrop::new(ctx),
    });
    let platform_vendor = match (platform.name(), platform.version()) {
        (Ok(n), Ok(v)) => Some(format!("{n} ({v})")),
        (Ok(n), Err(_)) => Some(n),
        _ => None,
    };
    Ok(ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let device = ClDeviceId::new(id);
            let global = device.global_mem_size().unwrap_or(0);
            let info = DeviceInfo {
                backend: BackendKind::OpenCl,
                ordinal: first_ordinal + i,
                name: device
                    .name()
                    .ok()
                    .filter(|n| !n.trim().is_empty())
                    .unwrap_or_else(|| "OpenCL device".to_string()),
                vendor: platform_vendor
                    .clone()
                    .or_else(|| device.vendor().ok())
                    .unwrap_or_default(),
                total_memory: global,
                // The spec guarantees at least a quarter of the global memory.
                max_alloc: device.max_mem_alloc_size().unwrap_or(global / 4),
                host_unified: device.host_unified_memory().unwrap_or(false),
            };
            // CL_DEVICE_MEM_BASE_ADDR_ALIGN is in bits (1024 on PoCL: 128 bytes).
            let base_align = device
                .mem_base_addr_align()
                .map_or(128, |bits| (bits as usize / 8).max(1))
                .next_power_of_two();
            ClDevice {
                label: info.label().into(),
                info,
                device,
                ctx: ctx.clone(),
                map_queue: OnceLock::new(),
                base_align,
            }
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------------------------------

/// One OpenCL device, sharing its platform's context.
pub(crate) struct ClDevice {
    info: DeviceInfo,
    label: Arc<str>,
    device: ClDeviceId,
    ctx: Arc<ClContext>,
    /// Internal queue for mapping and unmapping pinned buffers, created on first use.
    map_queue: OnceLock<Arc<Queue>>,
    /// Required alignment of sub-buffer origins, in bytes.
    base_align: usize,
}

impl ClDevice {
    /// The platform's OpenCL context, e.g. to build programs for this device.
    #[allow(dead_code)]
    pub(crate) fn context(&self) -> &Context {
        &self.ctx.ctx
    }

    /// The OpenCL device handle.
    #[allow(dead_code)]
    pub(crate) fn device_id(&self) -> opencl3::types::cl_device_id {
        self.device.id()
    }

    fn map_queue(&self) -> Result<Arc<Queue>> {
        if let Some(q) = self.map_queue.get() {
            return Ok(q.clone());
        }
        let q = Arc::new(Queue::new(&self.ctx, self.device, &self.label)?);
        // Two threads may race here; the loser's queue is simply released.
        Ok(self.map_queue.get_or_init(|| q).clone())
    }

    /// A second backend device for the same OpenCL device, with its own counters and pools
    /// once wrapped in a `Device` (see `Device::detached`).
    pub(crate) fn duplicate(&self) -> ClDevice {
        ClDevice {
            info: self.info.clone(),
            label: self.label.clone(),
            device: self.device,
            ctx: self.ctx.clone(),
            map_queue: OnceLock::new(),
            base_align: self.base_align,
        }
    }
}

impl BackendDevice for ClDevice {
    type Mem = ClMem;
    type Pinned = ClPinned;
    type Stream = ClStream;
    type Event = ClEvent;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<ClMem> {
        Ok(ClMem {
            buf: OwnedBuffer::new(&self.ctx, CL_MEM_READ_WRITE, bytes, &self.label)?,
            len: bytes,
            ctx: self.ctx.clone(),
            _parent: None,
        })
    }

    fn sub_align(&self) -> usize {
        self.base_align
    }

    fn sub_mem(&self, parent: &ClMem, off: usize, len: usize, keep: KeepAlive) -> Result<ClMem> {
        // SAFETY: CL_MEM_READ_WRITE is compatible with the parent's flags (CL_MEM_READ_WRITE),
        // and no host pointer flag is passed. The region lies inside the parent (caller's
        // contract); its origin is aligned to CL_DEVICE_MEM_BASE_ADDR_ALIGN (`sub_align`).
        let sub = unsafe {
            parent
                .buffer()
                .create_sub_buffer(CL_MEM_READ_WRITE, off, len)
        }
        .map_err(|ClError(c)| alloc_error(&self.label, "clCreateSubBuffer", c, len))?;
        Ok(ClMem {
            buf: OwnedBuffer {
                buf: ManuallyDrop::new(sub),
            },
            len,
            ctx: self.ctx.clone(),
            _parent: Some(keep),
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<ClPinned> {
        let buf = OwnedBuffer::new(
            &self.ctx,
            CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
            bytes,
            &self.label,
        )?;
        let queue = self.map_queue()?;
        let mut mapped: cl_mem = ptr::null_mut();
        // SAFETY: `buf` is a live buffer of `bytes` bytes in the context of `queue`; the map
        // is blocking, so `mapped` is set (or an error returned) when the call returns.
        let event = unsafe {
            cq::enqueue_map_buffer(
                queue.raw(),
                buf.raw(),
                CL_BLOCKING,
                CL_MAP_READ | CL_MAP_WRITE,
                0,
                bytes,
                &mut mapped,
                0,
                ptr::null(),
            )
        }
        .map_err(|c| alloc_error(&self.label, "clEnqueueMapBuffer", c, bytes))?;
        release_event_quietly(event);
        let ptr = mapped.cast::<u8>();
        if ptr.is_null() {
            return Err(backend_error(&self.label, "clEnqueueMapBuffer", -12));
        }
        // SAFETY: the blocking map made `ptr` valid for reads and writes of `bytes` bytes
        // until the buffer is unmapped, which only `ClPinned::drop` does.
        unsafe { ptr::write_bytes(ptr, 0, bytes) };
        Ok(ClPinned {
            buf,
            ptr,
            len: bytes,
            queue,
        })
    }

    fn new_stream(&self) -> Result<ClStream> {
        Ok(ClStream {
            queue: Queue::new(&self.ctx, self.device, &self.label)?,
            ctx: self.ctx.clone(),
            label: self.label.clone(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

/// Device memory: a `CL_MEM_READ_WRITE` buffer of the platform's context, or a sub-buffer of a
/// pool segment (so kernels see the block at offset 0 of their `cl_mem`).
pub(crate) struct ClMem {
    buf: OwnedBuffer,
    len: usize,
    ctx: Arc<ClContext>,
    /// For a sub-buffer: the pool segment it lies in (OpenCL also keeps the parent alive).
    _parent: Option<KeepAlive>,
}

impl ClMem {
    /// The OpenCL buffer, e.g. to pass as a kernel argument.
    pub(crate) fn buffer(&self) -> &Buffer<u8> {
        &self.buf.buf
    }
}

impl BackendMem for ClMem {
    fn len(&self) -> usize {
        self.len
    }
}

/// Pinned host memory: a `CL_MEM_ALLOC_HOST_PTR` buffer, mapped read/write until drop.
pub(crate) struct ClPinned {
    buf: OwnedBuffer,
    ptr: *mut u8,
    len: usize,
    /// The device's internal queue the buffer was mapped on.
    queue: Arc<Queue>,
}

// SAFETY: the mapped pointer is plain host memory owned by this value (no thread affinity);
// the OpenCL handles are thread-safe per the spec. Access to the bytes is synchronised by the
// public wrapper (`&` for reads, `&mut` for writes).
unsafe impl Send for ClPinned {}
// SAFETY: as for Send; `&ClPinned` only hands out the pointer and the length.
unsafe impl Sync for ClPinned {}

impl BackendPinned for ClPinned {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ClPinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the pointer the map of `buf` on `queue` returned, and it is unmapped
        // only here. Errors are ignored: at worst the mapping leaks.
        let unmapped = unsafe {
            cq::enqueue_unmap_mem_object(
                self.queue.raw(),
                self.buf.raw(),
                self.ptr.cast::<c_void>(),
                0,
                ptr::null(),
            )
        };
        if let Ok(event) = unmapped {
            let _ = opencl3::event::wait_for_events(&[event]);
            release_event_quietly(event);
        }
        // `buf` is released after this, by its own Drop.
    }
}

// ---------------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------------

/// A stream: an in-order command queue, without profiling.
pub(crate) struct ClStream {
    queue: Queue,
    ctx: Arc<ClContext>,
    label: Arc<str>,
}

impl ClStream {
    /// The OpenCL command queue, e.g. to enqueue kernels.
    pub(crate) fn queue(&self) -> &CommandQueue {
        &self.queue.queue
    }

    /// Rejects buffers of another platform's context (OpenCL would fail with
    /// `CL_INVALID_CONTEXT`).
    fn check_context(&self, mem: &ClMem, op: &'static str) -> Result<()> {
        if Arc::ptr_eq(&mem.ctx, &self.ctx) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                expected: format!("a buffer of the OpenCL platform of {}", self.label),
                actual: "a buffer of another OpenCL platform".to_string(),
            })
        }
    }

    fn enqueue_copy(
        &self,
        src: cl_mem,
        src_off: usize,
        dst: cl_mem,
        dst_off: usize,
        len: usize,
        dst_len: usize,
    ) -> Result<()> {
        // SAFETY: both handles are live buffers of this queue's context and the caller checked
        // both ranges; the regions do not overlap when src == dst (see `copy`).
        let event = unsafe {
            cq::enqueue_copy_buffer(
                self.queue.raw(),
                src,
                dst,
                src_off,
                dst_off,
                len,
                0,
                ptr::null(),
            )
        }
        .map_err(|c| enqueue_error(&self.label, "clEnqueueCopyBuffer", c, dst_len))?;
        release_event_quietly(event);
        Ok(())
    }
}

impl BackendStream for ClStream {
    type Mem = ClMem;
    type Event = ClEvent;

    unsafe fn write(
        &self,
        dst: &ClMem,
        dst_off: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.check_context(dst, "write")?;
        // SAFETY: the caller checked dst_off + len <= dst.len() and that `src` is valid for
        // `len` reads (until the command completes when not blocking).
        let event = unsafe {
            cq::enqueue_write_buffer(
                self.queue.raw(),
                dst.buf.raw(),
                cl_bool_of(blocking),
                dst_off,
                len,
                src.cast::<c_void>(),
                0,
                ptr::null(),
            )
        }
        .map_err(|c| enqueue_error(&self.label, "clEnqueueWriteBuffer", c, dst.len))?;
        release_event_quietly(event);
        Ok(())
    }

    unsafe fn read(
        &self,
        src: &ClMem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.check_context(src, "read")?;
        // SAFETY: the caller checked src_off + len <= src.len() and that `dst` is valid for
        // `len` writes and untouched until the command completes.
        let event = unsafe {
            cq::enqueue_read_buffer(
                self.queue.raw(),
                src.buf.raw(),
                cl_bool_of(blocking),
                src_off,
                len,
                dst.cast::<c_void>(),
                0,
                ptr::null(),
            )
        }
        .map_err(|c| enqueue_error(&self.label, "clEnqueueReadBuffer", c, src.len))?;
        release_event_quietly(event);
        Ok(())
    }

    fn copy(
        &self,
        src: &ClMem,
        src_off: usize,
        dst: &ClMem,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        self.check_context(src, "copy")?;
        self.check_context(dst, "copy")?;
        let same = src.buf.raw() == dst.buf.raw();
        let overlap =
            src_off < dst_off.saturating_add(len) && dst_off < src_off.saturating_add(len);
        if same && overlap {
            if src_off == dst_off {
                return Ok(());
            }
            // clEnqueueCopyBuffer rejects overlapping regions (CL_MEM_COPY_OVERLAP): stage
            // through a temporary buffer. Releasing it right away is fine: OpenCL keeps it
            // until the queued copies are done.
            let tmp = OwnedBuffer::new(&self.ctx, CL_MEM_READ_WRITE, len, &self.label)?;
            self.enqueue_copy(src.buf.raw(), src_off, tmp.raw(), 0, len, len)?;
            return self.enqueue_copy(tmp.raw(), 0, dst.buf.raw(), dst_off, len, dst.len);
        }
        self.enqueue_copy(src.buf.raw(), src_off, dst.buf.raw(), dst_off, len, dst.len)
    }

    fn fill(&self, dst: &ClMem, off: usize, len: usize, value: u8) -> Result<()> {
        self.check_context(dst, "fill")?;
        let pattern = [value];
        // SAFETY: range checked by the caller; OpenCL copies the 1-byte pattern before
        // clEnqueueFillBuffer returns, so the local may go out of scope.
        let event = unsafe {
            cq::enqueue_fill_buffer(
                self.queue.raw(),
                dst.buf.raw(),
                pattern.as_ptr().cast::<c_void>(),
                pattern.len(),
                off,
                len,
                0,
                ptr::null(),
            )
        }
        .map_err(|c| enqueue_error(&self.label, "clEnqueueFillBuffer", c, dst.len))?;
        release_event_quietly(event);
        Ok(())
    }

    fn record(&self) -> Result<ClEvent> {
        // SAFETY: a marker with an empty wait list on a live queue reads no host memory.
        let event = unsafe { cq::enqueue_marker_with_wait_list(self.queue.raw(), 0, ptr::null()) }
            .map_err(|c| backend_error(&self.label, "clEnqueueMarkerWithWaitList", c))?;
        let event = ClEvent(Arc::new(OwnedEvent {
            event,
            label: self.label.clone(),
        }));
        // Submit the work now: polling an event (is_complete) or waiting for it from another
        // queue does not flush this one, and could otherwise wait forever.
        cq::flush(self.queue.raw()).map_err(|c| backend_error(&self.label, "clFlush", c))?;
        Ok(event)
    }

    fn wait_for(&self, event: &ClEvent) -> Result<()> {
        let list = [event.0.event];
        // SAFETY: `list` holds one live event (kept alive by `event`) for the duration of the
        // call; OpenCL retains it as long as the barrier needs it.
        let barrier =
            unsafe { cq::enqueue_barrier_with_wait_list(self.queue.raw(), 1, list.as_ptr()) }
                .map_err(|c| backend_error(&self.label, "clEnqueueBarrierWithWaitList", c))?;
        release_event_quietly(barrier);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        cq::finish(self.queue.raw()).map_err(|c| backend_error(&self.label, "clFinish", c))
    }
}

/// A marker event of a stream. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ClEvent(Arc<OwnedEvent>);

impl BackendEvent for ClEvent {
    fn wait(&self) -> Result<()> {
        opencl3::event::wait_for_events(&[self.0.event])
            .map_err(|c| backend_error(&self.0.label, "clWaitForEvents", c))
    }

    fn is_complete(&self) -> Result<bool> {
        let status: cl_int = opencl3::event::get_event_info(
            self.0.event,
            opencl3::event::CL_EVENT_COMMAND_EXECUTION_STATUS,
        )
        .map_err(|c| backend_error(&self.0.label, "clGetEventInfo", c))?
        .into();
        if status < 0 {
            return Err(backend_error(&self.0.label, "clGetEventInfo", status));
        }
        Ok(status == opencl3::event::CL_COMPLETE)
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ClDevice>();
    send_sync::<ClMem>();
    send_sync::<ClPinned>();
    send_sync::<ClStream>();
    send_sync::<ClEvent>();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::RawDevice;
    use crate::testing::opencl_or_skip;
    use crate::Device;

    fn raw(dev: &Device) -> &ClDevice {
        match &dev.shared.raw {
            RawDevice::OpenCl(d) => d,
            #[allow(unreachable_patterns)]
            _ => panic!("{} is not an OpenCL device", dev.label()),
        }
    }

    /// A fresh `Device` over the same OpenCL device, with counters no other test touches.
    fn private_device(dev: &Device) -> Device {
        Device::from_raw(RawDevice::OpenCl(raw(dev).duplicate()))
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn opencl_discovery_reports_sane_info() {
        let Some(dev) = opencl_or_skip("opencl_discovery_reports_sane_info") else {
            return;
        };
        let all = Device::all(BackendKind::OpenCl).unwrap();
        assert!(!all.is_empty());
        for (i, d) in all.iter().enumerate() {
            let info = d.info();
            assert_eq!(info.backend, BackendKind::OpenCl);
            assert_eq!(info.ordinal, i);
            assert_eq!(d.label(), format!("opencl:{i}"));
            assert!(!info.name.trim().is_empty());
            assert!(!info.vendor.trim().is_empty());
            assert!(info.max_alloc > 0);
            assert!(info.total_memory >= info.max_alloc, "{info:?}");
        }
        assert!(Device::open("opencl:0").unwrap().same(&dev));
        let e = Device::open(&format!("opencl:{}", all.len())).unwrap_err();
        assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    }

    #[test]
    fn opencl_round_trip_with_offsets() {
        let Some(dev) = opencl_or_skip("opencl_round_trip_with_offsets") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(4096).unwrap();
        let data = pattern(1000, 7);
        s.write(&mut buf, 0, &vec![0u8; 4096]).unwrap();
        s.write(&mut buf, 123, &data).unwrap();
        let mut back = vec![0u8; 1000];
        s.read(&buf, 123, &mut back).unwrap();
        assert_eq!(back, data);
        let mut part = vec![0xAAu8; 10];
        s.read(&buf, 118, &mut part).unwrap();
        assert_eq!(&part[..5], &[0; 5]);
        assert_eq!(&part[5..], &data[..5]);
        let mut tail = vec![0xAAu8; 3];
        s.read(&buf, 4093, &mut tail).unwrap();
        assert_eq!(tail, [0, 0, 0]);
    }

    #[test]
    fn opencl_fill() {
        let Some(dev) = opencl_or_skip("opencl_fill") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(1000).unwrap();
        s.fill(&mut buf, 0, 1000, 0x11).unwrap();
        s.fill(&mut buf, 250, 333, 0xEE).unwrap();
        let mut back = vec![0u8; 1000];
        s.read(&buf, 0, &mut back).unwrap();
        assert!(back[..250].iter().all(|&b| b == 0x11));
        assert!(back[250..583].iter().all(|&b| b == 0xEE));
        assert!(back[583..].iter().all(|&b| b == 0x11));
    }

    #[test]
    fn opencl_copy_within_device() {
        let Some(dev) = opencl_or_skip("opencl_copy_within_device") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let data = pattern(512, 3);
        let mut a = dev.alloc(512).unwrap();
        let mut b = dev.alloc(700).unwrap();
        s.write(&mut a, 0, &data).unwrap();
        s.fill(&mut b, 0, 700, 0).unwrap();
        s.copy(&a, 100, &mut b, 50, 400).unwrap();
        let mut back = vec![0xFFu8; 700];
        s.read(&b, 0, &mut back).unwrap();
        assert!(back[..50].iter().all(|&x| x == 0));
        assert_eq!(&back[50..450], &data[100..500]);
        assert!(back[450..].iter().all(|&x| x == 0));
    }

    #[test]
    fn opencl_overlapping_copy_in_one_buffer() {
        let Some(dev) = opencl_or_skip("opencl_overlapping_copy_in_one_buffer") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let data = pattern(256, 9);
        let mut a = dev.alloc(256).unwrap();
        s.write(&mut a, 0, &data).unwrap();
        // copy_raw takes both buffers by `&`, like the crate's own callers may.
        s.copy_raw(&a, 0, &a, 16, 200).unwrap();
        let mut back = vec![0u8; 256];
        s.read(&a, 0, &mut back).unwrap();
        let mut expect = data.clone();
        expect.copy_within(0..200, 16);
        assert_eq!(back, expect);
        // Same offset: nothing to do.
        s.copy_raw(&a, 8, &a, 8, 100).unwrap();
        s.read(&a, 0, &mut back).unwrap();
        assert_eq!(back, expect);
    }

    #[test]
    fn opencl_async_write_record_wait() {
        let Some(dev) = opencl_or_skip("opencl_async_write_record_wait") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let len = 1 << 20;
        let data = pattern(len, 42);
        let mut buf = dev.alloc(len).unwrap();
        // SAFETY: `data` is neither dropped nor modified before the event has completed.
        unsafe { s.write_async(&mut buf, 0, &data).unwrap() };
        let ev = s.record().unwrap();
        ev.wait().unwrap();
        assert!(ev.is_complete().unwrap());
        let mut back = vec![0u8; len];
        // SAFETY: `back` is untouched until the event below has completed.
        unsafe { s.read_async(&buf, 0, &mut back).unwrap() };
        s.record().unwrap().wait().unwrap();
        assert_eq!(back, data);
        drop(data);
    }

    #[test]
    fn opencl_wait_for_across_streams() {
        let Some(dev) = opencl_or_skip("opencl_wait_for_across_streams") else {
            return;
        };
        let s1 = dev.new_stream().unwrap();
        let s2 = dev.new_stream().unwrap();
        let len = 4 << 20;
        let data = pattern(len, 5);
        let mut buf = dev.alloc(len).unwrap();
        let mut other = dev.alloc(len).unwrap();
        s2.fill(&mut other, 0, len, 0).unwrap();
        s2.synchronize().unwrap();
        // SAFETY: `data` outlives `s1.synchronize()` below.
        unsafe { s1.write_async(&mut buf, 0, &data).unwrap() };
        s1.fill(&mut buf, 0, 16, 0xCD).unwrap();
        let ev = s1.record().unwrap();
        s2.wait_for(&ev).unwrap();
        s2.copy(&buf, 0, &mut other, 0, len).unwrap();
        let mut back = vec![0u8; len];
        s2.read(&other, 0, &mut back).unwrap();
        assert!(back[..16].iter().all(|&b| b == 0xCD));
        assert_eq!(&back[16..], &data[16..]);
        s1.synchronize().unwrap();
    }

    #[test]
    fn opencl_is_complete_after_synchronize() {
        let Some(dev) = opencl_or_skip("opencl_is_complete_after_synchronize") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(8 << 20).unwrap();
        s.fill(&mut buf, 0, 8 << 20, 1).unwrap();
        let ev = s.record().unwrap();
        let clone = ev.clone();
        s.synchronize().unwrap();
        assert!(ev.is_complete().unwrap());
        assert!(clone.is_complete().unwrap());
        drop(ev);
        clone.wait().unwrap();
        // The default stream works too.
        dev.synchronize().unwrap();
        assert!(dev
            .default_stream()
            .unwrap()
            .record()
            .unwrap()
            .wait()
            .is_ok());
    }

    #[test]
    fn opencl_pinned_zeroed_writable_and_source_of_write() {
        let Some(dev) = opencl_or_skip("opencl_pinned_zeroed_writable_and_source_of_write") else {
            return;
        };
        let len = 3 * 4096 + 17;
        let mut pinned = dev.alloc_pinned(len).unwrap();
        assert_eq!(pinned.len(), len);
        assert!(pinned.as_slice().iter().all(|&b| b == 0));
        let data = pattern(len, 77);
        pinned.as_mut_slice().copy_from_slice(&data);
        assert_eq!(pinned.as_slice(), &data[..]);

        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(len).unwrap();
        s.write(&mut buf, 0, pinned.as_slice()).unwrap();
        // And as the destination of an asynchronous read.
        let mut pinned2 = dev.alloc_pinned(len).unwrap();
        // SAFETY: `pinned2` is not touched until synchronize returns.
        unsafe { s.read_async(&buf, 0, pinned2.as_mut_slice()).unwrap() };
        s.synchronize().unwrap();
        assert_eq!(pinned2.as_slice(), &data[..]);
        drop(pinned);
        drop(pinned2);
        // Many small pinned buffers, alive together and dropped in another order.
        let mut v: Vec<_> = (1..20)
            .map(|i| dev.alloc_pinned(i * 100).unwrap())
            .collect();
        for (i, p) in v.iter_mut().enumerate() {
            p.as_mut_slice().fill(i as u8);
        }
        v.reverse();
        for p in &v {
            let first = p.as_slice()[0];
            assert!(p.as_slice().iter().all(|&b| b == first));
        }
    }

    #[test]
    fn opencl_memory_stats_track_alloc_and_free() {
        let Some(shared) = opencl_or_skip("opencl_memory_stats_track_alloc_and_free") else {
            return;
        };
        // The shared device's counters are exact-checked only where other tests cannot
        // interfere (monotonic counters); a private device gets exact checks.
        let before = shared.memory_stats();
        let b = shared.alloc(1_234_567).unwrap();
        let during = shared.memory_stats();
        assert!(during.allocs > before.allocs);
        assert!(during.in_use >= 1_234_567);
        assert!(during.peak >= 1_234_567);
        drop(b);
        assert!(shared.memory_stats().frees > before.frees);

        let dev = private_device(&shared);
        assert_eq!(dev.label(), shared.label());
        assert!(!dev.same(&shared));
        let a = dev.alloc(1000).unwrap();
        let b = dev.alloc(24).unwrap();
        let m = dev.memory_stats();
        assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (1024, 1024, 2, 0));
        drop(a);
        let m = dev.memory_stats();
        assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (24, 1024, 2, 1));
        drop(b);
        let m = dev.memory_stats();
        assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (0, 1024, 2, 2));

        let p = dev.alloc_pinned(4096).unwrap();
        assert_eq!(dev.pinned_stats().in_use, 4096);
        assert_eq!(dev.memory_stats().in_use, 0);
        drop(p);
        let p = dev.pinned_stats();
        assert_eq!((p.in_use, p.allocs, p.frees), (0, 1, 1));
    }

    #[test]
    fn opencl_alloc_above_max_alloc_is_out_of_memory() {
        let Some(dev) = opencl_or_skip("opencl_alloc_above_max_alloc_is_out_of_memory") else {
            return;
        };
        let max = dev.info().max_alloc;
        let too_big = usize::try_from(max).unwrap().saturating_add(1);
        let e = dev.alloc(too_big).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        // The backend itself maps clCreateBuffer's refusal to OutOfMemory as well.
        let e = raw(&dev).alloc(too_big).err().unwrap();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(e.to_string().contains("opencl:0"), "{e}");
        let e = dev.alloc_pinned(too_big).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        // Nothing was counted.
        let m = private_device(&dev);
        assert!(m.alloc(too_big).is_err());
        assert_eq!(m.memory_stats().allocs, 0);
    }

    #[test]
    fn opencl_out_of_bounds_is_an_error() {
        let Some(dev) = opencl_or_skip("opencl_out_of_bounds_is_an_error") else {
            return;
        };
        let s = dev.new_stream().unwrap();
        let mut buf = dev.alloc(100).unwrap();
        let e = s.write(&mut buf, 90, &[0u8; 11]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfBounds {
                    offset: 90,
                    len: 11,
                    size: 100,
                    ..
                }
            ),
            "{e}"
        );
        let e = s.read(&buf, usize::MAX, &mut [0u8; 2]).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
        let e = s.fill(&mut buf, 50, 51, 0).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
        let mut other = dev.alloc(10).unwrap();
        let e = s.copy(&buf, 0, &mut other, 5, 6).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
        // A stream of another backend rejects the buffer.
        let cpu = Device::cpu().new_stream().unwrap();
        let e = cpu.write(&mut buf, 0, &[1]).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    }

    #[test]
    fn opencl_streams_on_many_threads() {
        let Some(dev) = opencl_or_skip("opencl_streams_on_many_threads") else {
            return;
        };
        std::thread::scope(|scope| {
            for t in 0..8u8 {
                let dev = dev.clone();
                scope.spawn(move || {
                    let s = dev.new_stream().unwrap();
                    for round in 0..10u8 {
                        let len = 1000 + usize::from(t) * 100 + usize::from(round);
                        let data = pattern(len, t ^ round);
                        let mut buf = dev.alloc(len).unwrap();
                        s.write(&mut buf, 0, &data).unwrap();
                        let mut back = vec![0u8; len];
                        s.read(&buf, 0, &mut back).unwrap();
                        assert_eq!(back, data);
                    }
                });
            }
        });
    }

    #[test]
    fn opencl_copy_between_two_devices() {
        let Some(dev0) = opencl_or_skip("opencl_copy_between_two_devices") else {
            return;
        };
        let all = Device::all(BackendKind::OpenCl).unwrap();
        let Some(dev1) = all.get(1).cloned() else {
            eprintln!(
                "opencl_copy_between_two_devices: only {} OpenCL device(s); nothing to check \
                 (run with POCL_DEVICES=\"pthread pthread\" for two)",
                all.len()
            );
            return;
        };
        assert!(!dev0.same(&dev1));
        let same_platform = Arc::ptr_eq(&raw(&dev0).ctx, &raw(&dev1).ctx);
        let s0 = dev0.new_stream().unwrap();
        let s1 = dev1.new_stream().unwrap();
        let data = pattern(10_000, 11);
        let mut a = dev0.alloc(10_000).unwrap();
        let mut b = dev1.alloc(10_000).unwrap();
        s0.write(&mut a, 0, &data).unwrap();
        s1.fill(&mut b, 0, 10_000, 0).unwrap();
        s1.synchronize().unwrap();
        let r = s0.copy(&a, 0, &mut b, 0, 10_000);
        if !same_platform {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
            eprintln!(
                "opencl_copy_between_two_devices: devices 0 and 1 are on different platforms"
            );
            return;
        }
        r.unwrap();
        s0.synchronize().unwrap();
        let mut back = vec![0u8; 10_000];
        s1.read(&b, 0, &mut back).unwrap();
        assert_eq!(back, data);
        // And back the other way, on device 1's stream, with offsets.
        s1.copy(&b, 10, &mut a, 20, 500).unwrap();
        s1.synchronize().unwrap();
        let mut part = vec![0u8; 500];
        s0.read(&a, 20, &mut part).unwrap();
        assert_eq!(part, &data[10..510]);
    }

    #[test]
    fn opencl_error_mapping() {
        for code in [-4, -5, -6, -61] {
            let e = alloc_error("opencl:3", "clCreateBuffer", code, 99);
            match e {
                Error::OutOfMemory {
                    device,
                    requested,
                    detail,
                } => {
                    assert_eq!((device.as_str(), requested), ("opencl:3", 99));
                    assert!(detail.contains("clCreateBuffer"), "{detail}");
                }
                e => panic!("{code}: {e}"),
            }
        }
        let e = alloc_error("opencl:0", "clCreateBuffer", -30, 1);
        assert!(matches!(e, Error::Backend { code: -30, .. }), "{e}");
        let e = backend_error("opencl:1", "clEnqueueWriteBuffer", -38);
        let text = e.to_string();
        assert!(text.contains("clEnqueueWriteBuffer"), "{text}");
        assert!(text.contains("CL_INVALID_MEM_OBJECT"), "{text}");
        assert!(text.contains("opencl:1"), "{text}");
        assert!(matches!(
            e,
            Error::Backend {
                backend: BackendKind::OpenCl,
                code: -38,
                ..
            }
        ));
        assert!(matches!(
            enqueue_error("opencl:0", "clEnqueueWriteBuffer", -4, 8),
            Error::OutOfMemory { requested: 8, .. }
        ));
        assert!(matches!(
            enqueue_error("opencl:0", "clEnqueueWriteBuffer", -5, 8),
            Error::Backend { code: -5, .. }
        ));
        assert_eq!(cl_error_message(-9999), "OpenCL error");
        assert_eq!(cl_error_message(-48), "CL_INVALID_KERNEL");
        for code in [-2000, -1001, -2001, -30] {
            match unavailable(code) {
                Error::RuntimeUnavailable {
                    backend: BackendKind::OpenCl,
                    reason,
                } => assert!(!reason.is_empty()),
                e => panic!("{code}: {e}"),
            }
        }
    }
}
