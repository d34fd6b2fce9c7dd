//! The kernels of a stream's device, checked: [`Kernels`] takes device buffers, checks that
//! each lives on the stream's device and holds what the call touches, and hands the backend
//! objects to the dispatch of the backend layer (one `match` per kernel there).
//!
//! Callers (operators, parameter math, [`crate::kernels`]) pass buffers they hold through
//! guards: inputs read-locked, outputs write-locked, so no one else touches the memory a
//! kernel writes. Error texts are built only when an error is returned.

use std::fmt;

use super::{DeviceBuffer, Stream};
use crate::backend::dispatch::{RawDevice, RawMem, RawStream};
use smallvec::SmallVec;

use crate::backend::{BadLabel, Gemm, Reduce, SoftmaxExtra, AXPY_MULTI};
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

impl<'a> Kernels<'a> {
    /// The backend device and stream.
    fn raw(&self) -> (&'a RawDevice, &'a RawStream) {
        (&self.stream.device().shared.raw, &self.stream.raw)
    }

    /// Queues one kernel with `launch`: first orders it after the commands of other streams
    /// it must follow (writers of what it reads; writers and readers of what it writes), then
    /// records it on every buffer it reads or writes. Returns at once.
    pub(super) fn queue<R>(
        &self,
        reads: &[Option<&DeviceBuffer>],
        writes: &[Option<&DeviceBuffer>],
        launch: impl FnOnce(&'a RawDevice, &'a RawStream) -> Result<R>,
    ) -> Result<R> {
        for b in reads.iter().flatten() {
            b.order_before(self.stream, false)?;
        }
        for b in writes.iter().flatten() {
            b.order_before(self.stream, true)?;
        }
        let (d, s) = self.raw();
        let r = launch(d, s)?;
        if let Some(at) = self.stream.at(self.stream.raw.last_seq()) {
            for b in reads.iter().flatten() {
                b.note(Some(at), false);
            }
            for b in writes.iter().flatten() {
                b.note(Some(at), true);
            }
        }
        Ok(r)
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
        let (d, s) = self.raw();
        d.prepare_math(s, kind)
    }

    /// `C[m,n] = op(A)·op(B) (+ bias[col])` in `f32` (see [`Gemm`]), then, with `mask`
    /// (`[m, n]`, not `c`), `C = mask > 0 ? C : 0` (a fused ReLU gradient); with `sum` (`[m]`,
    /// only when `g.ta`, aliasing no other operand), also `sum[i] = Σ_l A[l*m + i]` in the same
    /// launch, bit for bit what [`Kernels::col_sum`] writes for `(k, m, A)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        g: Gemm,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        c: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        mask: Option<&DeviceBuffer>,
        sum: Option<&DeviceBuffer>,
    ) -> Result<()> {
        const F: usize = 4;
        let (m, n, k) = (g.m, g.n, g.k);
        let a_full = a;
        let a = self.check(a, m.saturating_mul(k), F, op("gemm", "A"))?;
        let b = self.check(b, k.saturating_mul(n), F, op("gemm", "B"))?;
        let c = self.check(c, m.saturating_mul(n), F, op("gemm", "C"))?;
        let bias = match bias {
            Some(x) => self.check(x, n, F, op("gemm", "bias"))?,
            None => None,
        };
        let mask = match mask {
            Some(x) => self.check(x, m.saturating_mul(n), F, op("gemm", "mask"))?,
            None => None,
        };
        let sum_full = sum;
        let sum = match sum {
            Some(_) if !g.ta => {
                return Err(Error::InvalidState {
                    op: "gemm",
                    buffer: op("gemm", "sum").to_string(),
                    reason: "the column sums of A need A stored transposed".into(),
                })
            }
            Some(x) => self.check(x, m, F, op("gemm", "sum"))?,
            None => None,
        };
        let Some(c) = c else {
            // No product (n == 0): the sums, if any, on their own.
            return match sum_full {
                Some(out) if sum.is_some() => self.col_sum(k, m, a_full, out),
                _ => Ok(()),
            };
        };
        self.queue(&[a, b, bias, mask], &[Some(c), sum], |d, s| {
            d.gemm(
                s,
                &g,
                opt(a),
                opt(b),
                mem(c)?,
                opt(bias),
                opt(mask),
                opt(sum),
            )
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
        self.queue(&[x], &[Some(out)], |d, s| {
            d.col_sum(s, rows, cols, opt(x), mem(out)?)
        })
    }

    /// `y = max(x, 0)` over `n` `f32`s; `x` may be `y`.
    pub(crate) fn relu(&self, n: usize, x: &DeviceBuffer, y: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let x = self.need(x, n, 4, op("relu", "x"))?;
        let y = self.need(y, n, 4, op("relu", "y"))?;
        self.queue(&[Some(x)], &[Some(y)], |d, s| {
            d.relu(s, n, mem(x)?, mem(y)?)
        })
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
        self.queue(&[Some(y), Some(dy)], &[Some(dx)], |d, s| {
            d.relu_grad(s, n, mem(y)?, mem(dy)?, mem(dx)?)
        })
    }

    /// `y[..n] = value` (`f32`).
    pub(crate) fn fill_f32(&self, n: usize, value: f32, y: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let y = self.need(y, n, 4, op("fill", "y"))?;
        self.queue(&[], &[Some(y)], |d, s| d.fill_f32(s, n, value, mem(y)?))
    }

    /// Softmax of `x[rows, cols]` into `p`, mean cross-entropy into `loss[0]`, and what
    /// `extra` asks for in the same pass (the accuracy of `p`, the gradient with `dloss = 1`,
    /// the loss and the accuracy side by side).
    /// `Some` when a label is out of range and the backend could tell (the `cpu` device).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss(
        &self,
        rows: usize,
        cols: usize,
        x: &DeviceBuffer,
        labels: &DeviceBuffer,
        p: &DeviceBuffer,
        loss: &DeviceBuffer,
        extra: SoftmaxExtra<'_, DeviceBuffer>,
    ) -> Result<Option<BadLabel>> {
        let k = "softmax_loss";
        let cells = rows.saturating_mul(cols);
        let x = self.check(x, cells, 4, op(k, "x"))?;
        let labels = self.check(labels, rows, 4, op(k, "labels"))?;
        let p = self.check(p, cells, 4, op(k, "p"))?;
        let loss = self.need(loss, 1, 4, op(k, "loss"))?;
        let acc = match extra.accuracy {
            Some((top_k, a)) => Some((top_k.max(1), self.need(a, 1, 4, op(k, "accuracy"))?)),
            None => None,
        };
        // No rows: no gradient to write (as `softmax_loss_grad`).
        let grad = match extra.grad {
            Some(g) => self.check(g, cells, 4, op(k, "dx"))?,
            None => None,
        };
        // Written only with the accuracy (the caller checks).
        let scalars = match extra.scalars.filter(|_| acc.is_some()) {
            Some(b) => Some(self.need(b, 2, 4, op(k, "scalars"))?),
            None => None,
        };
        if cols == 0 && rows > 0 {
            return Err(self.no_classes(k));
        }
        let writes = [p, Some(loss), acc.map(|a| a.1), grad, scalars];
        self.queue(&[x, labels], &writes, |d, s| {
            let accuracy = match acc {
                Some((top_k, a)) => Some((top_k, mem(a)?)),
                None => None,
            };
            let extra = SoftmaxExtra {
                accuracy,
                grad: opt(grad),
                scalars: opt(scalars),
            };
            d.softmax_loss(
                s,
                rows,
                cols.max(1),
                opt(x),
                opt(labels),
                opt(p),
                mem(loss)?,
                extra,
            )
        })
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
        self.queue(&[Some(p), Some(labels), dloss], &[Some(dx)], |d, s| {
            d.softmax_loss_grad(s, rows, cols, mem(p)?, mem(labels)?, opt(dloss), mem(dx)?)
        })
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
        self.queue(&[x, labels], &[Some(out)], |d, s| {
            d.accuracy(
                s,
                rows,
                cols.max(1),
                top_k.max(1),
                opt(x),
                opt(labels),
                mem(out)?,
            )
        })
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
        self.queue(&[Some(x)], &[Some(y)], |d, s| {
            d.axpy(s, n, a, mem(x)?, mem(y)?)
        })
    }

    /// `y_i[..n_i] += a * x_i[..n_i]` for each `(n_i, x_i, y_i)` of `pairs`, bit for bit as one
    /// [`Kernels::axpy`] per pair, in one launch per [`AXPY_MULTI`] pairs. No `y_i` may be
    /// another pair's `x` or `y` (each is held through its own write guard).
    pub(crate) fn axpy_multi<F: Float>(
        &self,
        a: F,
        pairs: &[(usize, &DeviceBuffer, &DeviceBuffer)],
    ) -> Result<()> {
        let size = std::mem::size_of::<F>();
        for chunk in pairs.chunks(AXPY_MULTI) {
            let mut checked: SmallVec<[(usize, &DeviceBuffer, &DeviceBuffer); AXPY_MULTI]> =
                SmallVec::new();
            for &(n, x, y) in chunk {
                if n > 0 {
                    let x = self.need(x, n, size, op("axpy_multi", "x"))?;
                    let y = self.need(y, n, size, op("axpy_multi", "y"))?;
                    checked.push((n, x, y));
                }
            }
            if checked.is_empty() {
                continue;
            }
            let reads: SmallVec<[_; AXPY_MULTI]> = checked.iter().map(|p| Some(p.1)).collect();
            let writes: SmallVec<[_; AXPY_MULTI]> = checked.iter().map(|p| Some(p.2)).collect();
            self.queue(&reads, &writes, |d, s| {
                let mut raw: SmallVec<[(usize, &RawMem, &RawMem); AXPY_MULTI]> = SmallVec::new();
                for &(n, x, y) in &checked {
                    raw.push((n, mem(x)?, mem(y)?));
                }
                d.axpy_multi(s, a, &raw)
            })?;
        }
        Ok(())
    }

    /// `x[..n] *= a`.
    pub(crate) fn scale<F: Float>(&self, n: usize, a: F, x: &DeviceBuffer) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let x = self.need(x, n, std::mem::size_of::<F>(), op("scale", "x"))?;
        self.queue(&[], &[Some(x)], |d, s| d.scale(s, n, a, mem(x)?))
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
        let groups = self.raw().0.reduce_groups(n);
        let partial = self.stream.device().alloc(groups * size)?;
        self.queue(&[Some(x)], &[Some(&partial)], |d, s| {
            d.reduce_partials::<F>(s, r, n, mem(x)?, mem(&partial)?)
        })?;
        let mut values = vec![F::ZERO; groups];
        self.stream
            .read(&partial, 0, bytemuck::cast_slice_mut(&mut values))?;
        Ok(F::from_f64(values.iter().map(|v| v.to_f64()).sum()))
    }
}

/// The backend memory of an operand checked to be non-empty.
fn mem(b: &DeviceBuffer) -> Result<&RawMem> {
    b.raw().ok_or_else(|| Error::InvalidState {
        op: "kernel launch",
        buffer: format!("{b:?}"),
        reason: "the operand has no memory".into(),
    })
}

/// The backend memory of an operand that may be empty.
fn opt(b: Option<&DeviceBuffer>) -> Option<&RawMem> {
    b.and_then(|b| b.raw())
}
