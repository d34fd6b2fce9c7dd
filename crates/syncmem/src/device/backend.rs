//! The contract every backend implements (CPU, OpenCL, CUDA).
//!
//! These traits are crate-private. The public types in [`crate::device`] wrap one
//! implementation per backend in an enum, so every `match` compiles whatever features are on.
//!
//! Rules every implementation follows:
//! - `alloc(bytes)` is called with `bytes >= 1` only; memory contents are unspecified.
//! - A `Mem` / `Pinned` frees itself on `Drop` with the API that made it, and never panics there
//!   (errors on free are ignored: the runtime may already be shutting down).
//! - Stream operations are ordered on the stream. `copy` and `fill` are asynchronous.
//! - Offsets and lengths passed in have already been checked against the buffer sizes by the
//!   caller, and `len >= 1`.

use std::any::Any;
use std::sync::Arc;

use super::DeviceInfo;
use crate::error::Result;

/// Keeps a pool segment alive for as long as a view into it exists.
pub(crate) type KeepAlive = Arc<dyn Any + Send + Sync>;

/// One physical device of a backend, created once at discovery.
pub(crate) trait BackendDevice: Send + Sync + 'static {
    /// Device memory.
    type Mem: BackendMem;
    /// Page-locked host memory that the device can copy from/to quickly.
    type Pinned: BackendPinned;
    /// A queue of device work.
    type Stream: BackendStream<Mem = Self::Mem, Event = Self::Event>;
    /// A marker in a stream.
    type Event: BackendEvent;

    /// Facts about the device.
    fn info(&self) -> &DeviceInfo;
    /// Allocates `bytes` of device memory (no zero fill).
    fn alloc(&self, bytes: usize) -> Result<Self::Mem>;
    /// Allocates `bytes` of pinned host memory, zero-filled.
    fn alloc_pinned(&self, bytes: usize) -> Result<Self::Pinned>;
    /// Creates a new stream (in-order queue) on this device.
    fn new_stream(&self) -> Result<Self::Stream>;
    /// Alignment in bytes that the offset of a sub-buffer ([`BackendDevice::sub_mem`]) must
    /// respect (a power of two).
    fn sub_align(&self) -> usize;
    /// A view of `len >= 1` bytes of `parent` from `offset` (a multiple of
    /// [`BackendDevice::sub_align`], `offset + len <= parent.len()`), usable wherever a `Mem`
    /// is. Dropping the view never frees the parent's memory; `keep` (which owns the parent)
    /// lives as long as the view.
    fn sub_mem(
        &self,
        parent: &Self::Mem,
        offset: usize,
        len: usize,
        keep: KeepAlive,
    ) -> Result<Self::Mem>;
}

/// Device memory owned by this value.
pub(crate) trait BackendMem: Send + Sync + 'static {
    /// Size in bytes.
    fn len(&self) -> usize;
}

/// Pinned host memory owned by this value.
pub(crate) trait BackendPinned: Send + Sync + 'static {
    /// Start of the host-visible mapping. Valid for `len()` bytes until drop.
    fn as_ptr(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;
}

/// An in-order queue of device work.
pub(crate) trait BackendStream: Send + Sync + 'static {
    /// Device memory of this backend.
    type Mem;
    /// Events of this backend.
    type Event;

    /// Copies `len` bytes from host `src` into `dst` at `dst_off`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes. When `blocking` is false, `src` must stay
    /// valid and unmodified until an event recorded after this call has completed.
    unsafe fn write(
        &self,
        dst: &Self::Mem,
        dst_off: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<()>;

    /// Copies `len` bytes from `src` at `src_off` into host `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not accessed by anything else until the
    /// copy is complete (on return when `blocking`, else when an event recorded after this call
    /// has completed).
    unsafe fn read(
        &self,
        src: &Self::Mem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<()>;

    /// Device-to-device copy, asynchronous. `src` and `dst` may be on different devices of
    /// the same backend when the backend supports it.
    fn copy(
        &self,
        src: &Self::Mem,
        src_off: usize,
        dst: &Self::Mem,
        dst_off: usize,
        len: usize,
    ) -> Result<()>;

    /// Sets `len` bytes of `dst` from `off` to `value`, asynchronous.
    fn fill(&self, dst: &Self::Mem, off: usize, len: usize, value: u8) -> Result<()>;

    /// Records an event after all work queued so far.
    fn record(&self) -> Result<Self::Event>;

    /// Makes later work on this stream wait for `event`.
    fn wait_for(&self, event: &Self::Event) -> Result<()>;

    /// Blocks until all queued work is complete.
    fn synchronize(&self) -> Result<()>;
}

/// A marker in a stream.
pub(crate) trait BackendEvent: Send + Sync + Clone + 'static {
    /// Blocks until the event has completed.
    fn wait(&self) -> Result<()>;
    /// True once the event has completed.
    fn is_complete(&self) -> Result<bool>;
}
