//! Element types: [`DType`] names an element type at run time, [`Element`] at compile time.
//!
//! Caffe2 keeps a `TypeMeta` per tensor (id, item size, constructor, copy, destructor). Here the
//! set of element types is closed: thirteen plain-old-data types that live as bytes in a
//! [`crate::SyncedMemory`] (host and device), and [`String`], which lives on the host only as a
//! `Vec<String>` (Caffe2's non-fundamental `std::string` tensors).
//!
//! | [`DType`] | Rust type | bytes | storage |
//! |---|---|---|---|
//! | `Bool` | `bool` | 1 | bytes, validated (0 or 1) whenever viewed as `bool` |
//! | `U8` .. `I64` | `u8` .. `i64` | 1–8 | bytes |
//! | `F16`, `BF16` | [`half::f16`], [`half::bf16`] | 2 | bytes |
//! | `F32`, `F64` | `f32`, `f64` | 4, 8 | bytes |
//! | `String` | `String` | `size_of::<String>()` | host-only `Vec<String>` |
//!
//! [`Element`] is sealed: the tensor code relies on each implementation's byte conversions for
//! soundness, so no type outside this list can claim to be an element.
//!
//! `bool` is not [`bytemuck::Pod`] (only 0 and 1 are valid), so a `bool` view validates its
//! bytes (through [`bytemuck::CheckedBitPattern`]) each time it is taken: bind the slice once
//! (`let s = &mut *guard;`) rather than indexing the guard in a loop.

use std::fmt;

mod scalar;

pub use scalar::{Float, Scalar, ScalarKind};

/// The element type of a tensor, known at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// `bool`, one byte (0 or 1).
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// IEEE half precision ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `String`: not plain data, host only.
    String,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::String,
    ];

    /// Size of one element in bytes (Caffe2's `itemsize`; `size_of::<String>()` for `String`).
    pub const fn size(self) -> usize {
        use std::mem::size_of;
        match self {
            DType::Bool => size_of::<bool>(),
            DType::U8 => size_of::<u8>(),
            DType::I8 => size_of::<i8>(),
            DType::U16 => size_of::<u16>(),
            DType::I16 => size_of::<i16>(),
            DType::U32 => size_of::<u32>(),
            DType::I32 => size_of::<i32>(),
            DType::U64 => size_of::<u64>(),
            DType::I64 => size_of::<i64>(),
            DType::F16 => size_of::<half::f16>(),
            DType::BF16 => size_of::<half::bf16>(),
            DType::F32 => size_of::<f32>(),
            DType::F64 => size_of::<f64>(),
            DType::String => size_of::<String>(),
        }
    }

    /// Alignment of one element in bytes.
    pub const fn align(self) -> usize {
        use std::mem::align_of;
        match self {
            DType::Bool => align_of::<bool>(),
            DType::U8 => align_of::<u8>(),
            DType::I8 => align_of::<i8>(),
            DType::U16 => align_of::<u16>(),
            DType::I16 => align_of::<i16>(),
            DType::U32 => align_of::<u32>(),
            DType::I32 => align_of::<i32>(),
            DType::U64 => align_of::<u64>(),
            DType::I64 => align_of::<i64>(),
            DType::F16 => align_of::<half::f16>(),
            DType::BF16 => align_of::<half::bf16>(),
            DType::F32 => align_of::<f32>(),
            DType::F64 => align_of::<f64>(),
            DType::String => align_of::<String>(),
        }
    }

    /// The Rust name of the type: `bool`, `u8`, ..., `f16`, `bf16`, `f32`, `f64`, `String`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::String => "String",
        }
    }

    /// True for the types stored as plain bytes (host and device); false for `String`.
    pub const fn is_pod(self) -> bool {
        !matches!(self, DType::String)
    }

    /// The type named `name` (as returned by [`DType::name`], ASCII case ignored).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be a tensor element. Sealed: implemented for `bool`, the integer types
/// from 8 to 64 bits, [`half::f16`], [`half::bf16`], `f32`, `f64` and `String`.
pub trait Element:
    sealed::Sealed + Clone + Default + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The run-time name of this type.
    const DTYPE: DType;
}

/// An [`Element`] stored as plain bytes, on the host and on devices (every element type except
/// `String`). All of them are [`bytemuck::Pod`] except `bool`, which is
/// [`bytemuck::CheckedBitPattern`].
pub trait PodElement: Element + Copy {}

pub(crate) mod sealed {
    //! The byte conversions behind [`super::Element`]. Not nameable outside the crate.

    /// Host memory owned by an adopted value, viewed as bytes.
    pub struct OwnedBytes(pub(crate) Box<dyn AsMut<[u8]> + Send + Sync>);

    /// An adopted vector, ready to become a tensor's storage.
    pub enum Adopted {
        /// Plain data: host bytes for a [`crate::SyncedMemory`].
        Bytes(OwnedBytes),
        /// `String` elements.
        Strings(Vec<String>),
    }

    impl AsMut<[u8]> for OwnedBytes {
        fn as_mut(&mut self) -> &mut [u8] {
            (*self.0).as_mut()
        }
    }

    /// Conversions between stored elements and their views.
    pub trait Sealed: Sized {
        /// Views bytes as elements (length, alignment and, for `bool`, validity checked).
        fn view(bytes: &[u8]) -> Result<&[Self], String>;
        /// Views bytes mutably as elements.
        fn view_mut(bytes: &mut [u8]) -> Result<&mut [Self], String>;
        /// The bytes of elements (`None` for `String`).
        fn as_bytes(elems: &[Self]) -> Option<&[u8]>;
        /// Elements read from bytes of any alignment.
        fn collect(bytes: &[u8]) -> Result<Vec<Self>, String>;
        /// Views a string storage (`Some` only for `String`).
        fn strings(s: &[String]) -> Option<&[Self]>;
        /// Views a string storage mutably (`Some` only for `String`).
        fn strings_mut(s: &mut [String]) -> Option<&mut [Self]>;
        /// Turns a vector into adoptable storage, without copying where the type allows.
        fn adopt(v: Vec<Self>) -> Adopted;
    }
}

use sealed::{Adopted, OwnedBytes, Sealed};

/// A vector of plain data, lent to a [`crate::SyncedMemory`] as its host mirror.
struct PodVec<T>(Vec<T>);

impl<T: bytemuck::Pod> AsMut<[u8]> for PodVec<T> {
    fn as_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.0)
    }
}

fn cast_err<T>(len: usize, e: impl fmt::Debug) -> String {
    format!(
        "{len} bytes cannot be viewed as {} (size {}, align {}): {e:?}",
        std::any::type_name::<T>(),
        std::mem::size_of::<T>(),
        std::mem::align_of::<T>()
    )
}

macro_rules! pod_elements {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
        impl PodElement for $t {}
        impl Sealed for $t {
            fn view(bytes: &[u8]) -> Result<&[Self], String> {
                bytemuck::try_cast_slice(bytes).map_err(|e| cast_err::<$t>(bytes.len(), e))
            }
            fn view_mut(bytes: &mut [u8]) -> Result<&mut [Self], String> {
                let len = bytes.len();
                bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_err::<$t>(len, e))
            }
            fn as_bytes(elems: &[Self]) -> Option<&[u8]> {
                Some(bytemuck::cast_slice(elems))
            }
            fn collect(bytes: &[u8]) -> Result<Vec<Self>, String> {
                let size = std::mem::size_of::<$t>();
                if bytes.len() % size != 0 {
                    return Err(cast_err::<$t>(bytes.len(), "length not a multiple of the size"));
                }
                let n = bytes.len() / size;
                let mut v: Vec<$t> = Vec::new();
                v.try_reserve_exact(n).map_err(|e| format!("{n} elements: {e}"))?;
                v.resize(n, <$t as bytemuck::Zeroable>::zeroed());
                bytemuck::cast_slice_mut::<$t, u8>(&mut v).copy_from_slice(bytes);
                Ok(v)
            }
            fn strings(_: &[String]) -> Option<&[Self]> {
                None
            }
            fn strings_mut(_: &mut [String]) -> Option<&mut [Self]> {
                None
            }
            fn adopt(v: Vec<Self>) -> Adopted {
                Adopted::Bytes(OwnedBytes(Box::new(PodVec(v))))
            }
        }
    )*};
}

pod_elements! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
}
impl PodElement for bool {}

fn bool_err(len: usize, e: bytemuck::checked::CheckedCastError) -> String {
    match e {
        bytemuck::checked::CheckedCastError::InvalidBitPattern => {
            format!("{len} bytes are not all valid bool values (0 or 1)")
        }
        e => cast_err::<bool>(len, e),
    }
}

impl Sealed for bool {
    fn view(bytes: &[u8]) -> Result<&[Self], String> {
        bytemuck::checked::try_cast_slice(bytes).map_err(|e| bool_err(bytes.len(), e))
    }
    fn view_mut(bytes: &mut [u8]) -> Result<&mut [Self], String> {
        let len = bytes.len();
        bytemuck::checked::try_cast_slice_mut(bytes).map_err(|e| bool_err(len, e))
    }
    fn as_bytes(elems: &[Self]) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(elems))
    }
    fn collect(bytes: &[u8]) -> Result<Vec<Self>, String> {
        Self::view(bytes).map(<[bool]>::to_vec)
    }
    fn strings(_: &[String]) -> Option<&[Self]> {
        None
    }
    fn strings_mut(_: &mut [String]) -> Option<&mut [Self]> {
        None
    }
    fn adopt(v: Vec<Self>) -> Adopted {
        // `&mut [u8]` over `bool`s would allow invalid values: convert (one copy) instead.
        let bytes: Vec<u8> = v.into_iter().map(u8::from).collect();
        Adopted::Bytes(OwnedBytes(Box::new(bytes)))
    }
}

impl Element for String {
    const DTYPE: DType = DType::String;
}

impl Sealed for String {
    fn view(bytes: &[u8]) -> Result<&[Self], String> {
        Err(format!(
            "String elements are not stored as bytes ({} bytes given)",
            bytes.len()
        ))
    }
    fn view_mut(bytes: &mut [u8]) -> Result<&mut [Self], String> {
        Self::view(bytes).map(|_| Default::default())
    }
    fn as_bytes(_: &[Self]) -> Option<&[u8]> {
        None
    }
    fn collect(bytes: &[u8]) -> Result<Vec<Self>, String> {
        Self::view(bytes).map(|_| Vec::new())
    }
    fn strings(s: &[String]) -> Option<&[Self]> {
        Some(s)
    }
    fn strings_mut(s: &mut [String]) -> Option<&mut [Self]> {
        Some(s)
    }
    fn adopt(v: Vec<Self>) -> Adopted {
        Adopted::Strings(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_names_and_pod() {
        assert_eq!(DType::F16.size(), 2);
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(DType::Bool.size(), 1);
        assert_eq!(DType::String.size(), std::mem::size_of::<String>());
        assert!(!DType::String.is_pod());
        assert!(DType::ALL[..13].iter().all(|d| d.is_pod()));
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert!(d.align() <= d.size());
        }
        assert_eq!(DType::from_name("float"), None);
        assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
        assert_eq!(f32::DTYPE.to_string(), "f32");
    }

    #[test]
    fn bool_views_validate() {
        let mut bytes = [0u8, 1, 1, 0];
        assert_eq!(bool::view(&bytes).unwrap(), &[false, true, true, false]);
        bool::view_mut(&mut bytes).unwrap()[0] = true;
        assert_eq!(bytes[0], 1);
        bytes[2] = 7;
        let e = bool::view(&bytes).unwrap_err();
        assert!(e.contains("bool"), "{e}");
        assert!(bool::collect(&bytes).is_err());
        assert_eq!(bool::as_bytes(&[true, false]).unwrap(), &[1, 0]);
    }

    #[test]
    fn collect_handles_unaligned_bytes() {
        let src: Vec<u8> = (0..9).collect();
        let v = u32::collect(&src[1..9]).unwrap();
        assert_eq!(
            v,
            vec![
                u32::from_ne_bytes([1, 2, 3, 4]),
                u32::from_ne_bytes([5, 6, 7, 8])
            ]
        );
        assert!(u32::collect(&src[..3]).is_err());
        assert!(String::view(&src).is_err());
    }
}
