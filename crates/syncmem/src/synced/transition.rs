//! The transitions behind the accessors (Caffe's `to_cpu`, `to_gpu`), the settling of work in
//! flight, and the errors that name the buffer.

use std::sync::Arc;

use super::state::{Access, Place};
use super::{Core, HostMem, PendingKind, SyncedMemory};
use crate::alloc::stats::Direction;
use crate::device::{DeviceBuffer, LentStream, Point, Stream};
use crate::error::{Error, Result};

impl SyncedMemory {
    pub(super) fn prepare_host(&self, access: Access, overwrite: bool) -> Result<*mut u8> {
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        if !overwrite {
            self.refuse_if_dropped(&core, "host access")?;
            // Only replicas on other devices are current: the data comes back first.
            self.pull_if_elsewhere(&mut core)?;
        }
        if core.host.is_none() && core.dev.is_none() && self.share_protocol().is_some() {
            // The first allocation of a zero-copy buffer is its one allocation. Where the
            // device cannot give it (out of memory, a bad pool setting), the host side does not
            // fail: it gets a mirror of its own, and the buffer keeps two. The user sees no
            // error, so the out-of-memory observers are not called.
            let _ =
                crate::device::without_oom_observers(|| self.ensure_dev_alloc(&mut core, false));
        }
        if access == Access::HostWrite {
            // The exclusive lock: a buffer that kept two mirrors may share again.
            self.reshare(&mut core)?;
            if let Some(HostMem::Parked(p)) = &core.host {
                // A block spilled in place: device commands may still read it.
                p.wait_readers()?;
            }
        }
        if core.zc.is_some() {
            return self.shared_host(&mut core, access, overwrite);
        }
        if access == Access::HostWrite || !core.coh.has(Place::Host) {
            // The host mirror is about to be written (by the caller or by a copy from the
            // device): an upload still reading it must end first.
            core.coh.release_host()?;
        }
        let ptr = if overwrite {
            // The first host allocation of a buffer reads as zeros whatever the accessor (code
            // built on `host_overwrite` relies on a fresh mirror's unwritten tail being zero).
            // Free for fresh pool blocks; a memset only for a cached block.
            let fresh = core.coh.is_fresh() && core.host.is_none();
            self.ensure_host_alloc(&mut core, fresh)?
        } else {
            self.ensure_host_valid(&mut core)?
        };
        if access == Access::HostWrite {
            core.coh.host_written();
        }
        Ok(ptr)
    }

    pub(super) fn prepare_device(
        &self,
        access: Access,
        overwrite: bool,
    ) -> Result<(Arc<DeviceBuffer>, LentStream<'_>)> {
        if self.target().is_none() {
            return Err(self.no_device());
        }
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        if !overwrite {
            self.refuse_if_dropped(&core, "device access")?;
        }
        self.note_device_use();
        if core.parked() {
            // A block spilled in place is the device mirror again (charged to the cap first).
            self.unpark(&mut core)?;
        }
        let stream = self.pick_stream(None)?;
        // A device write holds the exclusive access lock: no host guard is alive.
        let exclusive = access == Access::DeviceWrite;
        if !overwrite {
            // Only replicas on other devices are current: the data comes back first.
            self.pull_to_device(&mut core, &stream, exclusive)?;
        }
        if core.dev.is_none() && self.share_protocol().is_some() {
            let mut set_aside = None;
            if overwrite && matches!(core.host, Some(HostMem::Owned(_))) && !self.shared.pinned() {
                // Every byte will be written: the host data need not move into the shared
                // memory (a spilled buffer overwritten is not refilled). It is set aside, not
                // freed, until the shared memory exists: a failed allocation leaves the buffer
                // as it was.
                core.coh.release_host()?;
                set_aside = core.host.take();
            }
            // Allocated (and shared, a spilled buffer's data moving in) before anything else.
            if let Err(e) = self.ensure_dev_alloc(&mut core, exclusive) {
                if set_aside.is_some() {
                    core.host = set_aside;
                }
                return Err(e);
            }
            if set_aside.is_some() {
                core.coh.spill_forgotten();
            }
        } else if exclusive {
            // A buffer that kept two mirrors may share again.
            self.reshare(&mut core)?;
        }
        let buf = if core.zc.is_some() {
            self.shared_device(&mut core, access, overwrite, &stream)?
        } else if overwrite {
            self.ensure_dev_alloc(&mut core, exclusive)?
        } else {
            self.ensure_dev_valid(&mut core, exclusive)?
        };
        if access == Access::DeviceWrite {
            core.coh.wrote(Place::Device);
        }
        if let Some(d) = &mut core.dev {
            d.exposed = true;
        }
        // Work the caller queues on the guard's stream through the native handles bypasses the
        // buffer's uses: make that stream wait, on the device, for the commands of other
        // streams the access must follow (nothing is queued when there are none).
        buf.order_before(&stream, access == Access::DeviceWrite)?;
        Ok((buf, stream))
    }

    /// Makes the host mirror current (Caffe's `to_cpu`), returning its start.
    pub(super) fn ensure_host_valid(&self, core: &mut Core) -> Result<*mut u8> {
        if core.coh.has(Place::Host) {
            return core.host_ptr().ok_or_else(|| self.no_host());
        }
        let fresh = core.coh.is_fresh();
        let dst = self.ensure_host_alloc(core, fresh)?;
        if fresh {
            // First allocation out of Uninitialized: host memory comes zero-filled.
            core.coh.wrote(Place::Host);
            return Ok(dst);
        }
        let dev = core.dev_buf().ok_or_else(|| self.no_device())?;
        let stream = self.pick_stream(None)?;
        // SAFETY: `dst` is the host mirror (valid for `size` bytes). The host is not valid, so
        // no host guard exists; the copy is blocking.
        unsafe { stream.read_raw(&dev, 0, dst, self.len(), true)? };
        self.count(Direction::DeviceToHost);
        core.coh.arrived(Place::Host);
        Ok(dst)
    }

    /// Makes the device mirror current (Caffe's `to_gpu`). `exclusive`: the caller holds the
    /// exclusive access lock (see [`SyncedMemory::ensure_dev_alloc`]).
    fn ensure_dev_valid(&self, core: &mut Core, exclusive: bool) -> Result<Arc<DeviceBuffer>> {
        if core.coh.has(Place::Device) {
            return core.dev_buf().ok_or_else(|| self.no_device());
        }
        let fresh = core.coh.is_fresh();
        let had = core.dev.is_some();
        let dev = self.ensure_dev_alloc(core, exclusive)?;
        let stream = self.pick_stream(None)?;
        if fresh {
            // First allocation out of Uninitialized: zero fill (device memory comes dirty),
            // queued: the buffer records it, so what comes next is ordered after it.
            if !had {
                stream.fill_raw(&dev, 0, self.len(), 0)?;
            }
            core.coh.wrote(Place::Device);
            return Ok(dev);
        }
        let src = core.host_ptr().ok_or_else(|| self.no_host())?;
        // A spilled buffer coming back is a refill; any other upload a copy.
        let kind = if core.coh.spilled() {
            Direction::Refill
        } else {
            Direction::HostToDevice
        };
        // SAFETY: `src` is the current host mirror, valid for `size` bytes. The copy is queued,
        // not waited for: until it ends the host mirror is only read (host readers), and
        // whatever writes, replaces or frees it waits for the copy first (`prepare_host`,
        // `adopt_host`, drop). Device work on the mirror is ordered after the copy on the
        // device: the copy is a write use of the buffer.
        unsafe { stream.write_counted(&dev, 0, src, self.len(), false, kind)? };
        core.coh.upload_queued(stream.point_now());
        self.count(kind);
        if kind == Direction::Refill {
            self.note_refill();
        }
        core.coh.uploaded();
        Ok(dev)
    }

    /// Settles pending work: waits for it when `access` conflicts (except a copy to the device
    /// met by a device access, which the device orders after the copy itself: see
    /// [`super::state::Coherence::arrive_on_device`]), else settles it only if done.
    pub(super) fn settle(&self, core: &mut Core, access: Access) -> Result<()> {
        // A copy to the host whose device mirror went already (freed ordered after it, see
        // `spill.rs`) holds the data for every access, a device read too. A block parked
        // while its writer ran (see `park.rs`) is still the memory the device reads: a device
        // read is ordered after the writer on the device.
        let no_source = core.dev.is_none() && !core.parked();
        match core.coh.pending() {
            Some(p)
                if p.kind.conflicts_with(access)
                    || (p.kind == PendingKind::ToHost && no_source) =>
            {
                if core.coh.arrive_on_device(access) {
                    return Ok(());
                }
                core.coh.finish_pending()
            }
            Some(_) => self.settle_if_complete(core),
            None => Ok(()),
        }
    }

    /// Settles pending work that is done. Work that failed (its event reports an error status)
    /// is settled too, through [`super::state::Coherence::finish_pending`]: its error is returned once and its
    /// destination is not marked valid, instead of failing every later access.
    pub(super) fn settle_if_complete(&self, core: &mut Core) -> Result<()> {
        if let Some(p) = core.coh.pending() {
            match p.point.stream.is_done(p.point.seq) {
                Ok(false) => {}
                Ok(true) | Err(_) => core.coh.finish_pending()?,
            }
        }
        Ok(())
    }

    pub(super) fn adopt_host(&self, mem: HostMem) -> Result<()> {
        let _lock = self.lock_write(None)?;
        self.refuse_if_pinned()?;
        let mut core = self.shared.core.lock();
        core.coh.finish_pending()?;
        // The adopted memory replaces shared memory as the host side; the device mirror keeps
        // its memory, stale from now on.
        self.unshare(&mut core)?;
        core.coh.release_host()?;
        core.host = Some(mem);
        core.coh.wrote(Place::Host);
        Ok(())
    }

    /// Records device work queued by the user on another stream: the next access waits for
    /// `point` (`None`: a stream whose work is done when queued).
    ///
    /// A newer point on a stream covers what came before it on that stream only, so the older
    /// pending work is waited for first and settled as [`super::state::Coherence::finish_pending`] does: if it
    /// failed, its destination is not marked valid and its error is returned. The new work is
    /// recorded in every case (it was queued, so later accesses must still wait for it).
    pub(crate) fn set_pending_work(&self, point: Option<Point>) -> Result<()> {
        let mut core = self.shared.core.lock();
        let settled = core.coh.finish_pending();
        core.coh.queued(PendingKind::DeviceWork, point);
        settled
    }

    /// The stream of an access: `given`, else the buffer's own, else its device's default
    /// one; lent (no reference count taken) for as long as the buffer and `given` are.
    pub(super) fn pick_stream<'s>(&'s self, given: Option<&'s Stream>) -> Result<LentStream<'s>> {
        if let Some(s) = given.or(self.settings().stream.as_ref()) {
            return Ok(s.lend());
        }
        self.target()
            .ok_or_else(|| self.no_device())?
            .default_stream_lent()
    }

    /// Counts a spilled buffer brought back, in its device's pool statistics.
    pub(super) fn note_refill(&self) {
        if let Some(d) = self.target() {
            d.shared.memory.note_refill(self.len());
        }
    }

    pub(super) fn count(&self, d: Direction) {
        if !self.is_empty() {
            self.shared.copies.record(d, self.len());
        }
    }

    pub(super) fn check_len(&self, op: &str, len: usize) -> Result<()> {
        if len != self.len() {
            return Err(Error::SizeMismatch {
                what: format!("{op} on {}", self.label()),
                expected: self.len(),
                actual: len,
            });
        }
        Ok(())
    }

    pub(super) fn named(&self, mut e: Error) -> Error {
        if let Error::OutOfMemory { report } = &mut e {
            report.purpose = Some(format!("buffer {}", self.label()));
        }
        e
    }

    /// [`Error::Busy`] while a [`super::PlacementPin`] lives: the memory of a mirror is about
    /// to be replaced.
    pub(super) fn refuse_if_pinned(&self) -> Result<()> {
        if self.shared.pinned() {
            return Err(self.busy(
                "its placement is pinned (a view or an export of its memory is alive): its \
                 memory cannot be replaced",
            ));
        }
        Ok(())
    }

    // Errors are the cold path: kept out of line, they cost the accessors nothing.
    #[cold]
    pub(super) fn busy(&self, reason: &'static str) -> Error {
        Error::Busy {
            buffer: self.label().to_string(),
            reason,
        }
    }

    #[cold]
    pub(super) fn no_device(&self) -> Error {
        Error::NoDevice {
            buffer: self.label().to_string(),
        }
    }

    #[cold]
    pub(super) fn no_host(&self) -> Error {
        Error::InvalidState {
            op: "host access",
            buffer: self.label().to_string(),
            reason: "host mirror missing while marked current".into(),
        }
    }

    /// [`Error::ContentsDropped`] for a read of a buffer whose contents were dropped.
    pub(super) fn refuse_if_dropped(&self, core: &Core, op: &'static str) -> Result<()> {
        if core.coh.dropped() {
            return Err(Error::ContentsDropped {
                op,
                buffer: self.label().to_string(),
            });
        }
        Ok(())
    }

    #[cold]
    pub(super) fn uninit(&self, op: &'static str) -> Error {
        Error::InvalidState {
            op,
            buffer: self.label().to_string(),
            reason: "the buffer is uninitialized: there is no data to transfer".into(),
        }
    }
}
