//! Mirrors of synced buffers as a device sees them: their [`Head`], the hooks the
//! out-of-memory path uses to drop clean ones ([`Evictable`], [`Mirrors`]) and what it reports
//! about them ([`LiveBuffer`]).
//!
//! The device knows nothing of the buffers above it: the synced layer registers its mirrors
//! with the device through [`Mirrors`] (a registry it installs on first use), and the
//! out-of-memory path calls back through it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::alloc::stats::human_bytes;

/// Caffe's head: which mirror holds the newest data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Head {
    /// Nothing has been allocated or written yet (`UNINITIALIZED`).
    Uninitialized,
    /// Only the host mirror is current (`HEAD_AT_CPU`).
    AtHost,
    /// Only the device mirror is current (`HEAD_AT_GPU`).
    AtDevice,
    /// Both mirrors hold the same data (`SYNCED`).
    Synced,
    /// Neither mirror is current: only a replica on another device holds the newest data
    /// (written there with [`crate::SyncedMemory::device_mut_on`]). Not one of Caffe's heads;
    /// the next access of either mirror copies the data back first.
    Elsewhere,
    /// No mirror holds data: the contents were dropped as no longer needed (a net's dead value
    /// under a memory cap, or [`crate::SyncedMemory::drop_contents`]). Reads fail with
    /// [`crate::Error::ContentsDropped`] until the buffer is overwritten whole. Not one of
    /// Caffe's heads.
    Dropped,
}

impl Head {
    /// `uninitialized`, `host`, `device`, `synced`, `elsewhere` or `dropped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Head::Uninitialized => "uninitialized",
            Head::AtHost => "host",
            Head::AtDevice => "device",
            Head::Synced => "synced",
            Head::Elsewhere => "elsewhere",
            Head::Dropped => "dropped",
        }
    }
}

impl fmt::Display for Head {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device mirror the out-of-memory path may drop.
pub(crate) trait Evictable: Send + Sync {
    /// Drops the device mirror if the host copy is current (head [`Head::Synced`], or
    /// [`Head::AtHost`]: the device mirror is stale) and no guard or transfer uses the buffer;
    /// never waits for a lock. Returns the bytes freed.
    fn try_evict(&self) -> Option<usize>;
    /// Frees the device mirror when nothing holds the buffer, never waiting for a lock:
    /// written back to the host first when only the device holds the data (or the host shares
    /// the device's memory), dropped as it is when the host is current. Without `wait`, a
    /// buffer with queued work is skipped; with it, the work is waited for first.
    fn try_spill(&self, wait: bool) -> Option<Freed>;
    /// Frees the device mirror of a buffer whose contents a schedule knows to be dead (see
    /// [`NextUse::is_dead`]) without writing them back: the buffer's head becomes
    /// [`Head::Dropped`]. Never waits for a lock; without `wait`, a buffer with a transfer in
    /// flight is skipped. Returns the bytes freed.
    fn try_drop_dead(&self, wait: bool) -> Option<usize>;
    /// When the device mirror was last used (larger is more recent): spills go least recently
    /// used first.
    fn last_use(&self) -> u64;
    /// The head now, or `None` when the buffer is busy (its state lock is held).
    fn head_now(&self) -> Option<Head>;
    /// The buffer's label.
    fn label_now(&self) -> String;
    /// The buffer's identity while it lives (its shared state's address): what a schedule
    /// ([`NextUse`]) knows it by.
    fn key(&self) -> usize;
    /// Where the device mirror lies in its pool: (its segment's address, its offset there);
    /// `None` when it is not a pool block or the buffer is busy. Victims that lie side by
    /// side free room in one piece.
    fn placement(&self) -> Option<(usize, usize)> {
        None
    }
    /// For a buffer whose block is spilled in place (parked): copies its data into a host
    /// mirror of its own and gives the block back to its pool, so that its segment can go
    /// (the out-of-memory path's last resort, see `crate::synced`). Never waits for a lock; it
    /// waits for the device write a block was parked under, if that still runs. Returns the
    /// bytes of the block given back.
    fn try_copy_out(&self) -> Option<usize> {
        None
    }
}

/// What a running schedule (a net) knows about when buffers are used next: under memory
/// pressure the out-of-memory path drops and spills first the mirrors the schedule does not
/// use, then those used furthest ahead (Belady's rule), instead of the least recently used.
pub(crate) trait NextUse: Send + Sync {
    /// Operators until the buffer `key` ([`Evictable::key`]) is used next (0: by the running
    /// operator), counting on into the next run of the schedule; `None` when the schedule
    /// does not use it.
    fn next_use(&self, key: usize) -> Option<usize>;
    /// Whether the contents of buffer `key` are dead: the schedule's next use of it overwrites
    /// it whole before anything reads it, and nothing outside the schedule reads it (a blob
    /// internal to the net). Its device mirror can then go without a write-back.
    fn is_dead(&self, key: usize) -> bool;
}

/// A mirror that frees nothing, for tests of what orders or finds mirrors.
#[cfg(test)]
pub(crate) struct Inert(pub(crate) &'static str);

#[cfg(test)]
impl Evictable for Inert {
    fn try_evict(&self) -> Option<usize> {
        None
    }
    fn try_spill(&self, _: bool) -> Option<Freed> {
        None
    }
    fn try_drop_dead(&self, _: bool) -> Option<usize> {
        None
    }
    fn last_use(&self) -> u64 {
        0
    }
    fn head_now(&self) -> Option<Head> {
        Some(Head::Synced)
    }
    fn label_now(&self) -> String {
        self.0.to_string()
    }
    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

/// A device mirror freed by [`Evictable::try_spill`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Freed {
    /// Device bytes freed.
    pub(crate) bytes: usize,
    /// The data was written back to the host (a spill), not just dropped (an eviction).
    pub(crate) spilled: bool,
}

/// A live device mirror of a [`crate::SyncedMemory`] (see [`crate::Device::live_buffers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveBuffer {
    /// The buffer's label.
    pub label: String,
    /// Size of the device mirror.
    pub bytes: u64,
    /// Its head, or `None` when it was busy at the time of reading.
    pub head: Option<Head>,
}

impl fmt::Display for LiveBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = self.head.map_or("busy", Head::as_str);
        write!(f, "{} ({}, {head})", self.label, human_bytes(self.bytes))
    }
}

/// The mirrors of one device, as the synced layer registers them (see the [module docs](self)).
pub(crate) trait Mirrors: Send + Sync + Any {
    /// The live mirrors in eviction order (largest first, then the mirror registered first),
    /// with their sizes. No lock is held afterwards.
    fn candidates(&self) -> Vec<(Arc<dyn Evictable>, usize)>;

    /// The buffers whose blocks are spilled in place (see [`Evictable::try_copy_out`]).
    fn parked(&self) -> Vec<Arc<dyn Evictable>> {
        Vec::new()
    }

    /// The registry itself, for the synced layer to take back its own type.
    fn as_any(&self) -> &dyn Any;
}

/// Label, size and head of every live mirror of `mirrors`, in eviction order.
pub(crate) fn live_buffers(mirrors: &dyn Mirrors) -> Vec<LiveBuffer> {
    mirrors
        .candidates()
        .into_iter()
        .map(|(item, bytes)| LiveBuffer {
            label: item.label_now(),
            bytes: bytes as u64,
            head: item.head_now(),
        })
        .collect()
}
