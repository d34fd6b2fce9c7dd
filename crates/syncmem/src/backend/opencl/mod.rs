//! The `opencl` backend, through `opencl3` (libOpenCL is loaded at run time).
//!
//! - Discovery ([`discover`]) lists every device of every platform; the ordinal is the index in
//!   that order. One OpenCL context per platform holds all of the platform's devices, so buffers
//!   of two devices of one platform can be copied into each other with `clEnqueueCopyBuffer`.
//! - Device memory is a `CL_MEM_READ_WRITE` buffer. Pinned memory is a `CL_MEM_ALLOC_HOST_PTR`
//!   buffer mapped for its whole life on an internal queue of the device.
//! - A stream is an in-order command queue without profiling; an event is a marker.
//! - Kernels: OpenCL C sources ([`source`], [`math_source`]), programs built once per device
//!   ([`program`]), one launch helper ([`launch`]) and the [`crate::backend::BackendKernels`]
//!   implementation. CPU devices build them with `-D SM_CONTIGUOUS`: element-wise kernels give
//!   each work-item a contiguous run of elements, and the register-blocked GEMMs are used.
//!
//! The `opencl3` wrappers call `expect` when a release fails in their `Drop`. This module keeps
//! them in [`ManuallyDrop`] and releases the handles itself, ignoring errors, so that no `Drop`
//! here can panic (the runtime may already be shutting down).
//!
//! [`ManuallyDrop`]: std::mem::ManuallyDrop

pub(crate) mod capture;
mod device;
mod discovery;
mod error;
mod grid;
mod handle;
mod kernels;
mod launch;
mod math_source;
mod memory;
mod program;
mod source;
mod stream;
mod user;

pub(crate) use device::ClDevice;
pub(crate) use discovery::discover;
pub(crate) use error::backend_error;
pub(crate) use memory::{ClMem, ClPinned};
pub(crate) use program::KernelCache;
pub(crate) use stream::{ClEvent, ClStream};
pub(crate) use user::ClUserKernel;
// For the backend's tests, which run through devices (`device/opencl_*_tests.rs`).
#[cfg(test)]
pub(crate) use error::{alloc_error, cl_error_message, enqueue_error, unavailable};
#[cfg(test)]
pub(crate) use kernels::CPU_RUN;
#[cfg(test)]
pub(crate) use program::GemmKernel;

#[allow(dead_code)]
fn _assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ClDevice>();
    send_sync::<ClMem>();
    send_sync::<ClPinned>();
    send_sync::<ClStream>();
    send_sync::<ClEvent>();
}
