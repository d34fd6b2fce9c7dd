//! The stream commands, dispatched: a [`RawStream`] and the [`RawMem`] it works on go to their
//! backend's implementation with one `match` per command; memory or events of another backend
//! are a [`crate::Error::DeviceMismatch`].

#[cfg(feature = "cuda")]
use std::sync::Arc;

use super::{each, mismatch, RawEvent, RawMem, RawStream};
use crate::backend::{BackendStream, MapAccess};
use crate::error::Result;

impl RawStream {
    fn label(&self) -> &'static str {
        match self {
            RawStream::Cpu(_) => "a cpu stream",
            #[cfg(feature = "opencl")]
            RawStream::OpenCl(_) => "an OpenCL stream",
            #[cfg(feature = "cuda")]
            RawStream::Cuda(_) => "a CUDA stream",
        }
    }

    /// Copies `len` bytes from host `src` into `dst` at `dst_off`.
    ///
    /// # Safety
    /// As [`BackendStream::write`].
    pub(crate) unsafe fn write(
        &self,
        dst: &RawMem,
        dst_off: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64> {
        match (self, dst) {
            (RawStream::Cpu(s), RawMem::Cpu(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.write(m, dst_off, src, len, blocking) }
            }
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.write(m, dst_off, src, len, blocking) }
            }
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawMem::Cuda(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.write(m, dst_off, src, len, blocking) }
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("write", self.label())),
        }
    }

    /// Copies `len` bytes from `src` at `src_off` into host `dst`.
    ///
    /// # Safety
    /// As [`BackendStream::read`].
    pub(crate) unsafe fn read(
        &self,
        src: &RawMem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64> {
        match (self, src) {
            (RawStream::Cpu(s), RawMem::Cpu(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.read(m, src_off, dst, len, blocking) }
            }
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.read(m, src_off, dst, len, blocking) }
            }
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawMem::Cuda(m)) => {
                // SAFETY: forwarded to the caller's contract.
                unsafe { s.read(m, src_off, dst, len, blocking) }
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("read", self.label())),
        }
    }

    /// Device-to-device copy of `len` bytes, queued.
    pub(crate) fn copy(
        &self,
        src: &RawMem,
        src_off: usize,
        dst: &RawMem,
        dst_off: usize,
        len: usize,
    ) -> Result<u64> {
        match (self, src, dst) {
            (RawStream::Cpu(s), RawMem::Cpu(a), RawMem::Cpu(b)) => {
                s.copy(a, src_off, b, dst_off, len)
            }
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(a), RawMem::OpenCl(b)) => {
                s.copy(a, src_off, b, dst_off, len)
            }
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawMem::Cuda(a), RawMem::Cuda(b)) => {
                s.copy(a, src_off, b, dst_off, len)
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("copy", self.label())),
        }
    }

    /// Sets `len` bytes of `dst` from `off` to `value`, queued.
    pub(crate) fn fill(&self, dst: &RawMem, off: usize, len: usize, value: u8) -> Result<u64> {
        match (self, dst) {
            (RawStream::Cpu(s), RawMem::Cpu(m)) => s.fill(m, off, len, value),
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(m)) => s.fill(m, off, len, value),
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawMem::Cuda(m)) => s.fill(m, off, len, value),
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("fill", self.label())),
        }
    }

    /// Maps all of `mem` for host access of kind `access` and returns the mapped address with
    /// the map command's sequence number (usable once that command completes; at once with
    /// `blocking`). Memory the host uses in place without map calls (`cpu`, CUDA mapped
    /// memory) maps to its host address, with nothing queued.
    ///
    /// # Errors
    /// A backend error; [`crate::Error::Unsupported`] for memory without a host address.
    pub(crate) fn map(
        &self,
        mem: &RawMem,
        access: MapAccess,
        blocking: bool,
    ) -> Result<(*mut u8, u64)> {
        match (self, mem) {
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(m)) => s.map(m, access, blocking),
            (s, m) => match m.host_ptr() {
                Some(p) => {
                    let _ = (access, blocking);
                    Ok((p, s.last_seq()))
                }
                None => Err(mismatch("map", self.label())),
            },
        }
    }

    /// Unmaps the mapping at `ptr` of `mem` made by [`RawStream::map`]: queued; returns the
    /// command's sequence number (nothing to do for memory the host uses in place).
    ///
    /// # Errors
    /// A backend error.
    pub(crate) fn unmap(&self, mem: &RawMem, ptr: *mut u8) -> Result<u64> {
        match (self, mem) {
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawMem::OpenCl(m)) => s.unmap(m, ptr),
            (s, _) => {
                let _ = ptr;
                Ok(s.last_seq())
            }
        }
    }

    /// An event after everything queued so far.
    pub(crate) fn record(&self) -> Result<RawEvent> {
        each!(self, RawStream, s => s.record(), into RawEvent)
    }

    /// Makes later work on this stream wait for `event`.
    pub(crate) fn wait_for(&self, event: &RawEvent) -> Result<()> {
        match (self, event) {
            (RawStream::Cpu(s), RawEvent::Cpu(e)) => s.wait_for(e),
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawEvent::OpenCl(e)) => s.wait_for(e),
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawEvent::Cuda(e)) => s.wait_for(e),
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("wait_for", self.label())),
        }
    }

    /// Blocks until all queued work is done.
    pub(crate) fn synchronize(&self) -> Result<()> {
        each!(self, RawStream, s => s.synchronize())
    }

    /// The sequence number of the newest command (see [`crate::backend::timeline`]).
    pub(crate) fn last_seq(&self) -> u64 {
        each!(self, RawStream, s => s.last_seq())
    }

    /// True once command `seq` has completed; never blocks.
    pub(crate) fn is_done(&self, seq: u64) -> Result<bool> {
        each!(self, RawStream, s => s.is_done(seq))
    }

    /// Blocks until command `seq` has completed; returns whether it had to wait.
    pub(crate) fn wait_done(&self, seq: u64) -> Result<bool> {
        each!(self, RawStream, s => s.wait_done(seq))
    }

    /// Makes later work on this stream wait, on the device, for command `seq` of `other`.
    pub(crate) fn wait_on(&self, other: &RawStream, seq: u64) -> Result<()> {
        match (self, other) {
            (RawStream::Cpu(s), RawStream::Cpu(o)) => s.wait_on(o, seq),
            #[cfg(feature = "opencl")]
            (RawStream::OpenCl(s), RawStream::OpenCl(o)) => s.wait_on(o, seq),
            #[cfg(feature = "cuda")]
            (RawStream::Cuda(s), RawStream::Cuda(o)) => s.wait_on(o, seq),
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("stream dependency", self.label())),
        }
    }

    /// True for a stream of the `cpu` backend (everything finishes before returning).
    pub(crate) fn is_cpu(&self) -> bool {
        matches!(self, RawStream::Cpu(_))
    }

    /// The OpenCL command queue (`None` for other backends).
    #[cfg(feature = "opencl")]
    pub(crate) fn as_opencl(&self) -> Option<&opencl3::command_queue::CommandQueue> {
        match self {
            RawStream::OpenCl(s) => Some(s.queue()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The cudarc stream (`None` for other backends).
    #[cfg(feature = "cuda")]
    pub(crate) fn as_cuda(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match self {
            RawStream::Cuda(s) => Some(s.cuda_stream()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}
