//! [`inspect`]: a safetensors file's table of contents, read from its header alone.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::Metadata;

use super::{element_dtype, format_error, io_error, MAX_HEADER_BYTES};
use crate::dtype::DType;
use crate::error::Result;

#[cfg(doc)]
use crate::error::Error;

/// One tensor listed in a safetensors file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
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
/// without reading the tensor data.
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
    let mut file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let file_bytes = file.metadata().map_err(io_error("stat", path))?.len();
    if file_bytes < 8 {
        return Err(format_error(
            path,
            format!("the file is {file_bytes} bytes, shorter than the 8-byte header length"),
        ));
    }
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io_error("read", path))?;
    let header_bytes = u64::from_le_bytes(len);
    if header_bytes > MAX_HEADER_BYTES {
        return Err(format_error(
            path,
            format!("the header length {header_bytes} exceeds the {MAX_HEADER_BYTES}-byte limit"),
        ));
    }
    if header_bytes > file_bytes - 8 {
        return Err(format_error(
            path,
            format!(
                "the header length {header_bytes} runs past the end of the file ({file_bytes} \
                 bytes): truncated?"
            ),
        ));
    }
    // At most MAX_HEADER_BYTES (100 MB), so it fits in usize.
    let mut header = vec![0u8; header_bytes as usize];
    file.read_exact(&mut header)
        .map_err(io_error("read", path))?;
    let header = std::str::from_utf8(&header)
        .map_err(|e| format_error(path, format!("the header is not UTF-8: {e}")))?;
    let meta: Metadata = serde_json::from_str(header)
        .map_err(|e| format_error(path, format!("invalid header: {e}")))?;
    let data_bytes = file_bytes - 8 - header_bytes;
    if meta.data_len() as u64 != data_bytes {
        return Err(format_error(
            path,
            format!(
                "the header describes {} bytes of tensor data but the file holds {data_bytes}{}",
                meta.data_len(),
                if (meta.data_len() as u64) > data_bytes {
                    ": truncated?"
                } else {
                    ""
                }
            ),
        ));
    }
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
