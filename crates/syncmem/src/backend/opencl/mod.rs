//! The `opencl` backend's kernels: OpenCL C sources, programs built once per device, one
//! launch helper, and the [`crate::backend::BackendKernels`] implementation.

mod kernels;
mod launch;
mod program;
mod source;

pub(crate) use program::KernelCache;
