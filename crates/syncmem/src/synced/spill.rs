//! What the device's out-of-memory path does to a buffer, through the weak reference the
//! buffer registered with the device ([`super::registry`]): eviction and spilling.
//!
//! Eviction drops a clean device mirror (the host is current) of a buffer not in use: the head
//! becomes [`super::Head::AtHost`], and the next device access uploads again.
//!
//! Spilling writes a dirty device mirror back to the host to make room. When a device
//! allocation fails even after the device's out-of-memory path freed its cache and dropped the
//! clean mirrors (see [`crate::device`]), the path spills: it writes back the least recently
//! used dirty mirrors that nothing holds (no guard, no lock taken, no transfer or command
//! queued on them; a last round waits for queued commands to finish first), moves their head
//! to the host and frees their device memory. The next device access brings the data back (a
//! refill). A zero-copy buffer's memory is its device mirror: where the host uses it in place,
//! spilling it parks it, no byte copied ([`super::park`]: the block becomes the host mirror and
//! leaves the cap's count); otherwise the data is copied into a host mirror of its own. A buffer whose placement is pinned ([`super::PlacementPin`]: a
//! view or an export of its memory lives) is never spilled nor evicted.
//!
//! Spills and refills are counted apart from copies ([`Direction::Spill`],
//! [`Direction::Refill`]), on the buffer, in the process's counters and in attached traces.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::memory::new_host_mirror;
use super::shared::ZeroCopyState;
use super::state::{Head, Place};
use super::{Core, HostMem, Shared, SyncedMemory};
use crate::alloc::stats::Direction;
use crate::device::{DeviceBuffer, Evictable, Freed, LentStream, MapAccess, Stream};

/// A clock of device accesses: every access of a device mirror takes the next tick (see
/// [`tick`]).
static CLOCK: AtomicU64 = AtomicU64::new(1);

/// Ticks a thread takes from [`CLOCK`] at once.
const TICKS: u64 = 1024;

thread_local! {
    /// The ticks this thread took last: the next one, and the end of its block.
    static BLOCK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The next tick of the clock of device accesses, after every tick handed out before (but
/// one each thread may be handing out at that moment). A thread takes a block of ticks with
/// one atomic add and hands them out while its block is still the clock's newest (no thread
/// took one since): an access costs a thread-local and a load, not a locked instruction
/// (which was a fifth of a device access's own time).
fn tick() -> u64 {
    BLOCK.with(|b| {
        let (next, end) = b.get();
        if next < end && CLOCK.load(Relaxed) == end {
            b.set((next + 1, end));
            return next;
        }
        let start = CLOCK.fetch_add(TICKS, Relaxed);
        b.set((start + 1, start + TICKS));
        start
    })
}

impl SyncedMemory {
    /// The buffer as the out-of-memory path sees it (a schedule drops dead values through it).
    pub(crate) fn evictable(&self) -> std::sync::Weak<dyn Evictable> {
        let weak: std::sync::Weak<Shared> = Arc::downgrade(&self.shared);
        weak
    }

    /// Notes a device access, for the order of spills (least recently used first).
    pub(super) fn note_device_use(&self) {
        self.shared.last_use.store(tick(), Relaxed);
    }
}

impl Shared {
    /// The buffer's stream (its own, else `device`'s default one), lent: what an access with no
    /// stream given uses ([`SyncedMemory::pick_stream`]); `None` when the default stream
    /// cannot be made.
    pub(super) fn stream_lent<'s>(&'s self, device: &'s crate::Device) -> Option<LentStream<'s>> {
        match &self.settings.stream {
            Some(s) => Some(s.lend()),
            None => device.default_stream_lent().ok(),
        }
    }
}

impl Evictable for Shared {
    fn try_spill(&self, wait: bool) -> Option<Freed> {
        spill(self, wait)
    }

    fn try_drop_dead(&self, wait: bool) -> Option<usize> {
        if self.pinned() {
            // An address of the buffer was handed out: its memory stays.
            return None;
        }
        let _exclusive = self.access.try_write()?;
        let mut core = self.core.try_lock()?;
        let device = self.settings.device.as_ref()?;
        let bytes = core.dev.as_ref()?.buf.len();
        if !core.dev_owned() {
            return None;
        }
        // A copy out that a copy back follows needs no wait: the contents go.
        core.coh.forget_chained_copy();
        if let Some(p) = core.coh.pending() {
            if !wait && !p.point.is_done() {
                return None;
            }
        }
        drop_dead(self, &mut core, device);
        Some(bytes)
    }

    fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
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
        if let Some(p) = core.coh.pending() {
            if !p.point.stream.is_done(p.point.seq).unwrap_or(false) {
                return None;
            }
            core.coh.finish_pending().ok()?;
        }
        // Only a clean or stale mirror may go: the host copy must be current, in memory of
        // its own (a zero-copy buffer's host side is the device mirror: it can only be
        // spilled).
        let device = self.settings.device.as_ref();
        if core.coh.remote_only() && core.dev_owned() && core.zc.is_none() {
            // Stale: only replicas on other devices hold the data, which stays with them.
            let bytes = core.dev.as_ref()?.buf.len();
            core.release_device(device);
            return Some(bytes);
        }
        if !core.coh.has(Place::Host) || !core.dev_owned() || core.zc.is_some() {
            return None;
        }
        let bytes = core.dev.as_ref()?.buf.len();
        core.release_device(device);
        core.coh.device_dropped();
        Some(bytes)
    }

    fn head_now(&self) -> Option<Head> {
        self.core.try_lock().map(|c| c.coh.head())
    }

    fn label_now(&self) -> String {
        self.settings.label.to_string()
    }

    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    fn try_copy_out(&self) -> Option<usize> {
        if self.pinned() {
            return None;
        }
        let _exclusive = self.access.try_write()?;
        let mut core = self.core.try_lock()?;
        copy_out(self, &mut core)
    }

    fn placement(&self) -> Option<(usize, usize)> {
        let core = self.core.try_lock()?;
        if !core.dev_owned() {
            return None;
        }
        core.dev.as_ref()?.buf.placement()
    }
}

/// Drops the contents of `shared` (see [`SyncedMemory::drop_contents`]): a transfer in flight
/// is waited for and forgotten, a mapping of shared memory undone, an owned device mirror
/// freed without a write-back (its block goes back to the pool, ordered after the commands
/// that use it); the host mirror stays, stale. The caller holds the exclusive access lock.
fn drop_dead(shared: &Shared, core: &mut Core, device: &crate::Device) {
    core.coh.abandon_pending();
    if core.zc.is_some_and(|z| z.mapped.is_some()) {
        // The mapping goes before the memory does (the pool hands the block out again).
        if let (Some(stream), Some(dev)) = (shared.stream_lent(device), core.dev_buf()) {
            let _ = stream.unmap(&dev, core.host_ptr().unwrap_or(std::ptr::null_mut()));
        }
    }
    if core.dev_owned() {
        core.release_device(Some(device));
    }
    core.coh.contents_dropped();
}

impl SyncedMemory {
    /// Drops the contents: the data is no longer needed, and the device memory goes back
    /// without a write-back (to the pool, ordered after the commands queued on it). Head becomes
    /// [`Head::Dropped`]: a read ([`SyncedMemory::host`], [`SyncedMemory::device`], a prefetch)
    /// fails with [`crate::Error::ContentsDropped`] until the buffer is written whole
    /// ([`SyncedMemory::host_overwrite`], [`SyncedMemory::device_overwrite`]). The host mirror
    /// stays allocated, for the next write. A net running on a device with a memory cap does
    /// the same to its dead values (see [`crate::net`]).
    ///
    /// # Errors
    /// [`crate::Error::Busy`] when this thread holds a guard of the buffer or its placement is
    /// pinned (a view or an export of its memory lives).
    pub fn drop_contents(&self) -> crate::Result<()> {
        self.refuse_if_pinned()?;
        let _lock = self.lock_write(None)?;
        let mut core = self.shared.core.lock();
        match self.target() {
            Some(device) => drop_dead(&self.shared, &mut core, device),
            None => core.coh.contents_dropped(),
        }
        Ok(())
    }
}

impl SyncedMemory {
    /// Moves the data to the host and frees the device mirror now, as the out-of-memory path
    /// would spill it (see [`crate::device`]), waiting for the commands queued on it: the
    /// data is written back first where only the device holds it (or where the host shares the
    /// device's memory), and the next device access brings it back. For a buffer a program
    /// will not need on the device for a while, under a memory cap: the room it frees is there
    /// for the next allocations without an out-of-memory path. Returns the device bytes freed,
    /// 0 when there was nothing to free (no device mirror, no data yet, adopted device memory)
    /// or no host memory for the data. Counted as a spill. A zero-copy buffer whose memory the
    /// host uses in place is spilled in place (without a copy): its block stays, as the host
    /// mirror, and only leaves the cap's count (the bytes returned); nothing is copied.
    ///
    /// # Errors
    /// [`crate::Error::Busy`] when this thread holds a guard of the buffer or its placement is
    /// pinned (a view or an export of its memory lives).
    pub fn offload(&self) -> crate::Result<usize> {
        self.offload_with(false)
    }

    /// [`SyncedMemory::offload`], except that a buffer with two mirrors whose copy to the host
    /// is in flight ([`SyncedMemory::prefetch_to_host`]) frees its device mirror at once,
    /// without waiting for the copy: a stream-ordered free. The block goes back to its pool
    /// ordered after the copy (the copy's stream may reuse it at once, the others once the
    /// copy is done: until then its memory stays taken), the host mirror becomes current when
    /// the copy lands (every access waits for it, a device read too), and a
    /// [`SyncedMemory::prefetch_to_device`] on the copy's stream queues its upload behind the
    /// copy, still without a wait. If the copy fails, the data is lost and reads say so
    /// ([`crate::Error::ContentsDropped`]). For a value a program takes out and brings back
    /// on one copy stream, when waiting costs more than the memory held until the copy ends.
    ///
    /// A zero-copy buffer whose memory the host uses in place is spilled in place at once,
    /// without waiting for the device command that writes it last (nothing is copied or freed,
    /// so only the host must follow that command): until the command ends it is pending as a
    /// copy to the host ([`SyncedMemory::pending`] says [`super::PendingKind::ToHost`]), host
    /// accesses and device writes wait for it, and device reads are ordered after it on the
    /// device, with no host wait.
    ///
    /// # Errors
    /// As [`SyncedMemory::offload`].
    pub fn offload_ordered(&self) -> crate::Result<usize> {
        self.offload_with(true)
    }

    fn offload_with(&self, ordered: bool) -> crate::Result<usize> {
        self.refuse_if_pinned()?;
        let _lock = self.lock_write(None)?;
        let mut core = self.shared.core.lock();
        let freed = match self.target() {
            Some(device) if ordered => free_under_copy(&mut core, device).or_else(|| {
                super::park::park_ordered(&self.shared, &mut core).map(|bytes| Freed {
                    bytes,
                    spilled: true,
                })
            }),
            _ => None,
        }
        .or_else(|| spill_locked(&self.shared, &mut core, true));
        if let (Some(f), Some(device)) = (freed, self.target()) {
            if f.spilled {
                device.note_spill(f.bytes);
            }
        }
        Ok(freed.map_or(0, |f| f.bytes))
    }
}

/// Spills `shared`'s device mirror (see the [module docs](self)); never waits for a lock.
/// Without `wait`, a buffer with a transfer or commands still queued is skipped; with it, they
/// are waited for first. A clean or stale mirror (the host is current) is dropped without a
/// write-back (an eviction the first pass could not make, the buffer being in use then).
/// Returns what was freed, `None` when the buffer was skipped (busy, adopted memory, no data,
/// or no host memory for the data).
fn spill(shared: &Shared, wait: bool) -> Option<Freed> {
    if shared.pinned() {
        // An address of the buffer was handed out (a view, an export): nothing moves.
        return None;
    }
    let _exclusive = shared.access.try_write()?;
    let mut core = shared.core.try_lock()?;
    spill_locked(shared, &mut core, wait)
}

/// [`spill`] with the exclusive access lock and the state lock held.
fn spill_locked(shared: &Shared, core: &mut Core, wait: bool) -> Option<Freed> {
    let device = shared.settings.device.as_ref()?;
    let dev = quiet_mirror(core, wait)?;
    let dirty = match core.zc {
        // Shared memory holds the data when either side is current (not when only replicas
        // on other devices are).
        Some(_) => core.coh.has(Place::Host) || core.coh.has(Place::Device),
        None => core.coh.has(Place::Device) && !core.coh.has(Place::Host),
    };
    if !dirty && (core.zc.is_some() || !core.coh.has(Place::Host)) {
        // A mirror with no data yet is not worth it.
        return None;
    }
    if dirty {
        let stream = shared.stream_lent(device)?;
        match core.zc {
            Some(state) => {
                if super::park::park(shared, core, &dev, state, &stream).is_some() {
                    // Spilled in place: no byte copied, the block stays as the host mirror.
                    return Some(Freed {
                        bytes: dev.len(),
                        spilled: true,
                    });
                }
                write_back_shared(shared, core, &dev, &stream, state)?;
            }
            None => write_back(shared, core, &dev, &stream)?,
        }
        if shared.settings.size > 0 {
            shared.copies.record(Direction::Spill, shared.settings.size);
        }
        core.coh.spilled_to_host();
    } else {
        // The host is current: the device mirror goes without a write-back.
        core.coh.device_dropped();
    }
    let bytes = dev.len();
    drop(dev);
    core.release_device(Some(device));
    Some(Freed {
        bytes,
        spilled: dirty,
    })
}

/// Frees the device mirror of a buffer with two mirrors whose copy to the host is in flight
/// (a prefetch to the host) without waiting for the copy: a stream-ordered free. The block
/// goes back to its pool ordered after the copy (the copy's read is recorded on it: the
/// copy's stream may reuse it at once, the others once the copy is done), and the host
/// mirror becomes current when the copy lands (the copy stays pending: every access waits
/// for it, a device read too, the mirror it would read being gone). Nothing was written to
/// the device since the copy was queued (a device write settles it first). `None` when that
/// is not the case: no copy to the host in flight, shared memory, adopted device memory.
fn free_under_copy(core: &mut Core, device: &crate::Device) -> Option<Freed> {
    if core.zc.is_some() || !core.dev_owned() {
        return None;
    }
    let p = core.coh.pending()?;
    if p.kind != super::PendingKind::ToHost || p.point.is_done() {
        // Done: the ordinary path settles it without a wait.
        return None;
    }
    let bytes = core.dev_buf()?.len();
    core.coh.device_left_under_copy();
    core.release_device(Some(device));
    Some(Freed {
        bytes,
        spilled: false,
    })
}

/// The device mirror of a buffer about to spill, once nothing is in flight on it or on the
/// host mirror; `None` when the buffer is skipped: adopted device memory (it belongs to the
/// caller), work still queued without `wait`, or work that failed.
fn quiet_mirror(core: &mut Core, wait: bool) -> Option<Arc<DeviceBuffer>> {
    let dev = core.dev_buf()?;
    if !core.dev_owned() {
        return None;
    }
    if let Some(p) = core.coh.pending() {
        if !wait && !p.point.is_done() {
            return None;
        }
        core.coh.finish_pending().ok()?;
    }
    // What the release must follow. The block goes back to the pool ordered after every
    // command recorded on it (see `DeviceBuffer`'s drop), so only a read of the data on the
    // host needs commands finished, and only those that write it: none when the host copy is
    // current (nothing is read from the device), the writer alone when the host reads shared
    // memory in place (commands that only read it may still run). A write-back through a
    // device read waits for every command, as before.
    let host_current = core.zc.is_none() && core.coh.has(Place::Host);
    let in_place = core.zc.is_some_and(ZeroCopyState::host_ready);
    if host_current || in_place {
        let writing = !host_current && dev.writer_point().is_some();
        if writing && !wait {
            return None;
        }
        if writing {
            dev.wait_writer().ok()?;
        }
    } else {
        if !wait && dev.has_pending_uses() {
            return None;
        }
        dev.wait_uses().ok()?;
    }
    core.coh.release_host().ok()?;
    Some(dev)
}

/// A new host mirror for the data of `shared` (no zero fill: the data is copied in).
fn host_mirror(shared: &Shared) -> Option<HostMem> {
    let s = &shared.settings;
    new_host_mirror(
        s.device.as_ref(),
        shared.pinned_host(),
        s.size,
        &s.label,
        false,
    )
    .ok()
}

/// Copies the data of a zero-copy buffer out of its shared memory (the device mirror `dev`)
/// into a host mirror of its own, and ends the sharing.
fn write_back_shared(
    shared: &Shared,
    core: &mut Core,
    dev: &DeviceBuffer,
    stream: &Stream,
    state: ZeroCopyState,
) -> Option<()> {
    let size = shared.settings.size;
    let src = core.host_ptr()?;
    if !state.host_ready() {
        stream.map_blocking(dev, MapAccess::Read).ok()?;
    }
    let mem = host_mirror(shared)?;
    // SAFETY: `src` is the shared memory (`size` bytes of the device mirror), which no command
    // uses (every use waited for) and no guard reads (the caller holds the exclusive lock);
    // `mem` is a new host block of `size` bytes; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, mem.ptr(), size) };
    if state.mapped.is_some() || !state.host_ready() {
        stream.unmap(dev, src).ok()?;
    }
    stream.count_transfer(Direction::Spill, size);
    core.zc = None;
    core.host = Some(mem);
    Some(())
}

/// Reads the device mirror `dev`, the only current one, back into the host mirror
/// (allocated if missing).
fn write_back(shared: &Shared, core: &mut Core, dev: &DeviceBuffer, stream: &Stream) -> Option<()> {
    if core.host.is_none() {
        core.host = Some(host_mirror(shared)?);
    }
    let dst = core.host_ptr()?;
    // SAFETY: `dst` is the host mirror, `size` bytes, stale (the device alone is current), so
    // no guard reads it (and the caller holds the exclusive lock); the read is blocking.
    unsafe { stream.read_counted(dev, 0, dst, shared.settings.size, true, Direction::Spill) }
        .ok()?;
    Some(())
}

/// Copies the data of a block spilled in place (see [`super::park`]) into a host mirror of its
/// own and lets the block go back to its pool (charged again first), so that the segment it
/// kept can go: the spill the buffer would have made without sharing memory in place, made
/// late. The caller holds the exclusive access lock. A block parked with its writer running
/// waits for it here. Returns the bytes of the block.
fn copy_out(shared: &Shared, core: &mut Core) -> Option<usize> {
    let Some(HostMem::Parked(p)) = &core.host else {
        return None;
    };
    // A block parked while its writer ran (`SyncedMemory::offload_ordered`): the bytes are
    // read once it is done (a wait). If it failed, the contents are dropped: nothing to copy,
    // and the block still goes.
    let lost = core.coh.finish_pending().is_err();
    let (_, bytes) = p.charge()?;
    let src = p.ptr();
    let device = shared.settings.device.as_ref()?;
    let stream = shared.stream_lent(device)?;
    let mem = host_mirror(shared)?;
    let size = if lost { 0 } else { shared.settings.size };
    // SAFETY: `src` is the parked block, `size` bytes, which no device command writes (its
    // writer was waited for when it was parked, or above) and no host guard writes (the
    // caller holds the exclusive lock); `mem` is a new host block of `size` bytes; they do
    // not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, mem.ptr(), size) };
    if size > 0 {
        shared.copies.record(Direction::Spill, size);
    }
    stream.count_transfer(Direction::Spill, size);
    // The parked record goes: the block is charged again and goes back to its pool.
    core.host = Some(mem);
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn ticks_follow_every_tick_handed_out_before_on_any_thread() {
        let mut last = tick();
        for round in 0..3 {
            // Past the end of a block on this thread...
            for _ in 0..super::TICKS + 5 {
                let t = tick();
                assert!(t > last, "round {round}: {t} after {last}");
                last = t;
            }
            // ...and across threads: a tick taken after another thread's comes after it.
            let other = std::thread::spawn(tick).join().unwrap();
            assert!(other > last);
            let t = tick();
            assert!(t > other, "{t} after the other thread's {other}");
            last = t;
        }
    }
}
