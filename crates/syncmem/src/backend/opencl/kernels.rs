//! [`BackendKernels`] for OpenCL devices: the programs of [`super::program`], launched with the
//! one helper of [`super::launch`] on the stream's command queue.

use std::ptr;

use opencl3::memory::ClMem as _;
use opencl3::types::{cl_event, cl_mem, cl_ulong};

use super::launch::{groups_for, launch, u32_arg, Arg, Slot, MAX_LOCAL};
use super::{backend_error, ClDevice, ClMem, ClStream};
use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce};
use crate::dtype::{Float, ScalarKind};
use crate::error::Result;

/// Most work-groups launched for an element-wise kernel (a grid-stride loop covers the rest).
const MAX_GROUPS_ELEMENTWISE: usize = 1024;
/// Most work-groups (partial sums) launched for a reduction.
const MAX_GROUPS_REDUCE: usize = 256;

fn mem(m: &ClMem) -> cl_mem {
    m.buffer().get()
}

fn mem_or_null(m: Buf<'_, ClMem>) -> cl_mem {
    m.map_or(ptr::null_mut(), mem)
}

/// A floating-point kernel argument of type `F` (`float` or `double`).
fn value<F: Float>(a: F) -> Arg {
    match F::KIND {
        ScalarKind::F64 => Arg::F64(a.to_f64()),
        _ => Arg::F32(a.to_f64() as f32),
    }
}

impl ClDevice {
    /// Launches `slot` on `s` and waits for the command.
    fn run(
        &self,
        s: &ClStream,
        slot: &Slot,
        args: &[Arg],
        global: &[usize],
        local: &[usize],
    ) -> Result<()> {
        let event = launch(self.label(), slot, s.queue().get(), args, global, local)?;
        self.finish(event)
    }

    /// A one-dimensional launch over `n >= 1` items (grid-stride loop).
    fn run_elementwise(&self, s: &ClStream, slot: &Slot, n: usize, args: &[Arg]) -> Result<()> {
        let groups = groups_for(n, slot.local, MAX_GROUPS_ELEMENTWISE);
        self.run(s, slot, args, &[groups * slot.local], &[slot.local])
    }

    /// Waits for a launched command and releases its event.
    fn finish(&self, event: cl_event) -> Result<()> {
        let waited = opencl3::event::wait_for_events(&[event])
            .map_err(|c| backend_error(self.label(), "clWaitForEvents", c));
        // SAFETY: the event came from a successful enqueue, which handed us its one reference;
        // it is released exactly once, here.
        let _ = unsafe { opencl3::event::release_event(event) };
        waited
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
    ) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let l = self.label();
        let args = [
            u32_arg(g.m, "GEMM M", l)?,
            u32_arg(g.n, "GEMM N", l)?,
            u32_arg(g.k, "GEMM K", l)?,
            Arg::U32(g.ta.into()),
            Arg::U32(g.tb.into()),
            Arg::Mem(mem_or_null(a)),
            Arg::Mem(mem_or_null(b)),
            Arg::Mem(mem(c)),
            Arg::Mem(mem_or_null(bias)),
            Arg::U32(bias.is_some().into()),
        ];
        let t = ks.tiles;
        let local = t.local();
        let global = [
            g.n.div_ceil(t.tsn) * local[0],
            g.m.div_ceil(t.tsm) * local[1],
        ];
        self.run(s, &ks.gemm, &args, &global, &local)
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
        let l = self.label();
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "columns", l)?,
            Arg::Mem(mem_or_null(x)),
            Arg::Mem(mem(out)),
        ];
        let local = ks.col_sum.local;
        let global = cols.div_ceil(local) * local;
        self.run(s, &ks.col_sum, &args, &[global], &[local])
    }

    fn relu(&self, s: &ClStream, n: usize, x: &ClMem, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = [Arg::U64(n as cl_ulong), Arg::Mem(mem(x)), Arg::Mem(mem(y))];
        self.run_elementwise(s, &ks.relu, n, &args)
    }

    fn relu_grad(&self, s: &ClStream, n: usize, y: &ClMem, dy: &ClMem, dx: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = [
            Arg::U64(n as cl_ulong),
            Arg::Mem(mem(y)),
            Arg::Mem(mem(dy)),
            Arg::Mem(mem(dx)),
        ];
        self.run_elementwise(s, &ks.relu_grad, n, &args)
    }

    fn fill_f32(&self, s: &ClStream, n: usize, value: f32, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().ops(self)?;
        let args = [Arg::U64(n as cl_ulong), Arg::F32(value), Arg::Mem(mem(y))];
        self.run_elementwise(s, &ks.fill, n, &args)
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
    ) -> Result<Option<BadLabel>> {
        let ks = self.kernel_cache().ops(self)?;
        let l = self.label();
        let local = ks.softmax_loss.local;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            Arg::Mem(mem_or_null(x)),
            Arg::Mem(mem_or_null(labels)),
            Arg::Mem(mem_or_null(p)),
            Arg::Mem(mem(loss)),
            Arg::Local(local * std::mem::size_of::<f32>()),
        ];
        self.run(s, &ks.softmax_loss, &args, &[local], &[local])?;
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
        let l = self.label();
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            Arg::Mem(mem(p)),
            Arg::Mem(mem(labels)),
            Arg::Mem(mem_or_null(dloss)),
            Arg::U32(dloss.is_some().into()),
            Arg::Mem(mem(dx)),
        ];
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
        let l = self.label();
        let local = ks.accuracy.local;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            u32_arg(top_k, "top_k", l)?,
            Arg::Mem(mem_or_null(x)),
            Arg::Mem(mem_or_null(labels)),
            Arg::Mem(mem(out)),
            Arg::Local(local * std::mem::size_of::<f32>()),
        ];
        self.run(s, &ks.accuracy, &args, &[local], &[local])?;
        Ok(None)
    }

    fn axpy<F: Float>(&self, s: &ClStream, n: usize, a: F, x: &ClMem, y: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        let args = [
            Arg::U64(n as cl_ulong),
            value(a),
            Arg::Mem(mem(x)),
            Arg::Mem(mem(y)),
        ];
        self.run_elementwise(s, &ks.axpy, n, &args)
    }

    fn scale<F: Float>(&self, s: &ClStream, n: usize, a: F, x: &ClMem) -> Result<()> {
        let ks = self.kernel_cache().math(self, F::KIND)?;
        let args = [Arg::U64(n as cl_ulong), value(a), Arg::Mem(mem(x))];
        self.run_elementwise(s, &ks.scale, n, &args)
    }

    fn reduce_groups(&self, n: usize) -> usize {
        // The math kernels' work-group size is the same for every element type and kernel
        // of a device in practice; use the bound every reduction launch respects.
        groups_for(n, MAX_LOCAL, MAX_GROUPS_REDUCE)
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
        // As many work-groups as `reduce_groups` said, of the kernel's own size: each writes
        // one partial sum, and the grid-stride loop covers every element.
        let local = slot.local;
        let groups = self.reduce_groups(n);
        let args = [
            Arg::U64(n as cl_ulong),
            Arg::Mem(mem(x)),
            Arg::Mem(mem(partial)),
            Arg::Local(local * std::mem::size_of::<F>()),
        ];
        self.run(s, slot, &args, &[groups * local], &[local])
    }
}
