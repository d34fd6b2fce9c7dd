//! Discovery: every device of every OpenCL platform, one context per platform.

use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::{Arc, OnceLock};

use opencl3::context::Context;
use opencl3::device::{Device as ClDeviceId, CL_DEVICE_TYPE_ALL};
use opencl3::error_codes::ClError;
use opencl3::platform::{get_platforms, Platform};

use super::error::{backend_error, unavailable};
use super::handle::ClContext;
use super::ClDevice;
use crate::backend::DeviceInfo;
use crate::error::{BackendKind, Error, Result};

/// Lists every device of every OpenCL platform, with one context per platform.
///
/// A platform whose devices cannot be listed, or whose context cannot be created, is skipped;
/// if every platform fails that way the first failure is returned.
///
/// # Errors
/// [`Error::RuntimeUnavailable`] when libOpenCL cannot be loaded or has no platform driver.
pub(crate) fn discover() -> Result<Vec<ClDevice>> {
    let platforms = get_platforms().map_err(|ClError(c)| unavailable(c))?;
    let mut out = Vec::new();
    let mut first_failure = None;
    for platform in platforms {
        match platform_devices(platform, out.len()) {
            Ok(mut list) => out.append(&mut list),
            Err(e) => {
                first_failure.get_or_insert(e);
            }
        }
    }
    match first_failure {
        Some(e) if out.is_empty() => Err(Error::RuntimeUnavailable {
            backend: BackendKind::OpenCl,
            reason: e.to_string(),
        }),
        _ => Ok(out),
    }
}

/// The devices of one platform, numbered from `first_ordinal`.
fn platform_devices(platform: Platform, first_ordinal: usize) -> Result<Vec<ClDevice>> {
    let ids = platform
        .get_devices(CL_DEVICE_TYPE_ALL)
        .map_err(|ClError(c)| backend_error("opencl", "clGetDeviceIDs", c))?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let ctx = Context::from_devices(&ids, &[], None, ptr::null_mut())
        .map_err(|ClError(c)| backend_error("opencl", "clCreateContext", c))?;
    let ctx = Arc::new(ClContext {
        ctx: ManuallyDrop::new(ctx),
    });
    let platform_vendor = match (platform.name(), platform.version()) {
        (Ok(n), Ok(v)) => Some(format!("{n} ({v})")),
        (Ok(n), Err(_)) => Some(n),
        _ => None,
    };
    Ok(ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let device = ClDeviceId::new(id);
            let global = device.global_mem_size().unwrap_or(0);
            let cpu = device
                .dev_type()
                .is_ok_and(|t| t & opencl3::device::CL_DEVICE_TYPE_CPU != 0);
            let info = DeviceInfo {
                backend: BackendKind::OpenCl,
                ordinal: first_ordinal + i,
                name: device
                    .name()
                    .ok()
                    .filter(|n| !n.trim().is_empty())
                    .unwrap_or_else(|| "OpenCL device".to_string()),
                vendor: platform_vendor
                    .clone()
                    .or_else(|| device.vendor().ok())
                    .unwrap_or_default(),
                total_memory: global,
                // The spec guarantees at least a quarter of the global memory.
                max_alloc: device.max_mem_alloc_size().unwrap_or(global / 4),
                host_unified: device.host_unified_memory().unwrap_or(false),
                // A CPU device's memory is the host's own: the host may use a buffer over a
                // host block in place once the device work on it is done, without mapping it.
                host_coherent: device.host_unified_memory().unwrap_or(false) && cpu,
            };
            // CL_DEVICE_MEM_BASE_ADDR_ALIGN is in bits (1024 on PoCL: 128 bytes).
            let base_align = device
                .mem_base_addr_align()
                .map_or(128, |bits| (bits as usize / 8).max(1))
                .next_power_of_two();
            ClDevice {
                label: info.label().into(),
                event_label: super::handle::interned(&info.label()),
                info,
                device,
                ctx: ctx.clone(),
                map_queue: OnceLock::new(),
                base_align,
                cpu,
                compute_units: device
                    .max_compute_units()
                    .map_or(1, |u| (u as usize).max(1)),
                kernels: Default::default(),
            }
        })
        .collect())
}
