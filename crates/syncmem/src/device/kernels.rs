//! The kernels of a stream's device, checked and dispatched: [`Kernels`] takes device buffers,
//! checks that each lives on the stream's device and holds what the call touches, and runs the
//! backend's implementation of [`BackendKernels`] with one `match` per call.
//!
//! Callers (operators, parameter math, [`crate::kernels`]) pass buffers they hold through
//! guards: inputs read-locked, outputs write-locked, so no one else touches the memory a
//! kernel writes. Error texts are built only when an error is returned.

use std::fmt;

use super::types::{RawMem, RawStream};
use super::{DeviceBuffer, RawDevice, Stream};
use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce};
use crate::dtype::{Float, ScalarKind};
use crate::error::{Error, Result};

/// The kernels of one stream's device, queued on that stream. Made by [`Stream::kernels`].
#[derive(Clone, Copy)]
pub(crate) struct Kernels<'a> {
    stream: &'a Stream,
}

impl Stream {
    /// The kernels of this stream's device, queued on this stream.
    pub(crate) fn kernels(&self) -> Kernels<'_> {
        Kernels { stream: self }
    }
}

/// An operand of a call, for error messages: the kernel, the operand's name.
#[derive(Clone, Copy)]
struct Operand {
    kernel: &'static str,
    name: &'static str,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "argument {} of kernel {}", self.name, self.kernel)
    }
}

fn op(kernel: &'static str, name: &'static str) -> Operand {
    Operand { kernel, name }
}

/// `elements * size` bytes, or a size-overflow error naming the operand.
fn bytes_of(elements: usize, size: usize, o: Operand) -> Result<usize> {
    elements
        .checked_mul(size)
        .ok_or_else(|| Error::SizeOverflow {
            what: format!("{o}: {elements} elements of {size} bytes"),
        })
}

macro_rules! mem_fn {
    ($name:ident, $variant:ident, $ty:ty) => {
        /// The backend memory of `b` (a non-empty buffer of this backend).
        #[allow(dead_code)]
        fn $name(b: &DeviceBuffer) -> Option<&$ty> {
            match &b.raw {
                Some(RawMem::$variant(m)) => Some(m),
                #[allow(unreachable_patterns)]
                _ => None,
            }
        }
    };
}
mem_fn!(cpu_mem, Cpu, crate::device::cpu::CpuMem);
#[cfg(feature = "opencl")]
mem_fn!(cl_mem, OpenCl, crate::device::opencl::ClMem);
#[cfg(feature = "cuda")]
mem_fn!(cu_mem, Cuda, crate::device::cuda::CuMem);

/// Runs `$body` with `$d` the backend device, `$s` the backend stream and `$m` the function
/// that takes a [`DeviceBuffer`] to the backend's memory.
macro_rules! dispatch {
    ($k:expr, |$d:ident, $s:ident, $m:ident| $body:expr) => {
        match (&$k.stream.device().shared.raw, &*$k.stream.raw) {
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
            _ => Err($k.stream_mismatch()),
        }
    };
}

impl<'a> Kernels<'a> {
    fn stream_mismatch(&self) -> Error {
        Error::DeviceMismatch {
            op: "kernel launch",
            expected: self.stream.device().label().to_string(),
            actual: "a stream of another backend".to_string(),
        }
    }

    /// Checks that `b` lives on the stream's device and holds `elements` elements of `size`
    /// bytes; returns it, or `None` when nothing is needed from it.
    fn check<'b>(
        &self,
        b: &'b DeviceBuffer,
        elements: usize,
        size: usize,
        o: Operand,
    ) -> Result<Option<&'b DeviceBuffer>> {
        let dev = self.stream.device();
        if !b.device().same(dev) {
            return Err(Error::DeviceMismatch {
                op: o.kernel,
                expected: dev.label().to_string(),
                actual: format!("{} for {o}", b.device().label()),
            });
        }
        let need = bytes_of(elements, size, o)?;
        if need > b.len() {
            return Err(Error::OutOfBounds {
                what: o.to_string(),
                offset: 0,
                len: need,
                size: b.len(),
            });
        }
        Ok((need > 0).then_some(b))
    }

    /// As `check`, for an operand the call needs (at least one element).
    fn need<'b>(
        &self,
        b: &'b DeviceBuffer,
        elements: usize,
        size: usize,
        o: Operand,
    ) -> Result<&'b DeviceBuffer> {
        self.check(b, elements, size, o)?
            .ok_or_else(|| Error::InvalidState {
                op: o.kernel,
                buffer: o.to_string(),
                reason: "the operand is empty".into(),
            })
    }

    /// Builds (or finds) the math kernels of `kind` on the device.
    pub(crate) fn prepare_math(&self, kind: ScalarKind) -> Result<()> {
        dispatch!(self, |d, _s, _m| d.prepare_math(kind))
    }

    /// `C[m,n] = op(A)·op(B) (+ bias[col])` in `f32` (see [`Gemm`]).
    pub(crate) fn gemm(
        &self,
        g: Gemm,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
    ) -> Result<()> {
        const F: usize = 4;
        let (m, n, k) = (g.m, g.n, g.k);
        let a = self.check(a, m.saturating_mul(k), F, op("gemm", "A"))?;
        let b = self.check(b, k.saturating_mul(n), F, op("gemm", "B"))?;
        let c = self.check(c, m.saturating_mul(n), F, op("gemm", "C"))?;
        let bias = match bias {
            Some(x) => self.check(x, n, F, op("gemm", "bias"))?,
            None => None,
        };
        let Some(c) = c else {
            return Ok(());
        };
        dispatch!(self, |d, s, mem| {
            let c = mem(c).ok_or_else(|| self.stream_mismatch())?;
            let bias_mem = opt(bias, mem)?;
            if bias.is_some() != bias_mem.is_some() {
                return Err(self.stream_mismatch());
            }
            d.gemm(s, &g, opt(a, mem)?, opt(b, mem)?, c, bias_mem)
        })
    }

    /// `out[j] = sum_i x[i*cols + j]` (`f32`).
    pub(crate) fn col_sum(
        &self,
        rows: usize,
        cols: usize,
        x: &DeviceBuffer,
        out: &DeviceBuffer,
    ) -> Result<()> {
        let x = self.check(x, rows.saturating_mul(cols), 4, op("col_sum", "x"))?;
        let Some(out) = self.check(out, cols, 4, op("col_sum", "out"))? else {
            return Ok(());
        };
        dispatch!(self, |d, s, mem| {
            let out = mem(out).ok_or_else(|| self.stream_mismatch())?;
            d.col_sum(s, rows, cols, opt(x, mem)?, out)
        })
    }

    /// `y = max(x, 0)` over `n` `f32`s; `x` may be `y`.
    pub(crate) fn relu(&self, n: usize, x: &DeviceBuffer, y: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let x = self.need(x, n, 4, op("relu", "x"))?;
        let y = self.need(y, n, 4, op("relu", "y"))?;
        dispatch!(self, |d, s, mem| d.relu(
            s,
            n,
            req(x, mem, self)?,
            req(y, mem, self)?
        ))
    }

    /// `dx = y > 0 ? dy : 0` over `n` `f32`s; `dy` may be `dx`.
    pub(crate) fn relu_grad(
        &self,
        n: usize,
        y: &DeviceBuffer,
        dy: &DeviceBuffer,
        dx: &DeviceBuffer,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let y = self.need(y, n, 4, op("relu_grad", "y"))?;
        let dy = self.need(dy, n, 4, op("relu_grad", "dy"))?;
        let dx = self.need(dx, n, 4, op("relu_grad", "dx"))?;
        dispatch!(self, |d, s, mem| d.relu_grad(
            s,
            n,
            req(y, mem, self)?,
            req(dy, mem, self)?,
            req(dx, mem, self)?
        ))
    }

    /// `y[..n] = value` (`f32`).
    pub(crate) fn fill_f32(&self, n: usize, value: f32, y: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let y = self.need(y, n, 4, op("fill", "y"))?;
        dispatch!(self, |d, s, mem| d.fill_f32(
            s,
            n,
            value,
            req(y, mem, self)?
        ))
    }

    /// Softmax of `x[rows, cols]` into `p`, mean cross-entropy into `loss[0]`. `Some` when a
    /// label is out of range and the backend could tell (the `cpu` device).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss(
        &self,
        rows: usize,
        cols: usize,
        x: &DeviceBuffer,
        labels: &DeviceBuffer,
        p: &DeviceBuffer,
        loss: &DeviceBuffer,
    ) -> Result<Option<BadLabel>> {
        let k = "softmax_loss";
        let cells = rows.saturating_mul(cols);
        let x = self.check(x, cells, 4, op(k, "x"))?;
        let labels = self.check(labels, rows, 4, op(k, "labels"))?;
        let p = self.check(p, cells, 4, op(k, "p"))?;
        let loss = self.need(loss, 1, 4, op(k, "loss"))?;
        if cols == 0 && rows > 0 {
            return Err(self.no_classes(k));
        }
        dispatch!(self, |d, s, mem| d.softmax_loss(
            s,
            rows,
            cols.max(1),
            opt(x, mem)?,
            opt(labels, mem)?,
            opt(p, mem)?,
            req(loss, mem, self)?
        ))
    }

    fn no_classes(&self, kernel: &'static str) -> Error {
        Error::InvalidState {
            op: kernel,
            buffer: format!("the scores on {}", self.stream.device().label()),
            reason: "there are rows but no classes".into(),
        }
    }

    /// `dx = (p - onehot) * dloss / rows` (`dloss[0]`, or 1 without it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss_grad(
        &self,
        rows: usize,
        cols: usize,
        p: &DeviceBuffer,
        labels: &DeviceBuffer,
        dloss: Option<&DeviceBuffer>,
        dx: &DeviceBuffer,
    ) -> Result<Option<BadLabel>> {
        let k = "softmax_loss_grad";
        let cells = rows.saturating_mul(cols);
        if cells == 0 {
            return Ok(None);
        }
        let p = self.need(p, cells, 4, op(k, "p"))?;
        let labels = self.need(labels, rows, 4, op(k, "labels"))?;
        let dloss = match dloss {
            Some(b) => Some(self.need(b, 1, 4, op(k, "dloss"))?),
            None => None,
        };
        let dx = self.need(dx, cells, 4, op(k, "dx"))?;
        dispatch!(self, |d, s, mem| d.softmax_loss_grad(
            s,
            rows,
            cols,
            req(p, mem, self)?,
            req(labels, mem, self)?,
            opt(dloss, mem)?,
            req(dx, mem, self)?
        ))
    }

    /// The fraction of rows whose label is in the top `top_k` into `out[0]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accuracy(
        &self,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: &DeviceBuffer,
        labels: &DeviceBuffer,
        out: &DeviceBuffer,
    ) -> Result<Option<BadLabel>> {
        let k = "accuracy";
        let x = self.check(x, rows.saturating_mul(cols), 4, op(k, "x"))?;
        let labels = self.check(labels, rows, 4, op(k, "labels"))?;
        let out = self.need(out, 1, 4, op(k, "out"))?;
        if cols == 0 && rows > 0 {
            return Err(self.no_classes(k));
        }
        dispatch!(self, |d, s, mem| d.accuracy(
            s,
            rows,
            cols.max(1),
            top_k.max(1),
            opt(x, mem)?,
            opt(labels, mem)?,
            req(out, mem, self)?
        ))
    }

    /// `y[..n] += a * x[..n]`.
    pub(crate) fn axpy<F: Float>(
        &self,
        n: usize,
        a: F,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let size = std::mem::size_of::<F>();
        let x = self.need(x, n, size, op("axpy", "x"))?;
        let y = self.need(y, n, size, op("axpy", "y"))?;
        dispatch!(self, |d, s, mem| d.axpy(
            s,
            n,
            a,
            req(x, mem, self)?,
            req(y, mem, self)?
        ))
    }

    /// `x[..n] *= a`.
    pub(crate) fn scale<F: Float>(&self, n: usize, a: F, x: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let x = self.need(x, n, std::mem::size_of::<F>(), op("scale", "x"))?;
        dispatch!(self, |d, s, mem| d.scale(s, n, a, req(x, mem, self)?))
    }

    /// A reduction of `x[..n]`, brought back to the host: the partial results of the backend
    /// go into a scratch buffer of the device, are read back (one copy, a host wait) and added
    /// in `f64`.
    pub(crate) fn reduce<F: Float>(&self, r: Reduce, n: usize, x: &DeviceBuffer) -> Result<F> {
        if n == 0 {
            return Ok(F::ZERO);
        }
        let kernel = r.name();
        let size = std::mem::size_of::<F>();
        let x = self.need(x, n, size, op(kernel, "x"))?;
        let groups = dispatch!(self, |d, _s, _m| Ok::<usize, Error>(d.reduce_groups(n)))?;
        let partial = self.stream.device().alloc(groups * size)?;
        dispatch!(self, |d, s, mem| d.reduce_partials::<F>(
            s,
            r,
            n,
            req(x, mem, self)?,
            req(&partial, mem, self)?
        ))?;
        let mut values = vec![F::ZERO; groups];
        self.stream
            .read(&partial, 0, bytemuck::cast_slice_mut(&mut values))?;
        Ok(F::from_f64(values.iter().map(|v| v.to_f64()).sum()))
    }
}

/// The backend memory of a non-empty operand.
fn req<'b, M>(
    b: &'b DeviceBuffer,
    mem: fn(&'b DeviceBuffer) -> Option<&'b M>,
    k: &Kernels<'_>,
) -> Result<&'b M> {
    mem(b).ok_or_else(|| k.stream_mismatch())
}

/// The backend memory of an operand that may be empty (`None`).
fn opt<'b, M>(
    b: Option<&'b DeviceBuffer>,
    mem: fn(&'b DeviceBuffer) -> Option<&'b M>,
) -> Result<Buf<'b, M>> {
    match b {
        None => Ok(None),
        Some(b) => mem(b).map(Some).ok_or_else(|| Error::DeviceMismatch {
            op: "kernel launch",
            expected: b.device().label().to_string(),
            actual: "memory of another backend".to_string(),
        }),
    }
}
