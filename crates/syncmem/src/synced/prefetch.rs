//! Asynchronous transfers: copies queued on a stream, waited for by the accesses they conflict
//! with.

use super::shared::{Mapping, ZeroCopyState};
use super::state::{Access, Place};
use super::{PendingKind, SyncedMemory};
use crate::alloc::stats::Direction;
use crate::device::{Event, MapAccess, Stream, ZeroCopyProtocol};
use crate::error::Result;

#[cfg(doc)]
use super::Head;
#[cfg(doc)]
use crate::error::Error;

impl SyncedMemory {
    /// Queues the host-to-device copy on `stream` (the buffer's stream when `None`) and returns
    /// without waiting (Caffe's `async_gpu_push`). Head reads [`Head::Synced`] at once; the first
    /// access that needs the device data, or a host write, waits for the copy. Host reads do not.
    ///
    /// Returns the copy's event, or `None` when the device was already current or no copy is
    /// needed (zero-copy: the host and the device share the memory; see
    /// [`crate::device::zero_copy`]).
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the buffer is uninitialized (nothing to push, as in Caffe),
    /// [`Error::NoDevice`], [`Error::Busy`] when this thread holds a write guard of the buffer,
    /// out of memory, or a backend error.
    pub fn prefetch_to_device(&self, stream: Option<&Stream>) -> Result<Option<Event>> {
        let _lock = self.lock_read(None)?;
        let mut core = self.shared.core.lock();
        if let Some(stream) = self.behind_download(&core, stream)? {
            return self.upload_behind_download(&mut core, &stream);
        }
        self.settle(&mut core, Access::DeviceRead)?;
        self.refuse_if_dropped(&core, "prefetch_to_device")?;
        // Only replicas on other devices are current: the data comes back first (blocking).
        self.pull_if_elsewhere(&mut core)?;
        if core.coh.has(Place::Device) {
            return Ok(None);
        }
        if core.coh.is_fresh() {
            return Err(self.uninit("prefetch_to_device"));
        }
        let stream = self.pick_stream(stream)?;
        self.note_device_use();
        // Under the shared lock: a host reader may still use the host mirror.
        let dev = self.ensure_dev_alloc(&mut core, false)?;
        if core.zc.is_some() {
            // Shared memory (a spilled buffer's data moved in while allocating, if it was one):
            // nothing to copy, nothing queued but an unmap where the device needs one.
            if !core.coh.has(Place::Device) {
                self.shared_device(&mut core, Access::DeviceRead, false, &stream)?;
            }
            return Ok(None);
        }
        let src = core.host_ptr().ok_or_else(|| self.no_host())?;
        // SAFETY: `src` is the host mirror, valid for `size` bytes. It stays alive and
        // unmodified until the event completes: it is freed or replaced only under the exclusive
        // lock after `finish_pending`, and host writes conflict with `ToDevice` and wait.
        unsafe { stream.write_raw(&dev, 0, src, self.len(), false)? };
        // The event first, then the point after it: an access that waits for the transfer
        // waits for the event too, so the event a caller holds is complete once it returns.
        let event = stream.record()?;
        let point = stream.point_now();
        self.count(Direction::HostToDevice);
        core.coh.queued(PendingKind::ToDevice, point);
        Ok(Some(event))
    }

    /// The stream of a copy to the host still in flight whose device mirror went already
    /// (freed ordered after it: see [`SyncedMemory::offload`]), when a prefetch to the device
    /// on `stream` can queue its upload behind that copy, on the same stream, instead of
    /// waiting for it: a buffer with two mirrors brought back on the stream that took it out.
    fn behind_download(
        &self,
        core: &super::Core,
        stream: Option<&Stream>,
    ) -> Result<Option<Stream>> {
        let Some(p) = core.coh.pending() else {
            return Ok(None);
        };
        if p.kind != PendingKind::ToHost
            || core.dev.is_some()
            || core.host.is_none()
            || core.parked()
            || self.share_protocol().is_some()
            || p.point.is_done()
        {
            return Ok(None);
        }
        let stream = self.pick_stream(stream)?;
        Ok((stream.id() == p.point.id).then(|| stream.to_stream()))
    }

    /// Queues the upload of the host mirror on `stream`, behind the copy into it in flight on
    /// the same stream (see [`SyncedMemory::behind_download`]): the stream runs them in order,
    /// so the upload reads what that copy wrote, and nobody waits. The device mirror is
    /// current from now on; the host still waits for its copy.
    fn upload_behind_download(
        &self,
        core: &mut super::Core,
        stream: &Stream,
    ) -> Result<Option<Event>> {
        self.note_device_use();
        let dev = self.ensure_dev_alloc(core, false)?;
        let src = core.host_ptr().ok_or_else(|| self.no_host())?;
        // SAFETY: `src` is the host mirror, valid for `size` bytes. The copy into it in flight
        // runs before the upload on this stream; host writes and frees of it wait for both
        // (the copy is pending, the upload recorded as its reader).
        unsafe { stream.write_raw(&dev, 0, src, self.len(), false)? };
        let event = stream.record()?;
        self.count(Direction::HostToDevice);
        match stream.point_now() {
            Some(point) => core.coh.chained_upload(point),
            // Done when queued (a backend that runs copies at once): so is the copy before.
            None => {
                core.coh.finish_pending()?;
                core.coh.uploaded();
            }
        }
        Ok(Some(event))
    }

    /// Queues the device-to-host copy on `stream` and returns without waiting. Host accesses and
    /// device writes wait for it; device reads do not.
    ///
    /// Returns the copy's event, or `None` when the host was already current or no copy is
    /// needed (zero-copy: the host side becomes current once the device work that writes the
    /// memory is done; host accesses wait for it).
    ///
    /// # Errors
    /// As [`SyncedMemory::prefetch_to_device`].
    pub fn prefetch_to_host(&self, stream: Option<&Stream>) -> Result<Option<Event>> {
        let _lock = self.lock_read(None)?;
        let mut core = self.shared.core.lock();
        if core.coh.parked_writer() {
            // Parked in place with its writer running (`offload_ordered`): the host is current
            // once that writer ends, with nothing to queue.
            return Ok(None);
        }
        self.settle(&mut core, Access::HostRead)?;
        self.refuse_if_dropped(&core, "prefetch_to_host")?;
        // Only replicas on other devices are current: the data comes back first (blocking).
        self.pull_if_elsewhere(&mut core)?;
        if core.coh.has(Place::Host) {
            return Ok(None);
        }
        if core.coh.is_fresh() {
            return Err(self.uninit("prefetch_to_host"));
        }
        let stream = self.pick_stream(stream)?;
        if let (Some(state), Some(dev)) = (core.zc, core.dev_buf()) {
            // Shared memory: the host side is current once the last device writer is done (and,
            // where the device needs it, the buffer is mapped). Nothing is copied.
            let point = match state.protocol {
                ZeroCopyProtocol::InPlace => dev.writer_point(),
                ZeroCopyProtocol::Map if state.mapped.is_some() => dev.writer_point(),
                ZeroCopyProtocol::Map => {
                    let (_, point) = stream.map_queued(&dev, MapAccess::Read)?;
                    core.zc = Some(ZeroCopyState {
                        mapped: Some(Mapping::Read),
                        ..state
                    });
                    point
                }
            };
            self.count_on(&stream, Direction::Mapped);
            core.coh.queued(PendingKind::ToHost, point);
            return Ok(None);
        }
        let dst = self.ensure_host_alloc(&mut core, false)?;
        let dev = core.dev_buf().ok_or_else(|| self.no_device())?;
        // SAFETY: `dst` is the host mirror, valid for `size` bytes; the host is not valid, so no
        // host guard reads it, and host accesses conflict with `ToHost` and wait for the event.
        // The mirror is freed or replaced only after `finish_pending`.
        unsafe { stream.read_raw(&dev, 0, dst, self.len(), false)? };
        // The event first, then the point after it: an access that waits for the transfer
        // waits for the event too, so the event a caller holds is complete once it returns.
        let event = stream.record()?;
        let point = stream.point_now();
        self.count(Direction::DeviceToHost);
        core.coh.queued(PendingKind::ToHost, point);
        Ok(Some(event))
    }
}
