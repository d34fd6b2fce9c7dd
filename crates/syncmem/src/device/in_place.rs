//! Device memory the host shares (zero-copy, see [`super::zero_copy`]): whether a block's
//! memory really is usable at its host address, mapping and unmapping it for the host, and the
//! waits that stand for a map where the host uses it in place.
//!
//! Every map and unmap is a command on a stream like a copy: it is ordered after the other
//! streams' commands on the buffer, and recorded on the buffer as a write (a mapping may be
//! written through), so whatever comes next on any stream follows it.

use std::ptr;

use super::usage::Point;
use super::{DeviceBuffer, Stream};
use crate::alloc::stats::Direction;
use crate::backend::dispatch::RawMem;
pub(crate) use crate::backend::MapAccess;
use crate::error::Result;

impl Stream {
    /// Maps `buf` for host `access`, after the commands on it the access must follow (the
    /// writers for a read, every command for a write); blocks until the mapping is usable (a
    /// host wait). Returns the mapped address (null for an empty buffer).
    ///
    /// # Errors
    /// A backend error (of the map, or of a command before it).
    pub(crate) fn map_blocking(&self, buf: &DeviceBuffer, access: MapAccess) -> Result<*mut u8> {
        self.check_buffer(buf, "map")?;
        let Some(mem) = buf.raw() else {
            return Ok(ptr::null_mut());
        };
        buf.order_before(self, access != MapAccess::Read)?;
        let (mapped, seq) = self.raw.map(mem, access, true)?;
        buf.note(self.at(seq), access != MapAccess::Read);
        if !self.raw.is_cpu() {
            self.count_wait();
        }
        Ok(mapped)
    }

    /// Queues a map of `buf` for host `access` after the commands on it the access must follow;
    /// the mapping is usable once the returned point completes (`None`: at once).
    ///
    /// # Errors
    /// A backend error.
    pub(crate) fn map_queued(
        &self,
        buf: &DeviceBuffer,
        access: MapAccess,
    ) -> Result<(*mut u8, Option<Point>)> {
        self.check_buffer(buf, "map")?;
        let Some(mem) = buf.raw() else {
            return Ok((ptr::null_mut(), None));
        };
        buf.order_before(self, access != MapAccess::Read)?;
        let (mapped, seq) = self.raw.map(mem, access, false)?;
        buf.note(self.at(seq), access != MapAccess::Read);
        Ok((mapped, self.point(seq)))
    }

    /// Queues the unmap of the mapping at `mapped` of `buf` (made by a map of this module):
    /// every later command on the buffer, on any stream, follows it.
    ///
    /// # Errors
    /// A backend error.
    pub(crate) fn unmap(&self, buf: &DeviceBuffer, mapped: *mut u8) -> Result<()> {
        self.check_buffer(buf, "unmap")?;
        let Some(mem) = buf.raw() else {
            return Ok(());
        };
        // After the map (which may have been queued on another stream).
        buf.order_before(self, true)?;
        let seq = self.raw.unmap(mem, mapped)?;
        buf.note(self.at(seq), true);
        Ok(())
    }

    /// Counts a transfer made without a copy command of this stream: a zero-copy sync
    /// ([`Direction::Mapped`]), or a spill or refill of shared memory (a host memcpy).
    pub(crate) fn count_transfer(&self, kind: Direction, len: usize) {
        self.count_copy(kind, len);
    }
}

impl DeviceBuffer {
    /// Whether the host may use the memory at its host address ([`DeviceBuffer::host_ptr`]):
    /// never without one. An OpenCL buffer over a host block was checked when its segment was
    /// made (mapping it gave the block's address: the driver uses the block in place;
    /// otherwise it copies, and a buffer in it keeps two mirrors). Nothing is queued here.
    pub(crate) fn in_place(&self) -> bool {
        self.host_ptr().is_some() && self.raw().is_some_and(RawMem::in_place)
    }

    /// The host address of the memory, where the host may use it in place (a `cpu` buffer, a
    /// block of a pool over host memory; see [`DeviceBuffer::in_place`]).
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        self.raw().and_then(RawMem::host_ptr)
    }

    /// True when the bytes are known to read as zeros: a block of a fresh pool segment of
    /// memory that comes zeroed.
    pub(crate) fn known_zero(&self) -> bool {
        self.lease_zeroed() && self.raw().is_some_and(RawMem::fresh_is_zero)
    }

    /// The last command recorded as writing the memory, unless known complete.
    pub(crate) fn writer_point(&self) -> Option<Point> {
        self.uses.lock().writer().filter(|p| !p.is_done()).cloned()
    }

    /// True when commands recorded on the memory may still be running.
    pub(crate) fn has_pending_uses(&self) -> bool {
        let mut uses = self.uses.lock();
        uses.prune();
        let pending = uses.points().next().is_some();
        pending
    }

    /// Blocks until the last command recorded as writing the memory has completed (a host wait
    /// when it was not complete yet): what a host read of shared memory must follow.
    ///
    /// # Errors
    /// The error of that command.
    pub(crate) fn wait_writer(&self) -> Result<()> {
        let writer = self.uses.lock().writer().cloned();
        match writer {
            Some(p) => p.wait(),
            None => Ok(()),
        }
    }
}
