//! The operators' CUDA kernels: one CUDA C module ([`cuda_src::SOURCE`](super::cuda_src)),
//! compiled to PTX by NVRTC on first use (once per process) and loaded once per device, cached
//! for the life of the process (the compile, cache and panic guards of
//! [`crate::kernels`]' CUDA path are shared).
//!
//! **Status: compile-checked only.** Written against the source of cudarc 0.19.10; it builds and
//! passes clippy without a GPU, and CI compiles the CUDA C source to PTX with NVRTC (the test
//! `source_compiles_with_nvrtc`, no GPU needed), but these kernels
//! have **never run on a GPU**: the CUDA device tests skip (printing `SKIPPED`) where no driver
//! is present, which is every machine this project's CI has.
//!
//! # Kernels
//!
//! Each kernel mirrors its OpenCL twin in [`super::opencl_src`] (same arguments, same index
//! arithmetic, same NaN for an out-of-range label that only lives on the device).
//!
//! - **GEMM** (`sm_gemm`, shared by `FC` and `FCGradient` through the transposes): a block of
//!   16 × 16 threads owns a 64 × 64 tile of C and walks K in steps of 16. Both operand tiles are
//!   staged in shared memory (k-major, one float of padding per row, zeros outside the
//!   matrices, so any M, N, K works), and each thread accumulates a 4 × 4 block of C in
//!   registers, its rows and columns strided by 16 so that a warp reads shared memory without
//!   bank conflicts and writes C in runs of 16 floats. The grid is `⌈N/64⌉ × min(⌈M/64⌉, 65535)`
//!   blocks; a block walks the row tiles `y, y + gridDim.y, …`, so M is not limited by the
//!   grid. The bias is added in the same kernel; `db` is a column sum (one thread per column).
//! - **Element-wise** kernels (`relu`, `relu_grad`, `fill`, `softmax_loss_grad`): blocks of 256
//!   threads, at most 1024 blocks, grid-stride loops over 64-bit indices.
//! - **Reductions to one scalar** (`softmax_loss`, `accuracy`): one block of 256 threads, each
//!   thread taking rows `tid, tid + 256, …`, then a tree sum in shared memory (as the OpenCL
//!   kernels use one work-group).
//!
//! # Streams
//!
//! Every kernel is launched on the context's stream ([`crate::Stream::as_cuda`]), then that
//! stream is synchronized, so the operator's device work is complete when
//! [`Operator::run`](super::Operator::run) returns. The inputs' device mirrors were made current
//! by their guards with blocking copies (and any pending work announced on them was waited for
//! when the guards were taken), so the kernel needs no further ordering. cudarc's event
//! tracking is disabled on syncmem's contexts, so the launch builder adds no waits or records.
//! `SGD` runs [`crate::kernels::axpy`], which launches on a stream of the kernel layer's own and
//! synchronizes it the same way.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use parking_lot::Mutex;

use super::cuda_src::{BLOCK, GEMM_THREADS, SOURCE, TILE_M, TILE_N};
use crate::context::Context;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::cache::BuildCache;
use crate::kernels::cuda::{compile_cached, driver_error, load_module};

/// Most blocks launched for an element-wise kernel (a grid-stride loop covers the rest).
const MAX_BLOCKS: usize = 1024;
/// Most blocks along a grid's y axis (CUDA's limit); the GEMM loops over further row tiles.
const MAX_GRID_Y: usize = 65_535;

/// A device pointer argument: `None` passes a null pointer (an empty tensor, or an argument the
/// kernel does not read).
pub(crate) type DevPtr<'a> = Option<&'a CudaSlice<u8>>;

/// The value passed for a null device pointer (`CUdeviceptr` is a 64-bit integer).
static NULL_PTR: u64 = 0;

/// The kernels of [`SOURCE`], in the order of the fields of [`Kernels`].
const KERNELS: [&str; 8] = [
    "sm_gemm",
    "sm_col_sum",
    "sm_relu",
    "sm_relu_grad",
    "sm_fill",
    "sm_softmax_loss",
    "sm_softmax_loss_grad",
    "sm_accuracy",
];

/// The compiled operator kernels of one CUDA device (the functions keep their module alive).
pub(crate) struct Kernels {
    label: String,
    gemm: CudaFunction,
    col_sum: CudaFunction,
    relu: CudaFunction,
    relu_grad: CudaFunction,
    fill: CudaFunction,
    softmax_loss: CudaFunction,
    softmax_loss_grad: CudaFunction,
    accuracy: CudaFunction,
}

/// Process-wide cache: device label -> kernels.
static CACHE: BuildCache<String, Kernels> = BuildCache::new();

/// The PTX of [`SOURCE`], compiled once per process (device-independent).
static PTX: Mutex<Option<Ptx>> = Mutex::new(None);

/// The cudarc stream of `ctx`, which every operator kernel is launched on.
pub(crate) fn stream(ctx: &Context) -> Result<&Arc<CudaStream>> {
    ctx.stream().as_cuda().ok_or_else(|| Error::DeviceMismatch {
        op: "CUDA operator",
        expected: "a CUDA stream".into(),
        actual: ctx.device().label().to_string(),
    })
}

/// The kernels of `dev` (whose context owns `stream`), built on first use. A failed build is
/// not cached.
pub(crate) fn kernels(dev: &Device, stream: &CudaStream) -> Result<Arc<Kernels>> {
    CACHE.get_or_build(dev.label().to_string(), || {
        build(dev.label(), stream.context())
    })
}

/// The threads per block every launch of `name` uses.
fn threads_of(name: &str) -> u32 {
    match name {
        "sm_gemm" => GEMM_THREADS.0 * GEMM_THREADS.1,
        _ => BLOCK,
    }
}

fn build(label: &str, ctx: &Arc<CudaContext>) -> Result<Kernels> {
    let ptx = compile_cached(SOURCE, &PTX)?;
    load_module(label, "CUDA operator kernels", ctx, ptx, |module| {
        let f = |name: &'static str| -> Result<CudaFunction> {
            let func = module
                .load_function(name)
                .map_err(|e| driver_error(label, "cuModuleGetFunction", e))?;
            let max = func
                .max_threads_per_block()
                .map_err(|e| driver_error(label, "cuFuncGetAttribute", e))?;
            check_threads(label, name, max, threads_of(name))?;
            Ok(func)
        };
        let [gemm, col_sum, relu, relu_grad, fill, softmax_loss, softmax_loss_grad, accuracy] =
            KERNELS.map(f);
        Ok(Kernels {
            label: label.to_string(),
            gemm: gemm?,
            col_sum: col_sum?,
            relu: relu?,
            relu_grad: relu_grad?,
            fill: fill?,
            softmax_loss: softmax_loss?,
            softmax_loss_grad: softmax_loss_grad?,
            accuracy: accuracy?,
        })
    })
}

/// Fails when the compiled kernel `name` cannot run the `needed` threads per block its launches
/// use (`max` is the driver's `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
fn check_threads(label: &str, name: &str, max: i32, needed: u32) -> Result<()> {
    if i64::from(max) >= i64::from(needed) {
        return Ok(());
    }
    Err(Error::Unsupported {
        device: label.to_string(),
        what: format!(
            "CUDA operator kernel {name} runs at most {max} threads per block on this device; \
             its launches use {needed}"
        ),
    })
}

/// One kernel argument.
enum Arg<'a> {
    U32(u32),
    U64(u64),
    F32(f32),
    Ptr(DevPtr<'a>),
}

/// A size as a kernel `unsigned int`.
fn u32_arg(v: usize, what: &str, label: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Unsupported {
        device: label.to_string(),
        what: format!("{what} = {v} exceeds the 32-bit sizes of the CUDA operator kernels"),
    })
}

/// Blocks of [`BLOCK`] threads for an element-wise launch over `n` items (grid-stride loop).
fn elementwise_blocks(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32
}

/// The grid of a GEMM with `m` rows and `n` columns (`n` at most `u32::MAX`): one block per
/// column tile along x, one per row tile along y up to [`MAX_GRID_Y`] (the kernel loops over
/// the rest).
fn gemm_grid(m: usize, n: usize) -> (u32, u32, u32) {
    let x = n.div_ceil(TILE_N).max(1);
    let y = m.div_ceil(TILE_M).clamp(1, MAX_GRID_Y);
    (x as u32, y as u32, 1)
}

/// One block of [`BLOCK`] threads per `BLOCK` columns.
fn col_sum_blocks(cols: usize) -> u32 {
    cols.div_ceil(BLOCK as usize).max(1) as u32
}

fn linear(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
    /// Launches `func` with `args` on `stream` and waits for it.
    fn launch(
        &self,
        name: &str,
        func: &CudaFunction,
        stream: &CudaStream,
        args: &[Arg<'_>],
        cfg: LaunchConfig,
    ) -> Result<()> {
        let mut b = stream.launch_builder(func);
        for a in args {
            match a {
                Arg::U32(v) => b.arg(v),
                Arg::U64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::Ptr(Some(s)) => b.arg(*s),
                Arg::Ptr(None) => b.arg(&NULL_PTR),
            };
        }
        // SAFETY: every caller passes the arguments in the order and of the types of the
        // kernel's parameters in SOURCE: `unsigned int` (u32), `unsigned long long` (u64),
        // `float` (f32), and pointers (the CUdeviceptr of a live allocation of this device's
        // context, held by the caller's guard for longer than this call, or a null CUdeviceptr
        // for a pointer the kernel does not read). `cfg` uses the block size the kernel was
        // written for (checked against the compiled function at build time); its shared memory
        // is static. The stream is synchronized below, before the guards can be released, so
        // no buffer is freed or reused while the kernel runs. cudarc's event tracking is
        // disabled on the context, so the builder waits on and records no events.
        unsafe { b.launch(cfg) }.map_err(|e| {
            let mut err = driver_error(&self.label, "cuLaunchKernel", e);
            if let Error::Backend { message, .. } = &mut err {
                message.push_str(&format!(" (kernel {name})"));
            }
            err
        })?;
        stream
            .synchronize()
            .map_err(|e| driver_error(&self.label, "cuStreamSynchronize", e))
    }

    /// `C[m,n] = op(A)·op(B) (+ bias[col])`; see the module docs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        stream: &CudaStream,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        a: DevPtr<'_>,
        b: DevPtr<'_>,
        c: DevPtr<'_>,
        bias: Option<DevPtr<'_>>,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let l = &self.label;
        let args = [
            Arg::U32(u32_arg(m, "GEMM M", l)?),
            Arg::U32(u32_arg(n, "GEMM N", l)?),
            Arg::U32(u32_arg(k, "GEMM K", l)?),
            Arg::U32(ta.into()),
            Arg::U32(tb.into()),
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Ptr(c),
            Arg::Ptr(bias.flatten()),
            Arg::U32(bias.is_some().into()),
        ];
        let cfg = LaunchConfig {
            grid_dim: gemm_grid(m, n),
            block_dim: (GEMM_THREADS.0, GEMM_THREADS.1, 1),
            shared_mem_bytes: 0,
        };
        self.launch("sm_gemm", &self.gemm, stream, &args, cfg)
    }

    /// `out[j] = sum_i x[i*cols + j]`.
    pub(crate) fn col_sum(
        &self,
        stream: &CudaStream,
        rows: usize,
        cols: usize,
        x: DevPtr<'_>,
        out: DevPtr<'_>,
    ) -> Result<()> {
        if cols == 0 {
            return Ok(());
        }
        let l = &self.label;
        let args = [
            Arg::U32(u32_arg(rows, "rows", l)?),
            Arg::U32(u32_arg(cols, "columns", l)?),
            Arg::Ptr(x),
            Arg::Ptr(out),
        ];
        let cfg = linear(col_sum_blocks(cols));
        self.launch("sm_col_sum", &self.col_sum, stream, &args, cfg)
    }

    /// `y = max(x, 0)` (`x` may be `y`).
    pub(crate) fn relu(
        &self,
        stream: &CudaStream,
        n: usize,
        x: DevPtr<'_>,
        y: DevPtr<'_>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [Arg::U64(n as u64), Arg::Ptr(x), Arg::Ptr(y)];
        let cfg = linear(elementwise_blocks(n));
        self.launch("sm_relu", &self.relu, stream, &args, cfg)
    }

    /// `dx = y > 0 ? dy : 0` (`dy` may be `dx`).
    pub(crate) fn relu_grad(
        &self,
        stream: &CudaStream,
        n: usize,
        y: DevPtr<'_>,
        dy: DevPtr<'_>,
        dx: DevPtr<'_>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [Arg::U64(n as u64), Arg::Ptr(y), Arg::Ptr(dy), Arg::Ptr(dx)];
        let cfg = linear(elementwise_blocks(n));
        self.launch("sm_relu_grad", &self.relu_grad, stream, &args, cfg)
    }

    /// `y = value`.
    pub(crate) fn fill(
        &self,
        stream: &CudaStream,
        n: usize,
        value: f32,
        y: DevPtr<'_>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let args = [Arg::U64(n as u64), Arg::F32(value), Arg::Ptr(y)];
        let cfg = linear(elementwise_blocks(n));
        self.launch("sm_fill", &self.fill, stream, &args, cfg)
    }

    /// Softmax of each of `rows` rows of `cols` into `p`, mean cross-entropy into `loss[0]`.
    /// One block.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss(
        &self,
        stream: &CudaStream,
        rows: usize,
        cols: usize,
        x: DevPtr<'_>,
        labels: DevPtr<'_>,
        p: DevPtr<'_>,
        loss: DevPtr<'_>,
    ) -> Result<()> {
        let l = &self.label;
        let args = [
            Arg::U32(u32_arg(rows, "rows", l)?),
            Arg::U32(u32_arg(cols, "classes", l)?),
            Arg::Ptr(x),
            Arg::Ptr(labels),
            Arg::Ptr(p),
            Arg::Ptr(loss),
        ];
        self.launch(
            "sm_softmax_loss",
            &self.softmax_loss,
            stream,
            &args,
            linear(1),
        )
    }

    /// `dx = (p - onehot) * dloss / rows`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss_grad(
        &self,
        stream: &CudaStream,
        rows: usize,
        cols: usize,
        p: DevPtr<'_>,
        labels: DevPtr<'_>,
        dloss: Option<DevPtr<'_>>,
        dx: DevPtr<'_>,
    ) -> Result<()> {
        let n = rows.saturating_mul(cols);
        if n == 0 {
            return Ok(());
        }
        let l = &self.label;
        let args = [
            Arg::U32(u32_arg(rows, "rows", l)?),
            Arg::U32(u32_arg(cols, "classes", l)?),
            Arg::Ptr(p),
            Arg::Ptr(labels),
            Arg::Ptr(dloss.flatten()),
            Arg::U32(dloss.is_some().into()),
            Arg::Ptr(dx),
        ];
        let cfg = linear(elementwise_blocks(n));
        self.launch(
            "sm_softmax_loss_grad",
            &self.softmax_loss_grad,
            stream,
            &args,
            cfg,
        )
    }

    /// Fraction of rows whose label is in the top `top_k` into `out[0]`. One block.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accuracy(
        &self,
        stream: &CudaStream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: DevPtr<'_>,
        labels: DevPtr<'_>,
        out: DevPtr<'_>,
    ) -> Result<()> {
        let l = &self.label;
        let args = [
            Arg::U32(u32_arg(rows, "rows", l)?),
            Arg::U32(u32_arg(cols, "classes", l)?),
            Arg::U32(u32_arg(top_k, "top_k", l)?),
            Arg::Ptr(x),
            Arg::Ptr(labels),
            Arg::Ptr(out),
        ];
        self.launch("sm_accuracy", &self.accuracy, stream, &args, linear(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cuda_or_skip;

    #[test]
    fn source_matches_the_host_constants() {
        for (name, v) in [
            ("SM_BLOCK", BLOCK as usize),
            ("SM_TM", TILE_M),
            ("SM_TN", TILE_N),
            ("SM_BX", GEMM_THREADS.0 as usize),
            ("SM_BY", GEMM_THREADS.1 as usize),
        ] {
            assert!(
                SOURCE.contains(&format!("#define {name} {v}\n")),
                "{name} {v}"
            );
        }
        // Each GEMM thread computes a whole number of rows and columns of its tile.
        assert_eq!(TILE_M % GEMM_THREADS.1 as usize, 0);
        assert_eq!(TILE_N % GEMM_THREADS.0 as usize, 0);
        // The block sum halves the block: a power of two.
        assert!(BLOCK.is_power_of_two());
        for name in KERNELS {
            assert!(
                SOURCE.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{name}"
            );
        }
        assert!(
            !SOURCE.contains("#include"),
            "NVRTC has no standard headers"
        );
    }

    #[test]
    fn source_compiles_with_nvrtc() {
        if !crate::testing::nvrtc_or_skip("ops::cuda::source_compiles_with_nvrtc") {
            return;
        }
        let ptx = compile_cached(SOURCE, &PTX)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        for name in KERNELS {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
        }
    }

    #[test]
    fn gemm_grid_covers_every_tile() {
        assert_eq!(gemm_grid(1, 1), (1, 1, 1));
        assert_eq!(gemm_grid(64, 64), (1, 1, 1));
        assert_eq!(gemm_grid(65, 129), (3, 2, 1));
        assert_eq!(gemm_grid(130, 150), (3, 3, 1));
        // Beyond 65535 row tiles the grid stops growing; the kernel loops over the rest.
        let m = (MAX_GRID_Y + 10) * TILE_M;
        assert_eq!(gemm_grid(m, 10).1 as usize, MAX_GRID_Y);
        // Every row tile is visited exactly once by the kernel's loop over blockIdx.y.
        let (tiles, grid_y) = (MAX_GRID_Y + 10, MAX_GRID_Y);
        let visits: usize = (0..grid_y)
            .map(|y| (y..tiles).step_by(grid_y).count())
            .sum();
        assert_eq!(visits, tiles);
        // The widest N a kernel accepts fits the x axis (2^31 - 1 blocks).
        assert!(gemm_grid(1, u32::MAX as usize).0 < i32::MAX as u32);
    }

    #[test]
    fn one_dimensional_launches() {
        assert_eq!(elementwise_blocks(1), 1);
        assert_eq!(elementwise_blocks(256), 1);
        assert_eq!(elementwise_blocks(257), 2);
        assert_eq!(elementwise_blocks(usize::MAX / 2), MAX_BLOCKS as u32);
        assert_eq!(col_sum_blocks(1), 1);
        assert_eq!(col_sum_blocks(513), 3);
        assert_eq!(
            col_sum_blocks(u32::MAX as usize) as u64 * u64::from(BLOCK),
            u64::from(u32::MAX) + 1
        );
    }

    #[test]
    fn sizes_beyond_32_bits_are_refused() {
        assert_eq!(u32_arg(7, "rows", "cuda:0").unwrap(), 7);
        let e = u32_arg(u32::MAX as usize + 1, "GEMM K", "cuda:0").unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { device, what }
                if device == "cuda:0" && what.contains("GEMM K = 4294967296")),
            "{e}"
        );
    }

    #[test]
    fn a_kernel_that_cannot_run_its_block_size_is_refused() {
        assert!(check_threads("cuda:0", "sm_gemm", 1024, 256).is_ok());
        assert!(check_threads("cuda:0", "sm_gemm", 256, 256).is_ok());
        let e = check_threads("cuda:1", "sm_gemm", 128, 256).unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { device, what }
                if device == "cuda:1" && what.contains("sm_gemm") && what.contains("128")),
            "{e}"
        );
        assert_eq!(threads_of("sm_gemm"), 256);
        assert_eq!(threads_of("sm_relu"), BLOCK);
    }

    #[test]
    fn operator_kernels_are_built_once_per_device() {
        let Some(dev) = cuda_or_skip("ops::cuda::operator_kernels_are_built_once_per_device")
        else {
            return;
        };
        let ctx = Context::with_seed(&dev, 1).unwrap();
        let s = stream(&ctx).unwrap();
        let a = kernels(&dev, s).unwrap();
        let b = kernels(&dev, s).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "cached");
        assert!(CACHE.contains(&dev.label().to_string()));
    }
}
