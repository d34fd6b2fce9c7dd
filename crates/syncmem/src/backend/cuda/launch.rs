//! The one launch helper of the CUDA kernels: the argument type and [`launch`], a direct
//! `cuLaunchKernel` with the parameter pointers in an array on the stack.
//!
//! cudarc's launch builder (`CudaStream::launch_builder`) keeps the parameter pointers in a
//! `Vec` that grows as they are pushed: one to three heap allocations per launch, which a
//! training step of a dozen launches pays every step. The builder's other work (waiting on and
//! recording the events of `CudaSlice`s) is off on syncmem's contexts, so nothing is lost.

use std::ffi::c_void;

use cudarc::driver::{result, CudaFunction, CudaStream, LaunchConfig};
use smallvec::SmallVec;

use super::error::driver_error;
use crate::backend::args::KArg;
use crate::error::{Error, Result};

/// Most blocks launched for an element-wise kernel (a grid-stride loop covers the rest).
pub(super) const MAX_BLOCKS: usize = 1024;
/// Most blocks along a grid's y axis (CUDA's limit); the GEMM loops over further row tiles.
pub(super) const MAX_GRID_Y: usize = 65_535;

/// One kernel argument: a device pointer is a `CUdeviceptr` (its 64-bit address).
pub(super) type Arg = KArg<u64>;

/// Blocks of `block` threads for a grid-stride loop over `n` items, at most `max`.
pub(super) fn blocks_for(n: usize, block: u32, max: usize) -> u32 {
    n.div_ceil(block as usize).clamp(1, max) as u32
}

/// A one-dimensional configuration of `blocks` blocks of `block` threads.
pub(super) fn linear(blocks: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `func` (named `name` in errors) with `args` on `stream`.
///
/// The caller passes the arguments in the order and of the types of the kernel's parameters
/// (`unsigned int`, `unsigned long long`, `float`, `double`, pointers to live memory of the
/// stream's context, kept alive until the kernel completes, or the bytes of a by-value
/// parameter of exactly its size, alive for the call) and a configuration whose block size
/// the kernel was written for (checked against the compiled function at build time) with static
/// shared memory only.
pub(super) fn launch(
    label: &str,
    name: &str,
    func: &CudaFunction,
    stream: &CudaStream,
    args: &[Arg],
    cfg: LaunchConfig,
) -> Result<()> {
    // Pointers to the values inside `args`, which outlives the call (the driver copies the
    // values when the launch is queued). Every kernel of the crate takes at most 26.
    let mut params: SmallVec<[*mut c_void; 32]> = args
        .iter()
        .map(|a| match a {
            KArg::U32(v) => v as *const u32 as *mut c_void,
            KArg::U64(v) | KArg::Ptr(v) => v as *const u64 as *mut c_void,
            KArg::F32(v) => v as *const f32 as *mut c_void,
            KArg::F64(v) => v as *const f64 as *mut c_void,
            KArg::Bytes { ptr, .. } => ptr.cast_mut().cast(),
        })
        .collect();
    let queued = stream.context().bind_to_thread().and_then(|()| {
        // SAFETY: the arguments match the kernel's parameters in order and type (this
        // function's contract; a device pointer is passed as its 64-bit address) and `params`
        // points at them, alive for the call (the driver copies the values before it returns);
        // the memory they point to stays alive until the kernel completes (contract); `cfg`
        // uses the block size the kernel was written for; the context of `stream` is current
        // (bound just above) and `func` was loaded into it.
        unsafe {
            result::launch_kernel(
                func.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                stream.cu_stream(),
                &mut params,
            )
        }
    });
    queued.map_err(|e| {
        let mut err = driver_error(label, "cuLaunchKernel", e);
        if let Error::Backend { message, .. } = &mut err {
            message.push_str(&format!(" (kernel {name})"));
        }
        err
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_dimensional_launches() {
        assert_eq!(blocks_for(1, 256, MAX_BLOCKS), 1);
        assert_eq!(blocks_for(256, 256, MAX_BLOCKS), 1);
        assert_eq!(blocks_for(257, 256, MAX_BLOCKS), 2);
        assert_eq!(
            blocks_for(usize::MAX / 2, 256, MAX_BLOCKS),
            MAX_BLOCKS as u32
        );
    }
}
