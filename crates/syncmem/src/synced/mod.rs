//! [`SyncedMemory`]: one logical byte buffer mirrored on the host and on a device.
//!
//! This is Caffe's `SyncedMemory`, with the same transition table (which access allocates,
//! which copies, the head after), made safe:
//!
//! | Caffe | syncmem | guard |
//! |---|---|---|
//! | `cpu_data()` | [`SyncedMemory::host`] | [`HostRead`] derefs to `&[u8]` |
//! | `mutable_cpu_data()` | [`SyncedMemory::host_mut`] | [`HostWrite`] derefs to `&mut [u8]` |
//! | `gpu_data()` | [`SyncedMemory::device`] | [`DeviceRead`] gives `&DeviceBuffer` |
//! | `mutable_gpu_data()` | [`SyncedMemory::device_mut`] | [`DeviceWrite`] |
//! | `set_cpu_data(p)` | [`SyncedMemory::set_host_data`], `unsafe` [`SyncedMemory::set_host_ptr`] | |
//! | `set_gpu_data(p)` | [`SyncedMemory::set_device_data`] | |
//! | `async_gpu_push(s)` | [`SyncedMemory::prefetch_to_device`] (and [`SyncedMemory::prefetch_to_host`]) | |
//! | `head()` | [`SyncedMemory::head`] | |
//!
//! # Borrowing replaces "never store the pointers"
//!
//! Guards borrow the buffer, so they cannot outlive it. Read guards are shared, write guards are
//! exclusive (an internal reader-writer lock): while a [`HostRead`] lives, nothing can make the
//! host copy stale, and a write guard moves the head when it is taken, so a forgotten
//! "modified" mark is impossible. The accessors block while a conflicting guard lives on another
//! thread; the `try_*` accessors return [`Error::Busy`] instead. As with any reader-writer
//! lock, asking for a write guard while the same thread holds a guard of the same buffer would
//! wait forever: use the `try_*` form where that can happen.
//!
//! # Copies in flight
//!
//! [`SyncedMemory::prefetch_to_device`] queues the host-to-device copy and returns. Unlike
//! Caffe, the buffer knows the copy is in flight: an access that conflicts with it (a device
//! access, or a host write) first waits for the copy's event; a host read does not wait.
//!
//! # Departures from Caffe, on purpose
//!
//! - Size 0 allocates nothing and every access returns an empty view (Caffe: platform-dependent
//!   or fatal).
//! - Errors are returned, never aborts: out of memory, a missing device, a size mismatch.
//! - An external host or device buffer must have exactly the buffer's size.
//! - The copy-in-flight state above (Caffe marks SYNCED before the copy ends).
//! - Overwrite accessors ([`SyncedMemory::host_overwrite`], [`SyncedMemory::device_overwrite`])
//!   skip the copy and the zero fill for callers that write every byte.
//!
//! # Memory
//!
//! Host mirrors come from the process-wide host pool ([`crate::HostPool`]), or from the
//! device's pinned pool for buffers built [`SyncedMemory::with_pinned_host`]; device mirrors
//! come from the device's pool ([`crate::Device::set_pool`]). Only the first host allocation
//! out of [`Head::Uninitialized`] must read as zeros: a block reused from the cache is zeroed
//! then, a fresh one is zero already; a mirror that a copy fills is not zeroed.
//!
//! When the device runs out of memory, clean device mirrors (head [`Head::Synced`]) of buffers
//! not in use are dropped (head becomes [`Head::AtHost`]; the next device access uploads again).
//! Dirty data (head [`Head::AtDevice`]) is never dropped.

mod guard;
mod memory;
mod state;

pub use guard::{DeviceRead, DeviceWrite, HostRead, HostWrite};
pub use state::{Head, PendingKind};

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::alloc::pool::HostAllocation;
use crate::alloc::stats::{CopyCounters, CopyStats, Direction};
use crate::device::{Device, DeviceBuffer, Event, PinnedBuffer, Stream};
use crate::error::{checked_mul, Error, Result};
use state::{Access, Pending, Place, Valid};

/// The host mirror.
enum HostMem {
    /// Allocated by this buffer from the host pool.
    Owned(HostAllocation),
    /// Allocated by this buffer as pinned memory of its device.
    Pinned(PinnedBuffer),
    /// Adopted, not allocated here (Caffe's `set_cpu_data`).
    External {
        ptr: NonNull<u8>,
        /// Keeps the memory alive when the caller gave an owner; `None` for raw pointers.
        _owner: Option<Box<dyn Send + Sync>>,
    },
}

// SAFETY: `External.ptr` is memory that `set_host_ptr`'s contract (or the owner's `AsMut`) gives
// to this buffer alone; the owner is `Send + Sync`. The other variants are `Send + Sync`.
unsafe impl Send for HostMem {}
// SAFETY: as above; access to the bytes is serialised by the buffer's locks.
unsafe impl Sync for HostMem {}

impl HostMem {
    fn ptr(&self) -> *mut u8 {
        match self {
            HostMem::Owned(b) => b.as_ptr(),
            HostMem::Pinned(p) => p.ptr(),
            HostMem::External { ptr, .. } => ptr.as_ptr(),
        }
    }
}

struct Core {
    valid: Valid,
    host: Option<HostMem>,
    dev: Option<Arc<DeviceBuffer>>,
    dev_owned: bool,
    /// A device guard was handed out since the mirror was allocated: work may be queued on it.
    dev_exposed: bool,
    /// Id in the device's registry of evictable mirrors.
    dev_reg: Option<u64>,
    pending: Option<Pending>,
}

impl Core {
    /// Caffe's head, counting a transfer in flight as done.
    fn head(&self) -> Head {
        let mut valid = self.valid;
        if let Some(place) = self.pending.as_ref().and_then(|p| p.kind.lands_on()) {
            valid = valid.with(place);
        }
        valid.head()
    }

    /// Waits for the work in flight and takes its result into the valid set.
    fn finish_pending(&mut self) -> Result<()> {
        if let Some(p) = self.pending.take() {
            p.event.wait()?;
            if let Some(place) = p.kind.lands_on() {
                self.valid = self.valid.with(place);
            }
        }
        Ok(())
    }
}

/// The part of a buffer the device's out-of-memory path reaches through a weak reference.
pub(crate) struct Shared {
    access: RwLock<()>,
    core: Mutex<Core>,
    label: Mutex<String>,
    device: Option<Device>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One logical byte buffer mirrored lazily on the host and on one device.
///
/// `Send + Sync`: share it with `&` or `Arc` across threads; readers run concurrently, writers
/// exclusively. See the [module docs](self) for the access rules.
pub struct SyncedMemory {
    label: String,
    size: usize,
    device: Option<Device>,
    stream: Option<Stream>,
    pinned_host: bool,
    shared: Arc<Shared>,
    copies: CopyCounters,
}

impl SyncedMemory {
    /// A buffer of `size` bytes mirrored on `device`. Allocates nothing.
    pub fn new(size: usize, device: &Device) -> Self {
        Self::build(size, Some(device.clone()))
    }

    /// A host-only buffer (Caffe's CPU_ONLY build): device accesses return [`Error::NoDevice`].
    pub fn host_only(size: usize) -> Self {
        Self::build(size, None)
    }

    /// A buffer of `count` elements of `elem_size` bytes each.
    ///
    /// # Errors
    /// [`Error::SizeOverflow`] when `count * elem_size` does not fit in `usize`.
    pub fn with_elements(count: usize, elem_size: usize, device: Option<&Device>) -> Result<Self> {
        let size = checked_mul(
            count,
            elem_size,
            "SyncedMemory element count * element size",
        )?;
        Ok(Self::build(size, device.cloned()))
    }

    fn build(size: usize, device: Option<Device>) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let label = format!("synced#{id}");
        Self {
            shared: Arc::new(Shared {
                access: RwLock::new(()),
                core: Mutex::new(Core {
                    valid: Valid::NONE,
                    host: None,
                    dev: None,
                    dev_owned: false,
                    dev_exposed: false,
                    dev_reg: None,
                    pending: None,
                }),
                label: Mutex::new(label.clone()),
                device: device.clone(),
            }),
            label,
            size,
            device,
            stream: None,
            pinned_host: false,
            copies: CopyCounters::new(),
        }
    }

    /// Names the buffer in errors and reports (e.g. the blob name).
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self.shared.label.lock().clone_from(&self.label);
        self
    }

    /// Allocates the host mirror as pinned memory of the device (faster copies), instead of
    /// ordinary host memory. A policy per buffer: other host allocations are unaffected.
    pub fn with_pinned_host(mut self, pinned: bool) -> Self {
        self.pinned_host = pinned;
        self
    }

    /// Uses `stream` for this buffer's copies instead of the device's default stream.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the stream belongs to another device, [`Error::NoDevice`]
    /// for a host-only buffer.
    pub fn with_stream(mut self, stream: &Stream) -> Result<Self> {
        let dev = self.device.as_ref().ok_or_else(|| self.no_device())?;
        if !stream.device().same(dev) {
            return Err(Error::DeviceMismatch {
                op: "SyncedMemory::with_stream",
                expected: dev.label().to_string(),
                actual: stream.device().label().to_string(),
            });
        }
        self.stream = Some(stream.clone());
        Ok(self)
    }

    /// Size in bytes, fixed at construction.
    pub fn len(&self) -> usize {
        self.size
    }

    /// True when the size is 0.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The label used in errors.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The device this buffer mirrors to, if any.
    pub fn target(&self) -> Option<&Device> {
        self.device.as_ref()
    }

    /// Which mirror holds the newest data. A transfer in flight counts as done (as in Caffe):
    /// an access that needs its data waits for it. See [`SyncedMemory::pending`].
    pub fn head(&self) -> Head {
        self.shared.core.lock().head()
    }

    /// The transfer or device work in flight, if any (completed work is settled first).
    ///
    /// # Errors
    /// A backend error while querying the event.
    pub fn pending(&self) -> Result<Option<PendingKind>> {
        let mut core = self.shared.core.lock();
        self.settle_if_complete(&mut core)?;
        Ok(core.pending.as_ref().map(|p| p.kind))
    }

    /// Blocks until any transfer or device work in flight is done.
    ///
    /// # Errors
    /// A backend error from the work waited for.
    pub fn wait(&self) -> Result<()> {
        let mut core = self.shared.core.lock();
        self.finish_pending(&mut core)
    }

    /// Copies made by this buffer's transitions, by direction.
    pub fn copy_stats(&self) -> CopyStats {
        self.copies.snapshot()
    }

    /// True once the host mirror exists.
    pub fn host_allocated(&self) -> bool {
        self.shared.core.lock().host.is_some()
    }

    /// True once the device mirror exists.
    pub fn device_allocated(&self) -> bool {
        self.shared.core.lock().dev.is_some()
    }

    /// True when the host mirror is owned by this buffer (not adopted).
    pub fn owns_host(&self) -> bool {
        matches!(
            self.shared.core.lock().host,
            Some(HostMem::Owned(_) | HostMem::Pinned(_))
        )
    }

    /// True when the device mirror is owned by this buffer (not adopted).
    pub fn owns_device(&self) -> bool {
        let core = self.shared.core.lock();
        core.dev.is_some() && core.dev_owned
    }

    // ----- accessors -------------------------------------------------------------------------

    /// Host read access (Caffe's `cpu_data`). From the head at device, copies device to host.
    ///
    /// # Errors
    /// Out of memory, or a backend error during the copy. The state is unchanged on error.
    pub fn host(&self) -> Result<HostRead<'_>> {
        let lock = self.shared.access.read_recursive();
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

    // ----- external buffers -------------------------------------------------------------------

    /// Adopts host memory owned by `owner` as the host mirror, without copying (Caffe's
    /// `set_cpu_data`, with the lifetime handled by ownership: the owner is dropped when the
    /// buffer is dropped or the mirror replaced). Head becomes [`Head::AtHost`]; the device
    /// mirror is kept but stale.
    ///
    /// `owner.as_mut()` is called once; it must keep returning the same memory while owned.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when the memory's length differs from the buffer's size. Waits
    /// for a transfer in flight first, and returns its error if it failed.
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
    /// [`Error::InvalidState`] for a null pointer.
    pub unsafe fn set_host_ptr(&self, ptr: *mut u8, len: usize) -> Result<()> {
        self.check_len("set_host_ptr", len)?;
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::InvalidState {
            op: "set_host_ptr",
            buffer: self.label.clone(),
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
    /// [`Error::SizeMismatch`] when its length differs.
    pub fn set_device_data(&self, buf: DeviceBuffer) -> Result<()> {
        let dev = self.device.as_ref().ok_or_else(|| self.no_device())?;
        if !buf.device().same(dev) {
            return Err(Error::DeviceMismatch {
                op: "set_device_data",
                expected: dev.label().to_string(),
                actual: buf.device().label().to_string(),
            });
        }
        self.check_len("set_device_data", buf.len())?;
        let _lock = self.shared.access.write();
        let mut core = self.shared.core.lock();
        self.finish_pending(&mut core)?;
        core.release_device(self.device.as_ref());
        core.dev = Some(Arc::new(buf));
        core.dev_owned = false;
        core.valid = Valid::only(Place::Device);
        Ok(())
    }

    /// Detaches an adopted device buffer and gives it back. The data it held goes with it:
    /// if the device mirror was the only current copy, the buffer becomes uninitialized.
    /// Returns `None` when the device mirror is not an adopted one.
    ///
    /// # Errors
    /// The error of a transfer in flight that had to be waited for.
    pub fn take_device_data(&self) -> Result<Option<DeviceBuffer>> {
        let _lock = self.shared.access.write();
        let mut core = self.shared.core.lock();
        self.finish_pending(&mut core)?;
        if core.dev_owned || core.dev.is_none() {
            return Ok(None);
        }
        let Some(arc) = core.dev.take() else {
            return Ok(None);
        };
        // The access lock is held exclusively and no guard exists, so this is the only Arc.
        let buf = Arc::try_unwrap(arc).map_err(|_| Error::InvalidState {
            op: "take_device_data",
            buffer: self.label.clone(),
            reason: "device mirror still referenced".into(),
        })?;
        core.valid = if core.valid.has(Place::Host) {
            Valid::only(Place::Host)
        } else {
            Valid::NONE
        };
        Ok(Some(buf))
    }

    // ----- asynchronous transfers -------------------------------------------------------------

    /// Queues the host-to-device copy on `stream` (the buffer's stream when `None`) and returns
    /// without waiting (Caffe's `async_gpu_push`). Head reads [`Head::Synced`] at once; the first
    /// access that needs the device data, or a host write, waits for the copy. Host reads do not.
    ///
    /// Returns the copy's event, or `None` when the device was already current.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the buffer is uninitialized (nothing to push, as in Caffe),
    /// [`Error::NoDevice`], out of memory, or a backend error.
    pub fn prefetch_to_device(&self, stream: Option<&Stream>) -> Result<Option<Event>> {
        let _lock = self.shared.access.read_recursive();
        let mut core = self.shared.core.lock();
        self.settle(&mut core, Access::DeviceRead)?;
        if core.valid.has(Place::Device) {
            return Ok(None);
        }
        if core.valid.is_empty() {
            return Err(self.uninit("prefetch_to_device"));
        }
        let stream = self.pick_stream(stream)?;
        let dev = self.ensure_dev_alloc(&mut core)?;
        let src = core
            .host
            .as_ref()
            .map(HostMem::ptr)
            .ok_or_else(|| self.no_host())?;
        // SAFETY: `src` is the host mirror, valid for `size` bytes. It stays alive and
        // unmodified until the event completes: it is freed or replaced only under the exclusive
        // lock after `finish_pending`, and host writes conflict with `ToDevice` and wait.
        unsafe { stream.write_raw(&dev, 0, src, self.size, false)? };
        let event = stream.record()?;
        self.count(Direction::HostToDevice);
        core.pending = Some(Pending {
            kind: PendingKind::ToDevice,
            event: event.clone(),
        });
        Ok(Some(event))
    }

    /// Queues the device-to-host copy on `stream` and returns without waiting. Host accesses and
    /// device writes wait for it; device reads do not.
    ///
    /// Returns the copy's event, or `None` when the host was already current.
    ///
    /// # Errors
    /// As [`SyncedMemory::prefetch_to_device`].
    pub fn prefetch_to_host(&self, stream: Option<&Stream>) -> Result<Option<Event>> {
        let _lock = self.shared.access.read_recursive();
        let mut core = self.shared.core.lock();
        self.settle(&mut core, Access::HostRead)?;
        if core.valid.has(Place::Host) {
            return Ok(None);
        }
        if core.valid.is_empty() {
            return Err(self.uninit("prefetch_to_host"));
        }
        let stream = self.pick_stream(stream)?;
        let dst = self.ensure_host_alloc(&mut core, false)?;
        let dev = core.dev.clone().ok_or_else(|| self.no_device())?;
        // SAFETY: `dst` is the host mirror, valid for `size` bytes; the host is not valid, so no
        // host guard reads it, and host accesses conflict with `ToHost` and wait for the event.
        // The mirror is freed or replaced only after `finish_pending`.
        unsafe { stream.read_raw(&dev, 0, dst, self.size, false)? };
        let event = stream.record()?;
        self.count(Direction::DeviceToHost);
        core.pending = Some(Pending {
            kind: PendingKind::ToHost,
            event: event.clone(),
        });
        Ok(Some(event))
    }

    // ----- internals ----------------------------------------------------------------------------

    fn prepare_host(&self, access: Access, overwrite: bool) -> Result<*mut u8> {
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        let ptr = if overwrite {
            // The first host allocation of a buffer reads as zeros whatever the accessor (code
            // built on `host_overwrite` relies on a fresh mirror's unwritten tail being zero).
            // Free for fresh pool blocks; a memset only for a cached block.
            let fresh = core.valid.is_empty() && core.host.is_none();
            self.ensure_host_alloc(&mut core, fresh)?
        } else {
            self.ensure_host_valid(&mut core)?
        };
        if access == Access::HostWrite {
            core.valid = Valid::only(Place::Host);
        }
        Ok(ptr)
    }

    fn prepare_device(
        &self,
        access: Access,
        overwrite: bool,
    ) -> Result<(Arc<DeviceBuffer>, Stream)> {
        if self.device.is_none() {
            return Err(self.no_device());
        }
        let mut core = self.shared.core.lock();
        self.settle(&mut core, access)?;
        let buf = if overwrite {
            self.ensure_dev_alloc(&mut core)?
        } else {
            self.ensure_dev_valid(&mut core)?
        };
        if access == Access::DeviceWrite {
            core.valid = Valid::only(Place::Device);
        }
        core.dev_exposed = true;
        Ok((buf, self.pick_stream(None)?))
    }

    /// Makes the host mirror current (Caffe's `to_cpu`), returning its start.
    fn ensure_host_valid(&self, core: &mut Core) -> Result<*mut u8> {
        if core.valid.has(Place::Host) {
            return core
                .host
                .as_ref()
                .map(HostMem::ptr)
                .ok_or_else(|| self.no_host());
        }
        let fresh = core.valid.is_empty();
        let dst = self.ensure_host_alloc(core, fresh)?;
        if fresh {
            // First allocation out of Uninitialized: host memory comes zero-filled.
            core.valid = Valid::only(Place::Host);
            return Ok(dst);
        }
        let dev = core.dev.clone().ok_or_else(|| self.no_device())?;
        let stream = self.pick_stream(None)?;
        // SAFETY: `dst` is the host mirror (valid for `size` bytes). The host is not valid, so
        // no host guard exists; the copy is blocking.
        unsafe { stream.read_raw(&dev, 0, dst, self.size, true)? };
        self.count(Direction::DeviceToHost);
        core.valid = core.valid.with(Place::Host);
        Ok(dst)
    }

    /// Makes the device mirror current (Caffe's `to_gpu`).
    fn ensure_dev_valid(&self, core: &mut Core) -> Result<Arc<DeviceBuffer>> {
        if core.valid.has(Place::Device) {
            return core.dev.clone().ok_or_else(|| self.no_device());
        }
        let fresh = core.valid.is_empty();
        let had = core.dev.is_some();
        let dev = self.ensure_dev_alloc(core)?;
        let stream = self.pick_stream(None)?;
        if fresh {
            // First allocation out of Uninitialized: zero fill (device memory comes dirty).
            if !had {
                stream.fill_raw(&dev, 0, self.size, 0)?;
                stream.synchronize()?;
            }
            core.valid = Valid::only(Place::Device);
            return Ok(dev);
        }
        let src = core
            .host
            .as_ref()
            .map(HostMem::ptr)
            .ok_or_else(|| self.no_host())?;
        // SAFETY: `src` is the current host mirror, valid for `size` bytes; readers only read it
        // and writers are excluded by the access lock; the copy is blocking.
        unsafe { stream.write_raw(&dev, 0, src, self.size, true)? };
        self.count(Direction::HostToDevice);
        core.valid = core.valid.with(Place::Device);
        Ok(dev)
    }

    /// Settles pending work: waits for it when `access` conflicts, else settles it only if done.
    fn settle(&self, core: &mut Core, access: Access) -> Result<()> {
        match &core.pending {
            Some(p) if p.kind.conflicts_with(access) => self.finish_pending(core),
            Some(_) => self.settle_if_complete(core),
            None => Ok(()),
        }
    }

    fn settle_if_complete(&self, core: &mut Core) -> Result<()> {
        if let Some(p) = &core.pending {
            if p.event.is_complete()? {
                self.finish_pending(core)?;
            }
        }
        Ok(())
    }

    fn finish_pending(&self, core: &mut Core) -> Result<()> {
        core.finish_pending()
    }

    fn adopt_host(&self, mem: HostMem) -> Result<()> {
        let _lock = self.shared.access.write();
        let mut core = self.shared.core.lock();
        self.finish_pending(&mut core)?;
        core.host = Some(mem);
        core.valid = Valid::only(Place::Host);
        Ok(())
    }

    pub(crate) fn set_pending_work(&self, event: Event) {
        let mut core = self.shared.core.lock();
        // A newer event on a stream covers what came before it on that stream only; keep the
        // older one waited for first.
        if let Some(old) = core.pending.take() {
            let _ = old.event.wait();
            if let Some(place) = old.kind.lands_on() {
                core.valid = core.valid.with(place);
            }
        }
        core.pending = Some(Pending {
            kind: PendingKind::DeviceWork,
            event,
        });
    }

    fn pick_stream(&self, given: Option<&Stream>) -> Result<Stream> {
        if let Some(s) = given.or(self.stream.as_ref()) {
            return Ok(s.clone());
        }
        self.device
            .as_ref()
            .ok_or_else(|| self.no_device())?
            .default_stream()
    }

    fn count(&self, d: Direction) {
        if self.size > 0 {
            self.copies.record(d, self.size);
        }
    }

    fn check_len(&self, op: &str, len: usize) -> Result<()> {
        if len != self.size {
            return Err(Error::SizeMismatch {
                what: format!("{op} on {}", self.label),
                expected: self.size,
                actual: len,
            });
        }
        Ok(())
    }

    fn named(&self, e: Error) -> Error {
        match e {
            Error::OutOfMemory {
                device,
                requested,
                detail,
            } => Error::OutOfMemory {
                device,
                requested,
                detail: format!("{detail} for buffer {}", self.label),
            },
            e => e,
        }
    }

    fn busy(&self, reason: &'static str) -> Error {
        Error::Busy {
            buffer: self.label.clone(),
            reason,
        }
    }

    fn no_device(&self) -> Error {
        Error::NoDevice {
            buffer: self.label.clone(),
        }
    }

    fn no_host(&self) -> Error {
        Error::InvalidState {
            op: "host access",
            buffer: self.label.clone(),
            reason: "host mirror missing while marked current".into(),
        }
    }

    fn uninit(&self, op: &'static str) -> Error {
        Error::InvalidState {
            op,
            buffer: self.label.clone(),
            reason: "the buffer is uninitialized: there is no data to transfer".into(),
        }
    }
}

impl Drop for SyncedMemory {
    fn drop(&mut self) {
        let mut core = self.shared.core.lock();
        // A transfer in flight still uses the mirrors: wait before freeing them.
        if let Some(p) = core.pending.take() {
            let _ = p.event.wait();
        }
        core.release_device(self.device.as_ref());
        core.host = None;
    }
}

impl fmt::Debug for SyncedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncedMemory")
            .field("label", &self.label)
            .field("size", &self.size)
            .field(
                "device",
                &self.device.as_ref().map(|d| d.label().to_string()),
            )
            .field("head", &self.head())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<SyncedMemory>();
}
