//! Discovery: every CUDA device, its primary context, and peer access between them.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;

use crate::backend::DeviceInfo;
use crate::error::{BackendKind, Error, Result};

use super::{device::*, error::*, shared::*};

/// Finds every CUDA device, retains its primary context and enables peer access between every
/// pair of devices that can use it. Runs once per process (the registry keeps the result).
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when `libcuda` cannot be loaded, `cuInit` fails, or the driver
/// panics inside cudarc (a missing symbol in an old driver); [`Error::Backend`] when a device
/// cannot be set up. A machine with the driver but no device gives an empty list.
pub(crate) fn discover() -> Result<Vec<CuDevice>> {
    // SAFETY: `is_culib_present` only tries to open the shared library with `libloading` (and
    // closes it again); it calls no CUDA function and has no preconditions.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: NO_DRIVER.to_string(),
        });
    }
    match catch_unwind(AssertUnwindSafe(discover_devices)) {
        Ok(found) => found,
        Err(payload) => Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: format!(
                "the CUDA driver could not be used (cudarc panicked: {})",
                panic_text(payload.as_ref())
            ),
        }),
    }
}

/// One device while discovery is still setting up the others.
pub(super) struct Found {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) info: DeviceInfo,
}

pub(super) fn discover_devices() -> Result<Vec<CuDevice>> {
    match result::init() {
        Ok(()) => {}
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                reason: format!("cuInit failed: {}", describe(e)),
            })
        }
    }
    let count =
        result::device::get_count().map_err(|e| driver_error("cuda", "cuDeviceGetCount", e))?;
    let count = usize::try_from(count).unwrap_or(0);

    let mut found = Vec::with_capacity(count);
    for ordinal in 0..count {
        let label = format!("cuda:{ordinal}");
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver_error(&label, "cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: no CudaSlice has been made on this context yet, so none is left tracked by
        // events while others are not. From here on, ordering between streams is explicit
        // (the backend contract: events recorded and waited for by the caller), and freeing
        // memory synchronizes every stream that may still use it (see `CuMem`'s Drop).
        unsafe { ctx.disable_event_tracking() };
        let name = ctx
            .name()
            .map_err(|e| driver_error(&label, "cuDeviceGetName", e))?;
        let total = ctx
            .total_mem()
            .map_err(|e| driver_error(&label, "cuDeviceTotalMem", e))? as u64;
        let integrated = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .map(|v| v != 0)
            .unwrap_or(false);
        found.push(Found {
            ctx,
            info: DeviceInfo {
                backend: BackendKind::Cuda,
                ordinal,
                name,
                vendor: "NVIDIA".to_string(),
                total_memory: total,
                max_alloc: total,
                host_unified: integrated,
                // Mapped pinned memory (`cuMemHostAlloc` with `DEVICEMAP`) needs no map call:
                // the host uses it directly once the stream's work on it is done.
                host_coherent: integrated,
            },
        });
    }

    let peers = enable_peer_access(&found);

    Ok(found
        .into_iter()
        .zip(peers)
        .map(|(f, (peers, peer_failures))| {
            let home = f.ctx.default_stream();
            CuDevice {
                shared: Arc::new(CuShared {
                    label: f.info.label(),
                    ordinal: f.info.ordinal,
                    ctx: f.ctx,
                    home,
                    peers,
                    peer_failures,
                    kernels: Default::default(),
                }),
                info: f.info,
            }
        })
        .collect())
}

/// For one device: the ordinals it has peer access to, and the peers where enabling failed (why).
type PeerTable = (Vec<usize>, Vec<(usize, String)>);

/// Enables peer access from every device to every other device that it can access, tolerating
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (primary contexts are shared with other libraries
/// of the process). Never fails: for each device, returns the peers enabled and the failures.
pub(super) fn enable_peer_access(found: &[Found]) -> Vec<PeerTable> {
    found
        .iter()
        .map(|me| {
            let mut peers = Vec::new();
            let mut failures = Vec::new();
            for other in found {
                let o = other.info.ordinal;
                if o == me.info.ordinal {
                    continue;
                }
                let mut can: c_int = 0;
                // SAFETY: `can` is a valid out-pointer; both devices come from cuDeviceGet
                // (through CudaContext::new) and stay valid for the process.
                let r = unsafe {
                    sys::cuDeviceCanAccessPeer(&mut can, me.ctx.cu_device(), other.ctx.cu_device())
                }
                .result();
                match r {
                    Ok(()) if can != 0 => {}
                    Ok(()) => continue,
                    Err(e) => {
                        failures.push((o, format!("cuDeviceCanAccessPeer: {}", describe(e))));
                        continue;
                    }
                }
                // cuCtxEnablePeerAccess acts on the *current* context: make `me` current.
                if let Err(e) = me.ctx.bind_to_thread() {
                    failures.push((o, format!("cuCtxSetCurrent: {}", describe(e))));
                    continue;
                }
                // SAFETY: `me`'s context is current on this thread; the peer context is a live
                // primary context retained by `other.ctx`; flags must be 0.
                let r = unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) }.result();
                match r {
                    Ok(()) | Err(DriverError(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => {
                        peers.push(o)
                    }
                    Err(e) => failures.push((o, format!("cuCtxEnablePeerAccess: {}", describe(e)))),
                }
            }
            (peers, failures)
        })
        .collect()
}
