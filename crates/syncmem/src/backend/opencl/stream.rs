//! Streams (in-order command queues) and their marker events.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use opencl3::command_queue::{self as cq, CommandQueue};
use opencl3::memory::{
    CL_MAP_READ, CL_MAP_WRITE, CL_MAP_WRITE_INVALIDATE_REGION, CL_MEM_READ_WRITE,
};
use opencl3::types::{cl_bool, cl_event, cl_int, cl_mem, CL_BLOCKING, CL_NON_BLOCKING};

use super::error::{backend_error, enqueue_error, failed_command_error};
use super::handle::{ClContext, OwnedBuffer, OwnedEvent, Queue};
use super::ClMem;
use crate::backend::timeline::Timeline;
use crate::backend::{BackendEvent, BackendStream, MapAccess};
use crate::error::{Error, Result};

fn cl_bool_of(blocking: bool) -> cl_bool {
    if blocking {
        CL_BLOCKING
    } else {
        CL_NON_BLOCKING
    }
}

/// A stream: an in-order command queue, without profiling, and the timeline of its commands.
pub(crate) struct ClStream {
    pub(super) queue: Queue,
    pub(super) ctx: Arc<ClContext>,
    pub(super) label: Arc<str>,
    /// `label`, [`interned`](super::handle::interned): what each event keeps.
    pub(super) event_label: &'static str,
    pub(super) timeline: Timeline<ClEvent>,
}

impl ClStream {
    /// Enqueues one command with `enqueue` (which returns the command's event, one reference)
    /// and records it on the timeline; returns its sequence number. The queue is flushed, so
    /// the device starts on the command while the host goes on.
    pub(super) fn submit(&self, enqueue: impl FnOnce() -> Result<cl_event>) -> Result<u64> {
        let seq = self
            .timeline
            .submit(|| Ok(ClEvent(OwnedEvent::new(enqueue()?, self.event_label))))?;
        cq::flush(self.queue.raw()).map_err(|c| backend_error(&self.label, "clFlush", c))?;
        Ok(seq)
    }

    /// As [`ClStream::submit`] for a command that finished before returning (blocking).
    fn submit_blocking(&self, enqueue: impl FnOnce() -> Result<cl_event>) -> Result<u64> {
        self.timeline
            .submit_blocking(|| Ok(ClEvent(OwnedEvent::new(enqueue()?, self.event_label))))
    }

    /// As the `blocking` flag of a copy says.
    fn submit_as(&self, blocking: bool, enqueue: impl FnOnce() -> Result<cl_event>) -> Result<u64> {
        if blocking {
            self.submit_blocking(enqueue)
        } else {
            self.submit(enqueue)
        }
    }

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
    ) -> Result<u64> {
        self.submit(|| {
            // SAFETY: both handles are live buffers of this queue's context and the caller
            // checked both ranges; the regions do not overlap when src == dst (see `copy`).
            unsafe {
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
            .map_err(|c| enqueue_error(&self.label, "clEnqueueCopyBuffer", c, dst_len))
        })
    }
}

impl ClStream {
    /// Maps all of `mem` for the host, for `access` (`CL_MAP_READ`, `CL_MAP_READ |
    /// CL_MAP_WRITE`, or `CL_MAP_WRITE_INVALIDATE_REGION`). Returns the mapped address and the
    /// map command's sequence number; with `blocking`, the mapping is usable when this returns,
    /// else once that command completes.
    pub(crate) fn map(
        &self,
        mem: &ClMem,
        access: MapAccess,
        blocking: bool,
    ) -> Result<(*mut u8, u64)> {
        self.check_context(mem, "map")?;
        let flags = match access {
            MapAccess::Read => CL_MAP_READ,
            MapAccess::ReadWrite => CL_MAP_READ | CL_MAP_WRITE,
            MapAccess::Overwrite => CL_MAP_WRITE_INVALIDATE_REGION,
        };
        let mut mapped: *mut c_void = ptr::null_mut();
        let seq = self.submit_as(blocking, || {
            // SAFETY: `mem` is a live buffer of this queue's context; the whole buffer is
            // mapped; `mapped` receives the address (unmapped again by `unmap`).
            unsafe {
                cq::enqueue_map_buffer(
                    self.queue.raw(),
                    mem.buf.raw(),
                    cl_bool_of(blocking),
                    flags,
                    0,
                    mem.len,
                    &mut mapped,
                    0,
                    ptr::null(),
                )
            }
            .map_err(|c| enqueue_error(&self.label, "clEnqueueMapBuffer", c, mem.len))
        })?;
        Ok((mapped.cast::<u8>(), seq))
    }

    /// Unmaps the mapping at `ptr` of `mem` made by [`ClStream::map`]: queued, the device may
    /// use the buffer after it.
    pub(crate) fn unmap(&self, mem: &ClMem, ptr: *mut u8) -> Result<u64> {
        self.check_context(mem, "unmap")?;
        self.submit(|| {
            // SAFETY: `ptr` is an address `map` returned for `mem`, not unmapped since.
            unsafe {
                cq::enqueue_unmap_mem_object(
                    self.queue.raw(),
                    mem.buf.raw(),
                    ptr.cast::<c_void>(),
                    0,
                    ptr::null(),
                )
            }
            .map_err(|c| enqueue_error(&self.label, "clEnqueueUnmapMemObject", c, mem.len))
        })
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
    ) -> Result<u64> {
        self.check_context(dst, "write")?;
        self.submit_as(blocking, || {
            // SAFETY: the caller checked dst_off + len <= dst.len() and that `src` is valid
            // for `len` reads (until the command completes when not blocking).
            unsafe {
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
            .map_err(|c| enqueue_error(&self.label, "clEnqueueWriteBuffer", c, dst.len))
        })
    }

    unsafe fn read(
        &self,
        src: &ClMem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64> {
        self.check_context(src, "read")?;
        self.submit_as(blocking, || {
            // SAFETY: the caller checked src_off + len <= src.len() and that `dst` is valid for
            // `len` writes and untouched until the command completes.
            unsafe {
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
            .map_err(|c| enqueue_error(&self.label, "clEnqueueReadBuffer", c, src.len))
        })
    }

    fn copy(
        &self,
        src: &ClMem,
        src_off: usize,
        dst: &ClMem,
        dst_off: usize,
        len: usize,
    ) -> Result<u64> {
        self.check_context(src, "copy")?;
        self.check_context(dst, "copy")?;
        let same = src.buf.raw() == dst.buf.raw();
        let overlap =
            src_off < dst_off.saturating_add(len) && dst_off < src_off.saturating_add(len);
        if same && overlap {
            if src_off == dst_off {
                return Ok(self.timeline.last());
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

    fn fill(&self, dst: &ClMem, off: usize, len: usize, value: u8) -> Result<u64> {
        self.check_context(dst, "fill")?;
        let pattern = [value];
        self.submit(|| {
            // SAFETY: range checked by the caller; OpenCL copies the 1-byte pattern before
            // clEnqueueFillBuffer returns, so the local may go out of scope.
            unsafe {
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
            .map_err(|c| enqueue_error(&self.label, "clEnqueueFillBuffer", c, dst.len))
        })
    }

    fn record(&self) -> Result<ClEvent> {
        let seq = self.submit(|| {
            // SAFETY: a marker with an empty wait list on a live queue reads no host memory.
            unsafe { cq::enqueue_marker_with_wait_list(self.queue.raw(), 0, ptr::null()) }
                .map_err(|c| backend_error(&self.label, "clEnqueueMarkerWithWaitList", c))
        })?;
        // The marker is the newest command: its own event, unless it is already known complete.
        match self.timeline.covering(seq) {
            Some((_, e)) => Ok(e),
            None => self.record_done(),
        }
    }

    fn wait_for(&self, event: &ClEvent) -> Result<()> {
        self.barrier(event).map(drop)
    }

    fn synchronize(&self) -> Result<()> {
        let last = self.timeline.last();
        cq::finish(self.queue.raw()).map_err(|c| backend_error(&self.label, "clFinish", c))?;
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

    fn wait_on(&self, other: &ClStream, seq: u64) -> Result<()> {
        match other.timeline.covering(seq) {
            Some((_, e)) => self.barrier(&e).map(drop),
            None => Ok(()),
        }
    }
}

impl ClStream {
    /// Queues a barrier: later commands of this stream wait for `event`.
    fn barrier(&self, event: &ClEvent) -> Result<u64> {
        let list = [event.0.event];
        self.submit(|| {
            // SAFETY: `list` holds one live event (kept alive by `event`) for the duration of
            // the call; OpenCL retains it as long as the barrier needs it.
            unsafe { cq::enqueue_barrier_with_wait_list(self.queue.raw(), 1, list.as_ptr()) }
                .map_err(|c| backend_error(&self.label, "clEnqueueBarrierWithWaitList", c))
        })
    }

    /// A complete event: a marker waited for (rare: a marker just queued is already complete).
    fn record_done(&self) -> Result<ClEvent> {
        // SAFETY: a marker with an empty wait list on a live queue reads no host memory.
        let event = unsafe { cq::enqueue_marker_with_wait_list(self.queue.raw(), 0, ptr::null()) }
            .map_err(|c| backend_error(&self.label, "clEnqueueMarkerWithWaitList", c))?;
        let event = ClEvent(OwnedEvent::new(event, self.event_label));
        event.wait()?;
        Ok(event)
    }
}

/// The event of a command of a stream. Cloning retains it (no allocation).
#[derive(Clone)]
pub(crate) struct ClEvent(OwnedEvent);

impl BackendEvent for ClEvent {
    fn wait(&self) -> Result<()> {
        opencl3::event::wait_for_events(&[self.0.event])
            .map_err(|c| backend_error(self.0.label, "clWaitForEvents", c))
    }

    fn is_complete(&self) -> Result<bool> {
        let status: cl_int = opencl3::event::get_event_info(
            self.0.event,
            opencl3::event::CL_EVENT_COMMAND_EXECUTION_STATUS,
        )
        .map_err(|c| backend_error(self.0.label, "clGetEventInfo", c))?
        .into();
        if status < 0 {
            return Err(failed_command_error(self.0.label, status));
        }
        Ok(status == opencl3::event::CL_COMPLETE)
    }
}
