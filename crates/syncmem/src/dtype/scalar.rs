//! Element types of the math kernels: [`Scalar`] (the element types of
//! [`ParamBlob`](crate::param::ParamBlob): `f32`, `f64`, `i32`, `u32`, as in Caffe) and
//! [`Float`], the subset with kernels (`f32`, `f64`). Re-exported by [`crate::kernels`].

use std::fmt;
use std::ops::{Add, Mul, Neg, Sub};

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
