//! [`Stream`]s (in-order queues of device work) and their [`Event`]s.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::handle::{OnStream, StreamHandle, StreamUsers};
use super::usage::{At, Point};
use super::{Device, DeviceBuffer};
use crate::alloc::event as memory_events;
use crate::alloc::pool::Fence;
use crate::alloc::stats::{count_copy, count_wait, Direction};
use crate::backend::dispatch::{RawEvent, RawStream};
use crate::error::{check_range_with, Error, Result};

mod lent;
pub(crate) use lent::LentStream;

/// An in-order queue of work on one device (a CUDA stream, an OpenCL command queue).
///
/// Cheap to clone: clones are the same queue.
#[derive(Clone)]
pub struct Stream {
    device: StreamHandle,
    pub(crate) raw: Arc<RawStream>,
    id: u64,
}

/// Stream ids start at 1: 0 is the pools' host "stream".
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// A [`Stream`] without its device handle: what a device keeps of its own default stream (a
/// `Stream` there would hold the device that holds it, and neither would ever be freed).
#[derive(Clone)]
pub(crate) struct UnboundStream {
    raw: Arc<RawStream>,
    id: u64,
}

impl UnboundStream {
    /// The stream's id ([`Stream::id`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// True for a `cpu`-device stream (whose work is done when it returns).
    pub(crate) fn is_cpu(&self) -> bool {
        self.raw.is_cpu()
    }
}

impl Stream {
    /// A copy of the queue without the device handle (see [`UnboundStream`]).
    pub(crate) fn unbound(&self) -> UnboundStream {
        UnboundStream {
            raw: self.raw.clone(),
            id: self.id,
        }
    }

    /// The queue without the device handle (see [`UnboundStream`]).
    pub(crate) fn unbind(self) -> UnboundStream {
        UnboundStream {
            raw: self.raw,
            id: self.id,
        }
    }

    pub(crate) fn new(device: &Device) -> Result<Self> {
        let raw = Arc::new(device.shared.raw.new_stream()?);
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        let on = OnStream::new(
            device.clone(),
            UnboundStream {
                raw: raw.clone(),
                id,
            },
        );
        Ok(Self {
            device: StreamHandle::Own(Arc::new(StreamUsers::new(Arc::new(on)))),
            raw,
            id,
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

    /// The stream's handle to its device (see [`StreamHandle`]).
    pub(crate) fn device_handle(&self) -> &StreamHandle {
        &self.device
    }

    pub(super) fn check_buffer(&self, buf: &DeviceBuffer, op: &'static str) -> Result<()> {
        if buf.device().backend() != self.device.backend() {
            return Err(Error::DeviceMismatch {
                op,
                expected: self.device.label().to_string(),
                actual: buf.device().label().to_string(),
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

    /// Counts a copy made on this stream in the always-on counters and, when a sink is
    /// attached anywhere (one relaxed atomic load otherwise), publishes it to the sinks (the
    /// traces) attached to this device.
    pub(super) fn count_copy(&self, d: Direction, len: usize) {
        self.count_copy_from(d, len, None);
    }

    /// As [`Stream::count_copy`], for a copy from device `peer` (traced with it).
    fn count_copy_from(&self, d: Direction, len: usize, peer: Option<&Device>) {
        count_copy(d, len);
        if memory_events::active() {
            self.publish_copy(d, len, peer);
        }
    }

    /// Publishes a copy to the sinks attached to this device (out of line: the copy path
    /// only pays for it while one is attached).
    #[cold]
    fn publish_copy(&self, d: Direction, len: usize, peer: Option<&Device>) {
        let copy = memory_events::Event::Copy {
            device: self.device.label(),
            stream: self.id,
            direction: d,
            bytes: len,
            peer: peer.map(Device::label),
        };
        memory_events::publish(self.device.trace_source(), &copy);
    }

    /// The point of command `seq` of this stream, for the buffers it used (`None` on the `cpu`
    /// stream, whose commands are done when they return).
    pub(crate) fn point(&self, seq: u64) -> Option<Point> {
        (!self.raw.is_cpu()).then(|| Point {
            stream: self.raw.clone(),
            id: self.id,
            seq,
        })
    }

    /// The point after everything queued on this stream so far (`None` on the `cpu` stream).
    pub(crate) fn point_now(&self) -> Option<Point> {
        self.point(self.raw.last_seq())
    }

    /// [`Stream::point`], borrowed: to record on a buffer (no reference count taken where the
    /// buffer holds a point of this stream already).
    pub(crate) fn at(&self, seq: u64) -> Option<At<'_>> {
        (!self.raw.is_cpu()).then_some(At {
            stream: &self.raw,
            id: self.id,
            seq,
        })
    }

    /// Counts a host wait on this stream's work (never on the `cpu` stream).
    pub(super) fn count_wait(&self) {
        if !self.raw.is_cpu() {
            count_wait();
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
        // SAFETY: the caller's contract.
        unsafe { self.write_counted(dst, offset, src, len, blocking, Direction::HostToDevice) }
    }

    /// [`Stream::write_raw`], counted as `kind` (a refill is a copy to the device too).
    ///
    /// # Safety
    /// As [`Stream::write_raw`].
    pub(crate) unsafe fn write_counted(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
        kind: Direction,
    ) -> Result<()> {
        self.check_buffer(dst, "write")?;
        check_range_with(|| format!("write into {dst:?}"), offset, len, dst.len())?;
        let Some(mem) = dst.raw().filter(|_| len > 0) else {
            return Ok(());
        };
        dst.order_before(self, true)?;
        // SAFETY: range checked above; pointer validity is the caller's contract.
        let seq = unsafe { self.raw.write(mem, offset, src, len, blocking)? };
        dst.note(self.at(seq), true);
        if blocking {
            self.count_wait();
        }
        self.count_copy(kind, len);
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
        // SAFETY: the caller's contract.
        unsafe { self.read_counted(src, offset, dst, len, blocking, Direction::DeviceToHost) }
    }

    /// [`Stream::read_raw`], counted as `kind` (a spill is a copy to the host too).
    ///
    /// # Safety
    /// As [`Stream::read_raw`].
    pub(crate) unsafe fn read_counted(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
        kind: Direction,
    ) -> Result<()> {
        self.check_buffer(src, "read")?;
        check_range_with(|| format!("read from {src:?}"), offset, len, src.len())?;
        let Some(mem) = src.raw().filter(|_| len > 0) else {
            return Ok(());
        };
        src.order_before(self, false)?;
        // SAFETY: range checked above; pointer validity is the caller's contract.
        let seq = unsafe { self.raw.read(mem, offset, dst, len, blocking)? };
        src.note(self.at(seq), false);
        if blocking {
            self.count_wait();
        }
        self.count_copy(kind, len);
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
        check_range_with(|| format!("copy from {src:?}"), src_offset, len, src.len())?;
        check_range_with(|| format!("copy into {dst:?}"), dst_offset, len, dst.len())?;
        let (Some(s_mem), Some(d_mem)) = (src.raw(), dst.raw()) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        src.order_before(self, false)?;
        dst.order_before(self, true)?;
        let seq = self.raw.copy(s_mem, src_offset, d_mem, dst_offset, len)?;
        src.note(self.at(seq), false);
        dst.note(self.at(seq), true);
        // A copy from another device names it in the trace.
        let peer = Some(src.device()).filter(|d| !d.same(&self.device));
        self.count_copy_from(Direction::DeviceToDevice, len, peer);
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
        check_range_with(|| format!("fill of {dst:?}"), offset, len, dst.len())?;
        let Some(mem) = dst.raw().filter(|_| len > 0) else {
            return Ok(());
        };
        dst.order_before(self, true)?;
        let seq = self.raw.fill(mem, offset, len, value)?;
        dst.note(self.at(seq), true);
        Ok(())
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
        self.raw.wait_for(&event.raw)
    }

    /// How many commands (kernel launches, copies, fills) were queued on this stream so far:
    /// the difference over a call counts the launches it made.
    pub fn commands_queued(&self) -> u64 {
        self.raw.last_seq()
    }

    /// Blocks until all queued work is done.
    ///
    /// # Errors
    /// A backend error (including errors of earlier asynchronous work).
    pub fn synchronize(&self) -> Result<()> {
        self.count_wait();
        synchronize_raw(&self.raw)
    }

    /// The OpenCL command queue behind this stream (`None` for other backends).
    #[cfg(feature = "opencl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opencl")))]
    pub fn as_opencl(&self) -> Option<&opencl3::command_queue::CommandQueue> {
        self.raw.as_opencl()
    }

    /// The cudarc stream behind this stream (`None` for other backends), to launch kernels on.
    ///
    /// cudarc's event tracking is disabled on syncmem's contexts: order work on it against
    /// other streams with [`Event`]s or [`Stream::synchronize`], not with cudarc's implicit
    /// tracking.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn as_cuda(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        self.raw.as_cuda()
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
    Ok(Event { raw: raw.record()? })
}

fn synchronize_raw(raw: &RawStream) -> Result<()> {
    raw.synchronize()
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
    pub(crate) fn new(stream: &UnboundStream) -> Self {
        Self {
            raw: stream.raw.clone(),
            event: OnceLock::new(),
        }
    }

    /// A point after everything queued on the stream so far, work queued outside the crate
    /// included: a marker is queued now. `None` when the marker could not be queued (the
    /// stream was drained instead, so nothing of it is left to follow).
    pub(crate) fn point_now(&self, id: u64) -> Option<Point> {
        match self.raw.record() {
            Ok(_) => Some(Point {
                stream: self.raw.clone(),
                id,
                seq: self.raw.last_seq(),
            }),
            Err(_) => {
                let _ = synchronize_raw(&self.raw);
                None
            }
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
        self.event().is_none_or(|e| e.is_complete().unwrap_or(true))
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
        if !matches!(self.raw, RawEvent::Cpu(_)) && !self.raw.is_complete().unwrap_or(false) {
            count_wait();
        }
        self.raw.wait()
    }

    /// True once the work before the event is done. Never blocks.
    ///
    /// # Errors
    /// A backend error.
    pub fn is_complete(&self) -> Result<bool> {
        self.raw.is_complete()
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("complete", &self.is_complete().ok())
            .finish()
    }
}

impl Fence for Event {
    fn is_complete(&self) -> bool {
        Event::is_complete(self).unwrap_or(true)
    }
    fn wait(&self) {
        let _ = Event::wait(self);
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
}
