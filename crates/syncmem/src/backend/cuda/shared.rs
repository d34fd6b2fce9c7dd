//! What every object of one CUDA device shares, and the quiet-drop wrapper of cudarc objects.

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, OomReport, Result};

use super::error::*;

/// A cudarc object whose `Drop` may record a driver error in its context (cudarc stores errors
/// of `Drop` in the context and returns them from the *next* call that checks). Frees are
/// allowed to fail silently by the backend contract, so this wrapper drops the object and then
/// clears the stored error, instead of letting it surface from an unrelated later operation.
pub(super) struct Quiet<T> {
    pub(super) inner: ManuallyDrop<T>,
    pub(super) ctx: Arc<CudaContext>,
}

impl<T> Quiet<T> {
    pub(super) fn new(inner: T, ctx: &Arc<CudaContext>) -> Self {
        Self {
            inner: ManuallyDrop::new(inner),
            ctx: ctx.clone(),
        }
    }
}

impl<T> Deref for Quiet<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Drop for Quiet<T> {
    fn drop(&mut self) {
        // SAFETY: `inner` is dropped exactly once, here, and never touched afterwards.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        let _ = self.ctx.check_err();
    }
}

/// What every object of one device shares: the context, the label for errors, the peer table.
pub(super) struct CuShared {
    /// The device's primary context, retained for the life of the process.
    pub(super) ctx: Arc<CudaContext>,
    /// Device ordinal (`cuda:N`).
    pub(super) ordinal: usize,
    /// `cuda:N`.
    pub(super) label: String,
    /// The legacy default stream of the context (a non-owning handle): the "home" stream of
    /// every [`CudaSlice`] this backend makes. No work of this backend is queued on it.
    pub(super) home: Arc<CudaStream>,
    /// Ordinals of the devices whose memory this device's context can access directly
    /// (peer access enabled, or found already enabled, at discovery).
    pub(super) peers: Vec<usize>,
    /// Peers where checking (`cuDeviceCanAccessPeer`) or enabling peer access failed, with why.
    pub(super) peer_failures: Vec<(usize, String)>,
    /// The kernels loaded into the context, built on first use.
    pub(super) kernels: crate::backend::cuda::KernelCache,
}

impl CuShared {
    pub(super) fn err(&self, op: &'static str, e: DriverError) -> Error {
        driver_error(&self.label, op, e)
    }

    /// Makes this device's context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("cuCtxSetCurrent", e))
    }

    /// Maps an allocation failure: `CUDA_ERROR_OUT_OF_MEMORY` becomes [`Error::OutOfMemory`]
    /// (with the device's free memory when `what` is device memory).
    pub(super) fn alloc_err(
        &self,
        op: &'static str,
        what: &str,
        device_memory: bool,
        requested: usize,
        e: DriverError,
    ) -> Error {
        if e.0 != CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return self.err(op, e);
        }
        let free = match self.ctx.mem_get_info() {
            Ok((free, total)) if device_memory => format!(", {free} of {total} bytes free"),
            _ => String::new(),
        };
        OomReport::new(self.label.clone(), requested, format!("{op}{free}"))
            .with_purpose(what.to_string())
            .into()
    }

    /// How this device's context reaches the memory of device `other`, for error messages.
    pub(super) fn peer_status(&self, other: usize) -> String {
        if other == self.ordinal || self.peers.contains(&other) {
            format!("peer access {} -> cuda:{other} enabled", self.label)
        } else if let Some((_, why)) = self.peer_failures.iter().find(|(o, _)| *o == other) {
            format!(
                "enabling peer access {} -> cuda:{other} failed: {why}",
                self.label
            )
        } else {
            format!("no peer access {} -> cuda:{other}", self.label)
        }
    }
}
