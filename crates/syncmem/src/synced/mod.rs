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
//! thread; the `try_*` accessors return [`Error::Busy`] instead.
//!
//! A thread never waits for itself: an access that conflicts with a guard *the same thread*
//! holds (a write access while it holds any guard of the buffer, a read access while it holds
//! a write guard), which a plain reader-writer lock would wait for forever, returns
//! [`Error::Busy`] at once, naming the buffer and, for tensors that share a storage, both
//! tensors: the one asked for and the one whose view the thread holds. Each thread keeps a
//! small record of the guards it holds, consulted only when the lock is not free at once; an
//! uncontended access just adds and removes its record. Read guards of one thread share the
//! lock as before.
//!
//! # Copies in flight
//!
//! [`SyncedMemory::prefetch_to_device`] queues the host-to-device copy and returns. Unlike
//! Caffe, the buffer knows the copy is in flight. A device access does not wait for it on the
//! host: the device mirror counts as current from then on, and every device command on the
//! buffer, on any stream, is ordered after the copy on the device (the copy is a write use of
//! the device buffer; the guard's stream waits for it, device-side, before the caller's own
//! commands), as for the copy below. A host write waits for the copy's event; a host read does
//! not wait.
//!
//! The copy a device access makes when the host holds the newest data (Caffe's `to_gpu`) is
//! queued too, on the buffer's stream, and the device mirror counts as current at once: every
//! device command on the buffer is ordered after the copy on the device (the copy is a write
//! use of the device buffer), so no device access waits for it. The host mirror is the copy's
//! source until it ends: a host write, a new host mirror ([`SyncedMemory::set_host_data`]) and
//! dropping the buffer wait for it; host reads do not.
//!
//! A copy (or announced device work) that fails is never counted as arrived where the host
//! waits for it: the access that settles it returns the backend's error, and the mirror it was
//! filling stays stale, so the next access that needs that mirror copies again. A copy to the
//! device that a device access took as arrived (both kinds above) reports its error to the
//! next access that waits for the copy (a host write, a new host mirror), which then marks the
//! device mirror stale.
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
//!
//! # Replicas on other devices
//!
//! [`SyncedMemory::device_on`], [`SyncedMemory::device_mut_on`] and
//! [`SyncedMemory::device_overwrite_on`] name any device: the buffer's own (the accessors
//! above), or another, of any backend, where the buffer then keeps a replica from that
//! device's pool. One coherence state covers the host, the buffer's device and every replica:
//! a read where a current copy already is copies nothing; a read where none is copies from the
//! cheapest current place (one device command between OpenCL devices of one context, counted
//! as [`crate::Direction::DeviceToDevice`]; otherwise through the host, whose mirror is made
//! current first); a write anywhere makes every other place stale. When only a replica is
//! current the head is [`Head::Elsewhere`], and the next access of the buffer's own mirrors
//! copies the data back first. Copies between devices are also counted per pair of devices
//! and route in [`crate::alloc::pairs`]. Replicas are freed with the buffer; the out-of-memory
//! path of their devices does not spill them, and a copy through the host is blocking.

// The device layer's lifetime tests: they drop devices that hold synced memory.
mod access;
#[cfg(test)]
mod device_lifetime_tests;
mod external;
mod fast;
mod guard;
pub(crate) mod held;
mod memory;
mod park;
mod pin;
mod prefetch;
mod registry;
mod replica;
mod shared;
mod spill;
mod state;
mod transition;

pub use guard::{DeviceRead, DeviceWrite, HostRead, HostWrite};
pub use pin::PlacementPin;
pub use state::{Head, PendingKind};

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use fast::CoreCell;

use crate::alloc::pool::HostAllocation;
use crate::alloc::stats::{CopyCounters, CopyStats};
use crate::device::{Device, DeviceBuffer, PinnedBuffer, Stream};
use crate::error::{checked_mul, Error, Result};
use state::Coherence;

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
    /// The device mirror's own memory, shared with the host (zero-copy, see [`shared`]): owned
    /// by the device mirror, gone with it.
    Shared(NonNull<u8>),
    /// The former device mirror's block, spilled in place (see [`park`]): the host's now.
    Parked(park::Parked),
}

// SAFETY: `External.ptr` is memory that `set_host_ptr`'s contract (or the owner's `AsMut`) gives
// to this buffer alone; the owner is `Send + Sync`. `Shared` and `Parked` point into a device
// block the buffer owns. The other variants are `Send + Sync`.
unsafe impl Send for HostMem {}
// SAFETY: as above; access to the bytes is serialised by the buffer's locks.
unsafe impl Sync for HostMem {}

impl HostMem {
    fn ptr(&self) -> *mut u8 {
        match self {
            HostMem::Owned(b) => b.as_ptr(),
            HostMem::Pinned(p) => p.ptr(),
            HostMem::External { ptr, .. } => ptr.as_ptr(),
            HostMem::Shared(ptr) => ptr.as_ptr(),
            HostMem::Parked(p) => p.ptr(),
        }
    }
}

/// The device mirror, and what the buffer knows of it.
struct DevMirror {
    buf: Arc<DeviceBuffer>,
    /// Allocated by this buffer from the device's pool (not adopted).
    owned: bool,
    /// A device guard was handed out since the mirror was allocated: work may be queued on it.
    exposed: bool,
    /// The buffer's entry in the device's registry of evictable mirrors.
    reg: Option<registry::Reg>,
}

/// The state of a buffer, behind its state lock: where the newest data is (the head, and
/// every change of it: [`Coherence`]) and the memory that holds it.
#[derive(Default)]
struct Core {
    coh: Coherence,
    host: Option<HostMem>,
    dev: Option<DevMirror>,
    /// Host and device share the device mirror's memory (zero-copy, see [`shared`]).
    zc: Option<shared::ZeroCopyState>,
    /// Replicas on other devices (see [`replica`]).
    remote: Vec<replica::Remote>,
    /// The heap allocation of the last device mirror this buffer freed, emptied, for its
    /// next one: a value dropped and made again every step (under a memory cap) allocates
    /// nothing on the heap. A few hundred bytes per buffer that had a device mirror.
    spare: Option<Arc<DeviceBuffer>>,
    /// The registry entry of the last device mirror this buffer freed, idle, for its next one
    /// (see [`registry::Reg`]); unregistered when the buffer goes.
    idle_reg: Option<registry::Reg>,
}

impl Core {
    /// The device mirror's memory, if it exists.
    fn dev_buf(&self) -> Option<Arc<DeviceBuffer>> {
        self.dev.as_ref().map(|d| d.buf.clone())
    }

    /// The device mirror exists and this buffer allocated it (not adopted).
    fn dev_owned(&self) -> bool {
        self.dev.as_ref().is_some_and(|d| d.owned)
    }

    /// The host mirror's start, if it exists.
    fn host_ptr(&self) -> Option<*mut u8> {
        self.host.as_ref().map(HostMem::ptr)
    }
}

/// What a buffer is and how it behaves: set while it is built (the `with_*` methods), the same
/// for the rest of its life. The one record of each: the buffer's accessors, its transitions
/// and the device's out-of-memory path all read it here.
#[derive(Clone)]
struct Settings {
    /// Names the buffer in errors, and its blocks in the pools' snapshots.
    label: Arc<str>,
    size: usize,
    device: Option<Device>,
    /// The buffer's stream (`None`: the device's default stream).
    stream: Option<Stream>,
    /// The buffer may share memory with its device (zero-copy) where the device allows it.
    zero_copy: bool,
}

/// The part of a buffer the device's out-of-memory path reaches through a weak reference (and
/// its pins through a strong one).
pub(crate) struct Shared {
    settings: Settings,
    access: RwLock<()>,
    core: CoreCell,
    /// Copies made by the buffer's transitions (and spills, refills, zero-copy syncs).
    copies: Arc<CopyCounters>,
    /// When the device mirror was last used (a tick of [`spill::tick`]): spills go least
    /// recently used first.
    last_use: AtomicU64,
    /// Live [`PlacementPin`]s: while any lives, no mirror moves (see [`pin`]).
    pins: Arc<AtomicUsize>,
    /// Host mirrors come from the device's pinned pool ([`SyncedMemory::set_pinned_host`]):
    /// read when a host mirror is made, or a device mirror that could share its memory.
    pinned_host: AtomicBool,
}

impl Shared {
    fn new(settings: Settings) -> Self {
        Self {
            settings,
            access: RwLock::new(()),
            core: CoreCell::new(Core::default()),
            copies: Arc::new(CopyCounters::new()),
            last_use: AtomicU64::new(0),
            pins: Arc::new(AtomicUsize::new(0)),
            pinned_host: AtomicBool::new(false),
        }
    }

    /// Whether new host mirrors come from the device's pinned pool.
    fn pinned_host(&self) -> bool {
        self.pinned_host.load(Ordering::Relaxed)
    }

    /// A new shared part that takes over this one's state, counters and pins, leaving this
    /// one empty (what the out-of-memory path or a pin still reaches of it holds no memory).
    fn take_over(&self) -> Shared {
        let core = std::mem::take(&mut *self.core.lock());
        Shared {
            settings: self.settings.clone(),
            access: RwLock::new(()),
            core: CoreCell::new(core),
            copies: self.copies.clone(),
            last_use: AtomicU64::new(self.last_use.load(Ordering::Relaxed)),
            pins: self.pins.clone(),
            pinned_host: AtomicBool::new(self.pinned_host()),
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One logical byte buffer mirrored lazily on the host and on one device.
///
/// `Send + Sync`: share it with `&` or `Arc` across threads; readers run concurrently, writers
/// exclusively. See the [module docs](self) for the access rules.
pub struct SyncedMemory {
    shared: Arc<Shared>,
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

    /// The buffer's identity while it lives, as the out-of-memory path knows it
    /// ([`crate::device::Evictable::key`]): the address of its shared state.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    fn build(size: usize, device: Option<Device>) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let settings = Settings {
            label: format!("synced#{id}").into(),
            size,
            device,
            stream: None,
            zero_copy: true,
        };
        Self {
            shared: Arc::new(Shared::new(settings)),
        }
    }

    /// Changes the settings of the buffer being built. Once a device mirror or a pin exists,
    /// the device's out-of-memory path or the pin share the settings: a new shared part then
    /// takes the buffer's state over, with the new settings, and the mirror is registered for
    /// eviction anew.
    fn configure(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            change(&mut shared.settings);
            return self;
        }
        let mut next = self.shared.take_over();
        change(&mut next.settings);
        self.shared = Arc::new(next);
        self.register_again();
        self
    }

    fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// Names the buffer in errors and reports (e.g. the blob name), and the blocks its mirrors
    /// get from the pools, in memory snapshots (mirrors allocated before keep the old name).
    pub fn with_label(self, label: impl Into<String>) -> Self {
        let label: Arc<str> = label.into().into();
        self.configure(|s| s.label = label)
    }

    /// Allocates the host mirror as pinned memory of the device (faster copies), instead of
    /// ordinary host memory. A policy per buffer: other host allocations are unaffected.
    /// [`SyncedMemory::set_pinned_host`] on a buffer being built.
    pub fn with_pinned_host(self, pinned: bool) -> Self {
        self.set_pinned_host(pinned);
        self
    }

    /// Sets where this buffer's host mirrors come from: the device's pinned pool (page-locked
    /// memory, which a discrete device copies to and from at full speed and without a host
    /// wait) or ordinary host memory. It takes effect when a host mirror is next made: a
    /// mirror that exists stays where it is until it is freed (a spill, `clear`, an adoption).
    /// A buffer with pinned host mirrors keeps two mirrors where its device could share
    /// memory with the host (zero-copy), from its next device mirror on. No effect on a
    /// host-only buffer (there is no device to pin memory for).
    pub fn set_pinned_host(&self, pinned: bool) {
        self.shared.pinned_host.store(pinned, Ordering::Relaxed);
    }

    /// Whether new host mirrors of this buffer come from the device's pinned pool
    /// ([`SyncedMemory::set_pinned_host`]).
    pub fn pinned_host(&self) -> bool {
        self.shared.pinned_host()
    }

    /// Whether this buffer may share one allocation with its device where the device's memory
    /// is host memory (zero-copy, see [`crate::device::zero_copy`]): `true` (the default)
    /// follows the device's setting, `false` keeps two mirrors and copies between them. Takes
    /// effect at the next allocation of the device mirror. A buffer with a pinned host mirror
    /// ([`SyncedMemory::with_pinned_host`]) keeps two mirrors.
    pub fn with_zero_copy(self, zero_copy: bool) -> Self {
        self.configure(|s| s.zero_copy = zero_copy)
    }

    /// How the host and the device share this buffer's memory, or `None` while it has two
    /// mirrors (or none yet).
    pub fn zero_copy_protocol(&self) -> Option<crate::device::ZeroCopyProtocol> {
        self.shared.core.lock().zc.map(|z| z.protocol)
    }

    /// Uses `stream` for this buffer's copies instead of the device's default stream.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the stream belongs to another device, [`Error::NoDevice`]
    /// for a host-only buffer.
    pub fn with_stream(self, stream: &Stream) -> Result<Self> {
        let dev = self.target().ok_or_else(|| self.no_device())?;
        if !stream.device().same(dev) {
            return Err(Error::DeviceMismatch {
                op: "SyncedMemory::with_stream",
                expected: dev.label().to_string(),
                actual: stream.device().label().to_string(),
            });
        }
        let stream = stream.clone();
        Ok(self.configure(|s| s.stream = Some(stream)))
    }

    /// Size in bytes, fixed at construction.
    pub fn len(&self) -> usize {
        self.settings().size
    }

    /// True when the size is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The label used in errors.
    pub fn label(&self) -> &str {
        &self.settings().label
    }

    /// The device this buffer mirrors to, if any.
    pub fn target(&self) -> Option<&Device> {
        self.settings().device.as_ref()
    }

    /// Which mirror holds the newest data. A transfer in flight counts as done (as in Caffe):
    /// an access that needs its data waits for it. See [`SyncedMemory::pending`].
    pub fn head(&self) -> Head {
        self.shared.core.lock().coh.head()
    }

    /// The transfer or device work in flight, if any (completed work is settled first).
    ///
    /// # Errors
    /// A backend error while querying the event.
    pub fn pending(&self) -> Result<Option<PendingKind>> {
        let mut core = self.shared.core.lock();
        self.settle_if_complete(&mut core)?;
        Ok(core.coh.pending().map(|p| p.kind))
    }

    /// Blocks until any transfer or device work in flight is done: a transfer or announced work
    /// ([`SyncedMemory::pending`]) and every command queued on the device mirror or on a
    /// replica on another device (kernels, copies, fills), each counted as a host wait when it
    /// was not complete yet.
    ///
    /// # Errors
    /// A backend error from the work waited for.
    pub fn wait(&self) -> Result<()> {
        let mut core = self.shared.core.lock();
        core.coh.finish_pending()?;
        if let Some(dev) = &core.dev {
            dev.buf.wait_uses()?;
        }
        core.wait_remotes()
    }

    /// Copies made by this buffer's transitions, by direction.
    pub fn copy_stats(&self) -> CopyStats {
        self.shared.copies.snapshot()
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
            Some(HostMem::Owned(_) | HostMem::Pinned(_) | HostMem::Shared(_) | HostMem::Parked(_))
        )
    }

    /// True when the device mirror is owned by this buffer (not adopted).
    pub fn owns_device(&self) -> bool {
        self.shared.core.lock().dev_owned()
    }
}

impl Drop for SyncedMemory {
    fn drop(&mut self) {
        let mut core = self.shared.core.lock();
        // A transfer in flight still uses the mirrors: wait before freeing them (not for the
        // writer of a block parked with it running: see `abandon_pending`).
        core.coh.abandon_pending();
        let _ = core.coh.release_host();
        if core.zc.is_some_and(|z| z.mapped.is_some()) {
            // The mapping goes before the memory does (the pool hands the block out again).
            if let (Ok(stream), Some(dev)) = (self.pick_stream(None), core.dev_buf()) {
                let _ = stream.unmap(&dev, core.host_ptr().unwrap_or(ptr::null_mut()));
            }
        }
        core.release_device(self.target());
        if let (Some(reg), Some(device)) = (core.idle_reg.take(), self.target()) {
            registry::of(device).unregister(reg);
        }
        core.host = None;
    }
}

impl fmt::Debug for SyncedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncedMemory")
            .field("label", &self.label())
            .field("size", &self.len())
            .field("device", &self.target().map(|d| d.label().to_string()))
            .field("head", &self.head())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<SyncedMemory>();
}
