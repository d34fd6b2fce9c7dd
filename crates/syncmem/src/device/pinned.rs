//! [`PinnedBuffer`]: page-locked host memory of a device, direct or from its pinned pool.

use std::fmt;

use super::Device;
use crate::alloc::pool::Lease;
use crate::alloc::stats::Counted;
use crate::backend::dispatch::RawPinned;
use crate::error::Result;

/// Page-locked host memory belonging to a device, zero-filled at allocation.
pub struct PinnedBuffer {
    device: Device,
    len: usize,
    raw: Option<PinnedMem>,
    /// The pinned-memory counters' token (`None` when nothing is allocated).
    counted: Option<Counted>,
}

enum PinnedMem {
    Own(RawPinned),
    /// A block of the device's pinned pool (used for [`crate::SyncedMemory`] host mirrors).
    Pooled(Lease<RawPinned>),
}

fn pinned_ptr(p: &RawPinned) -> *mut u8 {
    p.as_ptr()
}

impl PinnedBuffer {
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self {
                device: device.clone(),
                len,
                raw: None,
                counted: None,
            });
        }
        let raw = device.shared.raw.alloc_pinned(len)?;
        let counted = device.shared.pinned.on_alloc(len);
        Ok(Self {
            device: device.clone(),
            len,
            raw: Some(PinnedMem::Own(raw)),
            counted: Some(counted),
        })
    }

    /// A pooled block (`len >= 1`): zero only when [`PinnedBuffer::was_zeroed`].
    pub(crate) fn from_pool(device: &Device, len: usize, lease: Lease<RawPinned>) -> Self {
        let counted = device.shared.pinned.on_alloc(len);
        Self {
            device: device.clone(),
            len,
            raw: Some(PinnedMem::Pooled(lease)),
            counted: Some(counted),
        }
    }

    /// True when the bytes are known to be zero (always for [`Device::alloc_pinned`]).
    pub(crate) fn was_zeroed(&self) -> bool {
        match &self.raw {
            Some(PinnedMem::Pooled(l)) => l.zeroed(),
            _ => true,
        }
    }

    /// Start of the mapping (aligned dangling when empty).
    pub(crate) fn ptr(&self) -> *mut u8 {
        match &self.raw {
            None => std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            Some(PinnedMem::Own(p)) => pinned_ptr(p),
            // SAFETY: the block lies inside its segment, so the offset stays in its mapping.
            Some(PinnedMem::Pooled(l)) => unsafe { pinned_ptr(l.segment()).add(l.offset()) },
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device this memory is pinned for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the backend guarantees ptr is valid for len initialised (zero-filled at
        // allocation, or written since) bytes until drop (a pooled block: its lease keeps the
        // segment mapped, and no other block overlaps it); `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let (Some(_), Some(counted)) = (self.raw.take(), self.counted) {
            self.device.shared.pinned.on_free(counted, self.len);
        }
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("device", &self.device.label())
            .field("len", &self.len)
            .finish()
    }
}
