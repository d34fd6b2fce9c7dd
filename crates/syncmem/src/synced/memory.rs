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
        let mem = match (&self.device, self.pinned_host) {
            (Some(d), true) if self.size > 0 => {
                let mut p = d
                    .shared
                    .memory
                    .alloc_pinned(d, self.size, Some(&self.label))
                    .map_err(|e| self.named(e))?;
                if zero && !p.was_zeroed() {
                    p.as_mut_slice().fill(0);
                }
                HostMem::Pinned(p)
            }
            (Some(d), true) => HostMem::Pinned(d.alloc_pinned(0)?),
            _ => {
                let mut h = HostPool::global()
                    .and_then(|p| p.alloc_labelled(self.size, Some(&self.label)))
                    .map_err(|e| self.named(e))?;
                if zero {
                    h.zero();
                }
                HostMem::Owned(h)
            }
        };
        let ptr = mem.ptr();
        core.host = Some(mem);
        Ok(ptr)
    }

    /// Allocates the device mirror from the device pool if missing, and registers it as
    /// evictable.
    pub(super) fn ensure_dev_alloc(&self, core: &mut Core) -> Result<Arc<DeviceBuffer>> {
        if let Some(d) = &core.dev {
            return Ok(d.clone());
        }
        let device = self.device.as_ref().ok_or_else(|| self.no_device())?;
        let stream = self.pick_stream(None)?;
        let release = Release::record(&stream);
        let buf = DeviceBuffer::pooled(device, self.size, &stream, release, Some(&self.label))
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
        Ok(buf)
    }
}

impl Evictable for Shared {
    fn try_evict(&self) -> Option<usize> {
        // Never wait: a buffer whose locks are taken is in use (possibly by the very thread
        // that is allocating), and is skipped.
        let _exclusive = self.access.try_write()?;
        let mut core = self.core.try_lock()?;
        if let Some(p) = &core.pending {
            if !p.point.stream.is_done(p.point.seq).unwrap_or(false) {
                return None;
            }
            core.finish_pending().ok()?;
        }
        // Only a clean mirror may go: the host copy must be current too.
        let clean = core.valid.has(Place::Host) && core.valid.has(Place::Device);
        if !clean || !core.dev_owned {
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
