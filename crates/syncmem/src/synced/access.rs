//! The accessors: host and device, read and write, blocking and `try_*`. A blocking accessor
//! waits for guards of other threads only: see [`super::held`].

use super::held::{ReadHeld, WriteHeld};
use super::state::Access;
use super::{DeviceRead, DeviceWrite, HostRead, HostWrite, SyncedMemory};
use crate::error::Result;

#[cfg(doc)]
use super::Head;
#[cfg(doc)]
use crate::error::Error;

impl SyncedMemory {
    /// Host read access (Caffe's `cpu_data`). From the head at device, copies device to host.
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a write guard of the buffer (waiting for it would
    /// never end); out of memory, or a backend error during the copy. The state is unchanged
    /// on error.
    pub fn host(&self) -> Result<HostRead<'_>> {
        self.host_for(None)
    }

    /// [`SyncedMemory::host`] for the tensor named `tensor` (named in an [`Error::Busy`]).
    #[inline]
    pub(crate) fn host_for(&self, tensor: Option<&str>) -> Result<HostRead<'_>> {
        let lock = self.lock_read(tensor)?;
        // Fast path: the host mirror is current and nothing is in flight (no state to change).
        if let Some(ptr) = self.shared.core.current_host() {
            return Ok(HostRead::new(lock, ptr, self.len()));
        }
        let ptr = self.prepare_host(Access::HostRead, false)?;
        Ok(HostRead::new(lock, ptr, self.len()))
    }

    /// Host write access (Caffe's `mutable_cpu_data`): head becomes [`Head::AtHost`].
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a guard of the buffer; as
    /// [`SyncedMemory::host`].
    pub fn host_mut(&self) -> Result<HostWrite<'_>> {
        self.host_write_for(None, false)
    }

    /// Host write access for a caller that overwrites every byte: no copy from the device and
    /// no zero fill of an existing mirror. Head becomes [`Head::AtHost`]. The previous contents
    /// are unspecified, except that a buffer's very first host allocation reads as zeros.
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a guard of the buffer; out of memory.
    pub fn host_overwrite(&self) -> Result<HostWrite<'_>> {
        self.host_write_for(None, true)
    }

    /// [`SyncedMemory::host_mut`] (or, `overwrite`, [`SyncedMemory::host_overwrite`]) for the
    /// tensor named `tensor`.
    pub(crate) fn host_write_for(
        &self,
        tensor: Option<&str>,
        overwrite: bool,
    ) -> Result<HostWrite<'_>> {
        let lock = self.lock_write(tensor)?;
        let ptr = self.prepare_host(Access::HostWrite, overwrite)?;
        Ok(HostWrite::new(lock, ptr, self.len()))
    }

    /// Device read access (Caffe's `gpu_data`). From the head at host, copies host to device.
    ///
    /// # Errors
    /// [`Error::NoDevice`] for a host-only buffer, [`Error::Busy`] when this thread holds a
    /// write guard of the buffer, out of memory, or a backend error.
    pub fn device(&self) -> Result<DeviceRead<'_>> {
        self.device_for(None)
    }

    /// [`SyncedMemory::device`] for the tensor named `tensor`.
    pub(crate) fn device_for(&self, tensor: Option<&str>) -> Result<DeviceRead<'_>> {
        let lock = self.lock_read(tensor)?;
        let (buf, stream) = self.prepare_device(Access::DeviceRead, false)?;
        Ok(DeviceRead::new(lock, buf, stream))
    }

    /// Device write access (Caffe's `mutable_gpu_data`): head becomes [`Head::AtDevice`].
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a guard of the buffer; as
    /// [`SyncedMemory::device`].
    pub fn device_mut(&self) -> Result<DeviceWrite<'_>> {
        self.device_write_for(None, false)
    }

    /// Device write access for a caller that overwrites every byte: no copy from the host and
    /// no zero fill. Head becomes [`Head::AtDevice`]. The previous contents are unspecified.
    ///
    /// # Errors
    /// As [`SyncedMemory::device_mut`].
    pub fn device_overwrite(&self) -> Result<DeviceWrite<'_>> {
        self.device_write_for(None, true)
    }

    /// [`SyncedMemory::device_mut`] (or, `overwrite`, [`SyncedMemory::device_overwrite`]) for
    /// the tensor named `tensor`.
    pub(crate) fn device_write_for(
        &self,
        tensor: Option<&str>,
        overwrite: bool,
    ) -> Result<DeviceWrite<'_>> {
        let lock = self.lock_write(tensor)?;
        let (buf, stream) = self.prepare_device(Access::DeviceWrite, overwrite)?;
        Ok(DeviceWrite::new(lock, buf, stream, self))
    }

    /// As [`SyncedMemory::host`], but [`Error::Busy`] instead of waiting for a writer.
    ///
    /// # Errors
    /// [`Error::Busy`], or as [`SyncedMemory::host`].
    pub fn try_host(&self) -> Result<HostRead<'_>> {
        let lock = self
            .shared
            .access
            .try_read_recursive()
            .map(ReadHeld::new)
            .ok_or_else(|| self.busy("a write guard is alive"))?;
        if let Some(ptr) = self.shared.core.current_host() {
            return Ok(HostRead::new(lock, ptr, self.len()));
        }
        let ptr = self.prepare_host(Access::HostRead, false)?;
        Ok(HostRead::new(lock, ptr, self.len()))
    }

    /// As [`SyncedMemory::host_mut`], but [`Error::Busy`] instead of waiting for other guards.
    ///
    /// # Errors
    /// [`Error::Busy`], or as [`SyncedMemory::host`].
    pub fn try_host_mut(&self) -> Result<HostWrite<'_>> {
        let lock = self
            .shared
            .access
            .try_write()
            .map(WriteHeld::new)
            .ok_or_else(|| self.busy("another guard is alive"))?;
        let ptr = self.prepare_host(Access::HostWrite, false)?;
        Ok(HostWrite::new(lock, ptr, self.len()))
    }

    /// As [`SyncedMemory::device`], but [`Error::Busy`] instead of waiting for a writer.
    ///
    /// # Errors
    /// [`Error::Busy`], or as [`SyncedMemory::device`].
    pub fn try_device(&self) -> Result<DeviceRead<'_>> {
        let lock = self
            .shared
            .access
            .try_read_recursive()
            .map(ReadHeld::new)
            .ok_or_else(|| self.busy("a write guard is alive"))?;
        let (buf, stream) = self.prepare_device(Access::DeviceRead, false)?;
        Ok(DeviceRead::new(lock, buf, stream))
    }

    /// As [`SyncedMemory::device_mut`], but [`Error::Busy`] instead of waiting.
    ///
    /// # Errors
    /// [`Error::Busy`], or as [`SyncedMemory::device`].
    pub fn try_device_mut(&self) -> Result<DeviceWrite<'_>> {
        let lock = self
            .shared
            .access
            .try_write()
            .map(WriteHeld::new)
            .ok_or_else(|| self.busy("another guard is alive"))?;
        let (buf, stream) = self.prepare_device(Access::DeviceWrite, false)?;
        Ok(DeviceWrite::new(lock, buf, stream, self))
    }
}
