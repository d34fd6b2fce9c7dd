//! Zero-copy buffers: one allocation shared by the host and the device.
//!
//! Where a device's memory is host memory ([`crate::device::zero_copy`]), the device mirror is
//! allocated from a pool over host memory and, once the device has shown that it uses that
//! memory in place ([`crate::Stream`]'s check, once per pool block), it is the host mirror too:
//! [`HostMem::Shared`] points into it. Caffe's heads keep their meaning (the valid set is kept
//! exactly as with two mirrors), but making a stale side current moves no byte: it is counted
//! as a zero-copy sync ([`Direction::Mapped`]), never as a copy.
//!
//! What takes the place of the copies is ordering, by protocol:
//! - [`ZeroCopyProtocol::InPlace`]: a host read waits for the last device command that wrote
//!   the memory, a host write for every device command on it (it may still read what the host
//!   is about to overwrite); the device needs nothing (the host's writes are done when they
//!   return).
//! - [`ZeroCopyProtocol::Map`]: the host maps the buffer (a blocking map, queued after every
//!   device command on it) and keeps it mapped until a device access unmaps it (queued; every
//!   later command follows it). A host read of a buffer that stays current needs no new map.
//!
//! A host read and a device read may run at the same time (both take the shared access lock):
//! the device read unmaps the buffer under the host reader. The memory is the buffer's own
//! (the host block the device uses in place), unchanged by either reader, so the host reader
//! still reads the right bytes; only writes, which take the exclusive lock, need the protocol.

use std::ptr::NonNull;
use std::sync::Arc;

use super::state::{Access, Place};
use super::{Core, HostMem, SyncedMemory};
use crate::alloc::stats::Direction;
use crate::device::{DeviceBuffer, MapAccess, Stream, ZeroCopyProtocol};
use crate::error::Result;

/// How a zero-copy buffer shares its memory now.
#[derive(Debug, Clone, Copy)]
pub(super) struct ZeroCopyState {
    pub(super) protocol: ZeroCopyProtocol,
    /// [`ZeroCopyProtocol::Map`]: the buffer is mapped for the host (at its host address), for
    /// reading only (the device may still read it) or for writing too.
    pub(super) mapped: Option<Mapping>,
}

/// A mapping of a zero-copy buffer (see [`ZeroCopyState::mapped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mapping {
    Read,
    Write,
}

impl ZeroCopyState {
    /// The host may use the memory without a map or a wait for device writes (a current host
    /// side stays current only while no device command writes it).
    pub(super) fn host_ready(self) -> bool {
        self.protocol == ZeroCopyProtocol::InPlace || self.mapped.is_some()
    }
}

impl SyncedMemory {
    /// The protocol a new device mirror of this buffer would share memory with, if any.
    pub(super) fn share_protocol(&self) -> Option<ZeroCopyProtocol> {
        if !self.settings().zero_copy || self.shared.pinned_host() || self.is_empty() {
            return None;
        }
        self.target()?.zero_copy_protocol()
    }

    /// Makes `buf`, a device mirror just allocated, the buffer's one allocation when zero-copy
    /// applies: the device uses its host address in place, and the host mirror is absent, or
    /// the buffer's own (not adopted memory) and may be replaced (`replace_host`: no host
    /// guard can still read it, the caller holding the exclusive access lock). Host data the
    /// old host mirror held moves into the shared memory, counted as an upload (a refill for a
    /// spilled buffer), and the device side is then current too. Otherwise the buffer keeps two
    /// mirrors (a spilled buffer read back on the device under a host reader: until its device
    /// mirror goes again).
    ///
    /// # Errors
    /// A backend error of the waits.
    pub(super) fn share(
        &self,
        core: &mut Core,
        buf: &Arc<DeviceBuffer>,
        replace_host: bool,
    ) -> Result<()> {
        let Some(protocol) = self.share_protocol() else {
            return Ok(());
        };
        match core.host {
            None => {}
            // A pinned host mirror stays where it is (an address of it was handed out).
            Some(HostMem::Owned(_)) if replace_host && !self.shared.pinned() => {}
            _ => return Ok(()),
        }
        if !buf.in_place() {
            return Ok(());
        }
        let Some(host) = buf.host_ptr().and_then(NonNull::new) else {
            return Ok(());
        };
        let mut state = ZeroCopyState {
            protocol,
            mapped: None,
        };
        if let Some(old) = core.host.as_ref().filter(|_| core.coh.has(Place::Host)) {
            // The block may still be in use by its previous owner's commands.
            let old = old.ptr();
            let stream = self.pick_stream(None)?;
            // SAFETY: the old host mirror is valid for `size` bytes and no guard exists (the
            // caller holds the state lock during an allocation); `host` is `buf`'s memory.
            unsafe { self.move_in(core, buf, &stream, &mut state, old, host)? };
        }
        core.coh.release_host()?;
        core.host = Some(HostMem::Shared(host));
        core.zc = Some(state);
        Ok(())
    }

    /// Makes a buffer that kept two mirrors (a spilled buffer brought back under a host
    /// reader) share its device mirror again, where that mirror is memory the host may use in
    /// place: the caller holds the exclusive access lock (no host guard reads the host mirror).
    /// Host data the device mirror lacks moves in first, counted as the upload it stands for.
    ///
    /// # Errors
    /// A backend error of the waits.
    pub(super) fn reshare(&self, core: &mut Core) -> Result<()> {
        if core.zc.is_some()
            || !core.dev_owned()
            || !matches!(core.host, Some(HostMem::Owned(_)))
            || self.shared.pinned()
        {
            return Ok(());
        }
        let Some(protocol) = self.share_protocol() else {
            return Ok(());
        };
        let Some(dev) = core.dev_buf().filter(|d| d.in_place()) else {
            return Ok(());
        };
        let Some(host) = dev.host_ptr().and_then(NonNull::new) else {
            return Ok(());
        };
        let mut state = ZeroCopyState {
            protocol,
            mapped: None,
        };
        // The uploads still reading the host mirror end first.
        core.coh.release_host()?;
        if core.coh.has(Place::Host) && !core.coh.has(Place::Device) {
            let stream = self.pick_stream(None)?;
            let old = core
                .host
                .as_ref()
                .map_or(std::ptr::null_mut(), HostMem::ptr);
            // SAFETY: `old` is the host mirror, `size` bytes, which no guard reads (exclusive
            // lock) and no upload reads any more (released above); `host` is `dev`'s memory.
            unsafe { self.move_in(core, &dev, &stream, &mut state, old, host)? };
        }
        core.host = Some(HostMem::Shared(host));
        core.zc = Some(state);
        Ok(())
    }

    /// Moves the host data at `old` into `host`, the memory of device mirror `dev` that the
    /// buffer is about to share: waits for (or maps after) the commands still using `dev`,
    /// copies `size` bytes, counts the upload it stands for (a refill for a spilled buffer),
    /// and makes the device side current.
    ///
    /// # Safety
    /// `old` is valid for `size` bytes and nothing writes it meanwhile; `host` is `dev`'s
    /// memory, `size` bytes, a distinct allocation.
    unsafe fn move_in(
        &self,
        core: &mut Core,
        dev: &DeviceBuffer,
        stream: &Stream,
        state: &mut ZeroCopyState,
        old: *mut u8,
        host: NonNull<u8>,
    ) -> Result<()> {
        match state.protocol {
            ZeroCopyProtocol::InPlace => dev.wait_uses()?,
            ZeroCopyProtocol::Map => {
                stream.map_blocking(dev, MapAccess::Overwrite)?;
                state.mapped = Some(Mapping::Write);
            }
        }
        // SAFETY: per the contract, `old` and `host` are valid for `size` bytes and do not
        // overlap; no device command uses `host` any more (waited for, or mapped after them).
        unsafe { std::ptr::copy_nonoverlapping(old, host.as_ptr(), self.len()) };
        let kind = if core.coh.spilled() {
            Direction::Refill
        } else {
            Direction::HostToDevice
        };
        self.count_on(stream, kind);
        if kind == Direction::Refill {
            self.note_refill();
        }
        core.coh.uploaded();
        Ok(())
    }

    /// Readies the shared memory of a zero-copy buffer for a host access and returns its
    /// address: waits for (or maps after) the device commands the access must follow, zeroes
    /// a fresh buffer's memory, and moves the valid set as the two-mirror transitions would.
    ///
    /// # Errors
    /// A backend error of a wait or a map.
    pub(super) fn shared_host(
        &self,
        core: &mut Core,
        access: Access,
        overwrite: bool,
    ) -> Result<*mut u8> {
        let (Some(dev), Some(mut state), Some(host)) = (core.dev_buf(), core.zc, core.host_ptr())
        else {
            return Err(self.no_host());
        };
        let fresh = core.coh.is_fresh();
        let write = access == Access::HostWrite;
        let stale = !fresh && !core.coh.has(Place::Host);
        // A fresh buffer's memory is zero-filled by the host.
        let zero = fresh && !dev.known_zero();
        match state.protocol {
            ZeroCopyProtocol::InPlace => {
                if write || zero {
                    dev.wait_uses()?;
                } else if stale || fresh {
                    dev.wait_writer()?;
                }
            }
            ZeroCopyProtocol::Map => {
                let want = if write || zero {
                    Mapping::Write
                } else {
                    Mapping::Read
                };
                if state.mapped != Some(want) && state.mapped != Some(Mapping::Write) {
                    let stream = self.pick_stream(None)?;
                    if state.mapped.is_some() {
                        // Read-only: unmapped, to be mapped for writing.
                        stream.unmap(&dev, host)?;
                    }
                    let access = match want {
                        Mapping::Read => MapAccess::Read,
                        Mapping::Write if overwrite && !fresh => MapAccess::Overwrite,
                        Mapping::Write => MapAccess::ReadWrite,
                    };
                    stream.map_blocking(&dev, access)?;
                    state.mapped = Some(want);
                    core.zc = Some(state);
                }
            }
        }
        if zero {
            // The first host access of a buffer reads zeros, as with a host mirror of its own.
            // SAFETY: `host` is the shared memory, `size` bytes, which no device command uses
            // (waited for or mapped after above) and no guard reads (the state lock is held
            // and the buffer has no data yet).
            unsafe { std::ptr::write_bytes(host, 0, self.len()) };
        }
        if stale && !overwrite {
            self.count_sync();
        }
        if write || fresh {
            core.coh.wrote(Place::Host);
        } else {
            core.coh.arrived(Place::Host);
        }
        Ok(host)
    }

    /// Readies the shared memory of a zero-copy buffer for a device access on `stream`:
    /// unmaps it where it is mapped, zero-fills a fresh buffer's memory (queued), and moves the
    /// valid set. Returns the device mirror.
    ///
    /// # Errors
    /// A backend error of the unmap or the fill.
    pub(super) fn shared_device(
        &self,
        core: &mut Core,
        access: Access,
        overwrite: bool,
        stream: &Stream,
    ) -> Result<Arc<DeviceBuffer>> {
        let (Some(dev), Some(mut state)) = (core.dev_buf(), core.zc) else {
            return Err(self.no_device());
        };
        let fresh = core.coh.is_fresh();
        // The device may read a buffer mapped for reading; anything else needs it unmapped.
        let device_reads = access == Access::DeviceRead && (overwrite || !fresh);
        if state.mapped == Some(Mapping::Write) || (state.mapped.is_some() && !device_reads) {
            let host = core
                .host
                .as_ref()
                .map_or(std::ptr::null_mut(), HostMem::ptr);
            stream.unmap(&dev, host)?;
            state.mapped = None;
            core.zc = Some(state);
        }
        if fresh && !overwrite && !dev.known_zero() {
            // Device memory of a fresh buffer reads zeros, as with a mirror of its own.
            stream.fill_raw(&dev, 0, self.len(), 0)?;
        }
        if !fresh && !core.coh.has(Place::Device) && !overwrite {
            self.count_sync();
        }
        if access == Access::DeviceWrite || fresh {
            core.coh.wrote(Place::Device);
        } else {
            core.coh.arrived(Place::Device);
        }
        Ok(dev)
    }

    /// Ends the sharing of a zero-copy buffer whose host side is about to be replaced or whose
    /// device mirror is about to go (adopted memory, a spill): unmaps the memory where it is
    /// mapped and forgets the host address. The device mirror stays, as a mirror of its own.
    ///
    /// # Errors
    /// A backend error of the unmap.
    pub(super) fn unshare(&self, core: &mut Core) -> Result<()> {
        let Some(state) = core.zc.take() else {
            return Ok(());
        };
        if state.mapped.is_some() {
            if let Some(dev) = core.dev_buf() {
                let host = core
                    .host
                    .as_ref()
                    .map_or(std::ptr::null_mut(), HostMem::ptr);
                self.pick_stream(None)?.unmap(&dev, host)?;
            }
        }
        core.host = None;
        core.coh.unshared();
        Ok(())
    }

    /// Counts a zero-copy sync: on the buffer, and in the process's (and the thread's)
    /// counters.
    fn count_sync(&self) {
        if let Ok(stream) = self.pick_stream(None) {
            self.count_on(&stream, Direction::Mapped);
        }
    }

    /// Counts a transfer of kind `kind` made without a copy command: on the buffer and, through
    /// `stream`, in the process's counters (and attached traces).
    pub(super) fn count_on(&self, stream: &Stream, kind: Direction) {
        self.count(kind);
        if !self.is_empty() {
            stream.count_transfer(kind, self.len());
        }
    }
}
