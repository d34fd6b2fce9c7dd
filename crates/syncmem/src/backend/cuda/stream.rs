//! Streams (non-blocking CUDA streams) and their events.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result::{self};
use cudarc::driver::sys::{self};
use cudarc::driver::{CudaEvent, CudaStream};

use crate::backend::timeline::Timeline;
use crate::backend::{BackendEvent, BackendStream};
use crate::error::{Error, Result};

use super::{error::*, memory::*, shared::*};

/// A non-blocking CUDA stream of one device, and the timeline of its commands.
///
/// Every command is followed by an event recorded on the stream. The timeline keeps the events
/// of the last [`crate::backend::timeline::RING`] commands; the event a new command pushes out
/// of that ring is recorded again for it when nothing else holds it, so a stream in steady
/// state creates no event and allocates nothing per command.
pub(crate) struct CuStream {
    pub(super) stream: Quiet<Arc<CudaStream>>,
    pub(super) shared: Arc<CuShared>,
    pub(super) timeline: Timeline<CuEvent>,
}

impl CuStream {
    /// The cudarc stream, for kernel launches.
    pub(crate) fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The raw stream handle, for driver calls.
    pub(super) fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Checks that `mem` lives on this stream's device (host copies and fills need that).
    pub(super) fn same_device(&self, mem: &CuMem, op: &'static str) -> Result<()> {
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

    /// Queues one command with `enqueue`, then an event after it, and records the command on
    /// the timeline; with `blocking`, waits for it. Returns the command's sequence number.
    pub(crate) fn submit(
        &self,
        blocking: bool,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<u64> {
        let seq = self.timeline.submit_reusing(|spare| {
            enqueue()?;
            self.new_event(spare)
        })?;
        if blocking {
            self.timeline.wait(seq)?;
        }
        Ok(seq)
    }

    /// An event recorded after everything queued so far: `spare` recorded again when it is
    /// this stream's and nothing but the timeline holds it (it is left in place when that
    /// record fails), else a new event.
    fn new_event(&self, spare: &mut Option<CuEvent>) -> Result<CuEvent> {
        // A clone of an event is only made from a live one, so a count of 1 seen under the
        // timeline's lock (which `spare` is borrowed from) stays 1. A wait queued earlier on the
        // event (cuStreamWaitEvent) keeps the record it saw: recording again does not move it.
        if let Some(e) = spare.take_if(|e| Arc::strong_count(&e.event) == 1) {
            return match e.event.record(&self.stream) {
                Ok(()) => Ok(e),
                Err(err) => {
                    *spare = Some(e);
                    Err(self.shared.err("cuEventRecord", err))
                }
            };
        }
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

    /// Queues a device-to-device copy of `len` bytes, between contexts when needed.
    pub(super) fn raw_copy(
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
pub(super) struct Staging<'a> {
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
    ) -> Result<u64> {
        self.same_device(dst, "write")?;
        self.shared.bind()?;
        self.submit(blocking, || {
            // SAFETY: `dst_off + len <= dst.len()` (checked by the caller) inside a live
            // allocation of this (current) context; `src` is valid for `len` reads, and when
            // not blocking stays valid until the command completes (the caller's contract).
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst.at(dst_off), src.cast::<c_void>(), len, self.raw())
            }
            .result()
            .map_err(|e| self.shared.err("cuMemcpyHtoDAsync", e))
        })
    }

    unsafe fn read(
        &self,
        src: &CuMem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64> {
        self.same_device(src, "read")?;
        self.shared.bind()?;
        self.submit(blocking, || {
            // SAFETY: mirror of `write`: the device range is checked and live, `dst` is valid
            // for `len` writes and untouched by anyone else until the copy completes (caller's
            // contract). No Rust reference to `dst` is formed.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src.at(src_off), len, self.raw())
            }
            .result()
            .map_err(|e| self.shared.err("cuMemcpyDtoHAsync", e))
        })
    }

    fn copy(
        &self,
        src: &CuMem,
        src_off: usize,
        dst: &CuMem,
        dst_off: usize,
        len: usize,
    ) -> Result<u64> {
        self.shared.bind()?;
        src.note_foreign(&self.stream);
        dst.note_foreign(&self.stream);
        let same_buffer = src.ptr == dst.ptr;
        if same_buffer && src_off == dst_off {
            return Ok(self.timeline.last());
        }
        let overlap = same_buffer && src_off < dst_off + len && dst_off < src_off + len;
        if !overlap {
            return self.submit(false, || {
                self.raw_copy(
                    dst.at(dst_off),
                    &dst.shared,
                    src.at(src_off),
                    &src.shared,
                    len,
                )
            });
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
        let seq = self.submit(false, || {
            self.raw_copy(tmp.ptr, &self.shared, src.at(src_off), &src.shared, len)?;
            self.raw_copy(dst.at(dst_off), &dst.shared, tmp.ptr, &self.shared, len)
        })?;
        drop(tmp);
        Ok(seq)
    }

    fn fill(&self, dst: &CuMem, off: usize, len: usize, value: u8) -> Result<u64> {
        self.same_device(dst, "fill")?;
        self.shared.bind()?;
        self.submit(false, || {
            // SAFETY: the range is checked by the caller and lies in a live allocation of this
            // (current) context; the stream belongs to it.
            unsafe { result::memset_d8_async(dst.at(off), value, len, self.raw()) }
                .map_err(|e| self.shared.err("cuMemsetD8Async", e))
        })
    }

    fn record(&self) -> Result<CuEvent> {
        let seq = self.submit(false, || Ok(()))?;
        match self.timeline.covering(seq) {
            Some((_, e)) => Ok(e),
            None => self.new_event(&mut None),
        }
    }

    fn wait_for(&self, event: &CuEvent) -> Result<()> {
        // cuStreamWaitEvent accepts an event of another context or device.
        self.stream
            .wait(&event.event)
            .map_err(|e| self.shared.err("cuStreamWaitEvent", e))
    }

    fn synchronize(&self) -> Result<()> {
        let last = self.timeline.last();
        self.stream
            .synchronize()
            .map_err(|e| self.shared.err("cuStreamSynchronize", e))?;
        self.timeline.mark_done(last);
        Ok(())
    }

    fn last_seq(&self) -> u64 {
        self.timeline.last()
    }

    fn is_done(&self, seq: u64) -> Result<bool> {
        self.timeline.is_done(seq)
    }

    fn wait_done(&self, seq: u64) -> Result<bool> {
        self.timeline.wait(seq)
    }

    fn wait_on(&self, other: &CuStream, seq: u64) -> Result<()> {
        match other.timeline.covering(seq) {
            Some((_, e)) => self.wait_for(&e),
            None => Ok(()),
        }
    }
}

/// An event recorded on a [`CuStream`] (timing disabled). Clones share the event.
#[derive(Clone)]
pub(crate) struct CuEvent {
    pub(super) event: Arc<Quiet<CudaEvent>>,
    pub(super) shared: Arc<CuShared>,
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
