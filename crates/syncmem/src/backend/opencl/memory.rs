//! Device memory and pinned host memory.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use opencl3::command_queue as cq;
use opencl3::memory::Buffer;

use super::handle::{release_event_quietly, ClContext, OwnedBuffer, Queue};
use crate::backend::{BackendMem, BackendPinned, KeepAlive};

/// Device memory: a `CL_MEM_READ_WRITE` buffer of the platform's context, or a sub-buffer of a
/// pool segment (so kernels see the block at offset 0 of their `cl_mem`).
pub(crate) struct ClMem {
    pub(super) buf: OwnedBuffer,
    pub(super) len: usize,
    pub(super) ctx: Arc<ClContext>,
    /// For a sub-buffer: the pool segment it lies in (OpenCL also keeps the parent alive).
    pub(super) _parent: Option<KeepAlive>,
}

impl ClMem {
    /// The OpenCL buffer, e.g. to pass as a kernel argument.
    pub(crate) fn buffer(&self) -> &Buffer<u8> {
        &self.buf.buf
    }
}

impl BackendMem for ClMem {
    fn len(&self) -> usize {
        self.len
    }
}

/// Pinned host memory: a `CL_MEM_ALLOC_HOST_PTR` buffer, mapped read/write until drop.
pub(crate) struct ClPinned {
    pub(super) buf: OwnedBuffer,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    /// The device's internal queue the buffer was mapped on.
    pub(super) queue: Arc<Queue>,
}

// SAFETY: the mapped pointer is plain host memory owned by this value (no thread affinity);
// the OpenCL handles are thread-safe per the spec. Access to the bytes is synchronised by the
// public wrapper (`&` for reads, `&mut` for writes).
unsafe impl Send for ClPinned {}
// SAFETY: as for Send; `&ClPinned` only hands out the pointer and the length.
unsafe impl Sync for ClPinned {}

impl BackendPinned for ClPinned {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ClPinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the pointer the map of `buf` on `queue` returned, and it is unmapped
        // only here. Errors are ignored: at worst the mapping leaks.
        let unmapped = unsafe {
            cq::enqueue_unmap_mem_object(
                self.queue.raw(),
                self.buf.raw(),
                self.ptr.cast::<c_void>(),
                0,
                ptr::null(),
            )
        };
        if let Ok(event) = unmapped {
            let _ = opencl3::event::wait_for_events(&[event]);
            release_event_quietly(event);
        }
        // `buf` is released after this, by its own Drop.
    }
}
