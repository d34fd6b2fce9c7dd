//! The library's kernels as users and the built-in operators call them: checked, safe
//! launches on a [`Stream`], taking [`Src`] and [`Dst`] operands (guards of device mirrors) and,
//! for the kernels with many operands, an operand struct ([`Gemm`], [`SoftmaxLoss`],
//! [`SoftmaxLossGrad`], [`Accuracy`]).
//!
//! Every function checks that each operand lives on the stream's device and holds what the
//! call touches (errors name the kernel and the operand), orders the launch after the work of
//! other streams on the same memory, queues it and returns without waiting. All math is `f32`;
//! labels are `i32`.

use smallvec::SmallVec;

use super::epilogue::Epilogue;
use super::operand::{BadLabel, Dst, Src};
use crate::backend::{Gemm as GemmShape, SoftmaxExtra, AXPY_MULTI as AXPY_MULTI_BACKEND};
use crate::device::{DeviceBuffer, Stream};
use crate::dtype::Float;
use crate::error::Result;

/// The most `(n, x, y)` triples one launch of [`axpy_multi`] takes (it splits longer lists
/// into launches of this many).
pub const AXPY_MULTI: usize = AXPY_MULTI_BACKEND;

/// A GEMM with its fused epilogues: `C[m,n] = op(A)·op(B) (+ bias[col])`, then `max(C, 0)`
/// ([`Gemm::relu`]) or a user's activation ([`Gemm::activation`]), or `C = mask > 0 ? C : 0`
/// ([`Gemm::mask`], a fused ReLU gradient) or a user's activation gradient
/// ([`Gemm::activation_grad`]), and
/// the column sums of `A` in the same launch ([`Gemm::a_col_sums`]). Row-major, with
/// `op(A)[i,l] = A[l*m + i]` when `A` is stored transposed, else `A[i*k + l]`, and
/// `op(B)[l,j] = B[j*k + l]` when `B` is stored transposed, else `B[l*n + j]`.
///
/// ```
/// use syncmem::kernels::{self, Gemm};
/// use syncmem::{Device, SyncedMemory};
///
/// # fn main() -> syncmem::Result<()> {
/// let dev = Device::cpu();
/// let f32s = |v: &[f32]| -> syncmem::Result<SyncedMemory> {
///     let m = SyncedMemory::new(4 * v.len(), &dev);
///     m.host_mut()?.copy_from_slice(bytemuck::cast_slice(v));
///     Ok(m)
/// };
/// let (a, b, c) = (f32s(&[1.0, 2.0])?, f32s(&[3.0, 4.0])?, SyncedMemory::new(16, &dev));
/// {
///     let (a, b) = (a.device()?, b.device()?);
///     let mut c = c.device_overwrite()?;
///     // C[2,2] = A[2,1] · B[1,2]
///     kernels::gemm(&dev.default_stream()?, Gemm::new((2, 2, 1), &a, &b, &mut c))?;
/// }
/// let host = c.host()?;
/// let c: &[f32] = bytemuck::cast_slice(&host[..]);
/// assert_eq!(c, [3.0, 4.0, 6.0, 8.0]);
/// # Ok(())
/// # }
/// ```
pub struct Gemm<'a> {
    shape: GemmShape<'a>,
    a: &'a dyn Src,
    b: &'a dyn Src,
    c: &'a mut dyn Dst,
    bias: Option<&'a dyn Src>,
    mask: Option<&'a dyn Src>,
    sums: Option<&'a mut dyn Dst>,
}

impl<'a> Gemm<'a> {
    /// `C = A·B` with `(m, n, k)`: `C` is `m x n`, `A` is `m x k`, `B` is `k x n`.
    pub fn new(
        (m, n, k): (usize, usize, usize),
        a: &'a dyn Src,
        b: &'a dyn Src,
        c: &'a mut dyn Dst,
    ) -> Self {
        Self {
            shape: GemmShape {
                ta: false,
                tb: false,
                m,
                n,
                k,
                relu: false,
                user: None,
            },
            a,
            b,
            c,
            bias: None,
            mask: None,
            sums: None,
        }
    }

    /// Whether `A` is stored transposed (`k x m`).
    pub fn a_transposed(mut self, yes: bool) -> Self {
        self.shape.ta = yes;
        self
    }

    /// Whether `B` is stored transposed (`n x k`).
    pub fn b_transposed(mut self, yes: bool) -> Self {
        self.shape.tb = yes;
        self
    }

    /// Adds `bias[j]` (`n` elements) to every row.
    pub fn bias(mut self, bias: Option<&'a dyn Src>) -> Self {
        self.bias = bias;
        self
    }

    /// Applies `max(·, 0)` to every result, after the bias (a fused FC + Relu).
    pub fn relu(mut self, yes: bool) -> Self {
        self.shape.relu = yes;
        self
    }

    /// Applies a user's activation to every result, after the bias (and the ReLU): a fused
    /// FC + a user's element-wise operator. See [`Epilogue`].
    pub fn activation(mut self, act: Option<&'a Epilogue>) -> Self {
        self.shape.user = act.map(|e| e.act(false));
        self
    }

    /// Then `C = act_grad(C, y)` with the activation's output `y` (`m x n`, not `C`), in
    /// place of [`Gemm::mask`]: a fused gradient of a user's element-wise operator. See
    /// [`Epilogue`].
    pub fn activation_grad(mut self, act: Option<(&'a Epilogue, &'a dyn Src)>) -> Self {
        if let Some((e, y)) = act {
            self.shape.user = Some(e.act(true));
            self.mask = Some(y);
        }
        self
    }

    /// Then `C = mask > 0 ? C : 0` with `mask` (`m x n`, not `C`): a fused ReLU gradient.
    pub fn mask(mut self, mask: Option<&'a dyn Src>) -> Self {
        self.mask = mask;
        self
    }

    /// Also writes `sums[i] = Σ_l A[l*m + i]` (`m` elements) in the same launch, bit for bit
    /// what [`col_sum`] writes for `(k, m, A)`. Only with `A` stored transposed.
    pub fn a_col_sums(mut self, sums: Option<&'a mut dyn Dst>) -> Self {
        self.sums = sums;
        self
    }
}

impl std::fmt::Debug for Gemm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gemm")
            .field("shape", &self.shape)
            .field("bias", &self.bias.is_some())
            .field("mask", &self.mask.is_some())
            .field("a_col_sums", &self.sums.is_some())
            .finish()
    }
}

/// Runs a [`Gemm`] on `stream`.
///
/// # Errors
/// [`Error::DeviceMismatch`](crate::Error::DeviceMismatch) for an operand of another device,
/// [`Error::OutOfBounds`](crate::Error::OutOfBounds) for one too small,
/// [`Error::InvalidState`](crate::Error::InvalidState) for column sums without a transposed
/// `A`, or a backend error (including a failed kernel build).
pub fn gemm(stream: &Stream, g: Gemm<'_>) -> Result<()> {
    let sums = g.sums.map(|s| s.write_buffer());
    stream.kernels().gemm(
        g.shape,
        g.a.read_buffer(),
        g.b.read_buffer(),
        g.c.write_buffer(),
        g.bias.map(|b| b.read_buffer()),
        g.mask.map(|m| m.read_buffer()),
        sums,
    )
}

/// `out[j] = Σ_i x[i*cols + j]` (`rows x cols` elements of `x`, `cols` of `out`).
///
/// # Errors
/// As [`gemm`].
pub fn col_sum(
    stream: &Stream,
    (rows, cols): (usize, usize),
    x: &dyn Src,
    out: &mut dyn Dst,
) -> Result<()> {
    stream
        .kernels()
        .col_sum(rows, cols, x.read_buffer(), out.write_buffer())
}

/// `y = max(x, 0)` over `n` elements; `x: None` works in place on `y`.
///
/// # Errors
/// As [`gemm`]; an operand with fewer than `n` elements.
pub fn relu(stream: &Stream, n: usize, x: Option<&dyn Src>, y: &mut dyn Dst) -> Result<()> {
    let y = y.write_buffer();
    let x = x.map_or(y, |x| x.read_buffer());
    stream.kernels().relu(n, x, y)
}

/// `dx = y > 0 ? dy : 0` over `n` elements; `dy: None` reads the gradient from `dx` (in
/// place).
///
/// # Errors
/// As [`relu`].
pub fn relu_grad(
    stream: &Stream,
    n: usize,
    y: &dyn Src,
    dy: Option<&dyn Src>,
    dx: &mut dyn Dst,
) -> Result<()> {
    let dx = dx.write_buffer();
    let dy = dy.map_or(dx, |d| d.read_buffer());
    stream.kernels().relu_grad(n, y.read_buffer(), dy, dx)
}

/// `y[..n] = value`.
///
/// # Errors
/// As [`relu`].
pub fn fill(stream: &Stream, n: usize, value: f32, y: &mut dyn Dst) -> Result<()> {
    stream.kernels().fill_f32(n, value, y.write_buffer())
}

/// One `(n, x, y)` of [`axpy_multi`]: `y[..n] += a * x[..n]`.
pub type AxpyTriple<'a> = (usize, &'a dyn Src, &'a mut dyn Dst);

/// `y_i[..n_i] += a * x_i[..n_i]` for each `(n_i, x_i, y_i)`, bit for bit as one
/// [`axpy`](super::axpy) per triple, in one launch per [`AXPY_MULTI`] triples (a single
/// triple runs the `axpy` kernel itself).
///
/// # Errors
/// As [`relu`], naming the triple's operand.
pub fn axpy_multi<F: Float>(stream: &Stream, a: F, triples: &mut [AxpyTriple<'_>]) -> Result<()> {
    if let [(n, x, y)] = triples {
        return stream
            .kernels()
            .axpy(*n, a, x.read_buffer(), y.write_buffer());
    }
    let pairs: SmallVec<[(usize, &DeviceBuffer, &DeviceBuffer); AXPY_MULTI]> = triples
        .iter_mut()
        .map(|(n, x, y)| (*n, x.read_buffer(), y.write_buffer()))
        .collect();
    stream.kernels().axpy_multi(a, &pairs)
}

/// Softmax of the scores `x[rows, cols]` into `p`, the mean cross-entropy against `labels`
/// (`rows` `i32`s) into `loss[0]`, and, in the same pass, what the options ask for.
pub struct SoftmaxLoss<'a> {
    rows: usize,
    cols: usize,
    x: &'a dyn Src,
    labels: &'a dyn Src,
    p: &'a mut dyn Dst,
    loss: &'a mut dyn Dst,
    accuracy: Option<(usize, &'a mut dyn Dst)>,
    grad: Option<&'a mut dyn Dst>,
    scalars: Option<&'a mut dyn Dst>,
}

impl<'a> SoftmaxLoss<'a> {
    /// The loss of `x` (`rows x cols`) against `labels`, probabilities into `p`.
    pub fn new(
        (rows, cols): (usize, usize),
        x: &'a dyn Src,
        labels: &'a dyn Src,
        p: &'a mut dyn Dst,
        loss: &'a mut dyn Dst,
    ) -> Self {
        Self {
            rows,
            cols,
            x,
            labels,
            p,
            loss,
            accuracy: None,
            grad: None,
            scalars: None,
        }
    }

    /// Also the fraction of rows whose label is among the `top_k` best probabilities into
    /// `out[0]`, as [`accuracy`] computes it.
    pub fn accuracy(mut self, accuracy: Option<(usize, &'a mut dyn Dst)>) -> Self {
        self.accuracy = accuracy;
        self
    }

    /// Also `dx = (p - onehot(labels)) / rows`, as [`softmax_loss_grad`] without `dloss`.
    pub fn grad(mut self, dx: Option<&'a mut dyn Dst>) -> Self {
        self.grad = dx;
        self
    }

    /// Also the loss and the accuracy side by side in `out[0..2]` (written only with
    /// [`SoftmaxLoss::accuracy`]), so that one read brings both back.
    pub fn scalars(mut self, out: Option<&'a mut dyn Dst>) -> Self {
        self.scalars = out;
        self
    }
}

impl std::fmt::Debug for SoftmaxLoss<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftmaxLoss")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("accuracy", &self.accuracy.as_ref().map(|a| a.0))
            .field("grad", &self.grad.is_some())
            .field("scalars", &self.scalars.is_some())
            .finish()
    }
}

/// Runs a [`SoftmaxLoss`] on `stream`. `Some` when a label is out of range and the device
/// could tell (the `cpu` device); other devices clamp it.
///
/// # Errors
/// As [`gemm`]; [`Error::InvalidState`](crate::Error::InvalidState) for rows without classes.
pub fn softmax_loss(stream: &Stream, s: SoftmaxLoss<'_>) -> Result<Option<BadLabel>> {
    let extra = SoftmaxExtra {
        accuracy: s.accuracy.map(|(k, a)| (k, a.write_buffer())),
        grad: s.grad.map(|g| g.write_buffer()),
        scalars: s.scalars.map(|b| b.write_buffer()),
    };
    let seen = stream.kernels().softmax_loss(
        s.rows,
        s.cols,
        s.x.read_buffer(),
        s.labels.read_buffer(),
        s.p.write_buffer(),
        s.loss.write_buffer(),
        extra,
    )?;
    Ok(seen.map(BadLabel::from_pair))
}

/// `dx = (p - onehot(labels)) * dloss / rows`, with `dloss = dloss[0]`, or 1 without it.
#[derive(Clone, Copy)]
pub struct SoftmaxLossGrad<'a> {
    shape: (usize, usize),
    p: &'a dyn Src,
    labels: &'a dyn Src,
    dloss: Option<&'a dyn Src>,
}

impl<'a> SoftmaxLossGrad<'a> {
    /// The gradient for the probabilities `p` (`rows x cols`) and `labels` (`rows` `i32`s).
    pub fn new((rows, cols): (usize, usize), p: &'a dyn Src, labels: &'a dyn Src) -> Self {
        Self {
            shape: (rows, cols),
            p,
            labels,
            dloss: None,
        }
    }

    /// The gradient of the loss (one element), or `None` for 1.
    pub fn dloss(mut self, dloss: Option<&'a dyn Src>) -> Self {
        self.dloss = dloss;
        self
    }
}

impl std::fmt::Debug for SoftmaxLossGrad<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftmaxLossGrad")
            .field("shape", &self.shape)
            .field("dloss", &self.dloss.is_some())
            .finish()
    }
}

/// Runs a [`SoftmaxLossGrad`] on `stream`, writing `dx` (`rows x cols`).
///
/// # Errors
/// As [`softmax_loss`].
pub fn softmax_loss_grad(
    stream: &Stream,
    g: SoftmaxLossGrad<'_>,
    dx: &mut dyn Dst,
) -> Result<Option<BadLabel>> {
    let (rows, cols) = g.shape;
    let seen = stream.kernels().softmax_loss_grad(
        rows,
        cols,
        g.p.read_buffer(),
        g.labels.read_buffer(),
        g.dloss.map(|d| d.read_buffer()),
        dx.write_buffer(),
    )?;
    Ok(seen.map(BadLabel::from_pair))
}

/// The fraction of rows of `x` (`rows x cols`, probabilities or scores) whose label is among
/// the `top_k` best (ties count).
#[derive(Clone, Copy)]
pub struct Accuracy<'a> {
    shape: (usize, usize),
    top_k: usize,
    x: &'a dyn Src,
    labels: &'a dyn Src,
}

impl<'a> Accuracy<'a> {
    /// The accuracy of `x` (`rows x cols`) against `labels` (`rows` `i32`s), counting the
    /// `top_k` best classes (0 counts as 1).
    pub fn new(
        (rows, cols): (usize, usize),
        top_k: usize,
        x: &'a dyn Src,
        labels: &'a dyn Src,
    ) -> Self {
        Self {
            shape: (rows, cols),
            top_k,
            x,
            labels,
        }
    }
}

impl std::fmt::Debug for Accuracy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accuracy")
            .field("shape", &self.shape)
            .field("top_k", &self.top_k)
            .finish()
    }
}

/// Runs an [`Accuracy`] on `stream`, writing `out[0]` (0 for no rows).
///
/// # Errors
/// As [`softmax_loss`].
pub fn accuracy(stream: &Stream, a: Accuracy<'_>, out: &mut dyn Dst) -> Result<Option<BadLabel>> {
    let (rows, cols) = a.shape;
    let seen = stream.kernels().accuracy(
        rows,
        cols,
        a.top_k,
        a.x.read_buffer(),
        a.labels.read_buffer(),
        out.write_buffer(),
    )?;
    Ok(seen.map(BadLabel::from_pair))
}
