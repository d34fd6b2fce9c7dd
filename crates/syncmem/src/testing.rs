//! Helpers for tests of code built on syncmem (and for syncmem's own tests).
//!
//! Device tests call [`device_or_skip`]: it returns the device, or prints why the test is
//! skipped and returns `None`. With the environment variable `SYNCMEM_REQUIRE_OPENCL=1`
//! (or `SYNCMEM_REQUIRE_CUDA=1`) a missing device is a test failure instead of a skip: CI sets
//! it so that a run where the OpenCL tests were skipped cannot pass.

use crate::{BackendKind, Device};

/// The environment variable that turns a skipped OpenCL test into a failure.
pub const REQUIRE_OPENCL: &str = "SYNCMEM_REQUIRE_OPENCL";
/// The environment variable that turns a skipped CUDA test into a failure.
pub const REQUIRE_CUDA: &str = "SYNCMEM_REQUIRE_CUDA";

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

/// [`device_or_skip`] for OpenCL.
pub fn opencl_or_skip(test: &str) -> Option<Device> {
    device_or_skip(BackendKind::OpenCl, test)
}

/// [`device_or_skip`] for CUDA.
pub fn cuda_or_skip(test: &str) -> Option<Device> {
    device_or_skip(BackendKind::Cuda, test)
}
