//! Dropped contents in the composed model: `DropContents` frees a buffer's data without a
//! write-back; every read of it then fails with `ContentsDropped` (the model has no values for
//! it) until an overwrite gives it new ones. And its opposite, `Offload`: the device mirror
//! goes, the data stays (the operations that follow read it against the model).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use proptest::test_runner::TestCaseError;
use syncmem::{Error, Head, SyncedMemory};

use super::ops::Op;
use super::Live;

/// The slot whose dropped contents `op` would read, if any.
pub fn reads_dropped(op: Op, slots: &[Option<Live>]) -> Option<usize> {
    let dropped = |slot: usize| slots[slot].as_ref().is_some_and(|l| l.dropped);
    let read = match op {
        Op::HostRead { slot }
        | Op::HostWrite { slot, .. }
        | Op::Scale { slot, .. }
        | Op::DeviceRead { slot }
        | Op::Prefetch { slot, .. }
        | Op::Guard { slot, .. }
        | Op::ViewRead { slot }
        | Op::Pin { slot }
        | Op::MoveOut { slot, .. }
        | Op::UserTwice { slot }
        | Op::ReplicaRead { slot }
        | Op::ReplicaScale { slot, .. } => vec![slot],
        Op::Axpy { x, y, .. } => vec![x, y],
        _ => Vec::new(),
    };
    read.into_iter().find(|&s| dropped(s))
}

/// Every read of a dropped buffer fails, naming it, and changes nothing.
pub fn reads_fail(mem: &SyncedMemory, at: &str) -> Result<(), TestCaseError> {
    let is_dropped = |r: syncmem::Result<()>, what: &str| match r {
        Err(Error::ContentsDropped { buffer, .. }) if buffer == mem.label() => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "{at}: {what} of dropped contents: {other:?}"
        ))),
    };
    is_dropped(mem.host().map(drop), "host read")?;
    is_dropped(mem.device().map(drop), "device read")?;
    is_dropped(mem.host_mut().map(drop), "host write")?;
    is_dropped(mem.device_mut().map(drop), "device write")?;
    is_dropped(mem.prefetch_to_device(None).map(drop), "prefetch")?;
    if mem.head() != Head::Dropped {
        return Err(TestCaseError::fail(format!("{at}: head {}", mem.head())));
    }
    Ok(())
}

/// Contents dropped so far (by every program of the process).
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// `DropContents`: the buffer's data goes; a pinned one (a view keeps its address) refuses.
pub fn drop_step(l: &mut Live, pinned: bool, at: &str) -> Result<(), TestCaseError> {
    match (l.mem.drop_contents(), pinned) {
        (Ok(()), false) => {
            l.dropped = true;
            DROPPED.fetch_add(1, Relaxed);
            reads_fail(&l.mem, at)
        }
        (Err(Error::Busy { .. }), true) => Ok(()),
        (r, _) => Err(TestCaseError::fail(format!(
            "{at}: drop_contents (pinned {pinned}): {r:?}"
        ))),
    }
}

/// Buffers whose device mirror an `Offload` freed (by every program of the process).
pub static OFFLOADED: AtomicU64 = AtomicU64::new(0);

/// Buffers sharing memory in place that an `Offload` parked (spilled in place).
pub static PARKED: AtomicU64 = AtomicU64::new(0);

/// Ordered `Offload`s that freed a device mirror under its copy to the host in flight.
pub static UNDER_COPY: AtomicU64 = AtomicU64::new(0);

/// Ordered `Offload`s that parked a block shared in place under its device writer in flight.
pub static UNDER_WRITE: AtomicU64 = AtomicU64::new(0);

/// Counts an ordered offload of `l` that left its device mirror under work in flight: a copy
/// to the host, or (`in_place`: memory shared in place) the device's last write.
pub fn count_under_work(l: &Live, in_place: bool) {
    if l.mem.pending().ok().flatten() == Some(syncmem::synced::PendingKind::ToHost)
        && !l.mem.device_allocated()
    {
        if in_place {
            UNDER_WRITE.fetch_add(1, Relaxed);
        } else {
            UNDER_COPY.fetch_add(1, Relaxed);
        }
    }
}

/// `Offload`: the device mirror goes and the data stays (the model is unchanged: later reads
/// check it); dropped contents stay dropped; a pinned buffer (a view keeps its address)
/// refuses.
pub fn offload_step(l: &Live, pinned: bool, ordered: bool, at: &str) -> Result<(), TestCaseError> {
    let in_place = l.mem.zero_copy_protocol() == Some(syncmem::ZeroCopyProtocol::InPlace);
    let spilled = l.mem.copy_stats().spilled.bytes;
    let offloaded = if ordered {
        l.mem.offload_ordered()
    } else {
        l.mem.offload()
    };
    match (offloaded, pinned) {
        (Ok(freed), false) => {
            if freed > 0 {
                OFFLOADED.fetch_add(1, Relaxed);
                if in_place {
                    // Spilled in place: the block stays as the host mirror, nothing copied.
                    PARKED.fetch_add(1, Relaxed);
                    if l.mem.copy_stats().spilled.bytes != spilled {
                        return Err(TestCaseError::fail(format!(
                            "{at}: a buffer sharing memory in place was copied out"
                        )));
                    }
                }
                if l.mem.device_allocated() {
                    return Err(TestCaseError::fail(format!(
                        "{at}: {freed} bytes offloaded, the device mirror is still there"
                    )));
                }
                if ordered {
                    count_under_work(l, in_place);
                }
            }
            if l.dropped {
                return reads_fail(&l.mem, at);
            }
            Ok(())
        }
        (Err(Error::Busy { .. }), true) => Ok(()),
        (r, _) => Err(TestCaseError::fail(format!(
            "{at}: offload (pinned {pinned}): {r:?}"
        ))),
    }
}
