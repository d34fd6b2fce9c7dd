//! The `cuda` backend: the CUDA driver API through `cudarc` (feature `cuda`), with `libcuda`
//! loaded at run time.
//!
//! **Status:** written against cudarc 0.19.10. CI (no GPU) builds it, runs its no-driver tests
//! and compiles its CUDA C with NVRTC; every test whose name contains `cuda` has also passed on
//! an NVIDIA H200 (driver 580), run by hand (README, "CUDA on a GPU"). The device tests print a
//! `SKIPPED` line when no CUDA device is present (`SYNCMEM_REQUIRE_CUDA=1` turns a skip into a
//! failure).
//!
//! # Design
//!
//! - Discovery ([`discover`]) first checks that `libcuda` can be loaded at all: without it,
//!   cudarc's dynamic loader panics, so absence becomes [`Error::RuntimeUnavailable`] before any
//!   driver call. The rest of discovery also runs under `catch_unwind` as a second line of
//!   defence. One primary context ([`CudaContext::new`]) is retained per device for the life of
//!   the process, and peer access is enabled once between every pair of devices that support it
//!   (Caffe2's one-time CUDA initialisation).
//! - cudarc's automatic per-buffer event tracking is **disabled** on every context, before any
//!   memory is allocated: the backend contract puts ordering between streams in the caller's
//!   hands (explicit [`Event`](super::Event)s, as in Caffe2), and the tracking could not be used
//!   soundly anyway because the contract writes through `&CuMem`, not `&mut`.
//! - Device memory comes from `cuMemAlloc` (synchronous, usable from every stream at once and
//!   covered by `cuCtxEnablePeerAccess`) and is wrapped in a [`CudaSlice`] so that kernels can
//!   use it through cudarc. Freeing it first synchronizes its context (what `cudaFree` does in
//!   Caffe2) and every stream of another device that copied from or into it, then calls
//!   `cuMemFree`.
//! - Copies and fills go through the `result`/`sys` layers on raw device pointers, ordered on
//!   the stream they are issued on; `blocking` host copies synchronize that stream afterwards.
//! - Device work is asynchronous, as on OpenCL: a launch, a device copy or a fill is queued
//!   and an event is recorded after it on the stream's timeline (`backend/timeline.rs`), so
//!   the layers above record the command's point on every buffer it uses, order other streams
//!   after it with event waits on the device (`cuStreamWaitEvent`), and block the host only
//!   where it reads.
//! - Kernels: CUDA C sources ([`source`]) compiled by NVRTC once per process and loaded once per
//!   device ([`program`]), one launch helper ([`launch`]) and the
//!   [`crate::backend::BackendKernels`] implementation.

mod device;
mod discovery;
mod error;
mod kernels;
mod launch;
mod memory;
mod program;
mod shared;
mod source;
mod stream;
mod user;

pub(crate) use device::CuDevice;
pub(crate) use discovery::discover;
pub(crate) use memory::{CuMem, CuPinned};
pub(crate) use program::KernelCache;
pub(crate) use stream::{CuEvent, CuStream};
// For the backend's tests, which run through devices (`device/cuda_backend_tests.rs`).
#[cfg(test)]
pub(crate) use error::NO_DRIVER;
pub(crate) use user::CuUserKernel;

#[allow(dead_code)]
fn _assert_send_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<CuDevice>();
    send_sync::<CuMem>();
    send_sync::<CuPinned>();
    send_sync::<CuStream>();
    send_sync::<CuEvent>();
}
