//! Device memory (`cuMemAlloc`) and page-locked host memory (`cuMemHostAlloc`).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result::{self};
use cudarc::driver::sys::{self};
use cudarc::driver::{CudaSlice, CudaStream};
use parking_lot::Mutex;

use crate::backend::{BackendMem, BackendPinned, KeepAlive};

use super::{error::*, shared::*};

/// Device memory (`cuMemAlloc`), also exposed to kernels as a cudarc [`CudaSlice<u8>`].
pub(crate) struct CuMem {
    /// Taken back (`leak`) and freed with cuMemFree in `Drop`, never dropped as a slice.
    pub(super) slice: ManuallyDrop<CudaSlice<u8>>,
    /// The device address of the first byte (the same as the slice's).
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) len: usize,
    pub(super) shared: Arc<CuShared>,
    /// Streams of *other* devices that copied from or into this memory (peer copies): they are
    /// synchronized before the memory is freed, as this context's synchronize does not cover
    /// them.
    pub(super) foreign: Mutex<Vec<Arc<CudaStream>>>,
    /// For a view into a pool segment: the segment (kept alive; this value frees nothing).
    pub(super) parent: Option<KeepAlive>,
    /// For mapped pinned host memory (`cuMemHostAlloc` with `DEVICEMAP`, see
    /// `CuDevice::alloc_unified`) and views of it: the host address of the first byte. Such a
    /// segment is freed with cuMemFreeHost.
    pub(super) host: Option<NonNull<u8>>,
}

// SAFETY: the host address is memory of this allocation (mapped pinned memory), freed only by
// the segment's Drop; it is only handed out as a raw pointer, for the synced layer to use under
// its own rules. The cudarc handles are thread-safe.
unsafe impl Send for CuMem {}
// SAFETY: as for Send.
unsafe impl Sync for CuMem {}

impl CuMem {
    /// The memory as a cudarc slice, to pass to kernels.
    ///
    /// cudarc's event tracking is disabled for it: order kernel launches against syncmem's
    /// copies with [`Event`](crate::Event)s / stream synchronization, not with cudarc's implicit
    /// tracking. Its [`CudaSlice::stream`] is the context's legacy default stream.
    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    /// The device address of the first byte, to pass to kernels.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// For mapped pinned host memory: the host address of the first byte (the host may use it
    /// directly once the stream work on it is done).
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        self.host.map(NonNull::as_ptr)
    }

    /// The device address of byte `off`.
    pub(super) fn at(&self, off: usize) -> sys::CUdeviceptr {
        self.ptr + off as sys::CUdeviceptr
    }

    /// Waits for the streams of other devices that queued work on this memory, and forgets them.
    pub(crate) fn drain_foreign(&mut self) {
        for stream in self.foreign.get_mut().drain(..) {
            drain_stream(&stream);
            let other = stream.context().clone();
            drop(stream);
            let _ = other.check_err();
        }
    }

    /// Remembers that `stream` (of another device) has queued work on this memory.
    pub(super) fn note_foreign(&self, stream: &Arc<CudaStream>) {
        if stream.context().ordinal() == self.shared.ordinal {
            return;
        }
        let mut users = self.foreign.lock();
        if !users.iter().any(|s| Arc::ptr_eq(s, stream)) {
            users.push(stream.clone());
        }
    }
}

impl BackendMem for CuMem {
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CuMem {
    fn drop(&mut self) {
        if self.parent.is_some() {
            // A view: its memory goes back to the pool, which orders reuse on the allocation
            // stream with events. Peer streams are not covered by those events: drain them.
            self.drain_foreign();
            // SAFETY: `slice` is taken exactly once, here, and never used again.
            let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
            // `leak` hands back the pointer without freeing it (the segment owns the memory).
            let _ = slice.leak();
            let _ = self.shared.ctx.check_err();
            return;
        }
        let ctx = &self.shared.ctx;
        // Work queued on any stream of this context may still use the memory: wait for it
        // (cudaFree does the same in Caffe2). Errors are ignored: the contract says frees never
        // fail, and the runtime may be shutting down.
        if force_current(ctx) {
            let _ = result::ctx::synchronize();
        }
        for stream in self.foreign.get_mut().drain(..) {
            drain_stream(&stream);
            let other = stream.context().clone();
            drop(stream);
            let _ = other.check_err();
        }
        force_current(ctx);
        // SAFETY: `slice` is taken exactly once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // `leak` hands back the pointer without freeing it; with event tracking disabled it
        // has no events to wait on.
        let ptr = slice.leak();
        match self.host {
            Some(host) => {
                // SAFETY: `host` came from cuMemHostAlloc in `CuDevice::alloc_unified` (the
                // device address is its mapping), is freed only here, and no queued work can
                // still use it (every stream that could was synchronized above).
                let _ = unsafe { result::free_host(host.as_ptr().cast::<c_void>()) };
            }
            None => {
                // SAFETY: `ptr` came from cuMemAlloc in `CuDevice::alloc`, is freed only here,
                // and no queued work can still use it (every stream that could was synchronized
                // above).
                let _ = unsafe { result::free_sync(ptr) };
            }
        }
        let _ = ctx.check_err();
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable), zero-filled.
pub(crate) struct CuPinned {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    pub(super) shared: Arc<CuShared>,
}

// SAFETY: `CuPinned` owns its allocation exclusively, like a `Box<[u8]>`: it hands out only the
// raw pointer, and the public `PinnedBuffer` forms slices from it under `&self` / `&mut self`.
// cuMemFreeHost may be called from any thread.
unsafe impl Send for CuPinned {}
// SAFETY: as above; `&CuPinned` allows no mutation by itself.
unsafe impl Sync for CuPinned {}

impl BackendPinned for CuPinned {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CuPinned {
    fn drop(&mut self) {
        force_current(&self.shared.ctx);
        // SAFETY: the pointer came from cuMemHostAlloc and is freed once. Copies that use it
        // asynchronously must have completed by now (the caller's contract on async copies).
        let _ = unsafe { result::free_host(self.ptr.as_ptr().cast::<c_void>()) };
        let _ = self.shared.ctx.check_err();
    }
}
