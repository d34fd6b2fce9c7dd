//! Helpers for tests of code built on syncmem (and for syncmem's own tests).
//!
//! Device tests call [`device_or_skip`]: it returns the device, or prints why the test is
//! skipped and returns `None`. With the environment variable `SYNCMEM_REQUIRE_OPENCL=1`
//! (or `SYNCMEM_REQUIRE_CUDA=1`) a missing device is a test failure instead of a skip: CI sets
//! it so that a run where the OpenCL tests were skipped cannot pass.
//!
//! Tests that compile the CUDA kernels with NVRTC (no GPU needed, only `libnvrtc`) call
//! `nvrtc_or_skip` (feature `cuda`); `SYNCMEM_REQUIRE_NVRTC=1` makes a missing `libnvrtc` a
//! failure.

use crate::{BackendKind, Device};

/// The environment variable that turns a skipped OpenCL test into a failure.
pub const REQUIRE_OPENCL: &str = "SYNCMEM_REQUIRE_OPENCL";
/// The environment variable that turns a skipped CUDA test into a failure.
pub const REQUIRE_CUDA: &str = "SYNCMEM_REQUIRE_CUDA";
/// The environment variable that turns a skipped NVRTC compile test into a failure.
pub const REQUIRE_NVRTC: &str = "SYNCMEM_REQUIRE_NVRTC";

fn required(var: &str) -> bool {
    matches!(
        std::env::var(var).as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    )
}

/// Opens the first device of `backend` for the test named `test`, or reports a skip.
///
/// # Panics
/// When the device is missing and the matching `SYNCMEM_REQUIRE_*` variable is set.
pub fn device_or_skip(backend: BackendKind, test: &str) -> Option<Device> {
    let var = match backend {
        BackendKind::Cpu => return Some(Device::cpu()),
        BackendKind::OpenCl => REQUIRE_OPENCL,
        BackendKind::Cuda => REQUIRE_CUDA,
    };
    match Device::all(backend).map(|v| v.into_iter().next()) {
        Ok(Some(d)) => Some(d),
        other => {
            let why = match other {
                Ok(_) => format!("no {backend} device present"),
                Err(e) => e.to_string(),
            };
            if required(var) {
                panic!("{test}: {backend} device required ({var} is set) but unavailable: {why}");
            }
            eprintln!("SKIPPED {test}: {why} (set {var}=1 to make this a failure)");
            None
        }
    }
}

/// Every device of `backend` for the test named `test`: `[cpu]` for the cpu backend, every
/// OpenCL or CUDA device otherwise, or an empty list after reporting a skip.
///
/// # Panics
/// When no device is found and the matching `SYNCMEM_REQUIRE_*` variable is set.
pub fn all_or_skip(backend: BackendKind, test: &str) -> Vec<Device> {
    match device_or_skip(backend, test) {
        None => Vec::new(),
        Some(first) => Device::all(backend).unwrap_or_else(|_| vec![first]),
    }
}

/// Runs each `fn name(dev: &Device)` of the calling module as a test on every device: a module
/// `cpu` with one test per function on the `cpu` device, a module `opencl` running it on every
/// OpenCL device (feature `opencl`; reported as skipped where there is none, a failure with
/// `SYNCMEM_REQUIRE_OPENCL=1`), and a module `cuda` likewise for every CUDA device.
///
/// ```
/// fn round_trip(dev: &syncmem::Device) {
///     let mut buf = dev.alloc(4).unwrap();
///     dev.default_stream().unwrap().write(&mut buf, 0, &[1, 2, 3, 4]).unwrap();
/// }
/// syncmem::for_each_device!(round_trip);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! for_each_device {
    ($($name:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $name() { super::$name(&$crate::Device::cpu()); } )*
        }
        #[cfg(feature = "opencl")]
        mod opencl {
            $( #[test] fn $name() {
                let test = concat!("opencl::", stringify!($name));
                for d in $crate::testing::all_or_skip($crate::BackendKind::OpenCl, test) {
                    super::$name(&d);
                }
            } )*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $( #[test] fn $name() {
                let test = concat!("cuda::", stringify!($name));
                for d in $crate::testing::all_or_skip($crate::BackendKind::Cuda, test) {
                    super::$name(&d);
                }
            } )*
        }
    };
}

/// Two devices of `backend` for the test named `test` (the first two), or `None` after
/// reporting a skip. With PoCL, `POCL_DEVICES="pthread pthread"` gives two OpenCL devices.
///
/// # Panics
/// When there are fewer than two and the matching `SYNCMEM_REQUIRE_*` variable is set: a run
/// that requires OpenCL requires the second device too.
pub fn two_or_skip(backend: BackendKind, test: &str) -> Option<(Device, Device)> {
    let all = all_or_skip(backend, test);
    if let [a, b, ..] = &all[..] {
        return Some((a.clone(), b.clone()));
    }
    if all.is_empty() {
        // Reported (or failed) by `all_or_skip`.
        return None;
    }
    let var = match backend {
        BackendKind::Cpu => "",
        BackendKind::OpenCl => REQUIRE_OPENCL,
        BackendKind::Cuda => REQUIRE_CUDA,
    };
    let why = format!(
        "needs two {backend} devices, found only {} (with PoCL, POCL_DEVICES=\"pthread pthread\" \
         gives two)",
        all[0].label()
    );
    if !var.is_empty() && required(var) {
        panic!("{test}: {why}; {var} is set");
    }
    eprintln!("SKIPPED {test}: {why}");
    None
}

/// [`device_or_skip`] for OpenCL.
pub fn opencl_or_skip(test: &str) -> Option<Device> {
    device_or_skip(BackendKind::OpenCl, test)
}

/// [`device_or_skip`] for CUDA.
pub fn cuda_or_skip(test: &str) -> Option<Device> {
    device_or_skip(BackendKind::Cuda, test)
}

/// True when NVRTC (`libnvrtc`) can be loaded, so the CUDA kernel sources can be compiled to
/// PTX without a GPU; otherwise prints why the test named `test` is skipped and returns false.
///
/// # Panics
/// When `libnvrtc` is missing and `SYNCMEM_REQUIRE_NVRTC` is set.
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub fn nvrtc_or_skip(test: &str) -> bool {
    // SAFETY: `is_culib_present` only tries to open the shared library with `libloading` (and
    // closes it again); it calls no NVRTC function and has no preconditions.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return true;
    }
    if required(REQUIRE_NVRTC) {
        panic!("{test}: libnvrtc required ({REQUIRE_NVRTC} is set) but it could not be loaded");
    }
    eprintln!("SKIPPED {test}: libnvrtc not found (set {REQUIRE_NVRTC}=1 to make this a failure)");
    false
}

/// Checks the transfers a buffer (or a run) made, as `dev` counts them: `host_to_device` and
/// `device_to_host` syncs, each a copy in its direction where the buffers of `dev` keep two
/// mirrors, or a zero-copy sync ([`crate::CopyStats::mapped`], and no copy at all) where they
/// share memory ([`Device::zero_copy_protocol`]). `what` names the check in the message.
///
/// # Panics
/// When the figures differ (this is a test helper).
pub fn assert_syncs(
    dev: &Device,
    stats: &crate::CopyStats,
    host_to_device: u64,
    device_to_host: u64,
    what: &str,
) {
    let got = (
        stats.host_to_device.count,
        stats.device_to_host.count,
        stats.mapped.count,
    );
    let want = if dev.zero_copy_protocol().is_some() {
        (0, 0, host_to_device + device_to_host)
    } else {
        (host_to_device, device_to_host, 0)
    };
    assert_eq!(
        got,
        want,
        "{what} on {} (zero-copy {}): (host-to-device copies, device-to-host copies, zero-copy \
         syncs)",
        dev.label(),
        dev.zero_copy()
    );
}
