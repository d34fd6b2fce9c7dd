//! Saving and loading a workspace's tensors as [safetensors] files, and reading a file's table
//! of contents.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header (name → element
//! type, shape, byte range), then the tensors' bytes, little-endian, row-major. It is the format
//! of Hugging Face's `safetensors` packages (Python, Rust); files written here are read by
//! `safetensors.numpy.load_file` and the other way round.
//!
//! | [`DType`] | file dtype | | [`DType`] | file dtype |
//! |---|---|---|---|---|
//! | `Bool` | `BOOL` | | `I64` | `I64` |
//! | `U8`, `I8` | `U8`, `I8` | | `F16` | `F16` |
//! | `U16`, `I16` | `U16`, `I16` | | `BF16` | `BF16` |
//! | `U32`, `I32` | `U32`, `I32` | | `F32`, `F64` | `F32`, `F64` |
//! | `U64` | `U64` | | `String` | none: an error naming the blob |
//!
//! Files holding other element types (`F8_*`, `F4`, `F6_*`, `C64`) can be
//! [inspected](inspect) but not loaded.
//!
//! # Compared with Caffe2's blob serialisation
//!
//! Caffe2 serialises each blob into a `BlobProto` (protobuf) with a `TensorProto` payload,
//! chunked and written by a `Save` operator into a DB; `Load` restores it onto the device named
//! in the proto. Here:
//!
//! - one file holds the chosen tensors, in a format other tools read; there is no chunking and
//!   no DB;
//! - the device is chosen when loading ([`Workspace::load`]): safetensors records none;
//! - payloads are the raw little-endian bytes (Caffe2 widened `bool`, 8- and 16-bit integers
//!   and `float16` to `int32` fields);
//! - only tensors are saved: `String` tensors and other blob types have no safetensors form
//!   (Caffe2 serialised strings and registered custom types);
//! - a load validates the whole file and builds every tensor before it touches the workspace,
//!   so a corrupt or truncated file leaves the workspace unchanged; it streams the file (the
//!   header is bounded by the format's 100 MB limit), so a huge or endless input (`/dev/zero`)
//!   is an error, not an exhausted memory; a save writes a temporary file next to the target
//!   and renames it ([`crate::file::write_atomic`]), so a failed save leaves an existing file
//!   intact, and refuses a target that is not a regular file (`/dev/null`, a FIFO).
//!
//! [safetensors]: https://huggingface.co/docs/safetensors

mod header;
mod load;
mod save;

pub use header::{inspect, FileInfo, FileTensor};

use std::borrow::Cow;
use std::path::Path;

use ::safetensors::{Dtype, SafeTensorError};

use crate::dtype::DType;
use crate::error::Error;

#[cfg(doc)]
use crate::workspace::Workspace;

/// Format name used in [`Error::Format`].
const FORMAT: &str = "safetensors";

/// Largest header the safetensors crate accepts (100 MB), checked before reading one.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The name the safetensors header reserves for its string-to-string metadata.
const METADATA_KEY: &str = "__metadata__";

/// The file element type of a [`DType`] (`None` for `String`).
fn file_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::U16 => Dtype::U16,
        DType::I16 => Dtype::I16,
        DType::U32 => Dtype::U32,
        DType::I32 => Dtype::I32,
        DType::U64 => Dtype::U64,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::String => return None,
    })
}

/// The [`DType`] of a file element type (`None` for the types syncmem does not have).
fn element_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::U16 => DType::U16,
        Dtype::I16 => DType::I16,
        Dtype::U32 => DType::U32,
        Dtype::I32 => DType::I32,
        Dtype::U64 => DType::U64,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |error| Error::Io {
        op,
        path: path.to_path_buf(),
        error,
    }
}

fn format_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Format {
        format: FORMAT,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A safetensors error as ours: I/O errors as [`Error::Io`], the rest as [`Error::Format`].
fn file_error(op: &'static str, path: &Path, e: SafeTensorError) -> Error {
    match e {
        SafeTensorError::IoError(error) => io_error(op, path)(error),
        e => format_error(path, e.to_string()),
    }
}

/// File bytes (little-endian) to host bytes: a copy with each element's bytes reversed on a
/// big-endian host, the same bytes otherwise. The same conversion works in both directions.
fn le_to_native(bytes: &[u8], size: usize) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") || size == 1 {
        return Cow::Borrowed(bytes);
    }
    let mut v = bytes.to_vec();
    for elem in v.chunks_exact_mut(size) {
        elem.reverse();
    }
    Cow::Owned(v)
}

/// [`le_to_native`] in place.
fn native_in_place(bytes: &mut [u8], size: usize) {
    if cfg!(target_endian = "little") || size == 1 {
        return;
    }
    for elem in bytes.chunks_exact_mut(size) {
        elem.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_mapping_round_trips() {
        for d in DType::ALL {
            match file_dtype(d) {
                Some(f) => {
                    assert_eq!(element_dtype(f), Some(d));
                    assert_eq!(f.bitsize(), d.size() * 8, "{d}");
                }
                None => assert_eq!(d, DType::String),
            }
        }
        assert_eq!(element_dtype(Dtype::C64), None);
        assert_eq!(element_dtype(Dtype::F8_E4M3), None);
    }

    #[test]
    fn little_endian_conversion() {
        let bytes = [1u8, 2, 3, 4];
        let out = le_to_native(&bytes, 2);
        let values: Vec<u16> = out
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(values, [0x0201, 0x0403]);
        assert!(matches!(le_to_native(&bytes, 1), Cow::Borrowed(_)));
    }
}
