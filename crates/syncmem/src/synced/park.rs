//! Spilling in place: a zero-copy buffer spilled where the host uses the device's memory in
//! place keeps its memory, which becomes its host mirror; only the memory cap's accounting
//! moves.
//!
//! On a host-unified device ([`ZeroCopyProtocol::InPlace`]: `cpu`, PoCL, integrated GPUs) a
//! zero-copy buffer's one allocation is a block of the device pool that host and device both
//! use. Spilling it ([`super::spill`], [`SyncedMemory::offload`]) would copy its bytes into a
//! host mirror of its own and give the block back; instead the block is *parked*:
//! - it stays where it is and becomes the buffer's host mirror ([`HostMem::Parked`]); the
//!   device mirror is gone as far as the buffer, the device and its out-of-memory path see
//!   ([`SyncedMemory::device_allocated`] is false, the head [`super::Head::AtHost`]);
//! - its bytes leave the pool's budget ([`Budget::park`]), so the cap has that room, and the
//!   pool's reserved bytes exceed the bytes charged by [`crate::PoolStats::parked_bytes`]
//!   (the pool still counts the block as handed out: its snapshots show it allocated, owned
//!   by the buffer);
//! - the next device access charges them again (through the out-of-memory path when the cap
//!   has no room: cached segments released, other buffers dropped or spilled; when nothing
//!   makes room the access fails with [`crate::Error::OutOfMemory`] and the buffer stays
//!   parked), and the memory is the device mirror again: no byte copied either way. The spill
//!   and the refill are counted, of no byte ([`crate::Direction::Spill`],
//!   [`crate::Direction::Refill`] with 0 bytes, on the buffer, in the process and in traces;
//!   the pool's [`crate::PoolStats::spills`] and `refills`), and the device access as a
//!   zero-copy sync ([`crate::Direction::Mapped`]);
//! - a host write waits for the device commands that may still read the memory, as a host
//!   write of shared memory does; a host read needs no wait (the writer was waited for when
//!   the block was parked), except after [`SyncedMemory::offload_ordered`], which parks the
//!   block with its writer still running and leaves that writer pending as a copy to the host
//!   ([`park_ordered`]): host accesses and device writes wait for it, device reads are ordered
//!   after it on the device;
//! - freed while parked (the buffer dropped, its host data replaced), the block is charged
//!   again, over the cap if need be, before it goes back to its pool, whose segments are
//!   charged whole;
//! - a parked block keeps its segment, and with it the cached free memory the segment also
//!   holds, charged: when the out-of-memory path has dropped, evicted and spilled all it
//!   could, it copies parked data into host mirrors of their own and lets their blocks go (the
//!   copying spill, made late, counted then with its bytes), before it gives up.
//!
//! The `map` protocol (a driver that does not use the memory in place) and
//! `SYNCMEM_ZERO_COPY=off` keep the copying spill. The bytes are the same either way: on a
//! host-unified device the spilled data lives in host memory both ways.

use std::ptr::NonNull;
use std::sync::Arc;

use super::registry;
use super::shared::ZeroCopyState;
use super::state::Place;
use super::{Core, DevMirror, HostMem, PendingKind, Shared, SyncedMemory};
use crate::alloc::pool::Budget;
use crate::alloc::stats::{CopyCounters, Direction};
use crate::device::{Device, DeviceBuffer, Stream, ZeroCopyProtocol};
use crate::error::Result;

/// A device pool block parked as a buffer's host mirror (see the [module docs](self)). Kept
/// in place in the host mirror's record, not boxed: parking and bringing back allocate nothing
/// on the heap (a capped training step parks its batch every step).
pub(super) struct Parked {
    /// The block (`None` once taken back as the device mirror). Its pool's budget and the
    /// bytes parked there are the block's ([`DeviceBuffer::pool_charge`]).
    buf: Option<Arc<DeviceBuffer>>,
    /// The host address of the memory.
    host: NonNull<u8>,
    /// A device guard had been handed out (see [`DevMirror::exposed`]).
    exposed: bool,
    /// The device mirror's id in the device's registry, marked parked there.
    reg: Option<registry::Reg>,
}

impl Parked {
    pub(super) fn ptr(&self) -> *mut u8 {
        self.host.as_ptr()
    }

    /// Waits for the device commands that may still use the memory: before a host write.
    pub(super) fn wait_readers(&self) -> Result<()> {
        self.buf.as_ref().map_or(Ok(()), |b| b.wait_uses())
    }

    /// Registers the block again (marked parked) with an entry from `fresh` (given the
    /// block's bytes), after a new shared part took the buffer over: the old entry names the
    /// old part (see `SyncedMemory::register_again`).
    pub(super) fn register_again(
        &mut self,
        device: &Device,
        fresh: impl FnOnce(usize) -> registry::Reg,
    ) {
        let Some(old) = self.reg.take() else {
            return;
        };
        registry::of(device).unregister(old);
        if let Some(buf) = &self.buf {
            let reg = fresh(buf.len());
            registry::of(device).set_parked(reg.id(), true);
            self.reg = Some(reg);
        }
    }

    /// The budget the block's bytes were given back to, and those bytes.
    pub(super) fn charge(&self) -> Option<(Arc<Budget>, usize)> {
        let (budget, bytes) = self.buf.as_ref()?.pool_charge()?;
        Some((budget.clone(), bytes))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let Some((budget, bytes)) = self.charge() else {
            return;
        };
        let Some(buf) = self.buf.take() else {
            return;
        };
        // Charged again before the block goes back to its pool.
        budget.unpark_anyway(bytes as u64);
        let device = buf.device().clone();
        if let Some(reg) = self.reg.take() {
            registry::of(&device).unregister(reg);
        }
        drop(buf);
        if budget.refusing(0).is_some() {
            // Over the cap now: idle cached segments go back (without waiting) until it holds.
            if let Some(pool) = device.shared.memory.current_pool() {
                pool.trim();
            }
        }
    }
}

/// Parks the device mirror `dev` of `shared`, a zero-copy buffer sharing it in place (see the
/// [module docs](self)), once nothing writes it any more (the caller waited for that) and
/// with the exclusive access lock held. `None` where the buffer cannot be parked: the copying
/// spill applies.
pub(super) fn park(
    shared: &Shared,
    core: &mut Core,
    dev: &Arc<DeviceBuffer>,
    state: ZeroCopyState,
    stream: &Stream,
) -> Option<()> {
    let device = shared.settings.device.as_ref()?;
    if state.protocol != ZeroCopyProtocol::InPlace || state.mapped.is_some() {
        return None;
    }
    let (budget, bytes) = dev.pool_charge()?;
    let host = NonNull::new(core.host_ptr()?)?;
    let mirror = core.dev.take()?;
    if let Some(reg) = &mirror.reg {
        registry::of(device).set_parked(reg.id(), true);
    }
    budget.park(bytes as u64);
    core.zc = None;
    core.host = Some(HostMem::Parked(Parked {
        buf: Some(mirror.buf),
        host,
        exposed: mirror.exposed,
        reg: mirror.reg,
    }));
    core.coh.spilled_to_host();
    count_in_place(&shared.copies, stream, Direction::Spill);
    Some(())
}

/// Parks the device mirror of `shared`, a zero-copy buffer sharing it in place, without waiting
/// for the device command that writes it last ([`SyncedMemory::offload_ordered`]): parking
/// moves no byte and frees no memory (the block stays, as the host mirror), so only the host's
/// accesses must follow that command. It stays pending as a copy to the host ending with the
/// command ([`super::PendingKind::ToHost`]): every host access waits for it, as a device write
/// does (a device read is ordered after it on the device by the block's uses), and a spill
/// that copies the parked bytes out later settles it first. Returns the buffer's bytes (the
/// block's are given back to the budget), or `None` where the ordinary path applies: no write
/// in flight (it parks with no wait), other work pending (not a copy to the host), no data
/// yet, adopted or mapped memory, or memory that is not shared in place.
pub(super) fn park_ordered(shared: &Shared, core: &mut Core) -> Option<usize> {
    let state = core.zc?;
    if state.protocol != ZeroCopyProtocol::InPlace || state.mapped.is_some() || !core.dev_owned() {
        return None;
    }
    // A copy to the host pending on shared memory is the wait for that writer
    // ([`SyncedMemory::prefetch_to_host`]): the park takes it over.
    let other_work = core
        .coh
        .pending()
        .is_some_and(|p| p.kind != PendingKind::ToHost);
    if other_work || !(core.coh.has(Place::Host) || core.coh.has(Place::Device)) {
        return None;
    }
    // No write in flight (the common case at a deadline): the ordinary path, with no clone.
    let writer = core.dev.as_ref()?.buf.writer_point()?;
    let dev = core.dev_buf()?;
    let device = shared.settings.device.as_ref()?;
    let stream = shared.stream_lent(device)?;
    // A copy that reads the shared memory (none is queued for memory shared in place) is let
    // end as the ordinary path does.
    core.coh.release_host().ok()?;
    park(shared, core, &dev, state, &stream)?;
    core.coh.queued(PendingKind::ToHost, Some(writer));
    // The buffer's bytes, as the ordinary path's spill returns.
    Some(dev.len())
}

/// Counts a spill or a refill made in place: one, of no byte (nothing was copied), on the
/// buffer and in the process's counters (and attached traces).
fn count_in_place(copies: &CopyCounters, stream: &Stream, kind: Direction) {
    copies.record(kind, 0);
    stream.count_transfer(kind, 0);
}

impl Core {
    /// The host mirror is a parked block and no device mirror exists: the next device access
    /// brings the block back ([`SyncedMemory::unpark`]). Two compares on every device access.
    #[inline]
    pub(super) fn parked(&self) -> bool {
        self.dev.is_none() && matches!(self.host, Some(HostMem::Parked(_)))
    }
}

impl SyncedMemory {
    /// Brings a parked block back as the device mirror, shared with the host again (see the
    /// [module docs](self)): its bytes are charged to the budget first, making room as an
    /// allocation would. Nothing when the host mirror is not a parked block.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] when the cap has no room even after the out-of-memory
    /// path (the buffer stays as it was), or an injected failure.
    #[cold]
    #[inline(never)]
    pub(super) fn unpark(&self, core: &mut Core) -> Result<()> {
        let Some(HostMem::Parked(p)) = &core.host else {
            return Ok(());
        };
        if core.dev.is_some() {
            // An adopted device mirror: the parked block is only the host mirror.
            return Ok(());
        }
        let Some((budget, bytes)) = p.charge() else {
            return Ok(());
        };
        let device = self.target().ok_or_else(|| self.no_device())?;
        crate::device::inject::check(device, bytes, "device memory").map_err(|e| self.named(e))?;
        device
            .shared
            .memory
            .unpark(device, &budget, bytes)
            .map_err(|e| self.named(e))?;
        let mut p = match core.host.take() {
            Some(HostMem::Parked(p)) => p,
            other => {
                // Not reached: the state lock is held throughout.
                core.host = other;
                budget.park(bytes as u64);
                return Ok(());
            }
        };
        // Charged again: taken out, the block is not charged a second time when the record
        // goes.
        let Some(buf) = p.buf.take() else {
            return Ok(());
        };
        let host = p.host;
        let reg = p.reg.take();
        if let Some(reg) = &reg {
            registry::of(device).set_parked(reg.id(), false);
        }
        let reg = match reg {
            Some(reg) => Some(reg),
            None => self.register(core, device, buf.len()),
        };
        core.dev = Some(DevMirror {
            reg,
            buf,
            owned: true,
            exposed: p.exposed,
        });
        core.host = Some(HostMem::Shared(host));
        core.zc = Some(ZeroCopyState {
            protocol: ZeroCopyProtocol::InPlace,
            mapped: None,
        });
        // Nothing to bring back: the data never left. A refill of no byte, unless the host
        // wrote new data since (as the upload of a spilled buffer is then an ordinary one);
        // the device access counts the zero-copy sync.
        if core.coh.spilled() {
            core.coh.spill_forgotten();
            self.note_refill();
            if let Ok(stream) = self.pick_stream(None) {
                count_in_place(&self.shared.copies, &stream, Direction::Refill);
            }
        }
        Ok(())
    }
}
