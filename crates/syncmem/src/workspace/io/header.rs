//! [`inspect`]: a safetensors file's table of contents, read from its header alone.

use std::collections::BTreeMap;
use std::io::{BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

use ::safetensors::tensor::Metadata;

use super::{element_dtype, format_error, io_error, MAX_HEADER_BYTES};
use crate::dtype::DType;
use crate::error::Result;

#[cfg(doc)]
use crate::error::Error;

/// One tensor listed in a safetensors file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileTensor {
    /// Its name.
    pub name: String,
    /// Its element type as the file names it: `F32`, `BOOL`, `BF16`, `F8_E4M3`, ...
    pub dtype: String,
    /// The syncmem element type, when there is one (`None` for `F8_*`, `C64`, ...).
    pub element: Option<DType>,
    /// Its dims (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Start of its bytes, counted from the start of the data section.
    pub offset: usize,
    /// Its size in bytes.
    pub nbytes: usize,
}

/// The table of contents of a safetensors file (see [`inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileInfo {
    /// The file.
    pub path: PathBuf,
    /// Size of the file in bytes.
    pub file_bytes: u64,
    /// Size of the JSON header in bytes (without the 8-byte length before it).
    pub header_bytes: u64,
    /// The header's free-form `__metadata__` strings (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// The tensors, sorted by name.
    pub tensors: Vec<FileTensor>,
}

impl FileInfo {
    /// Bytes of tensor data: the sum of [`FileTensor::nbytes`].
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes as u64).sum()
    }
}

/// Reads the header of the safetensors file `path` and checks it against the file's size,
/// without reading the tensor data (a header is at most 100 MB, the format's limit).
///
/// ```
/// use syncmem::{dtype::DType, workspace::{io, Workspace}};
///
/// # fn main() -> syncmem::Result<()> {
/// let ws = Workspace::new();
/// ws.create_tensor("w", &[4, 2], DType::F32, None)?;
/// let path = std::env::temp_dir().join(format!("syncmem-inspect-{}.safetensors", std::process::id()));
/// ws.save(&path, None)?;
/// let info = io::inspect(&path)?;
/// assert_eq!(info.tensors[0].name, "w");
/// assert_eq!((info.tensors[0].dtype.as_str(), info.tensors[0].nbytes), ("F32", 32));
/// assert_eq!(info.tensors[0].shape, [4, 2]);
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::Io`] when the file cannot be opened or read; [`Error::Format`] when the header is
/// not valid (length, UTF-8, JSON, offsets, shapes) or the data is shorter or longer than the
/// header says.
pub fn inspect(path: impl AsRef<Path>) -> Result<FileInfo> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let file_bytes = file.metadata().map_err(io_error("stat", path))?.len();
    let (header_bytes, meta) = read_header(&mut BufReader::new(file), path, Some(file_bytes))?;
    check_data_len(path, &meta, file_bytes - 8 - header_bytes)?;
    let mut tensors: Vec<FileTensor> = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| FileTensor {
            name,
            dtype: info.dtype.to_string(),
            element: element_dtype(info.dtype),
            shape: info.shape.clone(),
            offset: info.data_offsets.0,
            nbytes: info.data_offsets.1 - info.data_offsets.0,
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let metadata = meta
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    Ok(FileInfo {
        path: path.to_path_buf(),
        file_bytes,
        header_bytes,
        metadata,
        tensors,
    })
}

/// Reads the 8-byte header length and the JSON header (at most [`MAX_HEADER_BYTES`]) from
/// `input`, checked against `file_bytes` when the size is known (a regular file). Returns the
/// header's length and its validated contents (names, element types, shapes, contiguous
/// offsets).
pub(super) fn read_header(
    input: &mut impl Read,
    path: &Path,
    file_bytes: Option<u64>,
) -> Result<(u64, Metadata)> {
    if let Some(n) = file_bytes.filter(|&n| n < 8) {
        return Err(format_error(
            path,
            format!("the file is {n} bytes, shorter than the 8-byte header length"),
        ));
    }
    let mut len = [0u8; 8];
    input.read_exact(&mut len).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            format_error(path, "the file ends before the 8-byte header length")
        } else {
            io_error("read", path)(e)
        }
    })?;
    let header_bytes = u64::from_le_bytes(len);
    if header_bytes > MAX_HEADER_BYTES {
        return Err(format_error(
            path,
            format!("the header length {header_bytes} exceeds the {MAX_HEADER_BYTES}-byte limit"),
        ));
    }
    if let Some(n) = file_bytes.filter(|&n| header_bytes > n - 8) {
        return Err(format_error(
            path,
            format!(
                "the header length {header_bytes} runs past the end of the file ({n} bytes): \
                 truncated?"
            ),
        ));
    }
    // Read as it arrives (never more than the bounded length), so that a forged length on a
    // stream costs only what the stream holds.
    let mut header = Vec::new();
    input
        .take(header_bytes)
        .read_to_end(&mut header)
        .map_err(io_error("read", path))?;
    if header.len() as u64 != header_bytes {
        return Err(format_error(
            path,
            format!(
                "the file ends inside the {header_bytes}-byte header, after {} bytes: truncated?",
                header.len()
            ),
        ));
    }
    let header = std::str::from_utf8(&header)
        .map_err(|e| format_error(path, format!("the header is not UTF-8: {e}")))?;
    let meta: Metadata = serde_json::from_str(header)
        .map_err(|e| format_error(path, format!("invalid header: {e}")))?;
    Ok((header_bytes, meta))
}

/// Checks that the data section holds exactly the bytes the header describes.
pub(super) fn check_data_len(path: &Path, meta: &Metadata, data_bytes: u64) -> Result<()> {
    let described = meta.data_len() as u64;
    if described == data_bytes {
        return Ok(());
    }
    Err(format_error(
        path,
        format!(
            "the header describes {described} bytes of tensor data but the file holds \
             {data_bytes}{}",
            if described > data_bytes {
                ": truncated?"
            } else {
                ""
            }
        ),
    ))
}
