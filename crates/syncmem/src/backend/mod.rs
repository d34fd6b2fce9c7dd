//! The backends: everything that names a compute API (OpenCL through `opencl3`, CUDA through
//! `cudarc`) or runs the math on the host, one folder per backend (`cpu/`, `opencl/`,
//! `cuda/`), behind crate-private traits.
//!
//! [`BackendKernels`] is the math every backend implements once: GEMM with an optional bias,
//! ReLU and its gradient, the softmax loss and its gradient, accuracy, fills, and the BLAS-1
//! operations of parameter blobs (axpy, scale, asum, sumsq). The device layer
//! ([`crate::device`]) checks the arguments (devices, lengths) and dispatches to the right
//! backend with one `match`; operators and parameter math never see a backend type.

#[cfg(any(feature = "opencl", feature = "cuda"))]
pub(crate) mod cache;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "opencl")]
pub(crate) mod opencl;

use crate::dtype::{Float, ScalarKind};
use crate::error::Result;

/// A memory argument of a kernel: `None` for an empty buffer, which a kernel never reads or
/// writes (the backends pass a null pointer).
pub(crate) type Buf<'a, M> = Option<&'a M>;

/// A label that is not a class index: (row, label). Only the `cpu` backend reports it (a device
/// kernel cannot return it without a read-back; it writes NaN instead).
pub(crate) type BadLabel = (usize, i32);

/// A GEMM: `C[m,n] = op(A)·op(B) (+ bias[col])`, row-major, with `op(A)[i,l] = ta ? A[l*m + i]
/// : A[i*k + l]` and `op(B)[l,j] = tb ? B[j*k + l] : B[l*n + j]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm {
    /// `A` is stored transposed.
    pub(crate) ta: bool,
    /// `B` is stored transposed.
    pub(crate) tb: bool,
    /// Rows of `C`.
    pub(crate) m: usize,
    /// Columns of `C`.
    pub(crate) n: usize,
    /// The inner dimension.
    pub(crate) k: usize,
}

/// The reductions of [`BackendKernels::reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// `sum |x[i]|`.
    Asum,
    /// `sum x[i]^2`.
    Sumsq,
}

impl Reduce {
    /// `asum` or `sumsq`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reduce::Asum => "asum",
            Reduce::Sumsq => "sumsq",
        }
    }
}

/// The kernels of one backend, implemented once per backend on its device type.
///
/// Contract, checked by the caller (the device layer) before any call:
/// - every buffer belongs to this device and holds at least the elements the call reads or
///   writes (`f32` unless stated, labels `i32`); `None` is passed only for an empty operand;
/// - the buffers written are held exclusively by the caller (write guards) for the duration of
///   the call, and no other buffer aliases them unless the method says so (in-place forms);
/// - sizes are at least 1 where the method says so; 32-bit limits are the backend's to check.
///
/// Work is queued on `stream`, ordered after everything queued there before.
pub(crate) trait BackendKernels {
    /// The backend's stream.
    type Stream;
    /// The backend's device memory.
    type Mem;

    /// Builds (or finds) the math kernels of element type `kind` (`f32` or `f64`).
    fn prepare_math(&self, kind: ScalarKind) -> Result<()>;

    /// `C = op(A)·op(B) (+ bias)`; `m, n >= 1` (`a` and `b` are empty only when `k == 0`).
    fn gemm(
        &self,
        s: &Self::Stream,
        g: &Gemm,
        a: Buf<'_, Self::Mem>,
        b: Buf<'_, Self::Mem>,
        c: &Self::Mem,
        bias: Buf<'_, Self::Mem>,
    ) -> Result<()>;

    /// `out[j] = sum_i x[i*cols + j]`; `cols >= 1` (`x` empty only when `rows == 0`).
    fn col_sum(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        x: Buf<'_, Self::Mem>,
        out: &Self::Mem,
    ) -> Result<()>;

    /// `y = max(x, 0)`, `n >= 1`; `x` may be `y`.
    fn relu(&self, s: &Self::Stream, n: usize, x: &Self::Mem, y: &Self::Mem) -> Result<()>;

    /// `dx = y > 0 ? dy : 0`, `n >= 1`; `dy` may be `dx`.
    fn relu_grad(
        &self,
        s: &Self::Stream,
        n: usize,
        y: &Self::Mem,
        dy: &Self::Mem,
        dx: &Self::Mem,
    ) -> Result<()>;

    /// `y[..n] = value` (`f32`), `n >= 1`.
    fn fill_f32(&self, s: &Self::Stream, n: usize, value: f32, y: &Self::Mem) -> Result<()>;

    /// Row-wise softmax of `x[rows, cols]` into `p` and the mean cross-entropy against
    /// `labels` into `loss[0]` (0 for no rows); `cols >= 1`.
    #[allow(clippy::too_many_arguments)]
    fn softmax_loss(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        x: Buf<'_, Self::Mem>,
        labels: Buf<'_, Self::Mem>,
        p: Buf<'_, Self::Mem>,
        loss: &Self::Mem,
    ) -> Result<Option<BadLabel>>;

    /// `dx = (p - onehot(labels)) * dloss / rows` (`dloss = dloss[0]`, or 1 without it);
    /// `rows, cols >= 1`.
    #[allow(clippy::too_many_arguments)]
    fn softmax_loss_grad(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        p: &Self::Mem,
        labels: &Self::Mem,
        dloss: Buf<'_, Self::Mem>,
        dx: &Self::Mem,
    ) -> Result<Option<BadLabel>>;

    /// The fraction of rows whose label is among the `top_k` best scores (ties count) into
    /// `out[0]` (0 for no rows); `cols, top_k >= 1`.
    #[allow(clippy::too_many_arguments)]
    fn accuracy(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: Buf<'_, Self::Mem>,
        labels: Buf<'_, Self::Mem>,
        out: &Self::Mem,
    ) -> Result<Option<BadLabel>>;

    /// `y[..n] += a * x[..n]`, `n >= 1`.
    fn axpy<F: Float>(
        &self,
        s: &Self::Stream,
        n: usize,
        a: F,
        x: &Self::Mem,
        y: &Self::Mem,
    ) -> Result<()>;

    /// `x[..n] *= a`, `n >= 1`.
    fn scale<F: Float>(&self, s: &Self::Stream, n: usize, a: F, x: &Self::Mem) -> Result<()>;

    /// How many partial results [`BackendKernels::reduce_partials`] writes for `n` elements.
    fn reduce_groups(&self, n: usize) -> usize;

    /// Writes `reduce_groups(n)` partial results of `op` over `x[..n]` (`n >= 1`) into
    /// `partial` (elements of `F`); their sum (in `f64`) is the result.
    fn reduce_partials<F: Float>(
        &self,
        s: &Self::Stream,
        op: Reduce,
        n: usize,
        x: &Self::Mem,
        partial: &Self::Mem,
    ) -> Result<()>;
}
