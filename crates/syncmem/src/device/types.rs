//! Device memory, pinned host memory, streams and events: the public wrappers over the backends.

use std::fmt;
use std::sync::Arc;

use super::backend::{BackendDevice, BackendEvent, BackendMem, BackendPinned, BackendStream};
#[cfg(feature = "cuda")]
use super::cuda;
#[cfg(feature = "opencl")]
use super::opencl;
use super::{cpu, with_raw_device, Device, RawDevice};
use crate::alloc::stats::{Direction, COPIES};
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

/// Device memory. Freed, by the backend that made it, when dropped.
///
/// Writing into a `DeviceBuffer` (through a [`Stream`]) takes `&mut`, reading takes `&`.
pub struct DeviceBuffer {
    device: Device,
    len: usize,
    /// `None` when `len == 0`: nothing is allocated.
    pub(crate) raw: Option<RawMem>,
}

impl DeviceBuffer {
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self {
                device: device.clone(),
                len,
                raw: None,
            });
        }
        let max = device.info().max_alloc;
        if (len as u64) > max {
            return Err(Error::OutOfMemory {
                device: device.label().to_string(),
                requested: len,
                detail: format!(" (above the device's largest single allocation, {max} bytes)"),
            });
        }
        let raw = match &device.shared.raw {
            RawDevice::Cpu(d) => RawMem::Cpu(d.alloc(len)?),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl(d) => RawMem::OpenCl(d.alloc(len)?),
            #[cfg(feature = "cuda")]
            RawDevice::Cuda(d) => RawMem::Cuda(d.alloc(len)?),
        };
        device.shared.mem.on_alloc(len);
        Ok(Self {
            device: device.clone(),
            len,
            raw: Some(raw),
        })
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
    pub fn as_opencl(&self) -> Option<&opencl3::memory::Buffer<u8>> {
        match &self.raw {
            Some(RawMem::OpenCl(m)) => Some(m.buffer()),
            _ => None,
        }
    }

    /// The CUDA device memory, to pass to kernels (`None` for other backends or length 0).
    #[cfg(feature = "cuda")]
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
        if self.raw.take().is_some() {
            self.device.shared.mem.on_free(self.len);
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

/// Page-locked host memory belonging to a device, zero-filled at allocation.
pub struct PinnedBuffer {
    device: Device,
    len: usize,
    raw: Option<RawPinned>,
}

impl PinnedBuffer {
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self {
                device: device.clone(),
                len,
                raw: None,
            });
        }
        let raw = match &device.shared.raw {
            RawDevice::Cpu(d) => RawPinned::Cpu(d.alloc_pinned(len)?),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl(d) => RawPinned::OpenCl(d.alloc_pinned(len)?),
            #[cfg(feature = "cuda")]
            RawDevice::Cuda(d) => RawPinned::Cuda(d.alloc_pinned(len)?),
        };
        device.shared.pinned.on_alloc(len);
        Ok(Self {
            device: device.clone(),
            len,
            raw: Some(raw),
        })
    }

    /// Start of the mapping (aligned dangling when empty).
    pub(crate) fn ptr(&self) -> *mut u8 {
        match &self.raw {
            None => std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            Some(RawPinned::Cpu(p)) => p.as_ptr(),
            #[cfg(feature = "opencl")]
            Some(RawPinned::OpenCl(p)) => p.as_ptr(),
            #[cfg(feature = "cuda")]
            Some(RawPinned::Cuda(p)) => p.as_ptr(),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device this memory is pinned for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the backend guarantees ptr is valid for len initialised (zero-filled) bytes
        // until drop; `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.raw.take().is_some() {
            self.device.shared.pinned.on_free(self.len);
        }
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
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
    raw: Arc<RawStream>,
}

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

impl Stream {
    pub(crate) fn new(device: &Device) -> Result<Self> {
        let raw = with_raw_device!(&device.shared.raw, d => d.new_stream().map(wrap_stream))?;
        Ok(Self {
            device: device.clone(),
            raw: Arc::new(raw),
        })
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
        COPIES.record(Direction::HostToDevice, len);
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
        COPIES.record(Direction::DeviceToHost, len);
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
        COPIES.record(Direction::DeviceToDevice, len);
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
        let raw = match &*self.raw {
            RawStream::Cpu(s) => s.record().map(RawEvent::Cpu),
            #[cfg(feature = "opencl")]
            RawStream::OpenCl(s) => s.record().map(RawEvent::OpenCl),
            #[cfg(feature = "cuda")]
            RawStream::Cuda(s) => s.record().map(RawEvent::Cuda),
        }?;
        Ok(Event { raw })
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
        match &*self.raw {
            RawStream::Cpu(s) => s.synchronize(),
            #[cfg(feature = "opencl")]
            RawStream::OpenCl(s) => s.synchronize(),
            #[cfg(feature = "cuda")]
            RawStream::Cuda(s) => s.synchronize(),
        }
    }

    /// The OpenCL command queue behind this stream (`None` for other backends).
    #[cfg(feature = "opencl")]
    pub fn as_opencl(&self) -> Option<&opencl3::command_queue::CommandQueue> {
        match &*self.raw {
            RawStream::OpenCl(s) => Some(s.queue()),
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
    send_sync::<PinnedBuffer>();
    send_sync::<Stream>();
    send_sync::<Event>();
    let _ = |m: &cpu::CpuMem| m.len();
    let _ = |p: &cpu::CpuPinned| p.len();
}
