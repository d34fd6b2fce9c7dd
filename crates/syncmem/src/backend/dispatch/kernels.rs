//! The kernels of [`BackendKernels`], dispatched: a [`RawDevice`], a [`RawStream`] of the same
//! backend and its [`RawMem`] operands go to the backend's implementation, with one `match`
//! per kernel. Memory of another backend is a [`crate::Error::DeviceMismatch`].

use super::{mismatch, RawDevice, RawMem, RawStream};
use smallvec::SmallVec;

use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce, SoftmaxExtra, AXPY_MULTI};
use crate::dtype::{Float, ScalarKind};
use crate::error::Result;

macro_rules! mem_fn {
    ($name:ident, $variant:ident, $ty:ty) => {
        /// The backend memory of `m`, when it is of this backend.
        fn $name(m: &RawMem) -> Option<&$ty> {
            match m {
                RawMem::$variant(x) => Some(x),
                #[allow(unreachable_patterns)]
                _ => None,
            }
        }
    };
}
mem_fn!(cpu_mem, Cpu, crate::backend::cpu::CpuMem);
#[cfg(feature = "opencl")]
mem_fn!(cl_mem, OpenCl, crate::backend::opencl::ClMem);
#[cfg(feature = "cuda")]
mem_fn!(cu_mem, Cuda, crate::backend::cuda::CuMem);

/// Runs `$body` with `$d` the backend device, `$s` the backend stream and `$m` the function
/// from a [`RawMem`] to the backend's memory.
macro_rules! dispatch {
    ($dev:expr, $stream:expr, |$d:ident, $s:ident, $m:ident| $body:expr) => {
        match ($dev, $stream) {
            (RawDevice::Cpu($d), RawStream::Cpu($s)) => {
                let $m = cpu_mem;
                $body
            }
            #[cfg(feature = "opencl")]
            (RawDevice::OpenCl($d), RawStream::OpenCl($s)) => {
                let $m = cl_mem;
                $body
            }
            #[cfg(feature = "cuda")]
            (RawDevice::Cuda($d), RawStream::Cuda($s)) => {
                let $m = cu_mem;
                $body
            }
            #[allow(unreachable_patterns)]
            _ => Err(mismatch("kernel launch", &$dev.info().label())),
        }
    };
}

/// The backend memory of a required operand.
fn req<'b, M>(
    m: &'b RawMem,
    mem: fn(&'b RawMem) -> Option<&'b M>,
    dev: &RawDevice,
) -> Result<&'b M> {
    mem(m).ok_or_else(|| mismatch("kernel launch", &dev.info().label()))
}

/// The backend memory of an operand that may be empty (`None`).
fn opt<'b, M>(
    m: Option<&'b RawMem>,
    mem: fn(&'b RawMem) -> Option<&'b M>,
    dev: &RawDevice,
) -> Result<Buf<'b, M>> {
    m.map(|m| req(m, mem, dev)).transpose()
}

/// A memory operand that may be empty.
pub(crate) type RawBuf<'a> = Option<&'a RawMem>;

impl RawDevice {
    /// See [`BackendKernels::prepare_math`].
    pub(crate) fn prepare_math(&self, s: &RawStream, kind: ScalarKind) -> Result<()> {
        dispatch!(self, s, |d, _s, _m| d.prepare_math(kind))
    }

    /// See [`BackendKernels::gemm`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        s: &RawStream,
        g: &Gemm,
        a: RawBuf<'_>,
        b: RawBuf<'_>,
        c: &RawMem,
        bias: RawBuf<'_>,
        mask: RawBuf<'_>,
        sum: RawBuf<'_>,
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.gemm(
            s,
            g,
            opt(a, m, self)?,
            opt(b, m, self)?,
            req(c, m, self)?,
            opt(bias, m, self)?,
            opt(mask, m, self)?,
            opt(sum, m, self)?
        ))
    }

    /// See [`BackendKernels::col_sum`].
    pub(crate) fn col_sum(
        &self,
        s: &RawStream,
        rows: usize,
        cols: usize,
        x: RawBuf<'_>,
        out: &RawMem,
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.col_sum(
            s,
            rows,
            cols,
            opt(x, m, self)?,
            req(out, m, self)?
        ))
    }

    /// See [`BackendKernels::relu`].
    pub(crate) fn relu(&self, s: &RawStream, n: usize, x: &RawMem, y: &RawMem) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.relu(
            s,
            n,
            req(x, m, self)?,
            req(y, m, self)?
        ))
    }

    /// See [`BackendKernels::relu_grad`].
    pub(crate) fn relu_grad(
        &self,
        s: &RawStream,
        n: usize,
        y: &RawMem,
        dy: &RawMem,
        dx: &RawMem,
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.relu_grad(
            s,
            n,
            req(y, m, self)?,
            req(dy, m, self)?,
            req(dx, m, self)?
        ))
    }

    /// See [`BackendKernels::fill_f32`].
    pub(crate) fn fill_f32(&self, s: &RawStream, n: usize, value: f32, y: &RawMem) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.fill_f32(s, n, value, req(y, m, self)?))
    }

    /// See [`BackendKernels::softmax_loss`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss(
        &self,
        s: &RawStream,
        rows: usize,
        cols: usize,
        x: RawBuf<'_>,
        labels: RawBuf<'_>,
        p: RawBuf<'_>,
        loss: &RawMem,
        extra: SoftmaxExtra<'_, RawMem>,
    ) -> Result<Option<BadLabel>> {
        dispatch!(self, s, |d, s, m| {
            let accuracy = match extra.accuracy {
                Some((k, a)) => Some((k, req(a, m, self)?)),
                None => None,
            };
            let grad = opt(extra.grad, m, self)?;
            let scalars = opt(extra.scalars, m, self)?;
            let extra = SoftmaxExtra {
                accuracy,
                grad,
                scalars,
            };
            d.softmax_loss(
                s,
                rows,
                cols,
                opt(x, m, self)?,
                opt(labels, m, self)?,
                opt(p, m, self)?,
                req(loss, m, self)?,
                extra,
            )
        })
    }

    /// See [`BackendKernels::softmax_loss_grad`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss_grad(
        &self,
        s: &RawStream,
        rows: usize,
        cols: usize,
        p: &RawMem,
        labels: &RawMem,
        dloss: RawBuf<'_>,
        dx: &RawMem,
    ) -> Result<Option<BadLabel>> {
        dispatch!(self, s, |d, s, m| d.softmax_loss_grad(
            s,
            rows,
            cols,
            req(p, m, self)?,
            req(labels, m, self)?,
            opt(dloss, m, self)?,
            req(dx, m, self)?
        ))
    }

    /// See [`BackendKernels::accuracy`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accuracy(
        &self,
        s: &RawStream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: RawBuf<'_>,
        labels: RawBuf<'_>,
        out: &RawMem,
    ) -> Result<Option<BadLabel>> {
        dispatch!(self, s, |d, s, m| d.accuracy(
            s,
            rows,
            cols,
            top_k,
            opt(x, m, self)?,
            opt(labels, m, self)?,
            req(out, m, self)?
        ))
    }

    /// See [`BackendKernels::axpy`].
    pub(crate) fn axpy<F: Float>(
        &self,
        s: &RawStream,
        n: usize,
        a: F,
        x: &RawMem,
        y: &RawMem,
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.axpy(
            s,
            n,
            a,
            req(x, m, self)?,
            req(y, m, self)?
        ))
    }

    /// See [`BackendKernels::axpy_multi`]: 1 to [`AXPY_MULTI`] pairs.
    pub(crate) fn axpy_multi<F: Float>(
        &self,
        s: &RawStream,
        a: F,
        pairs: &[(usize, &RawMem, &RawMem)],
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| {
            let mut raw: SmallVec<[_; AXPY_MULTI]> = SmallVec::new();
            for &(n, x, y) in pairs.iter().take(AXPY_MULTI) {
                raw.push((n, req(x, m, self)?, req(y, m, self)?));
            }
            d.axpy_multi(s, a, &raw)
        })
    }

    /// See [`BackendKernels::scale`].
    pub(crate) fn scale<F: Float>(&self, s: &RawStream, n: usize, a: F, x: &RawMem) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.scale(s, n, a, req(x, m, self)?))
    }

    /// See [`BackendKernels::reduce_groups`].
    pub(crate) fn reduce_groups(&self, n: usize) -> usize {
        super::each!(self, RawDevice, d => d.reduce_groups(n))
    }

    /// See [`BackendKernels::reduce_partials`].
    pub(crate) fn reduce_partials<F: Float>(
        &self,
        s: &RawStream,
        op: Reduce,
        n: usize,
        x: &RawMem,
        partial: &RawMem,
    ) -> Result<()> {
        dispatch!(self, s, |d, s, m| d.reduce_partials::<F>(
            s,
            op,
            n,
            req(x, m, self)?,
            req(partial, m, self)?
        ))
    }
}
