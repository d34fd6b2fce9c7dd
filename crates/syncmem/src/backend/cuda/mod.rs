//! The `cuda` backend's kernels: CUDA C sources compiled by NVRTC once per process, modules
//! loaded once per device, one launch helper, and the [`crate::backend::BackendKernels`]
//! implementation. **Compile-checked only: never run on a GPU.**

mod kernels;
mod launch;
mod program;
mod source;

pub(crate) use program::KernelCache;
