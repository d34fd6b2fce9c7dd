//! Device memory and pinned host memory.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};

use opencl3::command_queue as cq;
use opencl3::memory::Buffer;
use opencl3::types::cl_mem;

use super::handle::{release_event_quietly, ClContext, OwnedBuffer, Queue};
use crate::backend::cpu::host::AlignedBlock;
use crate::backend::{BackendMem, BackendPinned, KeepAlive};

/// Device memory: a `CL_MEM_READ_WRITE` buffer of the platform's context, or a sub-buffer of a
/// pool segment (so kernels see the block at offset 0 of their `cl_mem`).
pub(crate) struct ClMem {
    pub(super) buf: OwnedBuffer,
    pub(super) len: usize,
    pub(super) ctx: Arc<ClContext>,
    /// For a sub-buffer: the pool segment it lies in (OpenCL also keeps the parent alive).
    pub(super) _parent: Option<KeepAlive>,
    /// For memory over a host block (`CL_MEM_USE_HOST_PTR`, see [`ClMem::host_ptr`]): the host
    /// address of its first byte.
    pub(super) host: Option<NonNull<u8>>,
    /// Whether mapping the buffer gave its host address (checked when a segment over a host
    /// block is made; its sub-buffers inherit the answer).
    pub(super) in_place: OnceLock<bool>,
}

// SAFETY: the host address is memory of the buffer (the block OpenCL uses in place), owned by
// the segment's memory object and freed only when OpenCL destroys it; it is only handed out as
// a raw pointer, for the synced layer to use under its own rules. The handles are thread-safe.
unsafe impl Send for ClMem {}
// SAFETY: as for Send.
unsafe impl Sync for ClMem {}

impl ClMem {
    /// The OpenCL buffer, e.g. to pass as a kernel argument.
    pub(crate) fn buffer(&self) -> &Buffer<u8> {
        &self.buf.buf
    }

    /// For memory made over a host block (`CL_MEM_USE_HOST_PTR`): the host address of its first
    /// byte. The host may use it in place of the buffer only while the buffer is mapped (or, on
    /// a device whose memory is host memory, once the device work on it is done); whether the
    /// driver really uses the block in place is checked by mapping it once.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        self.host.map(NonNull::as_ptr)
    }

    /// Whether the driver uses the host block in place: mapping the buffer gave its host
    /// address (`None` for memory without a host block).
    pub(crate) fn in_place(&self) -> Option<bool> {
        self.in_place.get().copied()
    }
}

/// Frees the host block of a `CL_MEM_USE_HOST_PTR` segment when OpenCL destroys the memory
/// object, that is once every command that used it is done (`clSetMemObjectDestructorCallback`).
pub(super) extern "C" fn free_host_block(_mem: cl_mem, block: *mut c_void) {
    // SAFETY: `block` is the `Box<AlignedBlock>` leaked for this memory object by
    // `ClDevice::alloc_unified`, and OpenCL calls this exactly once, when the object goes.
    drop(unsafe { Box::from_raw(block.cast::<AlignedBlock>()) });
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
