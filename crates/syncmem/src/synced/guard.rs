//! Access guards of a [`SyncedMemory`]. They borrow the buffer, hold its access lock, and are
//! the only way to reach its memory.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::held::{ReadHeld, WriteHeld};
use super::SyncedMemory;
use crate::device::{DeviceBuffer, KernelArg, LentStream, Stream};
use crate::error::Result;

/// Shared read access to the host mirror. Derefs to `&[u8]`.
///
/// While it lives, the host mirror cannot become stale: writers wait.
pub struct HostRead<'a> {
    _lock: ReadHeld<'a, ()>,
    ptr: *const u8,
    len: usize,
}

impl<'a> HostRead<'a> {
    pub(super) fn new(lock: ReadHeld<'a, ()>, ptr: *mut u8, len: usize) -> Self {
        Self {
            _lock: lock,
            ptr,
            len,
        }
    }
}

/// Views bytes as elements, with an error naming the problem (length or alignment).
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| cast_error::<T>(bytes, e))
}

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    let (len, addr) = (bytes.len(), bytes.as_ptr() as usize);
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error_parts::<T>(len, addr, e))
}

fn cast_error<T>(bytes: &[u8], e: bytemuck::PodCastError) -> crate::Error {
    cast_error_parts::<T>(bytes.len(), bytes.as_ptr() as usize, e)
}

fn cast_error_parts<T>(len: usize, addr: usize, e: bytemuck::PodCastError) -> crate::Error {
    crate::Error::InvalidState {
        op: "typed host view",
        buffer: format!("{len} bytes at {addr:#x}"),
        reason: format!(
            "cannot view as {} (size {}, align {}): {e:?}",
            std::any::type_name::<T>(),
            std::mem::size_of::<T>(),
            std::mem::align_of::<T>()
        ),
    }
}

impl HostRead<'_> {
    /// The bytes viewed as elements of `T`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidState`] when the length is not a multiple of `T`'s size or the
    /// memory is not aligned for `T` (possible only for adopted external memory).
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        cast(self)
    }
}

impl HostWrite<'_> {
    /// The bytes viewed as elements of `T`.
    ///
    /// # Errors
    /// As [`HostRead::as_slice_of`].
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        cast(self)
    }

    /// The bytes viewed mutably as elements of `T`.
    ///
    /// # Errors
    /// As [`HostRead::as_slice_of`].
    pub fn as_mut_slice_of<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
        cast_mut(self)
    }
}

impl Deref for HostRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is the current host mirror, non-null and valid for `len` initialised
        // bytes. The shared access lock held by this guard excludes every writer and every
        // replacement of the mirror; a pending copy into the host was waited for when the guard
        // was made (host reads conflict with `ToHost`), or, on the fast path, nothing was in
        // flight (see the `fast` module for why the published pointer is current).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Exclusive write access to the host mirror. Derefs to `&mut [u8]`. Taking it made the host
/// the only current mirror.
pub struct HostWrite<'a> {
    _lock: WriteHeld<'a, ()>,
    ptr: *mut u8,
    len: usize,
}

impl<'a> HostWrite<'a> {
    pub(super) fn new(lock: WriteHeld<'a, ()>, ptr: *mut u8, len: usize) -> Self {
        Self {
            _lock: lock,
            ptr,
            len,
        }
    }
}

impl Deref for HostWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as for HostRead; this guard holds the lock exclusively.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for HostWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is the host mirror, valid for `len` initialised bytes; the exclusive
        // access lock held by this guard means no other guard or transfer touches it, and
        // `&mut self` makes this the only live slice from this guard.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Shared read access to the device mirror: pass [`DeviceRead::buffer`] to kernels that read it.
///
/// The guard's [`stream`](DeviceRead::stream) already follows (on the device) the commands of
/// other streams that last wrote the buffer, so work queued on it through the native handle
/// reads the newest data.
pub struct DeviceRead<'a> {
    _lock: ReadHeld<'a, ()>,
    buf: Arc<DeviceBuffer>,
    stream: LentStream<'a>,
}

impl<'a> DeviceRead<'a> {
    pub(super) fn new(
        lock: ReadHeld<'a, ()>,
        buf: Arc<DeviceBuffer>,
        stream: LentStream<'a>,
    ) -> Self {
        Self {
            _lock: lock,
            buf,
            stream,
        }
    }

    /// The device memory.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// The buffer's stream: work queued there is ordered with the buffer's own copies.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device memory as a shared handle that outlives the guard: the memory stays
    /// allocated while it lives (for an export to foreign code, e.g. DLPack), but once the
    /// guard is gone the buffer no longer keeps it current (a later write elsewhere is not
    /// seen there) nor orders work on it.
    pub fn shared_buffer(&self) -> Arc<DeviceBuffer> {
        self.buf.clone()
    }

    /// Copies the device bytes into `dst` (blocking), bypassing the host mirror. For checks.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] when `dst` is longer than the buffer, or a backend error.
    pub fn read_into(&self, dst: &mut [u8]) -> Result<()> {
        self.stream.read(&self.buf, 0, dst)
    }
}

/// Exclusive write access to the device mirror. Taking it made the device the only current
/// mirror.
///
/// The guard's [`stream`](DeviceWrite::stream) already follows (on the device) every command of
/// other streams that used the buffer, so work queued on it through the native handle comes
/// after them; and it is ordered before the buffer's later copies. Work queued on another
/// stream must be announced with
/// [`DeviceWrite::queued_on`], so that the next access waits for it.
pub struct DeviceWrite<'a> {
    _lock: WriteHeld<'a, ()>,
    buf: Arc<DeviceBuffer>,
    stream: LentStream<'a>,
    owner: &'a SyncedMemory,
    _not_send: PhantomData<*const ()>,
}

impl<'a> DeviceWrite<'a> {
    pub(super) fn new(
        lock: WriteHeld<'a, ()>,
        buf: Arc<DeviceBuffer>,
        stream: LentStream<'a>,
        owner: &'a SyncedMemory,
    ) -> Self {
        Self {
            _lock: lock,
            buf,
            stream,
            owner,
            _not_send: PhantomData,
        }
    }

    /// The device memory.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// The buffer's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device memory as a shared handle that outlives the guard (see
    /// [`DeviceRead::shared_buffer`]): what is written there after the guard is gone, outside
    /// the crate, is what the next access finds, as long as the device is still the only
    /// current copy then.
    pub fn shared_buffer(&self) -> Arc<DeviceBuffer> {
        self.buf.clone()
    }

    /// Sets every byte to `value` on the device (Caffe's `caffe_gpu_memset`).
    ///
    /// # Errors
    /// A backend error.
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.stream.fill_raw(&self.buf, 0, self.buf.len(), value)
    }

    /// Copies `src` into the device memory at `offset` (blocking).
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`], or a backend error.
    pub fn write_from(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: blocking copy from a borrowed slice.
        unsafe {
            self.stream
                .write_raw(&self.buf, offset, src.as_ptr(), src.len(), true)
        }
    }

    /// Copies the device bytes into `dst` (blocking). For checks.
    ///
    /// # Errors
    /// As [`DeviceRead::read_into`].
    pub fn read_into(&self, dst: &mut [u8]) -> Result<()> {
        self.stream.read(&self.buf, 0, dst)
    }

    /// The memory of a `cpu`-device buffer (`None` for other backends).
    pub fn cpu_slice_mut(&mut self) -> Option<&mut [u8]> {
        let ptr = self.buf.cpu_ptr()?;
        // SAFETY: a `cpu`-device buffer is host memory valid for `len` initialised bytes; the
        // exclusive access lock held by this guard and `&mut self` make this the only view.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, self.buf.len()) })
    }

    /// The memory, for writing from the host in place of device commands, where the host
    /// addresses the device memory directly without a map: a `cpu`-device buffer, or a
    /// zero-copy buffer shared in place ([`crate::ZeroCopyProtocol::InPlace`]). The device work
    /// queued on the memory is waited for first (a host wait when some is still running), so
    /// the host writes after it; the head stays at the device. `None` elsewhere (write with
    /// [`DeviceWrite::write_from`]).
    ///
    /// # Errors
    /// The error of device work that failed.
    pub fn host_slice_mut(&mut self) -> Result<Option<&mut [u8]>> {
        if let Some(s) = self.buf.cpu_ptr() {
            let len = self.buf.len();
            // SAFETY: a `cpu`-device buffer is host memory valid for `len` initialised bytes,
            // and its work is done when queued; the exclusive access lock held by this guard
            // and `&mut self` make this the only view.
            return Ok(Some(unsafe { std::slice::from_raw_parts_mut(s, len) }));
        }
        if self.owner.zero_copy_protocol() != Some(crate::ZeroCopyProtocol::InPlace) {
            return Ok(None);
        }
        let Some(ptr) = self.buf.host_ptr() else {
            return Ok(None);
        };
        if !self
            .owner
            .target()
            .is_some_and(|d| d.same(self.buf.device()))
            || !self.buf.in_place()
        {
            // A replica on another device (whose protocol is not the buffer's own), or memory
            // its driver does not use in place.
            return Ok(None);
        }
        self.buf.wait_uses()?;
        // SAFETY: the buffer's memory is host memory the device uses in place (checked when it
        // was shared), valid for `len` bytes while the buffer lives; every device command on it
        // has completed (waited for above), later ones are queued after this guard's writes
        // (which end when the slice's borrow ends); the exclusive access lock and `&mut self`
        // make this the only view.
        Ok(Some(unsafe {
            std::slice::from_raw_parts_mut(ptr, self.buf.len())
        }))
    }

    /// Announces work on the device memory queued on `stream` (not the buffer's own): a marker
    /// is queued there (it covers work queued on the native queue too), and the next access to
    /// the buffer waits for it.
    ///
    /// # Errors
    /// A backend error while recording, or the error of work announced earlier that failed
    /// (it is waited for first; the new work is announced all the same).
    pub fn queued_on(&self, stream: &Stream) -> Result<()> {
        stream.record()?;
        self.owner.set_pending_work(stream.point_now())
    }
}

impl fmt::Debug for HostRead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRead").field("len", &self.len).finish()
    }
}
impl fmt::Debug for HostWrite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostWrite").field("len", &self.len).finish()
    }
}
impl fmt::Debug for DeviceRead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRead")
            .field("buffer", &self.buf)
            .finish()
    }
}
impl fmt::Debug for DeviceWrite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceWrite")
            .field("buffer", &self.buf)
            .finish()
    }
}

/// The guard's buffer as an argument the kernel reads ([`crate::device::UserKernel::launch`]).
impl<'a> From<&'a DeviceRead<'_>> for KernelArg<'a> {
    fn from(g: &'a DeviceRead<'_>) -> Self {
        KernelArg::read(g.buffer())
    }
}

/// The guard's buffer as an argument the kernel writes (and may read): the guard holds it
/// exclusively, and `&mut` keeps it from being passed twice.
impl<'a> From<&'a mut DeviceWrite<'_>> for KernelArg<'a> {
    fn from(g: &'a mut DeviceWrite<'_>) -> Self {
        KernelArg::written(g.buffer())
    }
}
