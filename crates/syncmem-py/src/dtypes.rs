//! Element types between syncmem, NumPy and DLPack.

use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::prelude::*;
use syncmem::DType;

use crate::errors::TypeMismatchError;

/// The name Python sees for a syncmem element type (NumPy's names; `bfloat16`, and `str` for
/// `String` tensors).
pub fn name(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::U16 => "uint16",
        DType::I16 => "int16",
        DType::U32 => "uint32",
        DType::I32 => "int32",
        DType::U64 => "uint64",
        DType::I64 => "int64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::String => "str",
        // `DType` is non-exhaustive; a new type has no Python name yet.
        _ => "unknown",
    }
}

/// The NumPy dtype of a plain-data syncmem type; `TypeMismatchError` for `bfloat16` (NumPy
/// has none) and `str`.
pub fn numpy_descr<'py>(
    py: Python<'py>,
    d: DType,
    what: &str,
) -> PyResult<Bound<'py, PyArrayDescr>> {
    match d {
        DType::BF16 | DType::String => Err(TypeMismatchError::new_err(format!(
            "{what} holds {} elements, which have no NumPy dtype for a view{}",
            name(d),
            if d == DType::BF16 {
                " (fetch_blob converts bfloat16 to float32; DLPack exports it as is)"
            } else {
                " (fetch_blob returns them as an object array of str)"
            }
        ))),
        _ => PyArrayDescr::new(py, name(d)),
    }
}

/// What a NumPy array holds, for feeding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Plain data of this type.
    Pod(DType),
    /// Strings (`U`, `S` or `O` arrays), fed as a `String` tensor.
    Strings,
}

/// The syncmem type for a NumPy dtype; `TypeMismatchError` naming the dtype when there is none.
pub fn from_numpy(descr: &Bound<'_, PyArrayDescr>) -> PyResult<Fed> {
    let size = descr.itemsize();
    let d = match (descr.kind(), size) {
        (b'b', 1) => DType::Bool,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'U' | b'S' | b'O', _) => return Ok(Fed::Strings),
        // ml_dtypes' bfloat16 is a 2-byte 'V' dtype named bfloat16.
        (_, 2) if descr.str().is_ok_and(|s| s == "bfloat16") => DType::BF16,
        _ => {
            return Err(TypeMismatchError::new_err(format!(
                "NumPy dtype {} has no syncmem element type (supported: bool, int8..int64, \
                 uint8..uint64, float16, float32, float64, bfloat16, str)",
                descr.str().map(|s| s.to_string()).unwrap_or_default()
            )))
        }
    };
    Ok(Fed::Pod(d))
}

/// DLPack's type code and bits for a plain-data type (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2,
/// `kDLBfloat` 4, `kDLBool` 6).
pub fn dlpack_code(d: DType) -> Option<(u8, u8)> {
    Some(match d {
        DType::Bool => (6, 8),
        DType::I8 => (0, 8),
        DType::I16 => (0, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::U16 => (1, 16),
        DType::U32 => (1, 32),
        DType::U64 => (1, 64),
        DType::F16 => (2, 16),
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::BF16 => (4, 16),
        _ => return None,
    })
}

/// The syncmem type of a DLPack type (one lane only).
pub fn from_dlpack_code(code: u8, bits: u8, lanes: u16) -> Option<DType> {
    if lanes != 1 {
        return None;
    }
    DType::ALL
        .into_iter()
        .find(|&d| dlpack_code(d) == Some((code, bits)))
}
