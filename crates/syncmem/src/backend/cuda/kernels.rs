//! [`BackendKernels`] for CUDA devices: the modules of [`super::program`], launched with the one
//! helper of [`super::launch`] on the stream given.
//!
//! **Status:** CI (no GPU) compiles the CUDA C sources to PTX with NVRTC; the kernels' tests
//! have passed on an NVIDIA GPU run by hand (see the backend's status). The CUDA device tests
//! skip, printing `SKIPPED`, where no driver is present.
//!
//! # Kernels
//!
//! Each operator kernel mirrors its OpenCL twin (same arguments, same index arithmetic, same NaN
//! for an out-of-range label that only lives on the device).
//!
//! - **GEMM** (`sm_gemm`): a block of 16 × 16 threads owns a 64 × 64 tile of C and walks K in
//!   steps of 16; both operand tiles are staged in shared memory (k-major, one float of padding
//!   per row, zero-padded, so any M, N, K works), and each thread accumulates a 4 × 4 block of C
//!   in registers, rows and columns strided by 16 so that a warp reads shared memory without
//!   bank conflicts and writes C in runs of 16 floats. The grid is `⌈N/64⌉ × min(⌈M/64⌉,
//!   65535)` blocks; a block walks the row tiles `y, y + gridDim.y, …`, so M is not limited by
//!   the grid. The bias is added in the same kernel; `db` is a column sum (one thread per
//!   column).
//! - **Element-wise** kernels: blocks of 256 threads, at most 1024 blocks, grid-stride loops
//!   over 64-bit indices.
//! - **Reductions to one scalar** (`softmax_loss`, `accuracy`): one block of 256 threads and a
//!   tree sum in shared memory; the math reductions write one partial sum per block.

use cudarc::driver::LaunchConfig;

use super::launch::{blocks_for, launch, linear, Arg, MAX_BLOCKS, MAX_GRID_Y};
use super::source::{BLOCK, GEMM_THREADS, MATH_BLOCK, TILE_M, TILE_N};
use super::{CuDevice, CuMem, CuStream};
use crate::backend::args;
use crate::backend::epilogue::{Dialect, EpilogueCode};
use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce, SoftmaxExtra, AXPY_MULTI};
use crate::dtype::{Float, ScalarKind};
use crate::error::Result;

/// Most blocks (partial sums) launched for a math reduction.
const MAX_BLOCKS_REDUCE: usize = 256;

fn ptr(m: &CuMem) -> u64 {
    m.device_ptr()
}

fn opt(m: Buf<'_, CuMem>) -> Option<u64> {
    m.map(CuMem::device_ptr)
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

impl CuDevice {
    /// Queues `func` on `s` and returns at once (the command joins the stream's timeline).
    pub(super) fn run(
        &self,
        s: &CuStream,
        name: &str,
        func: &cudarc::driver::CudaFunction,
        args: &[Arg],
        cfg: LaunchConfig,
    ) -> Result<()> {
        s.submit(false, || {
            launch(self.label(), name, func, s.cuda_stream(), args, cfg)
        })
        .map(drop)
    }
}

impl BackendKernels for CuDevice {
    type Stream = CuStream;
    type Mem = CuMem;

    fn prepare_math(&self, _kind: ScalarKind) -> Result<()> {
        self.kernel_cache().math(self).map(drop)
    }

    fn gemm(
        &self,
        s: &CuStream,
        g: &Gemm,
        a: Buf<'_, CuMem>,
        b: Buf<'_, CuMem>,
        c: &CuMem,
        bias: Buf<'_, CuMem>,
        mask: Buf<'_, CuMem>,
        sum: Buf<'_, CuMem>,
    ) -> Result<()> {
        let user = match g.user {
            Some(act) => {
                let prelude = EpilogueCode::prelude(act, Dialect::Cuda, self.label())?;
                Some(self.kernel_cache().gemm_with_epilogue(self, prelude)?)
            }
            None => None,
        };
        let ks = self.kernel_cache().ops(self)?;
        let args = args::gemm(
            self.label(),
            g,
            opt(a),
            opt(b),
            ptr(c),
            opt(bias),
            opt(mask),
            opt(sum),
        )?;
        let cfg = LaunchConfig {
            grid_dim: gemm_grid(g.m, g.n),
            block_dim: (GEMM_THREADS.0, GEMM_THREADS.1, 1),
            shared_mem_bytes: 0,
        };
        let func = user.as_deref().unwrap_or(&ks.gemm);
        self.run(s, "sm_gemm", func, &args, cfg)
    }

    fn col_sum(
        &self,
        s: &CuStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, CuMem>,
        out: &CuMem,
    ) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::col_sum(self.label(), rows, cols, opt(x), ptr(out))?;
        let cfg = linear(col_sum_blocks(cols), BLOCK);
        self.run(s, "sm_col_sum", &ks.col_sum, &args, cfg)
    }

    fn relu(&self, s: &CuStream, n: usize, x: &CuMem, y: &CuMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::relu(n, ptr(x), ptr(y));
        let cfg = linear(blocks_for(n, BLOCK, MAX_BLOCKS), BLOCK);
        self.run(s, "sm_relu", &ks.relu, &args, cfg)
    }

    fn relu_grad(&self, s: &CuStream, n: usize, y: &CuMem, dy: &CuMem, dx: &CuMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::relu_grad(n, ptr(y), ptr(dy), ptr(dx));
        let cfg = linear(blocks_for(n, BLOCK, MAX_BLOCKS), BLOCK);
        self.run(s, "sm_relu_grad", &ks.relu_grad, &args, cfg)
    }

    fn fill_f32(&self, s: &CuStream, n: usize, value: f32, y: &CuMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::fill(n, value, ptr(y));
        let cfg = linear(blocks_for(n, BLOCK, MAX_BLOCKS), BLOCK);
        self.run(s, "sm_fill", &ks.fill, &args, cfg)
    }

    fn softmax_loss(
        &self,
        s: &CuStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, CuMem>,
        labels: Buf<'_, CuMem>,
        p: Buf<'_, CuMem>,
        loss: &CuMem,
        extra: SoftmaxExtra<'_, CuMem>,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let (l, rc) = (self.label(), (rows, cols));
        let acc = extra.accuracy.map(|(k, a)| (k, ptr(a)));
        let (x, labels, p, grad) = (opt(x), opt(labels), opt(p), opt(extra.grad));
        let scalars = opt(extra.scalars);
        let args = args::softmax_loss(l, rc, x, labels, p, ptr(loss), acc, grad, scalars)?;
        let cfg = linear(1, BLOCK);
        self.run(s, "sm_softmax_loss", &ks.softmax_loss, &args, cfg)?;
        Ok(None)
    }

    fn softmax_loss_grad(
        &self,
        s: &CuStream,
        rows: usize,
        cols: usize,
        p: &CuMem,
        labels: &CuMem,
        dloss: Buf<'_, CuMem>,
        dx: &CuMem,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let (l, rc) = (self.label(), (rows, cols));
        let args = args::softmax_loss_grad(l, rc, ptr(p), ptr(labels), opt(dloss), ptr(dx))?;
        let cfg = linear(blocks_for(rows * cols, BLOCK, MAX_BLOCKS), BLOCK);
        let f = &ks.softmax_loss_grad;
        self.run(s, "sm_softmax_loss_grad", f, &args, cfg)?;
        Ok(None)
    }

    fn accuracy(
        &self,
        s: &CuStream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: Buf<'_, CuMem>,
        labels: Buf<'_, CuMem>,
        out: &CuMem,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let (l, rck) = (self.label(), (rows, cols, top_k));
        let args = args::accuracy(l, rck, opt(x), opt(labels), ptr(out))?;
        let cfg = linear(1, BLOCK);
        self.run(s, "sm_accuracy", &ks.accuracy, &args, cfg)?;
        Ok(None)
    }

    fn axpy<F: Float>(&self, s: &CuStream, n: usize, a: F, x: &CuMem, y: &CuMem) -> Result<()> {
        let ks = self.kernel_cache().math(self)?;
        let args = args::axpy(n, a, ptr(x), ptr(y));
        let cfg = linear(blocks_for(n, MATH_BLOCK, MAX_BLOCKS), MATH_BLOCK);
        self.run(s, "sm_axpy", &ks.typed(F::KIND).axpy, &args, cfg)
    }

    fn axpy_multi<F: Float>(
        &self,
        s: &CuStream,
        a: F,
        pairs: &[(usize, &CuMem, &CuMem)],
    ) -> Result<()> {
        let ks = self.kernel_cache().math(self)?;
        let mut raw = [(0, 0u64, 0u64); AXPY_MULTI];
        let count = pairs.len().min(AXPY_MULTI);
        for (r, &(n, x, y)) in raw.iter_mut().zip(pairs) {
            *r = (n, ptr(x), ptr(y));
        }
        let longest = pairs.iter().map(|p| p.0).max().unwrap_or(1);
        let cfg = linear(blocks_for(longest, MATH_BLOCK, MAX_BLOCKS), MATH_BLOCK);
        let args = args::axpy_multi(a, &raw[..count]);
        self.run(
            s,
            "sm_axpy_multi",
            &ks.typed(F::KIND).axpy_multi,
            &args,
            cfg,
        )
    }

    fn scale<F: Float>(&self, s: &CuStream, n: usize, a: F, x: &CuMem) -> Result<()> {
        let ks = self.kernel_cache().math(self)?;
        let args = args::scale(n, a, ptr(x));
        let cfg = linear(blocks_for(n, MATH_BLOCK, MAX_BLOCKS), MATH_BLOCK);
        self.run(s, "sm_scale", &ks.typed(F::KIND).scale, &args, cfg)
    }

    fn reduce_groups(&self, n: usize) -> usize {
        blocks_for(n, MATH_BLOCK, MAX_BLOCKS_REDUCE) as usize
    }

    fn reduce_partials<F: Float>(
        &self,
        s: &CuStream,
        op: Reduce,
        n: usize,
        x: &CuMem,
        partial: &CuMem,
    ) -> Result<()> {
        let ks = self.kernel_cache().math(self)?;
        let typed = ks.typed(F::KIND);
        let (name, func) = match op {
            Reduce::Asum => ("sm_asum", &typed.asum),
            Reduce::Sumsq => ("sm_sumsq", &typed.sumsq),
        };
        let args = args::reduce(n, ptr(x), ptr(partial));
        let cfg = linear(self.reduce_groups(n) as u32, MATH_BLOCK);
        self.run(s, name, func, &args, cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::super::program::{check_threads, math_ptx, ops_ptx, threads_of, OP_KERNELS};
    use super::super::source::{MATH, OPS};
    use super::*;

    #[test]
    fn sources_match_the_host_constants() {
        for (name, v) in [
            ("SM_BLOCK", BLOCK as usize),
            ("SM_TM", TILE_M),
            ("SM_TN", TILE_N),
            ("SM_BX", GEMM_THREADS.0 as usize),
            ("SM_BY", GEMM_THREADS.1 as usize),
        ] {
            assert!(OPS.contains(&format!("#define {name} {v}\n")), "{name} {v}");
        }
        assert!(MATH.contains(&format!("#define SM_BLOCK {MATH_BLOCK}\n")));
        // Each GEMM thread computes a whole number of rows and columns of its tile.
        assert_eq!(TILE_M % GEMM_THREADS.1 as usize, 0);
        assert_eq!(TILE_N % GEMM_THREADS.0 as usize, 0);
        // The block sums halve the block: a power of two.
        assert!(BLOCK.is_power_of_two() && MATH_BLOCK.is_power_of_two());
        for name in OP_KERNELS {
            assert!(
                OPS.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{name}"
            );
        }
        for name in super::super::program::MATH_KERNELS {
            assert!(MATH.contains(&format!("{name}_##SUF")), "{name}");
        }
        for src in [OPS, MATH] {
            assert!(!src.contains("#include"), "NVRTC has no standard headers");
        }
    }

    #[test]
    fn ops_source_compiles_with_nvrtc() {
        if !crate::testing::nvrtc_or_skip("backend::cuda::ops_source_compiles_with_nvrtc") {
            return;
        }
        let ops = ops_ptx().unwrap_or_else(|e| panic!("{e}")).to_src();
        for name in OP_KERNELS {
            assert!(ops.contains(&format!(".entry {name}(")), "{name}");
        }
        // With a user's epilogue spliced in (as the LeakyRelu example declares it).
        let code = crate::backend::epilogue::EpilogueCode {
            name: "leaky".into(),
            source: Some("return x > 0.0f ? x : 0.01f * x;".into()),
            grad_source: Some("return y > 0.0f ? g : 0.01f * g;".into()),
            host: None,
            host_grad: None,
            preludes: Default::default(),
        };
        let act = crate::backend::epilogue::UserAct {
            code: &code,
            grad: true,
        };
        let prelude = EpilogueCode::prelude(act, Dialect::Cuda, "cuda").unwrap();
        let ptx = super::super::program::epilogue_ptx(prelude).unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.to_src().contains(".entry sm_gemm("));
    }

    #[test]
    fn math_source_compiles_with_nvrtc() {
        if !crate::testing::nvrtc_or_skip("backend::cuda::math_source_compiles_with_nvrtc") {
            return;
        }
        let math = math_ptx().unwrap_or_else(|e| panic!("{e}")).to_src();
        for name in super::super::program::MATH_KERNELS {
            for suf in ["f32", "f64"] {
                assert!(
                    math.contains(&format!(".entry {name}_{suf}(")),
                    "{name}_{suf}"
                );
            }
        }
        // The axpy kernels (SGD's update) round the product and the sum each on its own, as
        // the host's axpy does: no fused multiply-add in them.
        for entry in math.split(".entry ").filter(|e| e.starts_with("sm_axpy")) {
            assert!(!entry.contains("fma."), "a fused multiply-add in {entry}");
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
    fn column_sums_cover_every_column() {
        assert_eq!(col_sum_blocks(1), 1);
        assert_eq!(col_sum_blocks(513), 3);
        assert_eq!(
            col_sum_blocks(u32::MAX as usize) as u64 * u64::from(BLOCK),
            u64::from(u32::MAX) + 1
        );
    }

    #[test]
    fn a_kernel_that_cannot_run_its_block_size_is_refused() {
        assert!(check_threads("cuda:0", "sm_gemm", 1024, 256).is_ok());
        assert!(check_threads("cuda:0", "sm_gemm", 256, 256).is_ok());
        let e = check_threads("cuda:1", "sm_gemm", 128, 256).unwrap_err();
        assert!(
            matches!(&e, crate::Error::Unsupported { device, what }
                if device == "cuda:1" && what.contains("sm_gemm") && what.contains("128")),
            "{e}"
        );
        assert_eq!(threads_of("sm_gemm"), 256);
        assert_eq!(threads_of("sm_relu"), BLOCK);
    }
}
