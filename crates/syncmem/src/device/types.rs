//! Device memory, pinned host memory, streams and events: the public wrappers over the backends.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::backend::{BackendDevice, BackendEvent, BackendMem, BackendPinned, BackendStream};
#[cfg(feature = "cuda")]
use super::cuda;
#[cfg(feature = "opencl")]
use super::opencl;
use super::{cpu, with_raw_device, Device};
use crate::alloc::pool::{Fence, Lease};
use crate::alloc::stats::{Direction, COPIES};
use crate::alloc::trace::hub as trace_hub;
use crate::error::{check_range, Error, Result};

pub(crate) enum RawMem {
    Cpu(cpu::CpuMem),
    #[cfg(feature = "opencl")]
    OpenCl(opencl::ClMem),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuMem),
}

pub(crate) enum RawPinned {
    Cpu(cpu::CpuPinned),
    #[cfg(feature = "opencl")]
    OpenCl(opencl::ClPinned),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuPinned),
}

pub(crate) enum RawStream {
    Cpu(cpu::CpuStream),
    #[cfg(feature = "opencl")]
    OpenCl(opencl::ClStream),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuStream),
}

#[derive(Clone)]
pub(crate) enum RawEvent {
    Cpu(cpu::CpuEvent),
    #[cfg(feature = "opencl")]
    OpenCl(opencl::ClEvent),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CuEvent),
}

/// What to do when a pooled buffer is freed.
#[derive(Clone)]
pub(crate) enum Release {
    /// Nothing can be in flight on the memory: the block is free for every stream at once.
    Idle,
    /// Work may be in flight on this stream: the block is reusable at once there; other
    /// streams reuse it once an event recorded there (lazily, see `StreamFence`) completes.
    Record(Stream),
}

/// Where a buffer's memory comes from.
enum Origin {
    /// Nothing allocated (length 0).
    Empty,
    /// A backend allocation of its own, charged to the device's cap.
    Direct,
    /// A block of the device pool (the memory is a view: a sub-buffer / pointer into it).
    Pooled {
        lease: Lease<RawMem>,
        release: Release,
    },
}

/// Device memory. Freed when dropped: a direct allocation by the backend that made it, a
/// pooled one back into its device's pool.
///
/// Writing into a `DeviceBuffer` (through a [`Stream`]) takes `&mut`, reading takes `&`.
pub struct DeviceBuffer {
    device: Device,
    len: usize,
    /// `None` when `len == 0`: nothing is allocated.
    pub(crate) raw: Option<RawMem>,
    origin: Origin,
}

impl DeviceBuffer {
    pub(crate) fn empty(device: &Device) -> Self {
        Self {
            device: device.clone(),
            len: 0,
            raw: None,
            origin: Origin::Empty,
        }
    }

    /// Rejects requests above the device's largest single allocation.
    pub(crate) fn check_max(device: &Device, len: usize) -> Result<()> {
        let max = device.info().max_alloc;
        if (len as u64) > max {
            return Err(Error::OutOfMemory {
                device: device.label().to_string(),
                requested: len,
                detail: format!(" (above the device's largest single allocation, {max} bytes)"),
            });
        }
        Ok(())
    }

    /// A direct allocation (see [`Device::alloc`]).
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self::empty(device));
        }
        Self::check_max(device, len)?;
        device.shared.memory.alloc_direct(device, len)
    }

    /// A pooled allocation (see [`Device::alloc_pooled`]).
    pub(crate) fn pooled(
        device: &Device,
        len: usize,
        stream: &Stream,
        release: Release,
    ) -> Result<Self> {
        if !stream.device().same(device) {
            return Err(Error::DeviceMismatch {
                op: "pooled allocation",
                expected: device.label().to_string(),
                actual: stream.device().label().to_string(),
            });
        }
        if len == 0 {
            return Ok(Self::empty(device));
        }
        Self::check_max(device, len)?;
        device
            .shared
            .memory
            .alloc_pooled(device, len, stream, release)
    }

    /// Wraps a direct backend allocation (already charged to the cap).
    pub(crate) fn from_direct(device: &Device, len: usize, raw: RawMem) -> Self {
        device.shared.mem.on_alloc(len);
        Self {
            device: device.clone(),
            len,
            raw: Some(raw),
            origin: Origin::Direct,
        }
    }

    /// Wraps a pool block and the view of it.
    pub(crate) fn from_pool(
        device: &Device,
        len: usize,
        view: RawMem,
        lease: Lease<RawMem>,
        release: Release,
    ) -> Self {
        device.shared.mem.on_alloc(len);
        Self {
            device: device.clone(),
            len,
            raw: Some(view),
            origin: Origin::Pooled { lease, release },
        }
    }

    /// True when the memory is a block of the device's pool.
    pub fn is_pooled(&self) -> bool {
        matches!(self.origin, Origin::Pooled { .. })
    }

    /// Changes what freeing a pooled buffer does (no effect on direct allocations).
    pub(crate) fn set_release(&mut self, r: Release) {
        if let Origin::Pooled { release, .. } = &mut self.origin {
            *release = r;
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (which owns no device memory).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that owns the memory.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The OpenCL memory object, to pass to kernels (`None` for other backends or length 0).
    #[cfg(feature = "opencl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opencl")))]
    pub fn as_opencl(&self) -> Option<&opencl3::memory::Buffer<u8>> {
        match &self.raw {
            Some(RawMem::OpenCl(m)) => Some(m.buffer()),
            _ => None,
        }
    }

    /// The CUDA device memory, to pass to kernels (`None` for other backends or length 0).
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn as_cuda(&self) -> Option<&cudarc::driver::CudaSlice<u8>> {
        match &self.raw {
            Some(RawMem::Cuda(m)) => Some(m.slice()),
            _ => None,
        }
    }

    /// The bytes of a `cpu`-device buffer (`None` for other backends).
    pub fn as_cpu_slice(&self) -> Option<&[u8]> {
        match &self.raw {
            Some(RawMem::Cpu(m)) => Some(m.as_slice()),
            None if self.device.backend() == crate::BackendKind::Cpu => Some(&[]),
            _ => None,
        }
    }

    /// The bytes of a `cpu`-device buffer, mutably (`None` for other backends).
    pub fn as_cpu_slice_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.raw {
            Some(RawMem::Cpu(m)) => Some(m.as_mut_slice()),
            None if self.device.backend() == crate::BackendKind::Cpu => Some(&mut []),
            _ => None,
        }
    }
}

impl DeviceBuffer {
    /// Start of a `cpu`-device buffer's memory (`None` for other backends or length 0).
    pub(crate) fn cpu_ptr(&self) -> Option<*mut u8> {
        match &self.raw {
            Some(RawMem::Cpu(m)) => Some(m.as_ptr()),
            _ => None,
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Some(raw) = self.raw.take() else {
            return;
        };
        self.device.shared.mem.on_free(self.len);
        // The view (or the allocation) goes first; a pool block is given back after it.
        drop(raw);
        match std::mem::replace(&mut self.origin, Origin::Empty) {
            Origin::Empty => {}
            Origin::Direct => self.device.shared.memory.uncharge(self.len),
            Origin::Pooled { mut lease, release } => {
                // The cpu backend finishes every operation before returning: nothing is ever
                // in flight there.
                if let Release::Record(stream) = release {
                    if !matches!(&*stream.raw, RawStream::Cpu(_)) {
                        lease.add_pending(stream.id(), Arc::new(StreamFence::new(&stream)));
                    }
                }
                drop(lease);
            }
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.label())
            .field("len", &self.len)
            .finish()
    }
}

/// An in-order queue of work on one device (a CUDA stream, an OpenCL command queue).
///
/// Cheap to clone: clones are the same queue.
#[derive(Clone)]
pub struct Stream {
    device: Device,
    pub(crate) raw: Arc<RawStream>,
    id: u64,
}

/// Stream ids start at 1: 0 is the pools' host "stream".
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Dispatches on a (stream, mem) pair of the same backend.
macro_rules! with_stream_mem {
    ($self:expr, $mem:expr, |$s:ident, $m:ident| $body:expr) => {{
        let mem: &RawMem = $mem;
        match (&*$self.raw, mem) {
            (RawStream::Cpu($s), RawMem::Cpu($m)) => $body,
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl($s), RawMem::OpenCl($m)) => $body,
            #[cfg(feature = "cuda")]
            (RawStream::Cuda($s), RawMem::Cuda($m)) => $body,
            #[allow(unreachable_patterns)]
            _ => Err($self.mismatch("stream/buffer backend")),
        }
    }};
}

/// A [`Stream`] without its device handle: what a device keeps of its own default stream (a
/// `Stream` there would hold the device that holds it, and neither would ever be freed).
#[derive(Clone)]
pub(crate) struct UnboundStream {
    raw: Arc<RawStream>,
    id: u64,
}

impl UnboundStream {
    /// The stream again, on `device` (the device it was made on).
    pub(crate) fn bind(&self, device: &Device) -> Stream {
        Stream {
            device: device.clone(),
            raw: self.raw.clone(),
            id: self.id,
        }
    }
}

impl Stream {
    /// The queue without the device handle (see [`UnboundStream`]).
    pub(crate) fn unbind(self) -> UnboundStream {
        UnboundStream {
            raw: self.raw,
            id: self.id,
        }
    }

    pub(crate) fn new(device: &Device) -> Result<Self> {
        let raw = with_raw_device!(&device.shared.raw, d => d.new_stream().map(wrap_stream))?;
        Ok(Self {
            device: device.clone(),
            raw: Arc::new(raw),
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// A process-wide unique id (clones share it). Pools use it for stream-ordered reuse.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device this stream runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn mismatch(&self, op: &'static str) -> Error {
        Error::DeviceMismatch {
            op,
            expected: self.device.label().to_string(),
            actual: "a buffer of another backend".to_string(),
        }
    }

    fn check_buffer(&self, buf: &DeviceBuffer, op: &'static str) -> Result<()> {
        if buf.device.backend() != self.device.backend() {
            return Err(Error::DeviceMismatch {
                op,
                expected: self.device.label().to_string(),
                actual: buf.device.label().to_string(),
            });
        }
        Ok(())
    }

    /// Copies `src` into `dst` at `offset`, returning when the copy is complete.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if the range does not fit, [`Error::DeviceMismatch`] if `dst`
    /// belongs to another backend, or a backend error.
    pub fn write(&self, dst: &mut DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: blocking copy; `src` is borrowed for the whole call.
        unsafe { self.write_raw(dst, offset, src.as_ptr(), src.len(), true) }
    }

    /// Copies `dst.len()` bytes from `src` at `offset` into `dst`, returning when complete.
    ///
    /// # Errors
    /// As [`Stream::write`].
    pub fn read(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: blocking copy; `dst` is exclusively borrowed for the whole call.
        unsafe { self.read_raw(src, offset, dst.as_mut_ptr(), dst.len(), true) }
    }

    /// Queues a copy of `src` into `dst` at `offset` and returns at once.
    ///
    /// # Safety
    /// The memory behind `src` must stay alive and unmodified until an [`Event`] recorded on this
    /// stream after the call has completed (or [`Stream::synchronize`] returned).
    ///
    /// # Errors
    /// As [`Stream::write`].
    pub unsafe fn write_async(
        &self,
        dst: &mut DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.write_raw(dst, offset, src.as_ptr(), src.len(), false) }
    }

    /// Queues a copy from `src` at `offset` into `dst` and returns at once.
    ///
    /// # Safety
    /// The memory behind `dst` must stay alive and must not be read or written until an
    /// [`Event`] recorded on this stream after the call has completed.
    ///
    /// # Errors
    /// As [`Stream::write`].
    pub unsafe fn read_async(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.read_raw(src, offset, dst.as_mut_ptr(), dst.len(), false) }
    }

    /// Counts a copy made on this stream in the always-on counters and, when a trace is
    /// attached anywhere (one relaxed atomic load otherwise), reports it to the traces
    /// attached to this device.
    fn count_copy(&self, d: Direction, len: usize) {
        COPIES.record(d, len);
        if trace_hub::active() {
            trace_hub::copy(&self.device, d, len);
        }
    }

    /// # Safety
    /// `src` valid for `len` reads; when `!blocking`, until the copy completes.
    pub(crate) unsafe fn write_raw(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.check_buffer(dst, "write")?;
        check_range(&format!("write into {dst:?}"), offset, len, dst.len)?;
        let Some(mem) = dst.raw.as_ref().filter(|_| len > 0) else {
            return Ok(());
        };
        // SAFETY: range checked above; pointer validity is the caller's contract.
        with_stream_mem!(self, mem, |s, m| unsafe {
            s.write(m, offset, src, len, blocking)
        })?;
        self.count_copy(Direction::HostToDevice, len);
        Ok(())
    }

    /// # Safety
    /// `dst` valid for `len` writes and otherwise untouched until the copy completes.
    pub(crate) unsafe fn read_raw(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<()> {
        self.check_buffer(src, "read")?;
        check_range(&format!("read from {src:?}"), offset, len, src.len)?;
        let Some(mem) = src.raw.as_ref().filter(|_| len > 0) else {
            return Ok(());
        };
        // SAFETY: range checked above; pointer validity is the caller's contract.
        with_stream_mem!(self, mem, |s, m| unsafe {
            s.read(m, offset, dst, len, blocking)
        })?;
        self.count_copy(Direction::DeviceToHost, len);
        Ok(())
    }

    /// Queues a device-to-device copy of `len` bytes. Both buffers must belong to this stream's
    /// backend (and, for most backends, to the same context or to peer devices).
    ///
    /// # Errors
    /// Bounds, device mismatch or backend errors.
    pub fn copy(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.copy_raw(src, src_offset, dst, dst_offset, len)
    }

    pub(crate) fn copy_raw(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_buffer(src, "copy")?;
        self.check_buffer(dst, "copy")?;
        check_range(&format!("copy from {src:?}"), src_offset, len, src.len)?;
        check_range(&format!("copy into {dst:?}"), dst_offset, len, dst.len)?;
        let (Some(s_mem), Some(d_mem)) = (src.raw.as_ref(), dst.raw.as_ref()) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        match (&*self.raw, s_mem, d_mem) {
            (RawStream::Cpu(s), RawMem::Cpu(a), RawMem::Cpu(b)) => {
                s.copy(a, src_offset, b, dst_offset, len)
            }
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(a), RawMem::OpenCl(b)) => {
                s.copy(a, src_offset, b, dst_offset, len)
            }
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawMem::Cuda(a), RawMem::Cuda(b)) => {
                s.copy(a, src_offset, b, dst_offset, len)
            }
            #[allow(unreachable_patterns)]
            _ => Err(self.mismatch("copy")),
        }?;
        self.count_copy(Direction::DeviceToDevice, len);
        Ok(())
    }

    /// Queues a fill of `len` bytes of `dst` from `offset` with `value`.
    ///
    /// # Errors
    /// Bounds, device mismatch or backend errors.
    pub fn fill(&self, dst: &mut DeviceBuffer, offset: usize, len: usize, value: u8) -> Result<()> {
        self.fill_raw(dst, offset, len, value)
    }

    pub(crate) fn fill_raw(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        self.check_buffer(dst, "fill")?;
        check_range(&format!("fill of {dst:?}"), offset, len, dst.len)?;
        let Some(mem) = dst.raw.as_ref().filter(|_| len > 0) else {
            return Ok(());
        };
        with_stream_mem!(self, mem, |s, m| s.fill(m, offset, len, value))
    }

    /// Records an event after all work queued so far.
    ///
    /// # Errors
    /// A backend error.
    pub fn record(&self) -> Result<Event> {
        record_raw(&self.raw)
    }

    /// Makes work queued later on this stream wait until `event` has completed.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for an event of another backend, or a backend error.
    pub fn wait_for(&self, event: &Event) -> Result<()> {
        match (&*self.raw, &event.raw) {
            (RawStream::Cpu(s), RawEvent::Cpu(e)) => s.wait_for(e),
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawEvent::OpenCl(e)) => s.wait_for(e),
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawEvent::Cuda(e)) => s.wait_for(e),
            #[allow(unreachable_patterns)]
            _ => Err(self.mismatch("wait_for")),
        }
    }

    /// Blocks until all queued work is done.
    ///
    /// # Errors
    /// A backend error (including errors of earlier asynchronous work).
    pub fn synchronize(&self) -> Result<()> {
        synchronize_raw(&self.raw)
    }

    /// The OpenCL command queue behind this stream (`None` for other backends).
    #[cfg(feature = "opencl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opencl")))]
    pub fn as_opencl(&self) -> Option<&opencl3::command_queue::CommandQueue> {
        match &*self.raw {
            RawStream::OpenCl(s) => Some(s.queue()),
            _ => None,
        }
    }

    /// The cudarc stream behind this stream (`None` for other backends), to launch kernels on.
    ///
    /// cudarc's event tracking is disabled on syncmem's contexts: order work on it against
    /// other streams with [`Event`]s or [`Stream::synchronize`], not with cudarc's implicit
    /// tracking.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn as_cuda(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        match &*self.raw {
            RawStream::Cuda(s) => Some(s.cuda_stream()),
            _ => None,
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device.label())
            .finish()
    }
}

fn record_raw(raw: &RawStream) -> Result<Event> {
    let raw = match raw {
        RawStream::Cpu(s) => s.record().map(RawEvent::Cpu),
        #[cfg(feature = "opencl")]
        RawStream::OpenCl(s) => s.record().map(RawEvent::OpenCl),
        #[cfg(feature = "cuda")]
        RawStream::Cuda(s) => s.record().map(RawEvent::Cuda),
    }?;
    Ok(Event { raw })
}

fn synchronize_raw(raw: &RawStream) -> Result<()> {
    match raw {
        RawStream::Cpu(s) => s.synchronize(),
        #[cfg(feature = "opencl")]
        RawStream::OpenCl(s) => s.synchronize(),
        #[cfg(feature = "cuda")]
        RawStream::Cuda(s) => s.synchronize(),
    }
}

/// The work queued on a stream before a pooled buffer was freed. Its event is recorded lazily,
/// when another stream first wants the block (or a trim asks): a free costs nothing (an eager
/// marker + flush costs 1-25 us on PoCL) and same-stream reuse never needs the event. A later
/// event on an in-order stream covers everything queued before it, so recording late is
/// correct, only conservative. Holds the queue, not the [`Device`]: no reference cycle through
/// the device's pool.
pub(crate) struct StreamFence {
    raw: Arc<RawStream>,
    event: OnceLock<Option<Event>>,
}

impl StreamFence {
    pub(crate) fn new(stream: &Stream) -> Self {
        Self {
            raw: stream.raw.clone(),
            event: OnceLock::new(),
        }
    }

    /// The event, recorded on first use (`None`: recording failed, so the stream was drained
    /// instead).
    fn event(&self) -> Option<&Event> {
        self.event
            .get_or_init(|| match record_raw(&self.raw) {
                Ok(e) => Some(e),
                Err(_) => {
                    let _ = synchronize_raw(&self.raw);
                    None
                }
            })
            .as_ref()
    }
}

impl Fence for StreamFence {
    fn is_complete(&self) -> bool {
        self.event()
            .map_or(true, |e| e.is_complete().unwrap_or(true))
    }
    fn wait(&self) {
        if let Some(e) = self.event() {
            let _ = e.wait();
        }
    }
    fn poll(&self) -> bool {
        match self.event.get() {
            None => false,
            Some(None) => true,
            Some(Some(e)) => e.is_complete().unwrap_or(true),
        }
    }
}

fn wrap_stream<S: IntoRawStream>(s: S) -> RawStream {
    s.into_raw()
}

trait IntoRawStream {
    fn into_raw(self) -> RawStream;
}
impl IntoRawStream for cpu::CpuStream {
    fn into_raw(self) -> RawStream {
        RawStream::Cpu(self)
    }
}
#[cfg(feature = "opencl")]
impl IntoRawStream for opencl::ClStream {
    fn into_raw(self) -> RawStream {
        RawStream::OpenCl(self)
    }
}
#[cfg(feature = "cuda")]
impl IntoRawStream for cuda::CuStream {
    fn into_raw(self) -> RawStream {
        RawStream::Cuda(self)
    }
}

/// A point in a stream's work. Cheap to clone.
#[derive(Clone)]
pub struct Event {
    raw: RawEvent,
}

impl Event {
    /// Blocks until the work before the event is done.
    ///
    /// # Errors
    /// A backend error (including an error of the work before the event).
    pub fn wait(&self) -> Result<()> {
        match &self.raw {
            RawEvent::Cpu(e) => e.wait(),
            #[cfg(feature = "opencl")]
            RawEvent::OpenCl(e) => e.wait(),
            #[cfg(feature = "cuda")]
            RawEvent::Cuda(e) => e.wait(),
        }
    }

    /// True once the work before the event is done. Never blocks.
    ///
    /// # Errors
    /// A backend error.
    pub fn is_complete(&self) -> Result<bool> {
        match &self.raw {
            RawEvent::Cpu(e) => e.is_complete(),
            #[cfg(feature = "opencl")]
            RawEvent::OpenCl(e) => e.is_complete(),
            #[cfg(feature = "cuda")]
            RawEvent::Cuda(e) => e.is_complete(),
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("complete", &self.is_complete().ok())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_traits() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<DeviceBuffer>();
    send_sync::<super::PinnedBuffer>();
    send_sync::<Stream>();
    send_sync::<Event>();
    let _ = |m: &cpu::CpuMem| m.len();
    let _ = |p: &cpu::CpuPinned| p.len();
}
