//! [`BackendKernels`] for OpenCL devices: the programs of [`super::program`], launched with the
//! one helper of [`super::launch`] on the stream's command queue, with the argument lists of
//! [`crate::backend::args`].

use opencl3::memory::ClMem as _;
use opencl3::types::cl_mem;

use super::launch::{groups_for, launch, Arg, Grid, Slot};
use super::program::GemmKernel;
use super::{ClDevice, ClMem, ClStream};
use crate::backend::args;
use crate::backend::epilogue::{Dialect, EpilogueCode};
use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce, SoftmaxExtra, AXPY_MULTI};
use crate::dtype::{Float, ScalarKind};
use crate::error::Result;

/// Largest one-dimensional work-group size used by the math reductions.
const MAX_LOCAL_REDUCE: usize = 256;
/// Most work-groups launched for an element-wise kernel on a GPU (a grid-stride loop covers
/// the rest).
const MAX_GROUPS_ELEMENTWISE: usize = 1024;
/// On a CPU device, the fewest elements of an element-wise kernel per work-item (each takes
/// one contiguous run of elements, see `SM_FOR_EACH`).
pub(crate) const CPU_RUN: usize = 8192;
/// On a CPU device, the most work-items (one per work-group) of an element-wise kernel per
/// compute unit, and at least [`CPU_MIN_RUNS`]: enough to balance the runtime's threads, few
/// enough that the cost of each group stays small next to its work.
const CPU_RUNS_PER_UNIT: usize = 4;
/// See [`CPU_RUNS_PER_UNIT`].
const CPU_MIN_RUNS: usize = 32;
/// Pairs of [`BackendKernels::axpy_multi`] of at least this many elements get an `sm_axpy`
/// launch of their own.
const AXPY_MULTI_LARGE: usize = 1 << 14;
/// Most work-groups (partial sums) launched for a reduction.
const MAX_GROUPS_REDUCE: usize = 256;

fn mem(m: &ClMem) -> cl_mem {
    m.buffer().get()
}

fn opt(m: Buf<'_, ClMem>) -> Option<cl_mem> {
    m.map(mem)
}

/// The global and local sizes of a one-dimensional launch of `groups` work-groups of `local`
/// items.
fn linear(groups: usize, local: usize) -> ([usize; 1], [usize; 1]) {
    ([groups * local], [local])
}

impl ClDevice {
    /// Queues `slot` on `s` and returns at once: the command's event joins the stream's
    /// timeline, where the buffers' users find it.
    pub(super) fn run(
        &self,
        s: &ClStream,
        slot: &Slot,
        args: &[Arg],
        grid: Grid<'_>,
    ) -> Result<()> {
        s.submit(|| launch(self.label(), slot, s.queue().get(), args, &grid))
            .map(drop)
    }

    /// A one-dimensional launch over `n >= 1` items (`SM_FOR_EACH`: a grid-stride loop on a
    /// GPU, one contiguous run per work-item on a CPU device).
    fn run_elementwise(&self, s: &ClStream, slot: &Slot, n: usize, args: &[Arg]) -> Result<()> {
        self.run_items(s, slot, (n, n), args)
    }

    /// [`ClDevice::run_elementwise`] over `n >= 1` items that cover `elements` elements (a
    /// kernel whose items are blocks of elements): a CPU device's runs are sized by elements.
    fn run_items(
        &self,
        s: &ClStream,
        slot: &Slot,
        (n, elements): (usize, usize),
        args: &[Arg],
    ) -> Result<()> {
        let (global, local) = if self.cpu {
            // One work-item per group, each a contiguous run (see `SM_FOR_EACH`).
            linear(self.cpu_runs(elements).min(n), 1)
        } else {
            linear(
                groups_for(n, slot.local, MAX_GROUPS_ELEMENTWISE),
                slot.local,
            )
        };
        let grid = Grid {
            global: &global,
            local: &local,
            scratch: None,
        };
        self.run(s, slot, args, grid)
    }

    /// On a CPU device, the work-items of an element-wise kernel or a reduction over `n`
    /// elements (one per work-group, each a contiguous run).
    pub(crate) fn cpu_runs(&self, n: usize) -> usize {
        let most = (CPU_RUNS_PER_UNIT * self.compute_units).max(CPU_MIN_RUNS);
        n.div_ceil(CPU_RUN).clamp(1, most)
    }

    /// One work-group of `slot`'s size with a `float` scratch per work-item.
    fn run_one_group(&self, s: &ClStream, slot: &Slot, args: &[Arg]) -> Result<()> {
        let local = [slot.local];
        let grid = Grid {
            global: &local,
            local: &local,
            scratch: Some(slot.local * std::mem::size_of::<f32>()),
        };
        self.run(s, slot, args, grid)
    }
}

/// The operands of a GEMM: `A`, `B`, `C`, bias, mask, column sums of `A`.
type GemmOperands<'a> = (
    Buf<'a, ClMem>,
    Buf<'a, ClMem>,
    &'a ClMem,
    Buf<'a, ClMem>,
    Buf<'a, ClMem>,
    Buf<'a, ClMem>,
);

impl ClDevice {
    /// [`BackendKernels::gemm`] with the GEMM kernel `kernel` (see [`super::program`]); any
    /// of them works on any device that built them.
    pub(crate) fn gemm_on(
        &self,
        s: &ClStream,
        g: &Gemm,
        (a, b, c, bias, mask, sum): GemmOperands<'_>,
        kernel: GemmKernel,
    ) -> Result<()> {
        let ks = match g.user {
            Some(act) => {
                let prelude = EpilogueCode::prelude(act, Dialect::OpenCl, self.label())?;
                self.kernel_cache().ops_with_epilogue(self, prelude)?
            }
            None => self.kernel_cache().ops(self)?,
        };
        let args = args::gemm(
            self.label(),
            g,
            opt(a),
            opt(b),
            mem(c),
            opt(bias),
            opt(mask),
            opt(sum),
        )?;
        let (slot, global, local) = ks.gemm_launch(g, kernel);
        let grid = Grid {
            global: &global,
            local: &local,
            scratch: None,
        };
        self.run(s, slot, &args, grid)
    }
}

impl BackendKernels for ClDevice {
    type Stream = ClStream;
    type Mem = ClMem;

    fn prepare_math(&self, kind: ScalarKind) -> Result<()> {
        self.kernel_cache().math(self, kind).map(drop)
    }

    fn gemm(
        &self,
        s: &ClStream,
        g: &Gemm,
        a: Buf<'_, ClMem>,
        b: Buf<'_, ClMem>,
        c: &ClMem,
        bias: Buf<'_, ClMem>,
        mask: Buf<'_, ClMem>,
        sum: Buf<'_, ClMem>,
    ) -> Result<()> {
        let kernel = self.kernel_cache().ops(self)?.default_gemm(g);
        self.gemm_on(s, g, (a, b, c, bias, mask, sum), kernel)
    }

    fn col_sum(
        &self,
        s: &ClStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, ClMem>,
        out: &ClMem,
    ) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::col_sum(self.label(), rows, cols, opt(x), mem(out))?;
        let slot = &ks.col_sum;
        let (global, local) = linear(cols.div_ceil(slot.local), slot.local);
        let grid = Grid {
            global: &global,
            local: &local,
            scratch: None,
        };
        self.run(s, slot, &args, grid)
    }

    fn relu(&self, s: &ClStream, n: usize, x: &ClMem, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        self.run_elementwise(s, &ks.relu, n, &args::relu(n, mem(x), mem(y)))
    }

    fn relu_grad(&self, s: &ClStream, n: usize, y: &ClMem, dy: &ClMem, dx: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::relu_grad(n, mem(y), mem(dy), mem(dx));
        self.run_elementwise(s, &ks.relu_grad, n, &args)
    }

    fn fill_f32(&self, s: &ClStream, n: usize, value: f32, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        self.run_elementwise(s, &ks.fill, n, &args::fill(n, value, mem(y)))
    }

    fn softmax_loss(
        &self,
        s: &ClStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, ClMem>,
        labels: Buf<'_, ClMem>,
        p: Buf<'_, ClMem>,
        loss: &ClMem,
        extra: SoftmaxExtra<'_, ClMem>,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::softmax_loss(
            self.label(),
            (rows, cols),
            opt(x),
            opt(labels),
            opt(p),
            mem(loss),
            extra.accuracy.map(|(k, a)| (k, mem(a))),
            opt(extra.grad),
            opt(extra.scalars),
        )?;
        self.run_one_group(s, &ks.softmax_loss, &args)?;
        Ok(None)
    }

    fn softmax_loss_grad(
        &self,
        s: &ClStream,
        rows: usize,
        cols: usize,
        p: &ClMem,
        labels: &ClMem,
        dloss: Buf<'_, ClMem>,
        dx: &ClMem,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::softmax_loss_grad(
            self.label(),
            (rows, cols),
            mem(p),
            mem(labels),
            opt(dloss),
            mem(dx),
        )?;
        self.run_elementwise(s, &ks.softmax_loss_grad, rows * cols, &args)?;
        Ok(None)
    }

    fn accuracy(
        &self,
        s: &ClStream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: Buf<'_, ClMem>,
        labels: Buf<'_, ClMem>,
        out: &ClMem,
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let args = args::accuracy(
            self.label(),
            (rows, cols, top_k),
            opt(x),
            opt(labels),
            mem(out),
        )?;
        self.run_one_group(s, &ks.accuracy, &args)?;
        Ok(None)
    }

    fn axpy<F: Float>(&self, s: &ClStream, n: usize, a: F, x: &ClMem, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        self.run_elementwise(s, &ks.axpy, n, &args::axpy(n, a, mem(x), mem(y)))
    }

    fn axpy_multi<F: Float>(
        &self,
        s: &ClStream,
        a: F,
        pairs: &[(usize, &ClMem, &ClMem)],
    ) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        let slot = &ks.axpy_multi;
        let mut raw = [(0, std::ptr::null_mut(), std::ptr::null_mut()); AXPY_MULTI];
        let mut count = 0;
        for &(n, x, y) in pairs.iter().take(AXPY_MULTI) {
            if n >= AXPY_MULTI_LARGE {
                // Large enough that a launch of its own costs little next to the work, which
                // `sm_axpy` does faster.
                self.axpy(s, n, a, x, y)?;
            } else {
                raw[count] = (n, mem(x), mem(y));
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let longest = raw[..count].iter().map(|p| p.0).max().unwrap_or(1);
        // The kernel's items are blocks of 8 elements.
        self.run_items(
            s,
            slot,
            (longest.div_ceil(8), longest),
            &args::axpy_multi(a, &raw[..count]),
        )
    }

    fn scale<F: Float>(&self, s: &ClStream, n: usize, a: F, x: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        self.run_elementwise(s, &ks.scale, n, &args::scale(n, a, mem(x)))
    }

    fn reduce_groups(&self, n: usize) -> usize {
        if self.cpu {
            return self.cpu_runs(n);
        }
        // The math kernels' work-group size is the same for every element type and kernel
        // of a device in practice; use the bound every reduction launch respects.
        groups_for(n, MAX_LOCAL_REDUCE, MAX_GROUPS_REDUCE)
    }

    fn reduce_partials<F: Float>(
        &self,
        s: &ClStream,
        op: Reduce,
        n: usize,
        x: &ClMem,
        partial: &ClMem,
    ) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        let slot = match op {
            Reduce::Asum => &ks.asum,
            Reduce::Sumsq => &ks.sumsq,
        };
        // As many work-groups as `reduce_groups` said, each writing one partial sum, and
        // `SM_FOR_EACH` covers every element: of the kernel's own size on a GPU, of one
        // work-item (one contiguous run) on a CPU device.
        let size = if self.cpu { 1 } else { slot.local };
        let (global, local) = linear(self.reduce_groups(n), size);
        let grid = Grid {
            global: &global,
            local: &local,
            scratch: Some(size * std::mem::size_of::<F>()),
        };
        self.run(s, slot, &args::reduce(n, mem(x), mem(partial)), grid)
    }
}
