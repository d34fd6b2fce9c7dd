//! A small per-device kernel layer: `axpy`, `scale`, `asum` and `sumsq` over `f32` and `f64`,
//! on the host and on a buffer's device.
//!
//! | backend | how it runs |
//! |---|---|
//! | host slices ([`host`]) | plain Rust loops |
//! | `cpu` device | the same loops over the `cpu` device's memory |
//! | `opencl:N` | OpenCL C kernels, built once per device and cached process-wide; `f64` needs `cl_khr_fp64` |
//! | `cuda:N` | CUDA C kernels compiled at run time by NVRTC (`libnvrtc` loaded at run time; absent: [`Error::RuntimeUnavailable`]), loaded once per device and cached process-wide. **Compile-checked only: never run** (no GPU where it was written) |
//!
//! The device functions take the access guards of [`SyncedMemory`](crate::SyncedMemory), so the
//! caller has already made the device mirror current (or taken it for writing), and they run
//! on the guard's stream. Every call is complete when it returns: a later access of any kind,
//! on any stream, sees the result.
//!
//! Reductions run in two stages: each work-group writes one partial sum, and the host adds the
//! partial sums (in `f64`). `n` may be anything, including 0 and values that are not a multiple
//! of the work-group size. Reading the partial sums back (at most 256 values, into a scratch
//! buffer of the device) shows in the process-wide copy counters ([`crate::stats`]), never in
//! the counters of the buffer reduced: its head and mirrors are untouched.
//!
//! A failed build (or a device without `cl_khr_fp64`, for `f64`) is not cached: the next call
//! tries again.
//!
//! # Element types
//!
//! [`Scalar`] lists the element types of [`ParamBlob`](crate::param::ParamBlob) (`f32`, `f64`,
//! `i32`, `u32`, as in Caffe); [`Float`] is the subset with kernels (`f32`, `f64`).

#[cfg(any(feature = "opencl", feature = "cuda"))]
pub(crate) mod cache;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod host;
#[cfg(feature = "opencl")]
pub(crate) mod opencl;

use std::fmt;
use std::ops::{Add, Mul, Neg, Sub};

use crate::device::Device;
use crate::error::{BackendKind, Error, Result};
use crate::synced::{DeviceRead, DeviceWrite};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
}

/// Which element type a [`Scalar`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScalarKind {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i32` (shape and data only: no math, as in Caffe).
    I32,
    /// `u32` (shape and data only: no math, as in Caffe).
    U32,
}

impl ScalarKind {
    /// The Rust name of the type (`f32`, `f64`, `i32`, `u32`).
    pub fn name(self) -> &'static str {
        match self {
            ScalarKind::F32 => "f32",
            ScalarKind::F64 => "f64",
            ScalarKind::I32 => "i32",
            ScalarKind::U32 => "u32",
        }
    }

    /// True for the types with kernels (`f32`, `f64`).
    pub fn is_float(self) -> bool {
        matches!(self, ScalarKind::F32 | ScalarKind::F64)
    }
}

impl fmt::Display for ScalarKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type of a parameter blob. Sealed: implemented for `f32`, `f64`, `i32`, `u32`.
pub trait Scalar:
    bytemuck::Pod + Default + PartialEq + fmt::Debug + Send + Sync + 'static + sealed::Sealed
{
    /// Which type this is.
    const KIND: ScalarKind;
    /// The value as `f64` (exact for every implementing type).
    fn to_f64(self) -> f64;
    /// The nearest value of this type to `v` (saturating for the integer types).
    fn from_f64(v: f64) -> Self;
}

/// A floating-point [`Scalar`] with kernels: `f32` and `f64`. Sealed.
pub trait Float:
    Scalar + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Neg<Output = Self>
{
    /// Zero.
    const ZERO: Self;
    /// The OpenCL C name of the type (`float`, `double`).
    const CL_NAME: &'static str;
    /// The absolute value.
    fn abs(self) -> Self;
}

macro_rules! impl_scalar {
    ($t:ty, $kind:ident) => {
        impl Scalar for $t {
            const KIND: ScalarKind = ScalarKind::$kind;
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
impl_scalar!(f32, F32);
impl_scalar!(f64, F64);
impl_scalar!(i32, I32);
impl_scalar!(u32, U32);

impl Float for f32 {
    const ZERO: Self = 0.0;
    const CL_NAME: &'static str = "float";
    fn abs(self) -> Self {
        f32::abs(self)
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const CL_NAME: &'static str = "double";
    fn abs(self) -> Self {
        f64::abs(self)
    }
}

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

/// `y[..n] += a * x[..n]` on the device of `y`.
///
/// # Errors
/// [`Error::OutOfBounds`] when either buffer holds fewer than `n` elements,
/// [`Error::DeviceMismatch`] when `x` and `y` are on different devices,
/// [`Error::Unsupported`] for `f64` on an OpenCL device without `cl_khr_fp64` (or on a backend
/// this build has no kernels for), [`Error::RuntimeUnavailable`] on CUDA when `libnvrtc` cannot
/// be loaded, or a backend error (including a failed kernel build).
pub fn axpy<F: Float>(n: usize, a: F, x: &DeviceRead<'_>, y: &mut DeviceWrite<'_>) -> Result<()> {
    check_len::<F>(Op::Axpy, "x", n, x.buffer().len())?;
    check_len::<F>(Op::Axpy, "y", n, y.buffer().len())?;
    let (xd, yd) = (x.buffer().device(), y.buffer().device());
    if !xd.same(yd) {
        return Err(Error::DeviceMismatch {
            op: "kernels::axpy",
            expected: yd.label().to_string(),
            actual: xd.label().to_string(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    match yd.backend() {
        BackendKind::Cpu => {
            let xs = cpu_slice::<F>(Op::Axpy, x.buffer().as_cpu_slice(), n)?;
            let ys = cpu_slice_mut::<F>(Op::Axpy, y.cpu_slice_mut(), n)?;
            host::axpy(a, xs, ys)
        }
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => opencl::axpy(n, a, x, y),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda::axpy(n, a, x, y),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported(yd, Op::Axpy)),
    }
}

/// `x[..n] *= a` on the device of `x`.
///
/// # Errors
/// As [`axpy`].
pub fn scale<F: Float>(n: usize, a: F, x: &mut DeviceWrite<'_>) -> Result<()> {
    check_len::<F>(Op::Scale, "x", n, x.buffer().len())?;
    if n == 0 {
        return Ok(());
    }
    let dev = x.buffer().device().clone();
    match dev.backend() {
        BackendKind::Cpu => {
            host::scale(a, cpu_slice_mut::<F>(Op::Scale, x.cpu_slice_mut(), n)?);
            Ok(())
        }
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => opencl::scale(n, a, x),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda::scale(n, a, x),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported(&dev, Op::Scale)),
    }
}

/// `sum |x[i]|` over the first `n` elements, on the device of `x`.
///
/// # Errors
/// As [`axpy`].
pub fn asum<F: Float>(n: usize, x: &DeviceRead<'_>) -> Result<F> {
    reduce(Op::Asum, n, x)
}

/// `sum x[i]^2` over the first `n` elements, on the device of `x`.
///
/// # Errors
/// As [`axpy`].
pub fn sumsq<F: Float>(n: usize, x: &DeviceRead<'_>) -> Result<F> {
    reduce(Op::Sumsq, n, x)
}

fn reduce<F: Float>(op: Op, n: usize, x: &DeviceRead<'_>) -> Result<F> {
    check_len::<F>(op, "x", n, x.buffer().len())?;
    if n == 0 {
        return Ok(F::ZERO);
    }
    let dev = x.buffer().device();
    match dev.backend() {
        BackendKind::Cpu => {
            let xs = cpu_slice::<F>(op, x.buffer().as_cpu_slice(), n)?;
            Ok(match op {
                Op::Asum => host::asum(xs),
                _ => host::sumsq(xs),
            })
        }
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => opencl::reduce(op, n, x),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda::reduce(op, n, x),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported(dev, op)),
    }
}

/// Builds (or finds in the cache) the kernels for `F` on `device`, so that the first real call
/// does not pay the build. A no-op on the `cpu` device.
///
/// # Errors
/// As [`axpy`].
pub fn prepare<F: Float>(device: &Device) -> Result<()> {
    match device.backend() {
        BackendKind::Cpu => Ok(()),
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => opencl::prepare::<F>(device),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda::prepare::<F>(device),
        #[allow(unreachable_patterns)]
        _ => Err(unsupported(device, Op::Axpy)),
    }
}

/// The `Unsupported` error of a backend without kernels in this build (its feature is off).
#[allow(dead_code)]
fn unsupported(dev: &Device, op: Op) -> Error {
    let why = "this backend has no kernels in this build";
    Error::Unsupported {
        device: dev.label().to_string(),
        what: format!("kernel {}: {why}", op.name()),
    }
}

fn check_len<F: Float>(op: Op, arg: &str, n: usize, bytes: usize) -> Result<()> {
    let size = std::mem::size_of::<F>();
    crate::error::check_range(
        &format!(
            "kernel {}<{}> argument {arg} (in elements; the buffer holds {bytes} bytes)",
            op.name(),
            F::KIND
        ),
        0,
        n,
        bytes / size,
    )
}

fn cpu_slice<F: Float>(op: Op, bytes: Option<&[u8]>, n: usize) -> Result<&[F]> {
    let bytes = bytes.ok_or_else(|| not_cpu(op))?;
    let all: &[F] = bytemuck::try_cast_slice(bytes).map_err(|e| cast_err::<F>(op, e))?;
    all.get(..n).ok_or_else(|| not_cpu(op))
}

fn cpu_slice_mut<F: Float>(op: Op, bytes: Option<&mut [u8]>, n: usize) -> Result<&mut [F]> {
    let bytes = bytes.ok_or_else(|| not_cpu(op))?;
    let all: &mut [F] = bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_err::<F>(op, e))?;
    all.get_mut(..n).ok_or_else(|| not_cpu(op))
}

fn not_cpu(op: Op) -> Error {
    Error::InvalidState {
        op: "kernel on the cpu device",
        buffer: format!("argument of {}", op.name()),
        reason: "the buffer's memory is not cpu-device memory of the expected length".into(),
    }
}

fn cast_err<F: Float>(op: Op, e: bytemuck::PodCastError) -> Error {
    Error::InvalidState {
        op: "kernel on the cpu device",
        buffer: format!("argument of {}", op.name()),
        reason: format!("cannot view the memory as {}: {e:?}", F::KIND),
    }
}
