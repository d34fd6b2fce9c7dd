//! One CUDA device: allocation of device and pinned memory, and new streams.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::result::{self};
use cudarc::driver::sys::{self};
use cudarc::driver::CudaContext;
use parking_lot::Mutex;

use crate::backend::{BackendDevice, DeviceInfo, KeepAlive};
use crate::error::{BackendKind, Error, Result};

use super::{memory::*, shared::*, stream::*};

/// One CUDA device: its primary context, facts, and peer-access table.
pub(crate) struct CuDevice {
    pub(super) info: DeviceInfo,
    pub(super) shared: Arc<CuShared>,
}

impl CuDevice {
    /// `cuda:N`.
    pub(crate) fn label(&self) -> &str {
        &self.shared.label
    }

    /// The device's primary context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// The kernels loaded into the context.
    pub(crate) fn kernel_cache(&self) -> &crate::backend::cuda::KernelCache {
        &self.shared.kernels
    }

    /// A second backend device for the same CUDA device (same context), with its own counters
    /// and pools once wrapped in a `Device` (see `Device::isolated`).
    pub(crate) fn duplicate(&self) -> CuDevice {
        CuDevice {
            info: self.info.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl CuDevice {
    /// Device memory the host can use directly, for integrated devices: mapped pinned host
    /// memory (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`), used by kernels through its device
    /// mapping (`cuMemHostGetDevicePointer`). Not zero-filled.
    pub(crate) fn alloc_unified(&self, bytes: usize) -> Result<CuMem> {
        let sh = &self.shared;
        if sh.ctx.is_event_tracking() {
            // As in `alloc`: `upgrade_device_ptr` would create events with `unwrap`.
            return Err(Error::Unsupported {
                device: sh.label.clone(),
                what: "allocating while cudarc event tracking is enabled on the context"
                    .to_string(),
            });
        }
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let host = host_alloc(sh, bytes, flags, "mapped host memory", true)?;
        let raw = host.as_ptr().cast::<std::ffi::c_void>();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `raw` is a live DEVICEMAP allocation; `ptr` receives its device address.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, raw, 0) };
        if status != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: `raw` came from cuMemHostAlloc above and nothing else knows it.
            let _ = unsafe { result::free_host(raw) };
            return Err(sh.alloc_err(
                "cuMemHostGetDevicePointer",
                "mapped host memory",
                false,
                bytes,
                cudarc::driver::DriverError(status),
            ));
        }
        // SAFETY: `ptr` is the device mapping of `bytes` live bytes. Event tracking is disabled
        // (checked above). The slice is never dropped as such: `CuMem::drop` takes it back with
        // `leak` and frees the host allocation with cuMemFreeHost.
        let slice = unsafe { sh.home.upgrade_device_ptr::<u8>(ptr, bytes) };
        Ok(CuMem {
            slice: ManuallyDrop::new(slice),
            ptr,
            len: bytes,
            shared: sh.clone(),
            foreign: Mutex::new(Vec::new()),
            parent: None,
            host: Some(host),
        })
    }
}

impl BackendDevice for CuDevice {
    type Mem = CuMem;
    type Pinned = CuPinned;
    type Stream = CuStream;
    type Event = CuEvent;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<CuMem> {
        let sh = &self.shared;
        if sh.ctx.is_event_tracking() {
            // Only possible if a user re-enabled tracking through `as_cuda().context()`:
            // cudarc would then create events with `unwrap` in `upgrade_device_ptr`.
            return Err(Error::Unsupported {
                device: sh.label.clone(),
                what: "allocating while cudarc event tracking is enabled on the context \
                       (syncmem disables it; do not re-enable it)"
                    .to_string(),
            });
        }
        sh.bind()?;
        // SAFETY: the context is current; the memory is left uninitialised, which the contract
        // allows ("no zero fill"); it is only ever accessed by the device or copied as bytes.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| sh.alloc_err("cuMemAlloc", "device memory", true, bytes, e))?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation of `bytes` bytes (u8: any length is
        // valid). Event tracking is disabled (checked above), so cudarc creates no events and
        // reaches no `unwrap`. The slice is never dropped as such: `CuMem::drop` takes it back
        // with `leak` and frees `ptr` with cuMemFree, the API that made it.
        let slice = unsafe { sh.home.upgrade_device_ptr::<u8>(ptr, bytes) };
        Ok(CuMem {
            slice: ManuallyDrop::new(slice),
            ptr,
            len: bytes,
            shared: sh.clone(),
            foreign: Mutex::new(Vec::new()),
            parent: None,
            host: None,
        })
    }

    fn sub_align(&self) -> usize {
        // cuMemAlloc returns 256-byte aligned memory; pool blocks keep that alignment.
        256
    }

    fn sub_mem(&self, parent: &CuMem, off: usize, len: usize, keep: KeepAlive) -> Result<CuMem> {
        let sh = &self.shared;
        if sh.ctx.is_event_tracking() {
            // As in `alloc`: `upgrade_device_ptr` would create events with `unwrap`.
            return Err(Error::Unsupported {
                device: sh.label.clone(),
                what: "pooled allocation while cudarc event tracking is enabled on the context"
                    .to_string(),
            });
        }
        let ptr = parent.at(off);
        // SAFETY: `ptr .. ptr + len` lies inside the parent's live cuMemAlloc allocation
        // (caller's contract: `off + len <= parent.len`), which `keep` keeps alive as long as
        // this view. Event tracking is disabled (checked above), so cudarc creates no events.
        // The slice is never dropped as such: `CuMem::drop` takes it back with `leak` and, for
        // a view, frees nothing.
        let slice = unsafe { sh.home.upgrade_device_ptr::<u8>(ptr, len) };
        Ok(CuMem {
            slice: ManuallyDrop::new(slice),
            ptr,
            len,
            shared: sh.clone(),
            foreign: Mutex::new(Vec::new()),
            parent: Some(keep),
            // SAFETY: `off < parent.len`: the address stays inside the parent's host mapping.
            host: parent
                .host
                .map(|h| unsafe { NonNull::new_unchecked(h.as_ptr().add(off)) }),
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<CuPinned> {
        let sh = &self.shared;
        // PORTABLE: the memory counts as pinned for every context, since pinned buffers may be
        // used with streams of any device.
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        let ptr = host_alloc(sh, bytes, flags, "pinned host memory", false)?;
        // SAFETY: cuMemHostAlloc returned `bytes` writable host bytes at `ptr`; nothing else
        // knows the pointer yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
        Ok(CuPinned {
            ptr,
            len: bytes,
            shared: sh.clone(),
        })
    }

    fn new_stream(&self) -> Result<CuStream> {
        let sh = &self.shared;
        let stream = sh
            .ctx
            .new_stream()
            .map_err(|e| sh.err("cuStreamCreate", e))?;
        Ok(CuStream {
            stream: Quiet::new(stream, &sh.ctx),
            shared: sh.clone(),
            timeline: Default::default(),
        })
    }
}

/// `cuMemHostAlloc` of `bytes` with `flags` (`what` names the memory in errors; the device's
/// free memory is reported for `device_memory`). Binds the context first; the memory is left
/// uninitialised. A null pointer from the driver is an error.
fn host_alloc(
    sh: &CuShared,
    bytes: usize,
    flags: u32,
    what: &str,
    device_memory: bool,
) -> Result<NonNull<u8>> {
    sh.bind()?;
    // SAFETY: the context is current (bound above).
    let raw = unsafe { result::malloc_host(bytes, flags) }
        .map_err(|e| sh.alloc_err("cuMemHostAlloc", what, device_memory, bytes, e))?;
    NonNull::new(raw.cast::<u8>()).ok_or_else(|| Error::Backend {
        backend: BackendKind::Cuda,
        device: sh.label.clone(),
        op: "cuMemHostAlloc",
        code: 0,
        message: "the driver returned a null pointer".to_string(),
    })
}
