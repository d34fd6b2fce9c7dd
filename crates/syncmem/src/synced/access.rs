//! The accessors: host and device, read and write, blocking and `try_*`.

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
    /// Out of memory, or a backend error during the copy. The state is unchanged on error.
    pub fn host(&self) -> Result<HostRead<'_>> {
        let lock = self.shared.access.read_recursive();
        // Fast path: the host mirror is current and nothing is in flight (no state to change).
        if let Some(ptr) = self.shared.core.current_host() {
            return Ok(HostRead::new(lock, ptr, self.size));
        }
        let ptr = self.prepare_host(Access::HostRead, false)?;
        Ok(HostRead::new(lock, ptr, self.size))
    }

    /// Host write access (Caffe's `mutable_cpu_data`): head becomes [`Head::AtHost`].
    ///
    /// # Errors
    /// As [`SyncedMemory::host`].
    pub fn host_mut(&self) -> Result<HostWrite<'_>> {
        let lock = self.shared.access.write();
        let ptr = self.prepare_host(Access::HostWrite, false)?;
        Ok(HostWrite::new(lock, ptr, self.size))
    }

    /// Host write access for a caller that overwrites every byte: no copy from the device and
    /// no zero fill of an existing mirror. Head becomes [`Head::AtHost`]. The previous contents
    /// are unspecified, except that a buffer's very first host allocation reads as zeros.
    ///
    /// # Errors
    /// Out of memory.
    pub fn host_overwrite(&self) -> Result<HostWrite<'_>> {
        let lock = self.shared.access.write();
        let ptr = self.prepare_host(Access::HostWrite, true)?;
        Ok(HostWrite::new(lock, ptr, self.size))
    }

    /// Device read access (Caffe's `gpu_data`). From the head at host, copies host to device.
    ///
    /// # Errors
    /// [`Error::NoDevice`] for a host-only buffer, out of memory, or a backend error.
    pub fn device(&self) -> Result<DeviceRead<'_>> {
        let lock = self.shared.access.read_recursive();
        let (buf, stream) = self.prepare_device(Access::DeviceRead, false)?;
        Ok(DeviceRead::new(lock, buf, stream))
    }

    /// Device write access (Caffe's `mutable_gpu_data`): head becomes [`Head::AtDevice`].
    ///
    /// # Errors
    /// As [`SyncedMemory::device`].
    pub fn device_mut(&self) -> Result<DeviceWrite<'_>> {
        let lock = self.shared.access.write();
        let (buf, stream) = self.prepare_device(Access::DeviceWrite, false)?;
        Ok(DeviceWrite::new(lock, buf, stream, self))
    }

    /// Device write access for a caller that overwrites every byte: no copy from the host and
    /// no zero fill. Head becomes [`Head::AtDevice`]. The previous contents are unspecified.
    ///
    /// # Errors
    /// As [`SyncedMemory::device`].
    pub fn device_overwrite(&self) -> Result<DeviceWrite<'_>> {
        let lock = self.shared.access.write();
        let (buf, stream) = self.prepare_device(Access::DeviceWrite, true)?;
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
            .ok_or_else(|| self.busy("a write guard is alive"))?;
        if let Some(ptr) = self.shared.core.current_host() {
            return Ok(HostRead::new(lock, ptr, self.size));
        }
        let ptr = self.prepare_host(Access::HostRead, false)?;
        Ok(HostRead::new(lock, ptr, self.size))
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
            .ok_or_else(|| self.busy("another guard is alive"))?;
        let ptr = self.prepare_host(Access::HostWrite, false)?;
        Ok(HostWrite::new(lock, ptr, self.size))
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
            .ok_or_else(|| self.busy("another guard is alive"))?;
        let (buf, stream) = self.prepare_device(Access::DeviceWrite, false)?;
        Ok(DeviceWrite::new(lock, buf, stream, self))
    }
}
