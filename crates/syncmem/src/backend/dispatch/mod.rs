//! The backends behind one type each: [`RawDevice`], [`RawMem`], [`RawPinned`], [`RawStream`]
//! and [`RawEvent`] hold the implementation of whichever backend a device belongs to, and
//! every method below is the one `match` that dispatches it. A pair of objects of different
//! backends (a stream of one, memory of another) is a [`Error::DeviceMismatch`], never a panic.
//! The kernels are dispatched the same way in [`kernels`].

mod kernels;
mod stream;
mod user;

pub(crate) use user::{RawArg, RawUserKernel};

use std::sync::Arc;

use super::cpu::{CpuDevice, CpuEvent, CpuMem, CpuPinned, CpuStream};
#[cfg(feature = "cuda")]
use super::cuda::{CuDevice, CuEvent, CuMem, CuPinned, CuStream};
#[cfg(feature = "opencl")]
use super::opencl::{ClDevice, ClEvent, ClMem, ClPinned, ClStream};
use super::{
    BackendDevice, BackendEvent, BackendMem, BackendPinned, DeviceInfo, KeepAlive, RawStorage,
};
use crate::error::{Error, OomReport, Result};

/// One device of some backend.
pub(crate) enum RawDevice {
    Cpu(CpuDevice),
    #[cfg(feature = "opencl")]
    OpenCl(ClDevice),
    #[cfg(feature = "cuda")]
    Cuda(CuDevice),
}

/// Device memory of some backend.
pub(crate) enum RawMem {
    Cpu(CpuMem),
    #[cfg(feature = "opencl")]
    OpenCl(ClMem),
    #[cfg(feature = "cuda")]
    Cuda(CuMem),
}

/// Pinned host memory of some backend.
pub(crate) enum RawPinned {
    Cpu(CpuPinned),
    #[cfg(feature = "opencl")]
    OpenCl(ClPinned),
    #[cfg(feature = "cuda")]
    Cuda(CuPinned),
}

/// A stream of some backend.
pub(crate) enum RawStream {
    Cpu(CpuStream),
    #[cfg(feature = "opencl")]
    OpenCl(ClStream),
    #[cfg(feature = "cuda")]
    Cuda(CuStream),
}

/// An event of some backend.
#[derive(Clone)]
pub(crate) enum RawEvent {
    Cpu(CpuEvent),
    #[cfg(feature = "opencl")]
    OpenCl(ClEvent),
    #[cfg(feature = "cuda")]
    Cuda(CuEvent),
}

/// Runs `$body` with `$x` bound to the backend object inside `$raw`, and wraps the result into
/// the enum `$out` of the same backend (`|` for no wrapping).
macro_rules! each {
    ($raw:expr, $ty:ident, $x:ident => $body:expr) => {
        match $raw {
            $ty::Cpu($x) => $body,
            #[cfg(feature = "opencl")]
            $ty::OpenCl($x) => $body,
            #[cfg(feature = "cuda")]
            $ty::Cuda($x) => $body,
        }
    };
    ($raw:expr, $ty:ident, $x:ident => $body:expr, into $out:ident) => {
        match $raw {
            $ty::Cpu($x) => $body.map($out::Cpu),
            #[cfg(feature = "opencl")]
            $ty::OpenCl($x) => $body.map($out::OpenCl),
            #[cfg(feature = "cuda")]
            $ty::Cuda($x) => $body.map($out::Cuda),
        }
    };
}
pub(crate) use each;

/// The error of two objects of different backends used together.
pub(crate) fn mismatch(op: &'static str, expected: &str) -> Error {
    Error::DeviceMismatch {
        op,
        expected: expected.to_string(),
        actual: "an object of another backend".to_string(),
    }
}

impl RawDevice {
    /// Facts about the device.
    pub(crate) fn info(&self) -> &DeviceInfo {
        each!(self, RawDevice, d => d.info())
    }

    /// Whether a stream of this device can copy a buffer of `other` into one of its own with
    /// one device command: OpenCL devices of one context. Elsewhere (other backends, other
    /// contexts, CUDA peers) copies between devices go through the host.
    pub(crate) fn copies_directly_from(&self, other: &RawDevice) -> bool {
        match (self, other) {
            #[cfg(feature = "opencl")]
            (RawDevice::OpenCl(a), RawDevice::OpenCl(b)) => a.shares_context(b),
            _ => false,
        }
    }

    /// Refuses a request above the device's largest single allocation before any driver sees
    /// it (a driver may assert instead of failing).
    fn check_max_alloc(&self, bytes: usize) -> Result<()> {
        let info = self.info();
        if bytes as u64 <= info.max_alloc {
            return Ok(());
        }
        Err(OomReport::new(
            info.label(),
            bytes,
            format!(
                "above the device's largest single allocation, {} bytes",
                info.max_alloc
            ),
        )
        .with_max_alloc(info.max_alloc)
        .into())
    }

    /// Allocates `bytes >= 1` of device memory (no zero fill, no accounting).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] above [`DeviceInfo::max_alloc`] (checked here, before the
    /// backend is called) or when the backend refuses.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<RawMem> {
        self.check_max_alloc(bytes)?;
        each!(self, RawDevice, d => d.alloc(bytes), into RawMem)
    }

    /// Allocates `bytes >= 1` of device memory the host can use in place (see
    /// [`RawMem::host_ptr`]; no accounting): the device's own memory on `cpu`, a buffer over a
    /// page-aligned host block on OpenCL, mapped pinned memory on CUDA. Only sensible on a
    /// device whose memory is host memory ([`DeviceInfo::host_unified`]).
    pub(crate) fn alloc_unified(&self, bytes: usize) -> Result<RawMem> {
        match self {
            RawDevice::Cpu(d) => d.alloc(bytes).map(RawMem::Cpu),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl(d) => d.alloc_unified(bytes).map(RawMem::OpenCl),
            #[cfg(feature = "cuda")]
            RawDevice::Cuda(d) => d.alloc_unified(bytes).map(RawMem::Cuda),
        }
    }

    /// Allocates `bytes >= 1` of zero-filled pinned host memory (no accounting).
    ///
    /// # Errors
    /// As [`RawDevice::alloc`]: OpenCL pinned memory is a device buffer
    /// (`CL_MEM_ALLOC_HOST_PTR`), bound by [`DeviceInfo::max_alloc`]; CUDA's and the host's
    /// are plain host memory, bound only by what the system gives.
    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<RawPinned> {
        #[cfg(feature = "opencl")]
        if let RawDevice::OpenCl(_) = self {
            self.check_max_alloc(bytes)?;
        }
        each!(self, RawDevice, d => d.alloc_pinned(bytes), into RawPinned)
    }

    /// A new stream of the device.
    pub(crate) fn new_stream(&self) -> Result<RawStream> {
        each!(self, RawDevice, d => d.new_stream(), into RawStream)
    }

    /// The alignment sub-buffer offsets need on this device.
    pub(crate) fn sub_align(&self) -> usize {
        each!(self, RawDevice, d => d.sub_align())
    }

    /// A view of `len` bytes at `offset` of pool segment `seg` (which it keeps alive).
    pub(crate) fn sub_mem(&self, seg: &Arc<RawMem>, offset: usize, len: usize) -> Result<RawMem> {
        let keep: KeepAlive = seg.clone();
        match (self, &**seg) {
            (RawDevice::Cpu(d), RawMem::Cpu(m)) => d.sub_mem(m, offset, len, keep).map(RawMem::Cpu),
            #[cfg(feature = "opencl")]
            (RawDevice::OpenCl(d), RawMem::OpenCl(m)) => {
                d.sub_mem(m, offset, len, keep).map(RawMem::OpenCl)
            }
            #[cfg(feature = "cuda")]
            (RawDevice::Cuda(d), RawMem::Cuda(m)) => {
                d.sub_mem(m, offset, len, keep).map(RawMem::Cuda)
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("sub-buffer", &self.info().label())),
        }
    }

    /// A second backend device for the same hardware (same context), for an isolated device.
    pub(crate) fn duplicate(&self) -> RawDevice {
        match self {
            RawDevice::Cpu(_) => RawDevice::Cpu(CpuDevice::new()),
            #[cfg(feature = "opencl")]
            RawDevice::OpenCl(d) => RawDevice::OpenCl(d.duplicate()),
            #[cfg(feature = "cuda")]
            RawDevice::Cuda(d) => RawDevice::Cuda(d.duplicate()),
        }
    }
}

/// The device's own memory, as the storage of its device pool.
impl RawStorage for RawDevice {
    type Segment = RawMem;
    type View = RawMem;

    fn alloc(&self, bytes: usize) -> Result<RawMem> {
        RawDevice::alloc(self, bytes)
    }

    fn view(&self, segment: &Arc<RawMem>, offset: usize, len: usize) -> Result<RawMem> {
        self.sub_mem(segment, offset, len)
    }
}

/// A device's memory that the host can use in place ([`RawDevice::alloc_unified`]), as the
/// storage of its device pool when buffers share one allocation between host and device.
pub(crate) struct UnifiedStorage<'a>(pub(crate) &'a RawDevice);

impl RawStorage for UnifiedStorage<'_> {
    type Segment = RawMem;
    type View = RawMem;

    fn alloc(&self, bytes: usize) -> Result<RawMem> {
        self.0.alloc_unified(bytes)
    }

    fn view(&self, segment: &Arc<RawMem>, offset: usize, len: usize) -> Result<RawMem> {
        self.0.sub_mem(segment, offset, len)
    }
}

/// A device's pinned host memory, as the storage of its pinned pool (blocks are used through
/// their segment and offset: no views).
pub(crate) struct PinnedStorage<'a>(pub(crate) &'a RawDevice);

impl RawStorage for PinnedStorage<'_> {
    type Segment = RawPinned;
    type View = ();

    fn alloc(&self, bytes: usize) -> Result<RawPinned> {
        self.0.alloc_pinned(bytes)
    }

    fn view(&self, _: &Arc<RawPinned>, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

impl RawMem {
    /// Size in bytes.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        each!(self, RawMem, m => m.len())
    }

    /// The host address of the first byte of memory the host can use in place: a `cpu`
    /// buffer, or memory made by [`RawDevice::alloc_unified`] (and views of it). `None` for
    /// other device memory.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match self {
            RawMem::Cpu(m) => Some(m.as_ptr()),
            #[cfg(feature = "opencl")]
            RawMem::OpenCl(m) => m.host_ptr(),
            #[cfg(feature = "cuda")]
            RawMem::Cuda(m) => m.host_ptr(),
        }
    }

    /// Whether the host may use this memory at [`RawMem::host_ptr`] in place of the device's:
    /// always for `cpu` memory and CUDA mapped memory; for an OpenCL buffer over a host block,
    /// when mapping its segment gave the block's address (checked when the segment was made).
    pub(crate) fn in_place(&self) -> bool {
        match self {
            RawMem::Cpu(_) => true,
            #[cfg(feature = "opencl")]
            RawMem::OpenCl(m) => m.host_ptr().is_some() && m.in_place() == Some(true),
            #[cfg(feature = "cuda")]
            RawMem::Cuda(m) => m.host_ptr().is_some(),
        }
    }

    /// True when a new segment of this memory reads as zeros (a `cpu` block, an OpenCL buffer
    /// over a zeroed host block); CUDA memory is not zero-filled.
    pub(crate) fn fresh_is_zero(&self) -> bool {
        match self {
            RawMem::Cpu(_) => true,
            #[cfg(feature = "opencl")]
            RawMem::OpenCl(m) => m.host_ptr().is_some(),
            #[cfg(feature = "cuda")]
            RawMem::Cuda(_) => false,
        }
    }

    /// Readies a pool block's view for the block's next user, as dropping it would have: the
    /// CUDA backend drains the streams of other devices that copied from or into it (the pool's
    /// events do not cover them). Nothing to do elsewhere.
    pub(crate) fn recycle(&mut self) {
        match self {
            #[cfg(feature = "cuda")]
            RawMem::Cuda(m) => m.drain_foreign(),
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

impl RawPinned {
    /// Start of the host mapping, valid for `len()` bytes while `self` lives.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        each!(self, RawPinned, p => p.as_ptr())
    }

    /// Size in bytes.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        each!(self, RawPinned, p => p.len())
    }
}

impl RawEvent {
    /// Blocks until the work before the event is done.
    pub(crate) fn wait(&self) -> Result<()> {
        each!(self, RawEvent, e => e.wait())
    }

    /// True once the work before the event is done; never blocks.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        each!(self, RawEvent, e => e.is_complete())
    }
}

impl RawMem {
    /// The memory's address for foreign code: a `cpu` block's host address, an OpenCL
    /// buffer's `cl_mem` handle, a CUDA allocation's device pointer.
    pub(crate) fn native_address(&self) -> usize {
        match self {
            RawMem::Cpu(m) => m.as_ptr() as usize,
            #[cfg(feature = "opencl")]
            RawMem::OpenCl(m) => opencl3::memory::ClMem::get(m.buffer()) as usize,
            #[cfg(feature = "cuda")]
            RawMem::Cuda(m) => m.device_ptr() as usize,
        }
    }

    /// The OpenCL buffer (`None` for other backends).
    #[cfg(feature = "opencl")]
    pub(crate) fn as_opencl(&self) -> Option<&opencl3::memory::Buffer<u8>> {
        match self {
            RawMem::OpenCl(m) => Some(m.buffer()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The CUDA memory (`None` for other backends).
    #[cfg(feature = "cuda")]
    pub(crate) fn as_cuda(&self) -> Option<&cudarc::driver::CudaSlice<u8>> {
        match self {
            RawMem::Cuda(m) => Some(m.slice()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The `cpu`-device memory (`None` for other backends).
    pub(crate) fn as_cpu(&self) -> Option<&CpuMem> {
        match self {
            RawMem::Cpu(m) => Some(m),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The `cpu`-device memory, mutably (`None` for other backends).
    pub(crate) fn as_cpu_mut(&mut self) -> Option<&mut CpuMem> {
        match self {
            RawMem::Cpu(m) => Some(m),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

#[allow(dead_code)]
fn _assert_traits() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RawDevice>();
    send_sync::<RawMem>();
    send_sync::<RawPinned>();
    send_sync::<RawStream>();
    send_sync::<RawEvent>();
}
