//! CUDA driver statuses as typed errors, and the quiet context handling of `Drop` paths.

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{BackendKind, Error};

/// The `reason` of [`Error::RuntimeUnavailable`] when `libcuda` cannot be loaded.
pub(crate) const NO_DRIVER: &str = "CUDA driver library (libcuda) not found";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Readable text for a driver status: `CUDA_ERROR_X: description` when the driver can say.
pub(super) fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .ok()
        .map(|s| s.to_string_lossy().into_owned());
    let text = e
        .error_string()
        .ok()
        .map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(s), None) | (None, Some(s)) => s,
        (None, None) => format!("{:?}", e.0),
    }
}

/// Maps a failed driver call `op` (the CUDA API name) on device `label` to [`Error::Backend`].
pub(crate) fn driver_error(label: &str, op: &'static str, e: DriverError) -> Error {
    Error::Backend {
        backend: BackendKind::Cuda,
        device: label.to_string(),
        op,
        code: e.0 as i64,
        message: describe(e),
    }
}

/// The text of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Makes `ctx` current on the calling thread for a `Drop` path, returning whether it worked.
///
/// cudarc's `bind_to_thread` first returns (and clears) any error stored by an earlier `Drop`,
/// *without* binding; a free that relied on it could then skip the synchronize that keeps
/// queued work from using freed memory. This clears the stored error (frees may fail silently,
/// by the backend contract) and calls `cuCtxSetCurrent` directly.
pub(super) fn force_current(ctx: &CudaContext) -> bool {
    let _ = ctx.check_err();
    // SAFETY: `ctx` is borrowed, so alive, and its CUcontext is a primary context it retains.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }.is_ok()
}

/// Blocks until all work queued on `stream` is done, for `Drop` paths (errors ignored).
pub(super) fn drain_stream(stream: &CudaStream) {
    if force_current(stream.context()) {
        // SAFETY: `stream` is borrowed, so its CUstream is alive, and belongs to the context
        // made current just above.
        let _ = unsafe { result::stream::synchronize(stream.cu_stream()) };
    }
}
