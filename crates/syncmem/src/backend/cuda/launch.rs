//! The one launch helper of the CUDA kernels: the argument type and [`launch`], through
//! cudarc's launch builder (`CudaStream::launch_builder`, `PushKernelArg::arg`,
//! `LaunchArgs::launch`).

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::error::driver_error;
use crate::error::{Error, Result};

/// Most blocks launched for an element-wise kernel (a grid-stride loop covers the rest).
pub(super) const MAX_BLOCKS: usize = 1024;
/// Most blocks along a grid's y axis (CUDA's limit); the GEMM loops over further row tiles.
pub(super) const MAX_GRID_Y: usize = 65_535;

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A device pointer (`CUdeviceptr`): the address of a live allocation of the stream's
    /// context, or 0 for an operand the kernel does not read.
    Ptr(u64),
}

/// A size as a kernel `unsigned int`.
pub(super) fn u32_arg(v: usize, what: &'static str, label: &str) -> Result<Arg> {
    u32::try_from(v)
        .map(Arg::U32)
        .map_err(|_| Error::Unsupported {
            device: label.to_string(),
            what: format!("{what} = {v} exceeds the 32-bit sizes of the CUDA kernels"),
        })
}

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
/// stream's context, kept alive until the kernel completes) and a configuration whose block size
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
    let mut b = stream.launch_builder(func);
    for a in args {
        match a {
            Arg::U32(v) => b.arg(v),
            Arg::U64(v) => b.arg(v),
            Arg::F32(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
            Arg::Ptr(v) => b.arg(v),
        };
    }
    // SAFETY: the arguments match the kernel's parameters in order and type (this function's
    // contract; a device pointer is passed as its 64-bit address), the memory they point to
    // stays alive until the kernel completes (contract), and `cfg` uses the block size the
    // kernel was written for. cudarc's event tracking is disabled on syncmem's contexts, so the
    // builder waits on and records no events.
    unsafe { b.launch(cfg) }.map_err(|e| {
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

    #[test]
    fn sizes_beyond_32_bits_are_refused() {
        assert!(matches!(u32_arg(7, "rows", "cuda:0"), Ok(Arg::U32(7))));
        let e = u32_arg(u32::MAX as usize + 1, "GEMM K", "cuda:0").unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { device, what }
                if device == "cuda:0" && what.contains("GEMM K = 4294967296")),
            "{e}"
        );
    }
}
