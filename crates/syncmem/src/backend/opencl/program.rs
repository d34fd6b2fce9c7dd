//! Building the OpenCL programs of one device, once: the operator kernels (one program, GEMM
//! tiles chosen for the device) and the math kernels (one program per element type). A failed
//! build is not kept: the next call tries again.
//!
//! # GEMM tiles
//!
//! `sm_gemm` computes `C[M,N] = op(A)·op(B) (+ bias)`, either operand transposed. A work-group
//! owns a `TSM × TSN` tile of C (64 × 64 by default) and walks K in steps of `TSK`, staging a
//! tile of each operand in local memory (k-major, zero-padded, so no size must be a multiple of
//! a tile). Each work-item computes a 4 × 8 block in four `float8` accumulators, so a
//! work-group is `(TSN/8) × (TSM/4)` = 8 × 16 work-items. PoCL runs a work-group as loops over
//! its work-items and only vectorises what the kernel makes explicit: the first version (16 × 16
//! tiles, one element per work-item) ran at 0.4 GFLOP/s on PoCL, this one at 2–6 GFLOP/s on the
//! same two loaded cores.
//!
//! Sizes per device are fixed at build time (`-D TSM/TSN/TSK`, `reqd_work_group_size`):
//! 64 × 64 when work-groups of 128 fit, else 32 × 32 or 16 × 16; `TSK` is the largest of 64,
//! 32, 16 whose two tiles take at most half the local memory (PoCL: 64; a 48 KiB GPU: 32).
//! When the compiled kernel cannot run that work-group size, the next smaller tiling is built.
//!
//! # CPU devices: register-blocked GEMM
//!
//! On a CPU device (PoCL) the tiled kernel is slow for two reasons: the runtime runs a
//! work-group as loops over its work-items split at each barrier, so the accumulators of every
//! work-item go to memory and back at each K step; and the zero padding of a tile costs full
//! work for the skinny shapes of a small MLP (`k = 2` inputs, `n = 3` classes, 64-row batches).
//! CPU devices therefore run `sm_gemm_rb_{nn,tn,nt,tt}` (one kernel per transpose pair, so the
//! layout branches fold at compile time): each work-item computes 8 rows x 32 columns of C over
//! the whole K in 16 `float16` registers, with no local memory and no barrier, and blocks at the
//! edges of C load only what exists. Measured on PoCL (2 cores, AVX-512) at the shapes of
//! `syncmem train --hidden 1024` (batch 64): about 4-7x the tiled kernel's GFLOP/s, and on the
//! skinny shapes (`n = 3`, `k = 2`, `m = 3`) 3-10x. GPUs keep the tiled kernel, whose local
//! memory is real.
//!
//! With op(B) transposed (the forward product of an FC layer, `X·Wᵀ`), a row of op(B) is a
//! load per column, `K` floats apart: a gather for every 8 FMAs (16 columns per work-item then), which held the forward GEMM of
//! `--hidden 1024` to ~47 GFLOP/s against ~200 for the backward ones. CPU devices run
//! `sm_gemm_rbl_{nt,tt}` for those instead ([`GemmKernel::Staged`]): the 8 work-items of a
//! work-group share a 32-column block of C (8 blocks of 8 rows: a 64-row batch), copy its 32
//! rows of B into local memory k-major, 128 values of k at a time (each work-item reads whole
//! rows, contiguous), and accumulate from there as `sm_gemm_rb` does, in the same order (the
//! same results bit for bit). The barriers store the accumulators once per 128 values of k.
//! Measured on PoCL (2 cores, AVX-512): the forward GEMM at hidden 1024 from 47 to 180-246
//! GFLOP/s, at hidden 256 from 134 to 145-193.
//!
//! Both kernels first computed 16 columns per work-item: per k, one `float16` of op(B) and 8
//! broadcasts for 8 FMAs, more loads than FMAs. With 32 columns (two `float16`, 16 FMAs for 10
//! loads) FC + FCGradient at hidden 1024 went from 189-199 to 263-278 GFLOP/s (the backward
//! products from 175-188 to 280-288), 36-40% to 52-54% of the 2-core FMA peak.

use std::mem::ManuallyDrop;

use opencl3::device::Device as ClDeviceHandle;
use opencl3::error_codes::ClError;
use opencl3::program::Program;

use super::handle::OwnedProgram;
use super::launch::Slot;
use super::math_source::{ELEMENTWISE, MATH};
use super::source::OPS;
use super::{backend_error, ClDevice};
use crate::backend::cache::{BuildMap, BuildOnce};
use crate::backend::Gemm;
use crate::dtype::ScalarKind;
use crate::error::{Error, Result};

/// GEMM tiling: `tsm x tsn` elements of C per work-group, `tsk` along K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tiles {
    pub(super) tsm: usize,
    pub(super) tsn: usize,
    pub(super) tsk: usize,
}

impl Tiles {
    /// Work-items per work-group: each computes 4 x 8 elements of C.
    pub(super) fn work_group(self) -> usize {
        (self.tsm / 4) * (self.tsn / 8)
    }

    /// The local work size `[columns, rows]` of a launch.
    pub(super) fn local(self) -> [usize; 2] {
        [self.tsn / 8, self.tsm / 4]
    }
}

/// Tile candidates for a device, best first (see the module docs).
pub(super) fn tile_candidates(max_wg: usize, local_mem: u64) -> Vec<Tiles> {
    [64usize, 32, 16]
        .into_iter()
        .filter_map(|t| {
            let tsk = [64usize, 32, 16]
                .into_iter()
                .find(|k| ((2 * t * k * 4) as u64) <= local_mem / 2)?;
            let tiles = Tiles {
                tsm: t,
                tsn: t,
                tsk,
            };
            (tiles.work_group() <= max_wg).then_some(tiles)
        })
        .collect()
}

/// Work-items per work-group of the register-blocked GEMM (along columns; one row of blocks).
pub(super) const RB_LOCAL: [usize; 2] = [8, 1];
/// Work-items per work-group of the register-blocked GEMM with B staged in local memory (along
/// rows: they share one block of 32 columns; `SM_RBL_R` in the kernel source).
pub(super) const RBL_LOCAL: [usize; 2] = [1, 8];
/// Rows and columns of C one work-item of the register-blocked GEMM computes.
pub(super) const RB_BLOCK: (usize, usize) = (8, 32);

/// The GEMM kernels of the operator program (see the module docs); every device builds all
/// three, and any of them computes any GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmKernel {
    /// `sm_gemm`: tiles in local memory (GPUs).
    Tiled,
    /// `sm_gemm_rb_*`: register blocks, no local memory (CPU devices).
    RegisterBlocked,
    /// `sm_gemm_rbl_*`: register blocks with a transposed B staged in local memory (CPU
    /// devices, op(B) transposed).
    Staged,
}

/// The operator kernels of one device.
pub(crate) struct OpKernels {
    /// The GEMM tiling the program was built with.
    pub(super) tiles: Tiles,
    /// The GEMM that [`super::ClDevice::gemm`] runs: the register-blocked kernels on a CPU
    /// device, else the tiled one.
    pub(crate) register_blocked: bool,
    pub(super) gemm: Slot,
    /// The register-blocked GEMMs, indexed by `2 * ta + tb`.
    pub(super) gemm_rb: [Slot; 4],
    /// The register-blocked GEMMs of a transposed B staged in local memory (`nt`, `tt`), when
    /// the device runs their work-groups.
    pub(super) gemm_rbl: Option<[Slot; 2]>,
    pub(super) col_sum: Slot,
    pub(super) relu: Slot,
    pub(super) relu_grad: Slot,
    pub(super) fill: Slot,
    pub(super) softmax_loss: Slot,
    pub(super) softmax_loss_grad: Slot,
    pub(super) accuracy: Slot,
    // Declared last: dropped after the kernels that reference it.
    _program: OwnedProgram,
}

#[cfg(test)]
impl OpKernels {
    /// Whether the register-blocked GEMMs with a staged B were built (for the GEMM tests).
    pub(crate) fn has_gemm_rbl(&self) -> bool {
        self.gemm_rbl.is_some()
    }
}

impl OpKernels {
    /// The GEMM kernel a CPU device runs for `g` when [`OpKernels::register_blocked`]:
    /// B staged in local memory when op(B) is transposed (and the device runs those
    /// work-groups), else register-blocked.
    pub(super) fn default_gemm(&self, g: &Gemm) -> GemmKernel {
        match (self.register_blocked, g.tb && self.gemm_rbl.is_some()) {
            (false, _) => GemmKernel::Tiled,
            (true, true) => GemmKernel::Staged,
            (true, false) => GemmKernel::RegisterBlocked,
        }
    }

    /// The kernel `kernel` for `g` and its global and local sizes `[columns, rows]`
    /// ([`GemmKernel::Staged`] runs as register-blocked where it does not apply).
    pub(super) fn gemm_launch(
        &self,
        g: &Gemm,
        kernel: GemmKernel,
    ) -> (&Slot, [usize; 2], [usize; 2]) {
        match (kernel, &self.gemm_rbl) {
            (GemmKernel::Staged, Some(rbl)) if g.tb => {
                (&rbl[usize::from(g.ta)], rbl_global(g.m, g.n), RBL_LOCAL)
            }
            (GemmKernel::Staged | GemmKernel::RegisterBlocked, _) => {
                let slot = &self.gemm_rb[2 * usize::from(g.ta) + usize::from(g.tb)];
                (slot, rb_global(g.m, g.n), RB_LOCAL)
            }
            (GemmKernel::Tiled, _) => {
                let t = self.tiles;
                let local = t.local();
                let global = [
                    g.n.div_ceil(t.tsn) * local[0],
                    g.m.div_ceil(t.tsm) * local[1],
                ];
                (&self.gemm, global, local)
            }
        }
    }
}

/// The global size `[columns, rows]` of a register-blocked GEMM of `m x n` (both >= 1): one
/// work-item per block of C, rounded up to whole work-groups.
pub(super) fn rb_global(m: usize, n: usize) -> [usize; 2] {
    let (rows, cols) = RB_BLOCK;
    [
        n.div_ceil(cols).next_multiple_of(RB_LOCAL[0]),
        m.div_ceil(rows).next_multiple_of(RB_LOCAL[1]),
    ]
}

/// The global size `[columns, rows]` of a register-blocked GEMM of `m x n` with B staged in
/// local memory: one work-group per 32 columns of C, [`RBL_LOCAL`] blocks of rows each.
pub(super) fn rbl_global(m: usize, n: usize) -> [usize; 2] {
    let (rows, cols) = RB_BLOCK;
    [
        n.div_ceil(cols),
        m.div_ceil(rows).next_multiple_of(RBL_LOCAL[1]),
    ]
}

/// The math kernels of one device and element type.
pub(super) struct MathKernels {
    pub(super) axpy: Slot,
    pub(super) axpy_multi: Slot,
    pub(super) scale: Slot,
    pub(super) asum: Slot,
    pub(super) sumsq: Slot,
    // Declared last: dropped after the kernels that reference it.
    _program: OwnedProgram,
}

/// The compiled kernels of one OpenCL device, built on first use. Handles made by
/// `Device::detached` share them (same hardware, same context).
#[derive(Default)]
pub(crate) struct KernelCache {
    ops: BuildOnce<OpKernels>,
    f32: BuildOnce<MathKernels>,
    f64: BuildOnce<MathKernels>,
    /// The programs of the user's kernels (see [`super::user`]).
    pub(super) user: super::user::UserPrograms,
    /// The operator programs with a user's GEMM epilogue, by prelude
    /// ([`crate::backend::epilogue`]).
    epilogues: BuildMap<String, OpKernels>,
}

impl KernelCache {
    /// The operator kernels of `dev`.
    pub(crate) fn ops(&self, dev: &ClDevice) -> Result<std::sync::Arc<OpKernels>> {
        self.ops.get_or_build(|| build_ops(dev))
    }

    /// The operator kernels of `dev` with a user's GEMM epilogue: the operator program built
    /// once per `prelude` (the tiles of [`KernelCache::ops`]), after `prelude`.
    pub(crate) fn ops_with_epilogue(
        &self,
        dev: &ClDevice,
        prelude: &str,
    ) -> Result<std::sync::Arc<OpKernels>> {
        let tiles = self.ops(dev)?.tiles;
        let slot = self.epilogues.slot_of(prelude);
        slot.get_or_build(|| {
            // With the bodies on vectors first (`SM_USER_VECTOR`), else lane by lane.
            let vector = format!("#define SM_USER_VECTOR 1\n{prelude}");
            let built = match build_ops_with(dev, tiles, &vector) {
                Ok(k) => k,
                Err(_) => build_ops_with(dev, tiles, prelude)?,
            };
            built.ok_or_else(|| Error::Unsupported {
                device: dev.label().to_string(),
                what: "the GEMM with a user's epilogue does not fit the device's work-groups"
                    .into(),
            })
        })
    }

    /// The math kernels of `kind` (`f32` or `f64`) on `dev`.
    pub(super) fn math(
        &self,
        dev: &ClDevice,
        kind: ScalarKind,
    ) -> Result<std::sync::Arc<MathKernels>> {
        match kind {
            ScalarKind::F64 => self.f64.get_or_build(|| build_math(dev, "double")),
            _ => self.f32.get_or_build(|| build_math(dev, "float")),
        }
    }
}

/// Creates and builds `source` with `options` for `dev`; on failure, the error and the build
/// log (empty when the program was not created).
pub(super) fn compile_program(
    dev: &ClDevice,
    source: &str,
    options: &str,
) -> std::result::Result<OwnedProgram, (Error, String)> {
    let label = dev.label();
    let id = dev.device_id();
    let program = Program::create_from_source(dev.context(), source).map_err(|ClError(c)| {
        (
            backend_error(label, "clCreateProgramWithSource", c),
            String::new(),
        )
    })?;
    let mut program = OwnedProgram(ManuallyDrop::new(program));
    if let Err(ClError(code)) = program.0.build(&[id], options) {
        let log = program.0.get_build_log(id).unwrap_or_default();
        return Err((
            backend_error(label, "clBuildProgram", code),
            log.trim().to_string(),
        ));
    }
    Ok(program)
}

/// The build option that selects the element-wise mapping of `dev` (see [`ELEMENTWISE`]).
fn elementwise_option(dev: &ClDevice) -> &'static str {
    if dev.cpu {
        " -D SM_CONTIGUOUS"
    } else {
        ""
    }
}

/// Creates and builds `source` with `options` for `dev`; the build log joins the error.
fn build_program(dev: &ClDevice, source: &str, options: &str, what: &str) -> Result<OwnedProgram> {
    compile_program(dev, source, options).map_err(|(mut e, log)| {
        if let Error::Backend { message, .. } = &mut e {
            message.push_str(&format!("; {what} ({options}), build log: {log}"));
        }
        e
    })
}

fn build_ops(dev: &ClDevice) -> Result<OpKernels> {
    let label = dev.label();
    let info = ClDeviceHandle::new(dev.device_id());
    let max_wg = info
        .max_work_group_size()
        .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(MAX_WORK_GROUP_SIZE)", c))?;
    let local_mem = info
        .local_mem_size()
        .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(LOCAL_MEM_SIZE)", c))?;
    let candidates = tile_candidates(max_wg, local_mem);
    let mut last = None;
    for tiles in &candidates {
        match build_ops_with(dev, *tiles, "")? {
            Some(k) => return Ok(k),
            None => last = Some(*tiles),
        }
    }
    Err(Error::Unsupported {
        device: label.to_string(),
        what: format!(
            "the GEMM kernel does not fit the device (max work-group {max_wg}, local memory \
             {local_mem} bytes; last tiles tried: {last:?})"
        ),
    })
}

/// Builds the operator program with `tiles`; `None` when the GEMM kernel cannot run
/// work-groups of that size on the device (register pressure), so that smaller tiles are tried.
/// `prelude` goes first (a user's GEMM epilogue, or nothing).
fn build_ops_with(dev: &ClDevice, tiles: Tiles, prelude: &str) -> Result<Option<OpKernels>> {
    let (label, id) = (dev.label(), dev.device_id());
    let options = format!(
        "-D TSM={} -D TSN={} -D TSK={}{}",
        tiles.tsm,
        tiles.tsn,
        tiles.tsk,
        elementwise_option(dev)
    );
    let source = format!("{prelude}{ELEMENTWISE}{OPS}");
    let program = build_program(dev, &source, &options, "operator kernels")?;
    let gemm = Slot::new(&program, id, "sm_gemm", label)?;
    if gemm.max_work_group < tiles.work_group() {
        return Ok(None);
    }
    let slot = |name| Slot::new(&program, id, name, label);
    let gemm_rb = [
        slot("sm_gemm_rb_nn")?,
        slot("sm_gemm_rb_nt")?,
        slot("sm_gemm_rb_tn")?,
        slot("sm_gemm_rb_tt")?,
    ];
    let rb_fits = gemm_rb
        .iter()
        .all(|s| s.max_work_group >= RB_LOCAL[0] * RB_LOCAL[1]);
    let gemm_rbl = [slot("sm_gemm_rbl_nt")?, slot("sm_gemm_rbl_tt")?];
    let gemm_rbl = gemm_rbl
        .iter()
        .all(|s| s.max_work_group >= RBL_LOCAL[0] * RBL_LOCAL[1])
        .then_some(gemm_rbl);
    Ok(Some(OpKernels {
        tiles,
        register_blocked: dev.cpu && rb_fits,
        gemm,
        gemm_rb,
        gemm_rbl,
        col_sum: slot("sm_col_sum")?,
        relu: slot("sm_relu")?,
        relu_grad: slot("sm_relu_grad")?,
        fill: slot("sm_fill")?,
        softmax_loss: slot("sm_softmax_loss")?,
        softmax_loss_grad: slot("sm_softmax_loss_grad")?,
        accuracy: slot("sm_accuracy")?,
        _program: program,
    }))
}

/// Builds the math program for the OpenCL C type `ty` (`float` or `double`).
fn build_math(dev: &ClDevice, ty: &str) -> Result<MathKernels> {
    let label = dev.label();
    let mut header = format!("#define T {ty}\n");
    if ty == "double" {
        let exts = ClDeviceHandle::new(dev.device_id())
            .extensions()
            .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(EXTENSIONS)", c))?;
        if !exts.split_whitespace().any(|e| e == "cl_khr_fp64") {
            return Err(Error::Unsupported {
                device: label.to_string(),
                what: format!(
                    "f64 kernels: the device does not report cl_khr_fp64 (extensions: {exts})"
                ),
            });
        }
        header.push_str("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n");
    }
    let source = header + ELEMENTWISE + MATH;
    let what = format!("{ty} math kernels");
    let program = build_program(dev, &source, elementwise_option(dev), &what)?;
    let slot = |name| Slot::new(&program, dev.device_id(), name, label);
    Ok(MathKernels {
        axpy: slot("sm_axpy")?,
        axpy_multi: slot("sm_axpy_multi")?,
        scale: slot("sm_scale")?,
        asum: slot("sm_asum")?,
        sumsq: slot("sm_sumsq")?,
        _program: program,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::dispatch::RawDevice;
    use crate::testing::opencl_or_skip;
    use std::sync::Arc;

    #[test]
    fn kernels_are_built_once_per_device_and_shared_by_duplicates() {
        let Some(dev) = opencl_or_skip("backend::opencl::program::kernels_are_built_once") else {
            return;
        };
        let RawDevice::OpenCl(cl) = &dev.shared.raw else {
            panic!("not an OpenCL device");
        };
        let cache = cl.kernel_cache();
        let a = cache.ops(cl).unwrap();
        assert!(Arc::ptr_eq(&a, &cache.ops(cl).unwrap()), "built once");
        assert_eq!(
            a.tiles.local()[0] * a.tiles.local()[1],
            a.tiles.work_group()
        );
        for s in [&a.relu, &a.softmax_loss, &a.accuracy, &a.col_sum] {
            assert!(s.local.is_power_of_two() && s.local <= super::super::launch::MAX_LOCAL);
        }
        let f = cache.math(cl, ScalarKind::F32).unwrap();
        assert!(Arc::ptr_eq(&f, &cache.math(cl, ScalarKind::F32).unwrap()));
        if let Ok(d) = cache.math(cl, ScalarKind::F64) {
            assert!(!Arc::ptr_eq(&f, &d), "one program per element type");
        }
        // A detached handle of the same hardware shares the built programs.
        let other = dev.isolated();
        let RawDevice::OpenCl(cl2) = &other.shared.raw else {
            panic!("not an OpenCL device");
        };
        assert!(Arc::ptr_eq(&a, &cl2.kernel_cache().ops(cl2).unwrap()));
    }

    #[test]
    fn register_blocked_grids_cover_c_in_whole_work_groups() {
        for (m, n) in [(1, 1), (64, 3), (3, 1024), (64, 1024), (1024, 2), (65, 129)] {
            let g = rb_global(m, n);
            assert_eq!(g[0] % RB_LOCAL[0], 0);
            assert_eq!(g[1] % RB_LOCAL[1], 0);
            assert!(
                g[0] * RB_BLOCK.1 >= n && g[1] * RB_BLOCK.0 >= m,
                "{m} x {n}: {g:?}"
            );
            // Less than one work-group of padding in each direction.
            assert!((g[0] - RB_LOCAL[0]) * RB_BLOCK.1 < n, "{m} x {n}: {g:?}");
            assert!((g[1] - RB_LOCAL[1]) * RB_BLOCK.0 < m, "{m} x {n}: {g:?}");
            // Staged: one work-group per 32 columns, whole work-groups of row blocks.
            let g = rbl_global(m, n);
            assert_eq!(g[0], n.div_ceil(RB_BLOCK.1), "{m} x {n}: {g:?}");
            assert_eq!(g[1] % RBL_LOCAL[1], 0);
            assert!(g[1] * RB_BLOCK.0 >= m, "{m} x {n}: {g:?}");
            assert!((g[1] - RBL_LOCAL[1]) * RB_BLOCK.0 < m, "{m} x {n}: {g:?}");
        }
    }

    #[test]
    fn tiles_follow_the_device_limits() {
        let t = |tsm, tsk| Tiles { tsm, tsn: tsm, tsk };
        // PoCL: work-groups of 4096, 2 MiB of local memory.
        assert_eq!(tile_candidates(4096, 2 << 20)[0], t(64, 64));
        // A GPU with 48 KiB of local memory: K step 32 (16 KiB of tiles).
        assert_eq!(tile_candidates(1024, 48 << 10)[0], t(64, 32));
        // Small work-groups: smaller tiles.
        assert_eq!(tile_candidates(64, 32 << 10), vec![t(32, 64), t(16, 64)]);
        assert!(tile_candidates(4, 1 << 20).is_empty());
    }
}
