//! Spilling: a dirty device mirror written back to the host to make room on the device.
//!
//! When a device allocation fails even after the device's out-of-memory path freed its cache
//! and dropped the clean mirrors (see [`crate::device`]), the path spills: it writes back the
//! least recently used dirty mirrors that nothing holds (no guard, no lock taken, no transfer
//! or command queued on them; a last round waits for queued commands to finish first), moves
//! their head to the host and frees their device memory. The next device access brings the
//! data back (a refill). A zero-copy buffer's memory is its device mirror: spilling it copies
//! the data into a host mirror of its own. A buffer whose placement is pinned
//! ([`super::PlacementPin`]: a view or an export of its memory lives) is never spilled.
//!
//! Spills and refills are counted apart from copies ([`Direction::Spill`],
//! [`Direction::Refill`]), on the buffer, in the process's counters and in attached traces.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::memory::new_host_mirror;
use super::state::{Place, Valid};
use super::{HostMem, Shared};
use crate::alloc::stats::Direction;
use crate::device::{Freed, MapAccess};

/// A clock of device accesses: every access of a device mirror takes the next tick.
static CLOCK: AtomicU64 = AtomicU64::new(1);

/// The next tick of the device-access clock.
pub(super) fn tick() -> u64 {
    CLOCK.fetch_add(1, Relaxed)
}

/// Spills `shared`'s device mirror (see the [module docs](self)); never waits for a lock.
/// Without `wait`, a buffer with a transfer or commands still queued is skipped; with it, they
/// are waited for first. A clean or stale mirror (the host is current) is dropped without a
/// write-back (an eviction the first pass could not make, the buffer being in use then).
/// Returns what was freed, `None` when the buffer was skipped (busy, adopted memory, no data,
/// or no host memory for the data).
pub(super) fn spill(shared: &Shared, wait: bool) -> Option<Freed> {
    if shared.pinned() {
        // An address of the buffer was handed out (a view, an export): nothing moves.
        return None;
    }
    let _exclusive = shared.access.try_write()?;
    let mut core = shared.core.try_lock()?;
    let device = shared.device.as_ref()?;
    let dev = core.dev.clone()?;
    if !core.dev_owned {
        // Adopted device memory belongs to the caller: never moved.
        return None;
    }
    if let Some(p) = &core.pending {
        if !wait && !p.point.is_done() {
            return None;
        }
        core.finish_pending().ok()?;
    }
    if !wait && dev.has_pending_uses() {
        return None;
    }
    dev.wait_uses().ok()?;
    core.release_host().ok()?;
    let valid = core.valid;
    let shared_mem = core.zc;
    let dirty = match shared_mem {
        // Shared memory holds the data when either side is current (not when only replicas
        // on other devices are).
        Some(_) => valid.has(Place::Host) || valid.has(Place::Device),
        None => valid.has(Place::Device) && !valid.has(Place::Host),
    };
    if !dirty {
        if shared_mem.is_none() && valid.has(Place::Host) {
            // The host is current: the device mirror goes without a write-back.
            let bytes = dev.len();
            drop(dev);
            core.release_device(Some(device));
            core.valid = Valid::only(Place::Host);
            return Some(Freed {
                bytes,
                spilled: false,
            });
        }
        // A mirror with no data yet is not worth it.
        return None;
    }
    let stream = match shared.stream.lock().clone() {
        Some(s) => s,
        None => device.default_stream().ok()?,
    };
    let size = shared.size;
    let label: Arc<str> = shared.label.lock().as_str().into();
    let pinned = shared.pinned_host.load(Relaxed);
    match shared_mem {
        Some(state) => {
            let src = core.host.as_ref().map(HostMem::ptr)?;
            if !state.host_ready() {
                stream.map_blocking(&dev, MapAccess::Read).ok()?;
            }
            let mem = new_host_mirror(Some(device), pinned, size, &label, false).ok()?;
            // SAFETY: `src` is the shared memory (`size` bytes of the device mirror), which no
            // command uses (every use waited for above) and no guard reads (the exclusive lock
            // is held); `mem` is a new host block of `size` bytes; they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, mem.ptr(), size) };
            if state.mapped.is_some() || !state.host_ready() {
                stream.unmap(&dev, src).ok()?;
            }
            stream.count_transfer(Direction::Spill, size);
            core.zc = None;
            core.host = Some(mem);
        }
        None => {
            if core.host.is_none() {
                core.host = Some(new_host_mirror(Some(device), pinned, size, &label, false).ok()?);
            }
            let dst = core.host.as_ref().map(HostMem::ptr)?;
            // SAFETY: `dst` is the host mirror, `size` bytes, stale (the device alone is
            // current), so no guard reads it (and the exclusive lock is held); the read is
            // blocking.
            unsafe { stream.read_counted(&dev, 0, dst, size, true, Direction::Spill) }.ok()?;
        }
    }
    if size > 0 {
        shared.copies.record(Direction::Spill, size);
    }
    core.valid = Valid::only(Place::Host);
    core.spilled = true;
    let bytes = dev.len();
    drop(dev);
    core.release_device(Some(device));
    Some(Freed {
        bytes,
        spilled: true,
    })
}
