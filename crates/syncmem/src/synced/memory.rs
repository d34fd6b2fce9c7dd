//! Where the mirrors come from and how they go: the host pool (or the device's pinned pool)
//! for host mirrors, the device pool for device mirrors, and the eviction of clean device
//! mirrors that the device's out-of-memory path asks for through a weak reference (see
//! [`registry`]).

use std::sync::{Arc, Weak};

use super::registry;
use super::state::{Head, Place, Valid};
use super::{Core, HostMem, Shared, SyncedMemory};
use crate::alloc::pool::HostPool;
use crate::device::Evictable;
use crate::device::{Device, DeviceBuffer, Release};
use crate::error::Result;

impl Core {
    /// Frees the device mirror (back to the pool when it came from there) and unregisters it.
    /// The caller updates `valid`. A mirror no guard ever exposed has no work in flight, so its
    /// block is reusable by every stream at once.
    pub(super) fn release_device(&mut self, device: Option<&Device>) {
        if let (Some(id), Some(d)) = (self.dev_reg.take(), device) {
            registry::of(d).unregister(id);
        }
        if self.zc.take().is_some() {
            // Shared memory: the host side is the device mirror's memory and goes with it.
            self.host = None;
        }
        if let Some(mut buf) = self.dev.take() {
            if self.dev_owned && !self.dev_exposed {
                if let Some(b) = Arc::get_mut(&mut buf) {
                    b.set_release(Release::Idle);
                }
            }
        }
        self.dev_owned = false;
        self.dev_exposed = false;
    }
}

impl SyncedMemory {
    /// Allocates the host mirror if missing. `zero`: the bytes must read as zeros (first
    /// allocation out of Uninitialized); otherwise a copy or the caller fills them.
    pub(super) fn ensure_host_alloc(&self, core: &mut Core, zero: bool) -> Result<*mut u8> {
        if let Some(h) = &core.host {
            return Ok(h.ptr());
        }
        let mem = new_host_mirror(
            self.device.as_ref(),
            self.pinned_host,
            self.size,
            &self.label,
            zero,
        )
        .map_err(|e| self.named(e))?;
        let ptr = mem.ptr();
        core.host = Some(mem);
        Ok(ptr)
    }

    /// Allocates the device mirror from the device pool if missing, and registers it as
    /// evictable; it becomes the buffer's one allocation where zero-copy applies (see
    /// [`SyncedMemory::share`]), moving an existing host mirror's data in only with
    /// `replace_host` (the caller holds the exclusive access lock: no host guard can still
    /// read the old host mirror).
    pub(super) fn ensure_dev_alloc(
        &self,
        core: &mut Core,
        replace_host: bool,
    ) -> Result<Arc<DeviceBuffer>> {
        if let Some(d) = &core.dev {
            return Ok(d.clone());
        }
        let device = self.device.as_ref().ok_or_else(|| self.no_device())?;
        let stream = self.pick_stream(None)?;
        let buf = DeviceBuffer::pooled(device, self.size, &stream, Some(&self.label))
            .map_err(|e| self.named(e))?;
        let bytes = buf.len();
        let buf = Arc::new(buf);
        core.dev = Some(buf.clone());
        core.dev_owned = true;
        core.dev_exposed = false;
        if bytes > 0 {
            let weak: Weak<dyn Evictable> = Arc::downgrade(&self.shared) as Weak<dyn Evictable>;
            core.dev_reg = Some(registry::of(device).register(weak, bytes));
        }
        self.share(core, &buf, replace_host)?;
        Ok(buf)
    }

    /// Notes a device access, for the order of spills (least recently used first).
    pub(super) fn note_device_use(&self) {
        self.shared
            .last_use
            .store(super::spill::tick(), std::sync::atomic::Ordering::Relaxed);
    }
}

/// A host mirror of `size` bytes: from `device`'s pinned pool with `pinned`, else from the host
/// pool, named `label` in memory snapshots. `zero`: the bytes must read as zeros.
pub(super) fn new_host_mirror(
    device: Option<&Device>,
    pinned: bool,
    size: usize,
    label: &Arc<str>,
    zero: bool,
) -> Result<HostMem> {
    if let Some(d) = device {
        crate::device::inject::check(d, size, "a host mirror")?;
    }
    Ok(match (device, pinned) {
        (Some(d), true) if size > 0 => {
            let mut p = d.shared.memory.alloc_pinned(d, size, Some(label))?;
            if zero && !p.was_zeroed() {
                p.as_mut_slice().fill(0);
            }
            HostMem::Pinned(p)
        }
        (Some(d), true) => HostMem::Pinned(d.alloc_pinned(0)?),
        _ => {
            let mut h = HostPool::global().and_then(|p| p.alloc_labelled(size, Some(label)))?;
            if zero {
                h.zero();
            }
            HostMem::Owned(h)
        }
    })
}

impl Evictable for Shared {
    fn try_spill(&self, wait: bool) -> Option<crate::device::Freed> {
        super::spill::spill(self, wait)
    }

    fn last_use(&self) -> u64 {
        self.last_use.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn try_evict(&self) -> Option<usize> {
        // Never wait: a buffer whose locks are taken is in use (possibly by the very thread
        // that is allocating), and is skipped; so is a pinned one (an address of it was
        // handed out).
        if self.pinned() {
            return None;
        }
        let _exclusive = self.access.try_write()?;
        let mut core = self.core.try_lock()?;
        if let Some(p) = &core.pending {
            if !p.point.stream.is_done(p.point.seq).unwrap_or(false) {
                return None;
            }
            core.finish_pending().ok()?;
        }
        // Only a clean or stale mirror may go: the host copy must be current, in memory of
        // its own (a zero-copy buffer's host side is the device mirror: it can only be
        // spilled).
        if core.valid.remote_only() && core.dev_owned && core.zc.is_none() {
            // Stale: only replicas on other devices hold the data, which stays with them.
            let bytes = core.dev.as_ref()?.len();
            core.release_device(self.device.as_ref());
            return Some(bytes);
        }
        if !core.valid.has(Place::Host) || !core.dev_owned || core.zc.is_some() {
            return None;
        }
        let bytes = core.dev.as_ref()?.len();
        core.release_device(self.device.as_ref());
        core.valid = Valid::only(Place::Host);
        Some(bytes)
    }

    fn head_now(&self) -> Option<Head> {
        self.core.try_lock().map(|c| c.head())
    }

    fn label_now(&self) -> String {
        self.label.lock().clone()
    }
}
