//! Where the mirrors come from and how they go: the host pool (or the device's pinned pool)
//! for host mirrors, the device pool for device mirrors, registered with the device for its
//! out-of-memory path (see [`registry`], and [`super::spill`] for what that path does).

use std::sync::{Arc, Weak};

use super::registry;
use super::{Core, DevMirror, HostMem, SyncedMemory};
use crate::alloc::pool::HostPool;
use crate::device::Evictable;
use crate::device::{Device, DeviceBuffer, Release};
use crate::error::Result;

impl Core {
    /// Frees the device mirror (back to the pool when it came from there) and unregisters it.
    /// The caller moves the head. A mirror no guard ever exposed has no work in flight, so its
    /// block is reusable by every stream at once.
    pub(super) fn release_device(&mut self, device: Option<&Device>) {
        if self.zc.take().is_some() {
            // Shared memory: the host side is the device mirror's memory and goes with it.
            self.host = None;
        }
        let Some(mut mirror) = self.dev.take() else {
            return;
        };
        if let Some(reg) = mirror.reg.take() {
            // The entry stays for the next mirror; at most one entry per buffer.
            reg.idle();
            debug_assert!(
                self.idle_reg.is_none(),
                "a buffer with two registry entries"
            );
            if let (Some(old), Some(d)) = (self.idle_reg.replace(reg), device) {
                registry::of(d).unregister(old);
            }
        }
        if !mirror.owned {
            return;
        }
        let Some(b) = Arc::get_mut(&mut mirror.buf) else {
            return;
        };
        if !mirror.exposed {
            b.set_release(Release::Idle);
        }
        // The block goes back to the pool here; the buffer stays, empty, for the next one
        // (or, holding a stream's handle the pool keeps, its heap allocation does).
        if let Some(d) = device {
            if !b.release_memory() {
                drop(std::mem::replace(b, DeviceBuffer::empty(d)));
            }
            self.spare = Some(mirror.buf);
        }
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
            self.target(),
            self.shared.pinned_host(),
            self.len(),
            &self.settings().label,
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
            return Ok(d.buf.clone());
        }
        if core.parked() {
            // A block spilled in place comes back as it is (see `super::park`).
            self.unpark(core)?;
            if let Some(d) = &core.dev {
                return Ok(d.buf.clone());
            }
        }
        let device = self.target().ok_or_else(|| self.no_device())?;
        let label = Some(&self.settings().label);
        let buf = match self.settings().stream.as_ref() {
            Some(stream) => {
                let buf = DeviceBuffer::pooled(device, self.len(), stream, label)
                    .map_err(|e| self.named(e))?;
                reuse(core.spare.take(), buf)
            }
            // The default stream (as `pick_stream`), without a handle made for it, into the
            // last mirror's buffer when it is free (see `release_device`).
            None => match core.spare.take() {
                Some(mut spare) => {
                    let made = match Arc::get_mut(&mut spare) {
                        Some(shell) => {
                            DeviceBuffer::pooled_default_into(device, self.len(), label, shell)
                        }
                        None => DeviceBuffer::pooled_default(device, self.len(), label).map(Some),
                    };
                    match made {
                        Ok(None) => spare,
                        Ok(Some(buf)) => reuse(Some(spare), buf),
                        Err(e) => {
                            core.spare = Some(spare);
                            return Err(self.named(e));
                        }
                    }
                }
                None => Arc::new(
                    DeviceBuffer::pooled_default(device, self.len(), label)
                        .map_err(|e| self.named(e))?,
                ),
            },
        };
        core.dev = Some(DevMirror {
            reg: self.register(core, device, buf.len()),
            buf: buf.clone(),
            owned: true,
            exposed: false,
        });
        self.share(core, &buf, replace_host)?;
        Ok(buf)
    }

    /// Registers the buffer's device mirror of `bytes` bytes with the device's out-of-memory
    /// path: revives the entry of the buffer's last mirror where it has one (no lock, no new
    /// weak reference), else makes one. `None` for an empty mirror (nothing to free).
    pub(super) fn register(
        &self,
        core: &mut Core,
        device: &Device,
        bytes: usize,
    ) -> Option<registry::Reg> {
        if bytes == 0 {
            return None;
        }
        match core.idle_reg.take() {
            Some(reg) => {
                registry::of(device).revive(&reg, bytes);
                Some(reg)
            }
            None => Some(self.new_entry(device, bytes)),
        }
    }

    /// A new registry entry for this buffer's shared part, with a mirror of `bytes` bytes.
    fn new_entry(&self, device: &Device, bytes: usize) -> registry::Reg {
        let weak: Weak<dyn Evictable> = Arc::downgrade(&self.shared) as Weak<dyn Evictable>;
        registry::of(device).register(weak, bytes)
    }

    /// Registers the device mirror again, under this buffer's shared part, after a new one took
    /// the state over ([`SyncedMemory::configure`]).
    pub(super) fn register_again(&self) {
        let Some(device) = self.target() else {
            return;
        };
        let mut core = self.shared.core.lock();
        // An idle entry names the old shared part: the next mirror makes a new one.
        if let Some(reg) = core.idle_reg.take() {
            registry::of(device).unregister(reg);
        }
        // So does a parked block's.
        if let Some(HostMem::Parked(p)) = core.host.as_mut() {
            p.register_again(device, |bytes| self.new_entry(device, bytes));
        }
        let Some(mirror) = core.dev.as_mut() else {
            return;
        };
        if let Some(reg) = mirror.reg.take() {
            registry::of(device).unregister(reg);
            mirror.reg = Some(self.new_entry(device, mirror.buf.len()));
        }
    }
}

/// `buf` in `spare`'s heap allocation when it is free (see [`Core::spare`]), else in a new one.
fn reuse(spare: Option<Arc<DeviceBuffer>>, buf: DeviceBuffer) -> Arc<DeviceBuffer> {
    match spare {
        Some(mut spare) => match Arc::get_mut(&mut spare) {
            Some(slot) => {
                *slot = buf;
                spare
            }
            None => Arc::new(buf),
        },
        None => Arc::new(buf),
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
