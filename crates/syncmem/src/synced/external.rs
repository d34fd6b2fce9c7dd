//! Adopting external host and device buffers (Caffe's `set_cpu_data`, `set_gpu_data`).

use std::ptr::NonNull;
use std::sync::Arc;

use super::state::Place;
use super::{DevMirror, HostMem, SyncedMemory};
use crate::device::DeviceBuffer;
use crate::error::{Error, Result};

#[cfg(doc)]
use super::Head;

impl SyncedMemory {
    /// Adopts host memory owned by `owner` as the host mirror, without copying (Caffe's
    /// `set_cpu_data`, with the lifetime handled by ownership: the owner is dropped when the
    /// buffer is dropped or the mirror replaced). Head becomes [`Head::AtHost`]; the device
    /// mirror is kept but stale.
    ///
    /// `owner.as_mut()` is called once; it must keep returning the same memory while owned.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when the memory's length differs from the buffer's size;
    /// [`Error::Busy`] when this thread holds a guard of the buffer, or while its placement is
    /// pinned ([`SyncedMemory::pin_placement`]). Waits for a transfer in flight first, and
    /// returns its error if it failed.
    pub fn set_host_data<O>(&self, mut owner: O) -> Result<()>
    where
        O: AsMut<[u8]> + Send + Sync + 'static,
    {
        let slice = owner.as_mut();
        self.check_len("set_host_data", slice.len())?;
        let ptr = NonNull::new(slice.as_mut_ptr()).unwrap_or(NonNull::dangling());
        self.adopt_host(HostMem::External {
            ptr,
            _owner: Some(Box::new(owner)),
        })
    }

    /// Adopts raw host memory as the host mirror, without copying or taking ownership (Caffe's
    /// `set_cpu_data`). Head becomes [`Head::AtHost`].
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, initialised, and used by nothing
    /// else from this call until the buffer is dropped or its host mirror replaced.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when `len` differs from the buffer's size;
    /// [`Error::InvalidState`] for a null pointer; [`Error::Busy`] when this thread holds a
    /// guard of the buffer, or while its placement is pinned
    /// ([`SyncedMemory::pin_placement`]).
    pub unsafe fn set_host_ptr(&self, ptr: *mut u8, len: usize) -> Result<()> {
        self.check_len("set_host_ptr", len)?;
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::InvalidState {
            op: "set_host_ptr",
            buffer: self.label().to_string(),
            reason: "null pointer".into(),
        })?;
        self.adopt_host(HostMem::External { ptr, _owner: None })
    }

    /// Adopts a device buffer as the device mirror, without copying (Caffe's `set_gpu_data`).
    /// Head becomes [`Head::AtDevice`]; the host mirror is kept but stale. Get it back with
    /// [`SyncedMemory::take_device_data`].
    ///
    /// # Errors
    /// [`Error::NoDevice`], [`Error::DeviceMismatch`] when `buf` is on another device,
    /// [`Error::SizeMismatch`] when its length differs, [`Error::Busy`] when this thread holds
    /// a guard of the buffer, or while its placement is pinned
    /// ([`SyncedMemory::pin_placement`]).
    pub fn set_device_data(&self, buf: DeviceBuffer) -> Result<()> {
        let dev = self.target().ok_or_else(|| self.no_device())?;
        if !buf.device().same(dev) {
            return Err(Error::DeviceMismatch {
                op: "set_device_data",
                expected: dev.label().to_string(),
                actual: buf.device().label().to_string(),
            });
        }
        self.check_len("set_device_data", buf.len())?;
        let _lock = self.lock_write(None)?;
        self.refuse_if_pinned()?;
        let mut core = self.shared.core.lock();
        core.coh.finish_pending()?;
        // Shared memory goes with the old device mirror: the adopted buffer holds the data now.
        self.unshare(&mut core)?;
        core.release_device(self.target());
        core.dev = Some(DevMirror {
            buf: Arc::new(buf),
            owned: false,
            exposed: false,
            reg: None,
        });
        core.coh.wrote(Place::Device);
        Ok(())
    }

    /// Detaches an adopted device buffer and gives it back. The data it held goes with it:
    /// if the device mirror was the only current copy, the buffer becomes uninitialized.
    /// Returns `None` when the device mirror is not an adopted one.
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a guard of the buffer, or while its placement is
    /// pinned ([`SyncedMemory::pin_placement`]); the error of a transfer in flight that had to
    /// be waited for.
    pub fn take_device_data(&self) -> Result<Option<DeviceBuffer>> {
        let _lock = self.lock_write(None)?;
        self.refuse_if_pinned()?;
        let mut core = self.shared.core.lock();
        core.coh.finish_pending()?;
        if core.dev_owned() || core.dev.is_none() {
            return Ok(None);
        }
        let Some(mirror) = core.dev.take() else {
            return Ok(None);
        };
        // The access lock is held exclusively and no guard exists, so this is the only Arc.
        let buf = Arc::try_unwrap(mirror.buf).map_err(|_| Error::InvalidState {
            op: "take_device_data",
            buffer: self.label().to_string(),
            reason: "device mirror still referenced".into(),
        })?;
        // The host keeps its data if it was current, and so do replicas on other devices.
        core.coh.device_lost();
        Ok(Some(buf))
    }
}
