//! Kernels: the one door through which the built-in operators, users' operators and users'
//! code launch device work on [`SyncedMemory`](crate::SyncedMemory) buffers and
//! [`Tensor`](crate::Tensor)s.
//!
//! | what | functions |
//! |---|---|
//! | the library's kernels (`f32`) | [`gemm`] with its fused epilogues (bias, ReLU, ReLU-gradient mask, column sums of `A`), [`col_sum`], [`relu`], [`relu_grad`], [`fill`], [`softmax_loss`] (with accuracy, gradient and both scalars in one pass), [`softmax_loss_grad`], [`accuracy`], [`axpy_multi`] |
//! | parameter math (`f32`, `f64`; Caffe's `caffe_gpu_axpy` and friends) | [`axpy`], [`scale`], [`asum`], [`sumsq`], and their host loops ([`host`]) |
//! | kernels of your own | [`launch`] of a [`UserKernel`]; an element-wise activation of your own in the GEMM's store ([`Epilogue`], [`Gemm::activation`]) |
//!
//! Every launch is checked (each operand on the stream's device and large enough; errors name
//! the kernel and the operand) and safe: operands are guards of device mirrors ([`Src`] for
//! inputs, [`Dst`] for outputs, [`Empty`] for tensors without elements), so the caller has
//! made the device mirror current (or taken it for writing) and no one else touches the memory
//! meanwhile. The kernels with many operands take an operand struct ([`Gemm`],
//! [`SoftmaxLoss`], [`SoftmaxLossGrad`], [`Accuracy`]). The built-in operators of
//! `syncmem-nn` are written on exactly these functions.
//!
//! | backend | how it runs |
//! |---|---|
//! | `cpu` device | Rust loops and a blocked GEMM over the `cpu` device's memory |
//! | `opencl:N` | OpenCL C kernels, built once per device; `f64` needs `cl_khr_fp64` |
//! | `cuda:N` | CUDA C kernels compiled at run time by NVRTC (`libnvrtc` loaded at run time; absent: [`Error::RuntimeUnavailable`]), loaded once per device |
//!
//! The library's kernels run on the stream they are given; [`axpy`], [`scale`], [`asum`] and
//! [`sumsq`] on the written guard's stream. Every call is queued when it returns, not waited
//! for (the reductions, which return a value, wait for their partial sums): a later access of
//! any kind, on any stream, sees the result (device work on another stream is ordered after it
//! on the device; a host access waits for it).
//!
//! Reductions run in two stages: each work-group writes one partial sum, and the host adds the
//! partial sums (in `f64`). `n` may be anything, including 0 and values that are not a multiple
//! of the work-group size. Reading the partial sums back (at most 256 values, into a scratch
//! buffer of the device) shows in the process-wide copy counters ([`crate::stats`]), never in
//! the counters of the buffer reduced: its head and mirrors are untouched.
//!
//! A failed build (or a device without `cl_khr_fp64`, for `f64`) is not kept: the next call
//! tries again.
//!
//! # Kernels of your own
//!
//! [`launch`] runs a [`UserKernel`] (OpenCL C, CUDA C, or a host closure on `cpu`) on
//! [`SyncedMemory`](crate::SyncedMemory) buffers and [`Tensor`](crate::Tensor)s, each taken
//! through its guard ([`Arg::read`], [`Arg::write`], [`Arg::overwrite`]), so that the head
//! state machine makes exactly the copies needed, and orders and records the launch as the
//! crate's own kernels are.
//!
//! # Element types
//!
//! [`Scalar`] lists the element types of [`ParamBlob`](crate::param::ParamBlob) (`f32`, `f64`,
//! `i32`, `u32`, as in Caffe); [`Float`] is the subset with kernels (`f32`, `f64`).

use std::fmt;

use crate::backend::Reduce;
use crate::device::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use crate::synced::{DeviceRead, DeviceWrite};

mod epilogue;
mod launch;
mod library;
mod operand;

pub use crate::backend::cpu::math as host;
pub use crate::device::{Grid, UserKernel};
pub use crate::dtype::{Float, Scalar, ScalarKind};
pub use epilogue::Epilogue;
pub use launch::{launch, Arg, Buffer, BufferMut};
pub use library::{
    accuracy, axpy_multi, col_sum, fill, gemm, relu, relu_grad, softmax_loss, softmax_loss_grad,
    Accuracy, AxpyTriple, Gemm, SoftmaxLoss, SoftmaxLossGrad, AXPY_MULTI,
};
pub use operand::{BadLabel, Dst, Empty, Src};

/// The four operations, for error messages and dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Axpy,
    Scale,
    Asum,
    Sumsq,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Axpy => "axpy",
            Op::Scale => "scale",
            Op::Asum => "asum",
            Op::Sumsq => "sumsq",
        }
    }
}

/// `y[..n] += a * x[..n]` on the device of `y`, on `y`'s stream.
///
/// # Errors
/// [`Error::OutOfBounds`] when either buffer holds fewer than `n` elements,
/// [`Error::DeviceMismatch`] when `x` and `y` are on different devices,
/// [`Error::Unsupported`] for `f64` on an OpenCL device without `cl_khr_fp64`,
/// [`Error::RuntimeUnavailable`] on CUDA when `libnvrtc` cannot be loaded, or a backend error
/// (including a failed kernel build).
pub fn axpy<F: Float>(n: usize, a: F, x: &DeviceRead<'_>, y: &mut DeviceWrite<'_>) -> Result<()> {
    check_len::<F>(Op::Axpy, "x", n, x.buffer())?;
    check_len::<F>(Op::Axpy, "y", n, y.buffer())?;
    let (xd, yd) = (x.buffer().device(), y.buffer().device());
    if !xd.same(yd) {
        return Err(Error::DeviceMismatch {
            op: "kernels::axpy",
            expected: yd.label().to_string(),
            actual: xd.label().to_string(),
        });
    }
    y.stream().kernels().axpy(n, a, x.buffer(), y.buffer())
}

/// `x[..n] *= a` on the device of `x`, on its stream.
///
/// # Errors
/// As [`axpy`].
pub fn scale<F: Float>(n: usize, a: F, x: &mut DeviceWrite<'_>) -> Result<()> {
    check_len::<F>(Op::Scale, "x", n, x.buffer())?;
    x.stream().kernels().scale(n, a, x.buffer())
}

/// `sum |x[i]|` over the first `n` elements, on the device of `x`.
///
/// # Errors
/// As [`axpy`].
pub fn asum<F: Float>(n: usize, x: &DeviceRead<'_>) -> Result<F> {
    check_len::<F>(Op::Asum, "x", n, x.buffer())?;
    x.stream().kernels().reduce(Reduce::Asum, n, x.buffer())
}

/// `sum x[i]^2` over the first `n` elements, on the device of `x`.
///
/// # Errors
/// As [`axpy`].
pub fn sumsq<F: Float>(n: usize, x: &DeviceRead<'_>) -> Result<F> {
    check_len::<F>(Op::Sumsq, "x", n, x.buffer())?;
    x.stream().kernels().reduce(Reduce::Sumsq, n, x.buffer())
}

/// Builds (or finds) the kernels for `F` on `device`, so that the first real call does not pay
/// the build. A no-op on the `cpu` device.
///
/// # Errors
/// As [`axpy`].
pub fn prepare<F: Float>(device: &Device) -> Result<()> {
    device
        .default_stream_lent()?
        .kernels()
        .prepare_math(F::KIND)
}

/// Checks that `buf` holds `n` elements of `F`; the error text is built only on failure.
fn check_len<F: Float>(op: Op, arg: &'static str, n: usize, buf: &DeviceBuffer) -> Result<()> {
    let have = buf.len() / std::mem::size_of::<F>();
    if n <= have {
        return Ok(());
    }
    Err(Error::OutOfBounds {
        what: LenWhat {
            op,
            arg,
            kind: F::KIND,
            bytes: buf.len(),
        }
        .to_string(),
        offset: 0,
        len: n,
        size: have,
    })
}

struct LenWhat {
    op: Op,
    arg: &'static str,
    kind: ScalarKind,
    bytes: usize,
}

impl fmt::Display for LenWhat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {}<{}> argument {} (in elements; the buffer holds {} bytes)",
            self.op.name(),
            self.kind,
            self.arg,
            self.bytes
        )
    }
}
