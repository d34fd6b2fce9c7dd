//! The handles a stream and its buffers hold of their device: a [`StreamHandle`] (the
//! device's own handle, or a stream's users' count around its [`OnStream`]), and a buffer's
//! [`DeviceHandle`] (the device's own handle, a reference to the handle the process keeps of
//! a registry device, or a pointer to the `OnStream` the device pool keeps for the buffer's
//! block).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::stream::UnboundStream;
use super::Device;

/// A [`Stream`](super::Stream)'s handle to its device.
///
/// A stream made by [`Device::new_stream`] holds its device once, in an [`OnStream`] the
/// stream's clones share (through [`StreamUsers`]). The buffers allocated on it from the
/// device pool take no reference count at all: the pool keeps the `OnStream` for the stream's
/// leases ([`crate::alloc::pool::Pool::alloc_with`]), and each buffer points at it (see
/// [`DeviceHandle::Lent`]). Threads working each on a stream of their own then write no
/// counter that they share, and a pooled allocation and free take no locked instruction beyond
/// the pool shard's lock. The default stream, which the device keeps without its handle, and
/// a stream made again from the device's own ([`Device::default_stream`]) hold the device's
/// handle itself.
#[derive(Clone)]
pub(crate) enum StreamHandle {
    /// The device's own handle.
    Device(Device),
    /// The users' handle of a stream made by [`Device::new_stream`].
    Own(Arc<StreamUsers>),
}

/// What the handles of a stream made by [`Device::new_stream`] share: its last one dropped
/// tells the device pool to let the stream's [`OnStream`] go (it holds the device, which holds
/// the pool: kept past the stream's users, it would never be freed).
pub(crate) struct StreamUsers {
    on: Arc<OnStream>,
}

impl StreamUsers {
    /// The users' count of the stream `on`.
    pub(super) fn new(on: Arc<OnStream>) -> Self {
        Self { on }
    }
}

impl Drop for StreamUsers {
    fn drop(&mut self) {
        // Before the pool empties the threads' caches (in `release_stream`): a buffer of the
        // stream freed later reads it with its cache's flag held, and keeps its block out
        // (see `DeviceBuffer`'s drop), while one freed earlier is emptied from the cache.
        self.on.released.store(true, Ordering::Relaxed);
        // A stream that never allocated from the pool has nothing to let go (and the pool's
        // shards are not locked for it). Relaxed is enough: every allocation on the stream
        // happened before its handles' last reference count was dropped, which this follows.
        if !self.on.kept.load(Ordering::Relaxed) {
            return;
        }
        // `self.on` is still held here: the pool's copy is not the last one.
        self.on
            .device
            .shared
            .memory
            .release_stream(self.on.stream.id());
    }
}

/// A stream made by [`Device::new_stream`] without its users' count: its device and the
/// queue, which the device pool keeps for the buffers allocated on the stream.
pub(crate) struct OnStream {
    device: Device,
    stream: UnboundStream,
    /// The device pool was given this handle to keep (see [`OnStream::keep`]).
    kept: AtomicBool,
    /// The stream's last user handle is gone: the pool lets this handle go once the stream's
    /// last block is given back, so no block of it may wait in a thread's cache.
    released: AtomicBool,
}

impl OnStream {
    /// The handle of a new stream of `device`.
    pub(super) fn new(device: Device, stream: UnboundStream) -> Self {
        Self {
            device,
            stream,
            kept: AtomicBool::new(false),
            released: AtomicBool::new(false),
        }
    }

    /// Whether the stream's last user handle is gone (see [`OnStream::released`]).
    #[inline]
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    /// This handle, for the device pool to keep for the stream's buffers, noted so that the
    /// stream's last user handle lets the pool's copy go.
    pub(crate) fn keep(on: &Arc<OnStream>) -> Arc<OnStream> {
        on.kept.store(true, Ordering::Relaxed);
        on.clone()
    }
}

impl StreamHandle {
    /// The stream's [`OnStream`] (`None` for the device's own handle).
    #[inline]
    pub(crate) fn on_stream(&self) -> Option<&Arc<OnStream>> {
        match self {
            StreamHandle::Device(_) => None,
            StreamHandle::Own(u) => Some(&u.on),
        }
    }
}

impl std::ops::Deref for StreamHandle {
    type Target = Device;

    #[inline]
    fn deref(&self) -> &Device {
        match self {
            StreamHandle::Device(d) => d,
            StreamHandle::Own(u) => &u.on.device,
        }
    }
}

/// A buffer's handle to its device.
pub(crate) enum DeviceHandle {
    /// The device's own handle.
    Device(Device),
    /// The stream a pooled buffer was allocated on, kept by the device pool for the buffer's
    /// lease ([`crate::alloc::pool::Pool::alloc_with`]): no reference count of its own.
    Lent(Lent),
    /// The handle the process keeps for a device of the registry (`Device::open`,
    /// `Device::cpu`...), which lives as long as the process: no reference count taken. Threads
    /// allocating on a stream they share (the default stream) would otherwise all write the
    /// device's one count, twice a buffer.
    Process(&'static Device),
}

/// A pointer to an [`OnStream`] the device pool keeps for a lease (see [`DeviceHandle::Lent`]).
pub(crate) struct Lent(NonNull<OnStream>);

// SAFETY: a `Lent` is a shared reference to an `OnStream` (a device handle and a stream, both
// `Send + Sync`), kept alive by the pool for the lease of the buffer holding it.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`: only `&OnStream` is ever made from it.
unsafe impl Sync for Lent {}

impl Lent {
    /// A pointer to `on`.
    ///
    /// # Safety
    /// The device pool keeps `on` (the same allocation) for the lease of the buffer that will
    /// hold the result, and the buffer drops the lease after its last use of the result.
    pub(crate) unsafe fn new(on: &Arc<OnStream>) -> Self {
        Lent(NonNull::from(&**on))
    }

    #[inline]
    fn get(&self) -> &OnStream {
        // SAFETY: alive while the buffer's lease is out (see `Lent::new`), which is longer than
        // any borrow of the buffer.
        unsafe { self.0.as_ref() }
    }
}

impl DeviceHandle {
    /// A handle of `device` itself: the process's own when it keeps the device for its whole
    /// life, else a clone (a reference count taken).
    #[inline]
    pub(crate) fn of(device: &Device) -> Self {
        match device.shared.process.get() {
            Some(&d) => DeviceHandle::Process(d),
            None => DeviceHandle::Device(device.clone()),
        }
    }

    /// Whether this is a handle of the device itself (not a stream's the pool keeps).
    #[inline]
    pub(crate) fn is_device(&self) -> bool {
        !matches!(self, DeviceHandle::Lent(_))
    }

    /// The stream's handle the pool keeps (`None` for the device's own handle).
    #[inline]
    pub(crate) fn lent(&self) -> Option<&OnStream> {
        match self {
            DeviceHandle::Device(_) | DeviceHandle::Process(_) => None,
            DeviceHandle::Lent(l) => Some(l.get()),
        }
    }

    /// The stream this handle was made for (`None` for the device's own handle).
    #[inline]
    pub(crate) fn stream(&self) -> Option<&UnboundStream> {
        match self {
            DeviceHandle::Device(_) | DeviceHandle::Process(_) => None,
            DeviceHandle::Lent(l) => Some(&l.get().stream),
        }
    }
}

impl std::ops::Deref for DeviceHandle {
    type Target = Device;

    #[inline]
    fn deref(&self) -> &Device {
        match self {
            DeviceHandle::Device(d) => d,
            DeviceHandle::Lent(l) => &l.get().device,
            DeviceHandle::Process(d) => d,
        }
    }
}
