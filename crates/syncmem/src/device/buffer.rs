//! [`DeviceBuffer`]: device memory of one device, direct or a block of its pool.

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::handle::{DeviceHandle, Lent};
use super::stream::{StreamFence, UnboundStream};
use super::usage::{Point, Uses};
use super::{Device, Stream};
use crate::alloc::pool::{Budget, Fence, Lease, Slim, StreamId};
use crate::alloc::stats::Counted;
use crate::backend::dispatch::RawMem;
use crate::error::{BackendKind, Error, OomReport, Result};

#[path = "buffer_release.rs"]
mod release;

/// What to do when a pooled buffer is freed.
#[derive(Clone)]
pub(crate) enum Release {
    /// Nothing can be in flight on the memory: the block is free for every stream at once.
    Idle,
    /// Work may be in flight on this stream: the block is reusable at once there; other
    /// streams reuse it once the commands recorded on the buffer completed, and, when the
    /// buffer's native handle was handed out (work may have been queued outside the crate),
    /// once an event recorded there (lazily, see `StreamFence`) completes.
    Record(UnboundStream),
    /// [`Release::Record`] for the stream the buffer's device handle points at (a stream of
    /// [`Device::new_stream`], which the pool keeps: no reference count taken per buffer).
    RecordOwn,
    /// [`Release::Record`] for the device's default stream, which the device keeps (no
    /// reference count taken per buffer).
    RecordDefault,
}

impl Release {
    /// [`Release::Record`] for `stream`, for a buffer allocated on it: `lent` when the buffer
    /// points at `stream`'s own handle ([`DeviceHandle::Lent`]).
    fn record(stream: &Stream, lent: bool) -> Self {
        if lent {
            return Release::RecordOwn;
        }
        let default = stream.device().default_unbound();
        if default.is_some_and(|d| d.id() == stream.id()) {
            Release::RecordDefault
        } else {
            Release::Record(stream.unbound())
        }
    }
}

/// Where a buffer's memory comes from.
enum Origin {
    /// Nothing allocated (length 0).
    Empty,
    /// A backend allocation of its own, charged to the device's cap (boxed: a backend's memory
    /// handle is large, and a pooled buffer, the common kind, need not carry its room).
    Direct(Box<RawMem>),
    /// A block of the device pool. The memory is the block's view (a sub-buffer / pointer into
    /// its segment), which the lease holds and gives back to the pool with the block.
    Pooled {
        lease: Lease<RawMem, RawMem>,
        release: Release,
    },
}

/// Device memory. Freed when dropped: a direct allocation by the backend that made it, a
/// pooled one back into its device's pool.
///
/// Writing into a `DeviceBuffer` (through a [`Stream`]) takes `&mut`, reading takes `&`.
pub struct DeviceBuffer {
    /// The device: the handle the process keeps of a registry device, a handle of its own
    /// (an isolated device), or for a pooled buffer the stream it was allocated on, which the
    /// pool keeps for the lease (see [`DeviceHandle`]): read last in `Drop::drop` before the
    /// lease is given back (into a thread cache, or with `origin` at its end).
    pub(super) device: DeviceHandle,
    len: usize,
    /// The memory (`Empty` when `len == 0`: nothing is allocated). Dropped at the end of
    /// `Drop::drop` when it holds something (a block gone to a thread cache leaves `Empty`).
    origin: ManuallyDrop<Origin>,
    /// The commands queued on the memory that may still run (see [`super::usage`]). Never
    /// dropped in place: `Drop` takes the uses out unless they own nothing
    /// ([`Uses::owns_nothing`]), which saves the drop of three empty slots on every free.
    pub(super) uses: ManuallyDrop<Mutex<Uses>>,
    /// [`Uses::single_stream`] of `uses` as of its last change that recorded a point
    /// ([`single_hint`]; points forgotten since leave it true, until a wait finds them all
    /// complete and sets 0): a command of that stream is ordered after them, and a wait with 0
    /// returns, without taking the lock. Written under the lock. 32 bits, beside `exposed`.
    pub(super) single: AtomicU32,
    /// The native handle was handed out (`as_opencl`, `as_cuda`): work the crate does not see
    /// may be queued on the memory.
    exposed: AtomicBool,
    /// The device-memory counters' token of a direct allocation (`None` for an empty or a
    /// pooled buffer: the pool counts those).
    counted: Option<Counted>,
}

impl DeviceBuffer {
    pub(crate) fn empty(device: &Device) -> Self {
        Self {
            device: DeviceHandle::of(device),
            len: 0,
            origin: ManuallyDrop::new(Origin::Empty),
            uses: ManuallyDrop::default(),
            single: AtomicU32::new(0),
            exposed: AtomicBool::new(false),
            counted: None,
        }
    }

    /// Rejects requests above the device's largest single allocation.
    #[inline]
    pub(crate) fn check_max(device: &Device, len: usize) -> Result<()> {
        let max = device.info().max_alloc;
        if (len as u64) > max {
            return Err(Self::above_max(device, len, max));
        }
        Ok(())
    }

    #[cold]
    fn above_max(device: &Device, len: usize, max: u64) -> Error {
        OomReport::new(
            device.label(),
            len,
            format!("above the device's largest single allocation, {max} bytes"),
        )
        .with_max_alloc(max)
        .into()
    }

    /// The checks of every allocation of `len >= 1` bytes: the device's largest single
    /// allocation ([`DeviceBuffer::check_max`]), then a failure injected for tests.
    #[inline]
    fn check_request(device: &Device, len: usize) -> Result<()> {
        Self::check_max(device, len)?;
        super::inject::check(device, len, "device memory")
    }

    /// A direct allocation (see [`Device::alloc`]).
    pub(crate) fn new(device: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self::empty(device));
        }
        Self::check_request(device, len)?;
        device.shared.memory.alloc_direct(device, len)
    }

    /// A pooled allocation (see [`Device::alloc_pooled`]) for `owner` (a buffer's label, kept
    /// with the block for memory snapshots). Its free is recorded on `stream` (see
    /// [`DeviceBuffer::set_release`]).
    #[inline]
    pub(crate) fn pooled(
        device: &Device,
        len: usize,
        stream: &Stream,
        owner: Option<&Arc<str>>,
    ) -> Result<Self> {
        if !stream.device().same(device) {
            return Err(Self::mismatch(device, stream));
        }
        if len == 0 {
            return Ok(Self::empty(device));
        }
        Self::check_request(device, len)?;
        device
            .shared
            .memory
            .alloc_pooled(device, len, stream, owner)
    }

    /// [`DeviceBuffer::pooled`] on `device`'s default stream, without a handle of the stream
    /// made for it (the common case of a buffer's mirror: two reference counts taken and
    /// given back less).
    pub(crate) fn pooled_default(
        device: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<Self> {
        if len == 0 {
            return Ok(Self::empty(device));
        }
        Self::check_request(device, len)?;
        device
            .shared
            .memory
            .alloc_pooled_default(device, len, owner)
    }

    #[cold]
    fn mismatch(device: &Device, stream: &Stream) -> Error {
        Error::DeviceMismatch {
            op: "pooled allocation",
            expected: device.label().to_string(),
            actual: stream.device().label().to_string(),
        }
    }

    /// Wraps a direct backend allocation (already charged to the cap).
    pub(crate) fn from_direct(device: &Device, len: usize, raw: RawMem) -> Self {
        let counted = device.shared.mem.on_alloc(len);
        Self {
            device: DeviceHandle::of(device),
            len,
            origin: ManuallyDrop::new(Origin::Direct(Box::new(raw))),
            uses: ManuallyDrop::default(),
            single: AtomicU32::new(0),
            exposed: AtomicBool::new(false),
            counted: Some(counted),
        }
    }

    /// Wraps a pool block, whose view (held by the lease) is the buffer's memory, allocated on
    /// `stream`: the buffer points at the stream's handle, which the pool keeps for a kept
    /// lease, or holds the device's own handle.
    #[inline]
    pub(crate) fn from_pool(stream: &Stream, len: usize, lease: Lease<RawMem, RawMem>) -> Self {
        let handle = stream.device_handle();
        let device = match handle.on_stream() {
            Some(on) if lease.is_kept() => {
                // The pool keeps this very `OnStream` (stream ids are unique, and only
                // `Stream::new` makes an `OnStream`, for a new id).
                #[cfg(debug_assertions)]
                debug_assert_eq!(
                    lease.kept_owner(),
                    Some(Arc::as_ptr(on).cast::<()>()),
                    "the pool keeps another owner for stream {}",
                    stream.id()
                );
                // SAFETY: the pool keeps the stream's `OnStream` for a kept lease until the
                // lease is given back, which `Drop::drop` does after its last use of `device`.
                DeviceHandle::Lent(unsafe { Lent::new(on) })
            }
            _ => DeviceHandle::of(handle),
        };
        let release = Release::record(stream, matches!(device, DeviceHandle::Lent(_)));
        Self::of_lease(device, len, lease, release)
    }

    /// [`DeviceBuffer::from_pool`] for a block of `device`'s default stream (as that function
    /// makes it for the stream's handle: the device's own handle, recorded on the default
    /// stream when given back).
    #[inline]
    pub(crate) fn from_pool_default(
        device: &Device,
        len: usize,
        lease: Lease<RawMem, RawMem>,
    ) -> Self {
        let device = DeviceHandle::of(device);
        Self::of_lease(device, len, lease, Release::RecordDefault)
    }

    /// The buffer of a pool block (see [`DeviceBuffer::from_pool`]; counted by the pool, under
    /// its shard's lock). With no work in flight, the common case, it is written whole where
    /// the caller wants it (one built and then given its uses was copied twice on its way).
    #[inline(always)]
    fn of_lease(
        device: DeviceHandle,
        len: usize,
        lease: Lease<RawMem, RawMem>,
        release: Release,
    ) -> Self {
        debug_assert!(lease.view().is_some(), "a device pool lease holds its view");
        if lease.pending().next().is_some() {
            return Self::inheriting(device, len, lease, release);
        }
        Self {
            device,
            len,
            origin: ManuallyDrop::new(Origin::Pooled { lease, release }),
            uses: ManuallyDrop::default(),
            single: AtomicU32::new(0),
            exposed: AtomicBool::new(false),
            counted: None,
        }
    }

    /// [`DeviceBuffer::of_lease`] for a block that comes with work in flight: the buffer's
    /// uses are that work (see [`inherit_pending`]).
    #[cold]
    #[inline(never)]
    fn inheriting(
        device: DeviceHandle,
        len: usize,
        lease: Lease<RawMem, RawMem>,
        release: Release,
    ) -> Self {
        let uses = inherit_pending(&lease);
        let single = AtomicU32::new(single_hint(uses.single_stream()));
        Self {
            device,
            len,
            origin: ManuallyDrop::new(Origin::Pooled { lease, release }),
            uses: ManuallyDrop::new(Mutex::new(uses)),
            single,
            exposed: AtomicBool::new(false),
            counted: None,
        }
    }

    /// The pool block of this buffer for a thread cache ([`Lease::take_cached`]: a [`Slim`] of
    /// `stream` and its mark), with the [`Release`] to drop after it is given back, taken
    /// where it lies, `Empty` left (a lease moved out with its origin was copied twice). `None`,
    /// the buffer left as it was, when the block goes back to its shard whole, or is none.
    #[inline(always)]
    pub(super) fn take_cached(
        &mut self,
        stream: StreamId,
    ) -> Option<(Slim<RawMem, RawMem>, u8, Release)> {
        let origin: *mut Origin = &raw mut *self.origin;
        // SAFETY: `origin` points to the live field, borrowed here alone.
        let Origin::Pooled { lease, release } = (unsafe { &mut *origin }) else {
            return None;
        };
        // SAFETY: on `Some` the lease's fields are moved out, and the lease is never used nor
        // dropped again: the field is overwritten below before anything else runs.
        let (slim, mark) = unsafe { lease.take_cached(stream) }?;
        // SAFETY: moved out once, with the field overwritten at once (not dropped: its lease
        // was moved out above); `origin` is the live field, and the references above are no
        // longer used.
        let release = unsafe { std::ptr::read(release) };
        // SAFETY: as above.
        unsafe { std::ptr::write(origin, Origin::Empty) };
        Some((slim, mark, release))
    }

    /// Drops the origin, last in `Drop::drop` (see the field).
    #[inline(always)]
    fn drop_origin(&mut self) {
        if !matches!(*self.origin, Origin::Empty) {
            // SAFETY: called once, at the end of `Drop::drop`: the field is never used again.
            unsafe { ManuallyDrop::drop(&mut self.origin) };
        }
    }

    /// The memory (`None` when `len == 0`).
    #[inline]
    pub(crate) fn raw(&self) -> Option<&RawMem> {
        match &*self.origin {
            Origin::Empty => None,
            Origin::Direct(m) => Some(m),
            Origin::Pooled { lease, .. } => lease.view(),
        }
    }

    fn raw_mut(&mut self) -> Option<&mut RawMem> {
        match &mut *self.origin {
            Origin::Empty => None,
            Origin::Direct(m) => Some(m),
            Origin::Pooled { lease, .. } => lease.view_mut(),
        }
    }

    /// True for a block of a fresh pool segment, never handed out before (see
    /// [`DeviceBuffer::known_zero`]).
    pub(crate) fn lease_zeroed(&self) -> bool {
        match &*self.origin {
            Origin::Pooled { lease, .. } => lease.zeroed(),
            _ => false,
        }
    }

    /// For a pool block: its segment's address and its offset there.
    pub(crate) fn placement(&self) -> Option<(usize, usize)> {
        match &*self.origin {
            Origin::Pooled { lease, .. } => {
                Some((std::ptr::from_ref(lease.segment()) as usize, lease.offset()))
            }
            _ => None,
        }
    }

    /// For a pool block: the budget its pool charges and the bytes the block holds of its
    /// segment (what parking it gives back, see [`crate::alloc::pool::Budget::park`]).
    pub(crate) fn pool_charge(&self) -> Option<(&Arc<Budget>, usize)> {
        match &*self.origin {
            Origin::Pooled { lease, .. } => Some(lease.charge()),
            _ => None,
        }
    }

    /// True when the memory is a block of the device's pool.
    pub fn is_pooled(&self) -> bool {
        matches!(*self.origin, Origin::Pooled { .. })
    }

    /// Changes what freeing a pooled buffer does (no effect on direct allocations).
    pub(crate) fn set_release(&mut self, r: Release) {
        if let Origin::Pooled { release, .. } = &mut *self.origin {
            *release = r;
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (which owns no device memory).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that owns the memory.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The OpenCL memory object, to pass to kernels (`None` for other backends or length 0).
    /// A pooled buffer's is a sub-buffer of the block, which may be larger than `len()`. Work
    /// queued on it through the buffer's own stream is covered when a pooled buffer is freed
    /// (an event is recorded there before another stream reuses the block); announce work on
    /// other queues with events. To run a kernel of your own, prefer
    /// [`crate::device::UserKernel`]: it orders the launch after every other stream's work on
    /// its buffers and records it on each, which native work cannot do.
    #[cfg(feature = "opencl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opencl")))]
    pub fn as_opencl(&self) -> Option<&opencl3::memory::Buffer<u8>> {
        self.exposed.store(true, Ordering::Relaxed);
        self.raw().and_then(RawMem::as_opencl)
    }

    /// The CUDA device memory, to pass to kernels (`None` for other backends or length 0). A
    /// pooled buffer's covers the block, which may be larger than `len()`; work queued through
    /// it is covered as for [`DeviceBuffer::as_opencl`].
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn as_cuda(&self) -> Option<&cudarc::driver::CudaSlice<u8>> {
        self.exposed.store(true, Ordering::Relaxed);
        self.raw().and_then(RawMem::as_cuda)
    }

    /// Whether a native handle of the memory was handed out (`as_opencl`, `as_cuda`,
    /// [`DeviceBuffer::native_address`]): work the crate does not see may be queued on it.
    pub(crate) fn was_exposed(&self) -> bool {
        self.exposed.load(Ordering::Relaxed)
    }

    /// The memory's address for code outside the crate (DLPack, collective libraries): the
    /// host address of a `cpu` buffer, the `cl_mem` handle of an OpenCL buffer (a pooled
    /// buffer's sub-buffer, which starts at the buffer), the device pointer of CUDA memory.
    /// `None` for an empty buffer. Work queued on it elsewhere is not seen by the crate: as for
    /// `as_opencl`, order it with the buffer's stream and keep a guard (or the buffer) alive
    /// meanwhile.
    pub fn native_address(&self) -> Option<usize> {
        let m = self.raw()?;
        self.exposed.store(true, Ordering::Relaxed);
        Some(m.native_address())
    }

    /// The bytes of a `cpu`-device buffer (`None` for other backends).
    pub fn as_cpu_slice(&self) -> Option<&[u8]> {
        match self.raw() {
            // A pooled buffer's view covers its whole block.
            Some(m) => m.as_cpu().map(|m| &m.as_slice()[..self.len]),
            None if self.device.backend() == BackendKind::Cpu => Some(&[]),
            None => None,
        }
    }

    /// The bytes of a `cpu`-device buffer, mutably (`None` for other backends).
    pub fn as_cpu_slice_mut(&mut self) -> Option<&mut [u8]> {
        let cpu = self.device.backend() == BackendKind::Cpu;
        let len = self.len;
        match self.raw_mut() {
            Some(m) => m.as_cpu_mut().map(|m| &mut m.as_mut_slice()[..len]),
            None if cpu => Some(&mut []),
            None => None,
        }
    }
}

impl DeviceBuffer {
    /// Start of a `cpu`-device buffer's memory (`None` for other backends or length 0).
    pub(crate) fn cpu_ptr(&self) -> Option<*mut u8> {
        self.raw().and_then(RawMem::as_cpu).map(|m| m.as_ptr())
    }
}

/// [`DeviceBuffer::single`] when the points are of several streams, or of one whose id does
/// not fit in 32 bits (a command of any stream then takes the lock).
pub(super) const NOT_SINGLE: u32 = u32::MAX;

/// [`Uses::single_stream`] in 32 bits: 0 (no point), a stream id, or [`NOT_SINGLE`].
pub(super) fn single_hint(single: u64) -> u32 {
    u32::try_from(single)
        .ok()
        .filter(|&s| s != NOT_SINGLE)
        .unwrap_or(NOT_SINGLE)
}

/// The uses of a block's new owner: the work of its previous owners still in flight. The pool
/// hands a block out at once to a request on the stream of that work (a stream runs in order),
/// but the new owner's first command may run on another stream: it must wait for that work on
/// the device, as it would for a write of its own.
#[cold]
pub(super) fn inherit_pending(lease: &Lease<RawMem, RawMem>) -> Uses {
    let mut uses = Uses::default();
    for (stream, fence) in lease.pending() {
        let any: &dyn Any = fence;
        let point = if let Some(p) = Point::of_fence(stream, fence) {
            (!p.is_done()).then_some(p)
        } else if let Some(p) = any.downcast_ref::<Point>() {
            (!p.is_done()).then(|| p.clone())
        } else if let Some(f) = any.downcast_ref::<StreamFence>() {
            // Work queued natively on the stream: a marker after it stands for it.
            f.point_now(stream)
        } else {
            // A fence the device layer does not make (a user's event): wait for it.
            Fence::wait(fence);
            None
        };
        if let Some(displaced) = point.and_then(|p| uses.inherit(p)) {
            let _ = displaced.wait();
        }
    }
    uses
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.label())
            .field("len", &self.len)
            .finish()
    }
}
#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    /// A buffer moves (into an `Arc`, out of a `Result`) by copying it whole: pooled buffers,
    /// made and dropped on every step, keep it small (a direct allocation's large backend
    /// handle is boxed).
    #[test]
    fn a_buffer_stays_small() {
        let size = std::mem::size_of::<super::DeviceBuffer>();
        assert!(size <= 256, "DeviceBuffer is {size} bytes");
    }
}
