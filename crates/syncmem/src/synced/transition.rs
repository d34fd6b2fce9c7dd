//! The transitions behind the accessors (Caffe's `to_cpu`, `to_gpu`), the settling of work in
//! flight, and the errors that name the buffer.

use std::sync::Arc;

use super::state::{Access, Pending, Place, Valid};
use super::{Core, HostMem, PendingKind, SyncedMemory};
use crate::alloc::stats::Direction;
use crate::device::{DeviceBuffer, Point, Stream};
use crate::error::{Error, Result};

impl SyncedMemory {
    pub(super) fn prepare_host(&self, access: Access, overwrite: bool) -> Result<*mut u8> {
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        if access == Access::HostWrite || !core.valid.has(Place::Host) {
            // The host mirror is about to be written (by the caller or by a copy from the
            // device): an upload still reading it must end first.
            core.release_host()?;
        }
        let ptr = if overwrite {
            // The first host allocation of a buffer reads as zeros whatever the accessor (code
            // built on `host_overwrite` relies on a fresh mirror's unwritten tail being zero).
            // Free for fresh pool blocks; a memset only for a cached block.
            let fresh = core.valid.is_empty() && core.host.is_none();
            self.ensure_host_alloc(&mut core, fresh)?
        } else {
            self.ensure_host_valid(&mut core)?
        };
        if access == Access::HostWrite {
            core.valid = Valid::only(Place::Host);
        }
        Ok(ptr)
    }

    pub(super) fn prepare_device(
        &self,
        access: Access,
        overwrite: bool,
    ) -> Result<(Arc<DeviceBuffer>, Stream)> {
        if self.device.is_none() {
            return Err(self.no_device());
        }
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        let buf = if overwrite {
            self.ensure_dev_alloc(&mut core)?
        } else {
            self.ensure_dev_valid(&mut core)?
        };
        if access == Access::DeviceWrite {
            core.valid = Valid::only(Place::Device);
        }
        core.dev_exposed = true;
        let stream = self.pick_stream(None)?;
        // Work the caller queues on the guard's stream through the native handles bypasses the
        // buffer's uses: make that stream wait, on the device, for the commands of other
        // streams the access must follow (nothing is queued when there are none).
        buf.order_before(&stream, access == Access::DeviceWrite)?;
        Ok((buf, stream))
    }

    /// Makes the host mirror current (Caffe's `to_cpu`), returning its start.
    fn ensure_host_valid(&self, core: &mut Core) -> Result<*mut u8> {
        if core.valid.has(Place::Host) {
            return core
                .host
                .as_ref()
                .map(HostMem::ptr)
                .ok_or_else(|| self.no_host());
        }
        let fresh = core.valid.is_empty();
        let dst = self.ensure_host_alloc(core, fresh)?;
        if fresh {
            // First allocation out of Uninitialized: host memory comes zero-filled.
            core.valid = Valid::only(Place::Host);
            return Ok(dst);
        }
        let dev = core.dev.clone().ok_or_else(|| self.no_device())?;
        let stream = self.pick_stream(None)?;
        // SAFETY: `dst` is the host mirror (valid for `size` bytes). The host is not valid, so
        // no host guard exists; the copy is blocking.
        unsafe { stream.read_raw(&dev, 0, dst, self.size, true)? };
        self.count(Direction::DeviceToHost);
        core.valid = core.valid.with(Place::Host);
        Ok(dst)
    }

    /// Makes the device mirror current (Caffe's `to_gpu`).
    fn ensure_dev_valid(&self, core: &mut Core) -> Result<Arc<DeviceBuffer>> {
        if core.valid.has(Place::Device) {
            return core.dev.clone().ok_or_else(|| self.no_device());
        }
        let fresh = core.valid.is_empty();
        let had = core.dev.is_some();
        let dev = self.ensure_dev_alloc(core)?;
        let stream = self.pick_stream(None)?;
        if fresh {
            // First allocation out of Uninitialized: zero fill (device memory comes dirty),
            // queued: the buffer records it, so what comes next is ordered after it.
            if !had {
                stream.fill_raw(&dev, 0, self.size, 0)?;
            }
            core.valid = Valid::only(Place::Device);
            return Ok(dev);
        }
        let src = core
            .host
            .as_ref()
            .map(HostMem::ptr)
            .ok_or_else(|| self.no_host())?;
        // SAFETY: `src` is the current host mirror, valid for `size` bytes. The copy is queued,
        // not waited for: until it ends the host mirror is only read (host readers), and
        // whatever writes, replaces or frees it waits for `host_busy` first (`prepare_host`,
        // `adopt_host`, drop). Device work on the mirror is ordered after the copy on the
        // device: the copy is a write use of the buffer.
        unsafe { stream.write_raw(&dev, 0, src, self.size, false)? };
        core.host_busy = stream.point_now();
        self.count(Direction::HostToDevice);
        core.valid = core.valid.with(Place::Device);
        Ok(dev)
    }

    /// Settles pending work: waits for it when `access` conflicts, else settles it only if done.
    pub(super) fn settle(&self, core: &mut Core, access: Access) -> Result<()> {
        match &core.pending {
            Some(p) if p.kind.conflicts_with(access) => self.finish_pending(core),
            Some(_) => self.settle_if_complete(core),
            None => Ok(()),
        }
    }

    /// Settles pending work that is done. Work that failed (its event reports an error status)
    /// is settled too, through [`Core::finish_pending`]: its error is returned once and its
    /// destination is not marked valid, instead of failing every later access.
    pub(super) fn settle_if_complete(&self, core: &mut Core) -> Result<()> {
        if let Some(p) = &core.pending {
            match p.point.stream.is_done(p.point.seq) {
                Ok(false) => {}
                Ok(true) | Err(_) => self.finish_pending(core)?,
            }
        }
        Ok(())
    }

    pub(super) fn finish_pending(&self, core: &mut Core) -> Result<()> {
        core.finish_pending()
    }

    pub(super) fn adopt_host(&self, mem: HostMem) -> Result<()> {
        let _lock = self.lock_write(None)?;
        let mut core = self.shared.core.lock();
        self.finish_pending(&mut core)?;
        core.release_host()?;
        core.host = Some(mem);
        core.valid = Valid::only(Place::Host);
        Ok(())
    }

    /// Records device work queued by the user on another stream: the next access waits for
    /// `point` (`None`: a stream whose work is done when queued).
    ///
    /// A newer point on a stream covers what came before it on that stream only, so the older
    /// pending work is waited for first and settled as [`Core::finish_pending`] does: if it
    /// failed, its destination is not marked valid and its error is returned. The new work is
    /// recorded in every case (it was queued, so later accesses must still wait for it).
    pub(crate) fn set_pending_work(&self, point: Option<Point>) -> Result<()> {
        let mut core = self.shared.core.lock();
        let settled = self.finish_pending(&mut core);
        core.pending = point.map(|point| Pending {
            kind: PendingKind::DeviceWork,
            point,
        });
        settled
    }

    pub(super) fn pick_stream(&self, given: Option<&Stream>) -> Result<Stream> {
        if let Some(s) = given.or(self.stream.as_ref()) {
            return Ok(s.clone());
        }
        self.device
            .as_ref()
            .ok_or_else(|| self.no_device())?
            .default_stream()
    }

    pub(super) fn count(&self, d: Direction) {
        if self.size > 0 {
            self.copies.record(d, self.size);
        }
    }

    pub(super) fn check_len(&self, op: &str, len: usize) -> Result<()> {
        if len != self.size {
            return Err(Error::SizeMismatch {
                what: format!("{op} on {}", self.label),
                expected: self.size,
                actual: len,
            });
        }
        Ok(())
    }

    pub(super) fn named(&self, e: Error) -> Error {
        match e {
            Error::OutOfMemory {
                device,
                requested,
                detail,
            } => Error::OutOfMemory {
                device,
                requested,
                detail: format!("{detail} for buffer {}", self.label),
            },
            e => e,
        }
    }

    pub(super) fn busy(&self, reason: &'static str) -> Error {
        Error::Busy {
            buffer: self.label.to_string(),
            reason,
        }
    }

    pub(super) fn no_device(&self) -> Error {
        Error::NoDevice {
            buffer: self.label.to_string(),
        }
    }

    pub(super) fn no_host(&self) -> Error {
        Error::InvalidState {
            op: "host access",
            buffer: self.label.to_string(),
            reason: "host mirror missing while marked current".into(),
        }
    }

    pub(super) fn uninit(&self, op: &'static str) -> Error {
        Error::InvalidState {
            op,
            buffer: self.label.to_string(),
            reason: "the buffer is uninitialized: there is no data to transfer".into(),
        }
    }
}
