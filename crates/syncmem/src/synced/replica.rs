//! Replicas of a buffer on other devices than its own (MSI across devices).
//!
//! A [`SyncedMemory`] has a home device (the one it was made for): Caffe's accessors
//! ([`SyncedMemory::host`], [`SyncedMemory::device`], ...) and [`SyncedMemory::head`] keep their
//! meaning for it. [`SyncedMemory::device_on`] and [`SyncedMemory::device_mut_on`] name another
//! device, of any backend: the buffer then keeps a replica there, from that device's pool, and
//! the coherence state covers every replica:
//!
//! - a read on a device with no current replica copies from the cheapest current one: from a
//!   device in the same OpenCL context with one device command (counted as
//!   [`Direction::DeviceToDevice`]), else through the host: the home host mirror is made
//!   current first (a read from the device that holds the data), and the replica is written
//!   from it;
//! - a read where a current replica is already present copies nothing;
//! - a write on one place (the host, the home device, a replica) makes every other place
//!   stale: after a write on another device the head is [`Head::Elsewhere`], and the next
//!   access of the home mirrors copies the data back first.
//!
//! The copies between devices are counted per pair of devices and route in
//! [`crate::alloc::pairs::pair_copies`], besides the buffer's and the process's copy
//! statistics. Replicas are freed with the buffer; the out-of-memory path of their devices
//! does not spill them.

use std::sync::Arc;

use super::state::{Access, Place};
use super::{Core, DeviceRead, DeviceWrite, SyncedMemory};
use crate::alloc::pairs;
use crate::alloc::stats::Direction;
use crate::device::{Device, DeviceBuffer, LentStream, Stream};
use crate::error::Result;

#[cfg(doc)]
use super::Head;

/// A replica on another device.
pub(super) struct Remote {
    device: Device,
    buf: Arc<DeviceBuffer>,
    /// Holds the newest data (meaningful only while the valid set has [`Place::Remote`]).
    current: bool,
}

impl Core {
    /// Forgets replicas marked current when the valid set says none is: a write elsewhere
    /// cleared [`Place::Remote`] without visiting them.
    fn reconcile_remotes(&mut self) {
        if !self.coh.has(Place::Remote) {
            for r in &mut self.remote {
                r.current = false;
            }
        }
    }

    /// Blocks until the work recorded on every replica is done.
    pub(super) fn wait_remotes(&self) -> Result<()> {
        self.remote.iter().try_for_each(|r| r.buf.wait_uses())
    }

    /// The device and memory of a current replica, the stale marks reconciled first.
    fn current_source(&mut self) -> Option<(Device, Arc<DeviceBuffer>)> {
        self.reconcile_remotes();
        let r = &self.remote[self.current_remote()?];
        Some((r.device.clone(), r.buf.clone()))
    }

    fn current_remote(&self) -> Option<usize> {
        if !self.coh.has(Place::Remote) {
            return None;
        }
        self.remote.iter().position(|r| r.current)
    }
}

impl SyncedMemory {
    /// Read access on `device`: the buffer's own device gives [`SyncedMemory::device`]; any
    /// other device a replica there, copied from the cheapest current place when it is not
    /// current (see [replicas](crate::synced#replicas-on-other-devices)).
    ///
    /// # Errors
    /// [`crate::Error::Busy`] when this thread holds a write guard of the buffer; out of memory on
    /// `device`; a backend error of a copy.
    pub fn device_on(&self, device: &Device) -> Result<DeviceRead<'_>> {
        if self.is_home(device) {
            return self.device();
        }
        let lock = self.lock_read(None)?;
        let (buf, stream) = self.prepare_remote(device, Access::DeviceRead, false)?;
        Ok(DeviceRead::new(lock, buf, LentStream::owned(stream)))
    }

    /// Write access on `device` (the buffer's own device: [`SyncedMemory::device_mut`]): the
    /// replica there becomes the only current place.
    ///
    /// # Errors
    /// As [`SyncedMemory::device_on`].
    pub fn device_mut_on(&self, device: &Device) -> Result<DeviceWrite<'_>> {
        self.device_write_on(device, false)
    }

    /// As [`SyncedMemory::device_mut_on`] for a caller that overwrites every byte: nothing is
    /// copied to `device` first.
    ///
    /// # Errors
    /// As [`SyncedMemory::device_on`].
    pub fn device_overwrite_on(&self, device: &Device) -> Result<DeviceWrite<'_>> {
        self.device_write_on(device, true)
    }

    fn device_write_on(&self, device: &Device, overwrite: bool) -> Result<DeviceWrite<'_>> {
        if self.is_home(device) {
            return self.device_write_for(None, overwrite);
        }
        let lock = self.lock_write(None)?;
        let (buf, stream) = self.prepare_remote(device, Access::DeviceWrite, overwrite)?;
        Ok(DeviceWrite::new(lock, buf, LentStream::owned(stream), self))
    }

    /// Whether `device` holds a current copy (the buffer's own device: its mirror; another
    /// device: a replica), counting a transfer in flight as done.
    pub fn is_current_on(&self, device: &Device) -> bool {
        if self.is_home(device) {
            return matches!(self.head(), super::Head::AtDevice | super::Head::Synced);
        }
        let mut core = self.shared.core.lock();
        core.reconcile_remotes();
        core.remote
            .iter()
            .any(|r| r.current && r.device.same(device))
    }

    /// The devices other than the buffer's own that hold a replica (current or not).
    pub fn replica_devices(&self) -> Vec<Device> {
        let core = self.shared.core.lock();
        core.remote.iter().map(|r| r.device.clone()).collect()
    }

    fn is_home(&self, device: &Device) -> bool {
        self.target().is_some_and(|d| d.same(device))
    }

    /// Readies the replica on `device` for `access` and returns it with the stream of its
    /// device's default stream.
    fn prepare_remote(
        &self,
        device: &Device,
        access: Access,
        overwrite: bool,
    ) -> Result<(Arc<DeviceBuffer>, Stream)> {
        let stream = device.default_stream()?;
        let mut core = self.shared.core.lock();
        // Work in flight on the home mirrors is settled first: a copy from them needs it done,
        // and a write here must not race a transfer that lands later.
        core.coh.finish_pending()?;
        if !overwrite {
            self.refuse_if_dropped(&core, "device access on another device")?;
        }
        core.reconcile_remotes();
        let i = self.remote_index(&mut core, device, &stream)?;
        let write = access == Access::DeviceWrite;
        if !core.remote[i].current && !overwrite {
            if core.coh.is_fresh() {
                // Never written: the replica reads zeros, as a fresh mirror does.
                let buf = core.remote[i].buf.clone();
                stream.fill_raw(&buf, 0, self.len(), 0)?;
            } else {
                self.fill_remote(&mut core, i, &stream)?;
            }
            core.remote[i].current = true;
            core.coh.arrived(Place::Remote);
        }
        if write {
            for (j, r) in core.remote.iter_mut().enumerate() {
                r.current = j == i;
            }
            core.coh.wrote(Place::Remote);
        }
        let buf = core.remote[i].buf.clone();
        buf.order_before(&stream, write)?;
        Ok((buf, stream))
    }

    /// The index of the replica on `device`, allocated from its pool if missing.
    fn remote_index(&self, core: &mut Core, device: &Device, stream: &Stream) -> Result<usize> {
        if let Some(i) = core.remote.iter().position(|r| r.device.same(device)) {
            return Ok(i);
        }
        let buf = DeviceBuffer::pooled(device, self.len(), stream, Some(&self.settings().label))
            .map_err(|e| self.named(e))?;
        core.remote.push(Remote {
            device: device.clone(),
            buf: Arc::new(buf),
            current: false,
        });
        Ok(core.remote.len() - 1)
    }

    /// Makes replica `i` current from the cheapest current place: another device of its
    /// context with one command, else the host (made current first where only a device holds
    /// the data).
    fn fill_remote(&self, core: &mut Core, i: usize, stream: &Stream) -> Result<()> {
        let dst = core.remote[i].buf.clone();
        let dst_dev = core.remote[i].device.clone();
        // A current device copy reachable with one command: the home mirror, then replicas.
        let home = match (self.target(), core.dev_buf()) {
            (Some(d), Some(b)) if core.coh.has(Place::Device) => Some((d.clone(), b)),
            _ => None,
        };
        let remotes = core
            .remote
            .iter()
            .filter(|r| r.current)
            .map(|r| (r.device.clone(), r.buf.clone()));
        let direct = home
            .into_iter()
            .chain(remotes)
            .find(|(d, _)| dst_dev.copies_directly_from(d));
        if let Some((src_dev, src)) = direct {
            let from_home = core.dev.as_ref().is_some_and(|d| Arc::ptr_eq(&d.buf, &src));
            // The stream of the source's guards.
            let src_stream = if from_home {
                self.pick_stream(None)?
            } else {
                src_dev.default_stream_lent()?
            };
            if from_home && core.zc.is_some() {
                // The home mirror shares its memory with the host: ready it for the device
                // (unmapped where it is mapped) before another device reads it.
                self.shared_device(core, Access::DeviceRead, false, &src_stream)?;
            }
            after_native_work(&src, &src_stream, stream)?;
            stream.copy_raw(&src, 0, &dst, 0, self.len())?;
            self.count(Direction::DeviceToDevice);
            pairs::record(src_dev.label(), dst_dev.label(), true, self.len());
            return Ok(());
        }
        // Through the host: from the device that holds the data, then to this one.
        let from = if core.coh.has(Place::Host) {
            None
        } else if core.coh.has(Place::Device) {
            self.target().cloned()
        } else {
            core.current_remote().map(|j| core.remote[j].device.clone())
        };
        let src = self.host_source(core)?;
        // SAFETY: `src` is the current host mirror (or the shared memory, ready for the host),
        // `size` bytes; the copy is blocking, so nothing can change or free it meanwhile.
        unsafe { stream.write_counted(&dst, 0, src, self.len(), true, Direction::HostToDevice)? };
        self.count(Direction::HostToDevice);
        if let Some(from) = from {
            pairs::record(from.label(), dst_dev.label(), false, self.len());
        }
        Ok(())
    }

    /// The address of a current host copy, made current first: from the home device (as a
    /// host read does) or from a replica ([`SyncedMemory::pull_remote`]).
    fn host_source(&self, core: &mut Core) -> Result<*const u8> {
        if core.coh.remote_only() {
            self.pull_remote(core)?;
        }
        if core.zc.is_some() {
            return Ok(self
                .shared_host(core, Access::HostRead, false)?
                .cast_const());
        }
        Ok(self.ensure_host_valid(core)?.cast_const())
    }

    /// Copies the data of a current replica into the home host mirror, when only replicas
    /// are current: the host becomes current too (the replicas stay so). A read from the
    /// replica's device, blocking.
    ///
    /// # Errors
    /// Out of memory for the host mirror; a backend error of the read.
    pub(super) fn pull_remote(&self, core: &mut Core) -> Result<()> {
        let Some((src_dev, src)) = core.current_source() else {
            return Ok(());
        };
        // Until the copy has landed, only the replicas hold the data (restored on failure).
        let before = core.coh.save();
        let dst = if core.zc.is_some() {
            // The shared memory is written from the host: ready it as for a host overwrite (no
            // host guard can exist: the host was stale).
            self.shared_host(core, Access::HostWrite, true)?
        } else {
            core.coh.release_host()?;
            self.ensure_host_alloc(core, false)?
        };
        let stream = src_dev.default_stream()?;
        // SAFETY: `dst` is the host mirror (or the shared memory, ready for host writes),
        // `size` bytes, which no guard reads (the host was stale); the read is blocking.
        let read =
            unsafe { stream.read_counted(&src, 0, dst, self.len(), true, Direction::DeviceToHost) };
        if let Err(e) = read {
            core.coh.restore(before);
            return Err(e);
        }
        self.pulled(core, &src_dev, Place::Host);
        Ok(())
    }

    /// Pulls the data back before an access of the home mirrors when only replicas hold it.
    pub(super) fn pull_if_elsewhere(&self, core: &mut Core) -> Result<()> {
        if core.coh.remote_only() {
            self.pull_remote(core)?;
        }
        Ok(())
    }

    /// Before a device access of the home mirror when only replicas hold the data: copies a
    /// current replica into the home device mirror with one command on `stream` where the
    /// devices share a context (the home device becomes current, the host stays stale), else
    /// through the host ([`SyncedMemory::pull_remote`]). `exclusive`: the caller holds the
    /// exclusive access lock.
    ///
    /// # Errors
    /// Out of memory; a backend error of the copy.
    pub(super) fn pull_to_device(
        &self,
        core: &mut Core,
        stream: &Stream,
        exclusive: bool,
    ) -> Result<()> {
        if !core.coh.remote_only() {
            return Ok(());
        }
        let Some((src_dev, src)) = core.current_source() else {
            return Ok(());
        };
        let direct = self
            .target()
            .is_some_and(|h| h.copies_directly_from(&src_dev));
        if !direct {
            return self.pull_remote(core);
        }
        let before = core.coh.save();
        let mut dst = self.ensure_dev_alloc(core, exclusive)?;
        if core.zc.is_some() {
            // Shared memory: unmapped where it is mapped before a device command writes it.
            dst = self.shared_device(core, Access::DeviceWrite, true, stream)?;
        }
        let copied = after_native_work(&src, &src_dev.default_stream()?, stream)
            .and_then(|()| stream.copy_raw(&src, 0, &dst, 0, self.len()));
        if let Err(e) = copied {
            // Only the replicas hold the data still.
            core.coh.restore(before);
            return Err(e);
        }
        self.pulled(core, &src_dev, Place::Device);
        Ok(())
    }

    /// After the data was copied from `src_dev`'s replica into the home mirror at `place`
    /// (the host, or the home device directly): counts the copy, and makes that mirror and the
    /// replicas the current ones. The mirror holds new data: its next upload is an ordinary
    /// copy.
    fn pulled(&self, core: &mut Core, src_dev: &Device, place: Place) {
        let direct = place == Place::Device;
        self.count(if direct {
            Direction::DeviceToDevice
        } else {
            Direction::DeviceToHost
        });
        if let Some(home) = self.target() {
            pairs::record(src_dev.label(), home.label(), direct, self.len());
        }
        core.coh.pulled(place);
    }
}

/// Makes `stream` wait for the work queued so far on `src_stream`, the stream of the guards of
/// `src`, when a native handle of `src` was handed out: work queued there outside the crate
/// (which the buffer's recorded uses do not show) comes before a copy from it on another
/// device's stream, as it would before a copy on its own stream.
fn after_native_work(src: &DeviceBuffer, src_stream: &Stream, stream: &Stream) -> Result<()> {
    if src.was_exposed() && src_stream.id() != stream.id() {
        stream.wait_for(&src_stream.record()?)?;
    }
    Ok(())
}
