//! Process-wide device discovery: once per backend, behind a lock.

use std::sync::OnceLock;

use super::{Device, DeviceInfo};
use crate::alloc::pool::config::check_env;
use crate::backend::cpu::CpuDevice;
use crate::backend::dispatch::RawDevice;
use crate::error::{BackendKind, Error, Result};

/// Discovery outcome kept for the life of the process. Errors are kept as their parts so that
/// every caller gets its own typed error.
type Found = std::result::Result<Vec<Device>, (BackendKind, String, bool)>;

static CPU: OnceLock<Device> = OnceLock::new();
#[cfg(feature = "opencl")]
static OPENCL: OnceLock<Found> = OnceLock::new();
#[cfg(feature = "cuda")]
static CUDA: OnceLock<Found> = OnceLock::new();

pub(crate) fn cpu() -> Device {
    let dev: &'static Device =
        CPU.get_or_init(|| Device::from_raw(RawDevice::Cpu(CpuDevice::new())));
    kept_for_the_process(dev);
    dev.clone()
}

/// Notes that the process keeps `dev` (in a static) for its whole life, before any handle of
/// it is handed out: its buffers then take no reference count of it (see
/// [`super::handle::DeviceHandle::Process`]).
fn kept_for_the_process(dev: &'static Device) {
    // Set already by an earlier call (or another thread's): to the same handle.
    let _ = dev.shared.process.set(dev);
}

#[allow(dead_code)]
fn unpack(found: &'static Found) -> Result<Vec<Device>> {
    match found {
        Ok(v) => {
            v.iter().for_each(kept_for_the_process);
            Ok(v.clone())
        }
        Err((backend, reason, _)) => Err(Error::RuntimeUnavailable {
            backend: *backend,
            reason: reason.clone(),
        }),
    }
}

#[allow(dead_code)]
fn discover_with<D>(
    backend: BackendKind,
    f: impl FnOnce() -> Result<Vec<D>>,
    wrap: impl Fn(D) -> RawDevice,
) -> Found {
    match f() {
        Ok(list) => Ok(list
            .into_iter()
            .map(|d| Device::from_raw(wrap(d)))
            .collect()),
        Err(Error::RuntimeUnavailable { reason, .. }) => Err((backend, reason, true)),
        Err(e) => Err((backend, e.to_string(), false)),
    }
}

/// All devices of `backend`, discovering them on first call. Every pool variable of the
/// process is checked first (see [`check_env`]), for every backend compiled in.
pub(crate) fn devices(backend: BackendKind) -> Result<Vec<Device>> {
    let compiled = match backend {
        BackendKind::Cpu => true,
        BackendKind::OpenCl => cfg!(feature = "opencl"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
    };
    if compiled {
        check_env()?;
        super::zero_copy::check_env()?;
    }
    match backend {
        BackendKind::Cpu => Ok(vec![cpu()]),
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => unpack(OPENCL.get_or_init(|| {
            discover_with(backend, crate::backend::opencl::discover, RawDevice::OpenCl)
        })),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => unpack(CUDA.get_or_init(|| {
            discover_with(backend, crate::backend::cuda::discover, RawDevice::Cuda)
        })),
        #[allow(unreachable_patterns)]
        b => Err(Error::BackendNotCompiled { backend: b }),
    }
}

/// What one backend offers on this machine: see [`probe`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackendReport {
    /// The backend.
    pub backend: BackendKind,
    /// False when the cargo feature is off.
    pub compiled: bool,
    /// The devices found, or why none could be listed.
    pub devices: std::result::Result<Vec<DeviceInfo>, String>,
}

/// Lists every backend with its devices (or the reason it has none). Never fails.
pub fn probe() -> Vec<BackendReport> {
    [BackendKind::Cpu, BackendKind::OpenCl, BackendKind::Cuda]
        .into_iter()
        .map(|backend| {
            let r = devices(backend);
            BackendReport {
                backend,
                compiled: !matches!(r, Err(Error::BackendNotCompiled { .. })),
                devices: r
                    .map(|v| v.iter().map(|d| d.info().clone()).collect())
                    .map_err(|e| e.to_string()),
            }
        })
        .collect()
}

/// Every device discovered so far, without triggering discovery.
pub(crate) fn discovered() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut v: Vec<Device> = CPU.get().cloned().into_iter().collect();
    #[cfg(feature = "opencl")]
    if let Some(Ok(list)) = OPENCL.get() {
        v.extend(list.iter().cloned());
    }
    #[cfg(feature = "cuda")]
    if let Some(Ok(list)) = CUDA.get() {
        v.extend(list.iter().cloned());
    }
    v
}
