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
//!   so a corrupt or truncated file leaves the workspace unchanged; a save writes a temporary
//!   file next to the target and renames it, so a failed save leaves an existing file intact.
//!
//! [safetensors]: https://huggingface.co/docs/safetensors

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Metadata, TensorView};
use ::safetensors::{Dtype, SafeTensorError, SafeTensors, View};
use parking_lot::RwLockReadGuard;

use super::{BlobRef, Workspace};
use crate::blob::Blob;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{HostBytes, Tensor};

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

/// Bytes of one tensor being saved.
enum SaveBytes<'a> {
    /// The tensor's host view (little-endian hosts).
    Host(HostBytes<'a>),
    /// A converted copy (big-endian hosts).
    Owned(Vec<u8>),
}

impl Deref for SaveBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SaveBytes::Host(h) => h,
            SaveBytes::Owned(v) => v,
        }
    }
}

/// One tensor being saved, as the safetensors writer sees it.
struct SaveEntry<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: SaveBytes<'a>,
}

impl View for &SaveEntry<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn save_state_error(name: &str, reason: String) -> Error {
    Error::InvalidState {
        op: "Workspace::save",
        buffer: format!("blob {name:?}"),
        reason,
    }
}

/// Checks that `t` (in blob `name`) can be saved and takes its host bytes: the newest data,
/// copied from the device first only when the device holds it alone.
fn save_entry<'a>(name: &str, t: &'a Tensor, path: &Path) -> Result<SaveEntry<'a>> {
    let numel = t.numel().ok_or_else(|| {
        save_state_error(
            name,
            "the tensor is uninitialised (no shape): nothing to save".into(),
        )
    })?;
    let dtype = t.dtype().ok_or_else(|| {
        save_state_error(
            name,
            format!(
                "the tensor (dims {:?}) has no element type yet: write it or call set_dtype",
                t.dims()
            ),
        )
    })?;
    let fdtype = file_dtype(dtype).ok_or_else(|| Error::TypeMismatch {
        what: format!("blob {name:?} (saving to {})", path.display()),
        stored: format!("a {dtype} tensor"),
        requested: "a tensor of plain data: safetensors has no string elements".into(),
    })?;
    if numel > 0 && !t.has_storage() {
        return Err(save_state_error(
            name,
            format!("the tensor has {numel} elements but no data: it was never written"),
        ));
    }
    let host = t.host_bytes()?;
    if dtype == DType::Bool {
        if let Some(pos) = host.iter().position(|&b| b > 1) {
            return Err(save_state_error(
                name,
                format!(
                    "element {pos} of the bool tensor holds the byte {}, not 0 or 1",
                    host[pos]
                ),
            ));
        }
    }
    let bytes = match le_to_native(&host, dtype.size()) {
        Cow::Borrowed(_) => SaveBytes::Host(host),
        Cow::Owned(v) => SaveBytes::Owned(v),
    };
    Ok(SaveEntry {
        dtype: fdtype,
        shape: t.dims().to_vec(),
        bytes,
    })
}

fn not_a_tensor(name: &str, blob: &Blob, path: &Path) -> Error {
    Error::TypeMismatch {
        what: format!("blob {name:?} (saving to {})", path.display()),
        stored: blob
            .type_name()
            .unwrap_or("nothing (the blob is empty)")
            .to_string(),
        requested: std::any::type_name::<Tensor>().to_string(),
    }
}

/// Builds the tensor `name` of a validated file on `device` (host only for `None`).
fn load_tensor(
    name: &str,
    view: &TensorView<'_>,
    device: Option<&Device>,
    path: &Path,
) -> Result<Tensor> {
    let dtype = element_dtype(view.dtype()).ok_or_else(|| Error::TypeMismatch {
        what: format!("tensor {name:?} in {}", path.display()),
        stored: view.dtype().to_string(),
        requested: "an element type syncmem has (BOOL, U8, I8, U16, I16, U32, I32, U64, I64, \
                    F16, BF16, F32, F64)"
            .into(),
    })?;
    let data = view.data();
    if dtype == DType::Bool {
        if let Some(pos) = data.iter().position(|&b| b > 1) {
            return Err(format_error(
                path,
                format!(
                    "element {pos} of the BOOL tensor {name:?} is the byte {}, not 0 or 1",
                    data[pos]
                ),
            ));
        }
    }
    // Label first: the storage takes the tensor's label when it is created.
    let mut t = Tensor::on(device).with_label(name);
    t.resize(view.shape())?;
    t.set_dtype(dtype)?;
    if data.is_empty() {
        return Ok(t);
    }
    let bytes = le_to_native(data, dtype.size());
    if device.is_some() {
        // Straight into device memory (as Caffe2's deserializer does): the head ends at the
        // device and no host mirror is allocated until the host asks.
        let mem = t.synced().ok_or_else(|| Error::InvalidState {
            op: "Workspace::load",
            buffer: format!("tensor {name:?}"),
            reason: "a plain-data tensor with elements has no byte storage".into(),
        })?;
        mem.device_overwrite()?.write_from(0, &bytes)?;
    } else {
        t.host_bytes_overwrite()?.copy_from_slice(&bytes);
    }
    Ok(t)
}

/// Writes the file. The safetensors crate writes a temporary file (mode 0600 on Unix) next to
/// `path` and renames it over `path`; the result gets the permissions of the file it replaces,
/// or those a plain create gives (the umask's), like any other file the caller writes.
fn write_file(path: &Path, entries: &[(&str, SaveEntry<'_>)]) -> Result<()> {
    let (permissions, created) = match std::fs::metadata(path) {
        Ok(m) => (m.permissions(), false),
        Err(_) => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(io_error("create", path))?;
            let m = f.metadata().map_err(io_error("stat", path))?;
            (m.permissions(), true)
        }
    };
    if let Err(e) =
        ::safetensors::serialize_to_file(entries.iter().map(|(n, e)| (*n, e)), None, path)
    {
        if created {
            let _ = std::fs::remove_file(path);
        }
        return Err(file_error("write", path, e));
    }
    std::fs::set_permissions(path, permissions).map_err(io_error("set the permissions of", path))
}

impl Workspace {
    /// Writes tensors to the safetensors file `path`, replacing it: the tensors of the blobs
    /// `names`, or with `None` every visible blob that holds a [`Tensor`] (local, forwarded and
    /// the parent's; other blobs are skipped). Returns the names written, sorted.
    ///
    /// Each tensor is read from its newest data: when only its device copy is current, it is
    /// copied to the host once (which leaves the host mirror current too). The saved blobs are
    /// read-locked while the file is written, so the file is a consistent snapshot of them.
    /// The file is written next to `path` and renamed over it, so a failed save leaves an
    /// existing file as it was; it keeps the permissions of the file it replaces (a new file
    /// gets those of a plain create).
    ///
    /// # Errors
    /// - [`Error::NotFound`] for a named blob that does not exist;
    /// - [`Error::TypeMismatch`] for a named blob that holds no tensor, and for any `String`
    ///   tensor (safetensors has no strings), naming the blob;
    /// - [`Error::InvalidState`] for an uninitialised or never-written tensor, or one without an
    ///   element type; [`Error::AlreadyExists`] for a name given twice; [`Error::Format`] for
    ///   the name `__metadata__`, which the format reserves;
    /// - [`Error::Io`] when the file cannot be written; a device error from the copy to host.
    pub fn save(&self, path: impl AsRef<Path>, names: Option<&[&str]>) -> Result<Vec<String>> {
        let path = path.as_ref();
        let explicit = names.is_some();
        let mut selected: Vec<(String, BlobRef)> = Vec::new();
        match names {
            None => {
                for name in self.blobs() {
                    if let Some(b) = self.try_get_blob(&name) {
                        selected.push((name, b));
                    }
                }
            }
            Some(list) => {
                let mut seen = BTreeSet::new();
                for &name in list {
                    if !seen.insert(name) {
                        return Err(Error::AlreadyExists {
                            kind: "blob",
                            name: name.to_string(),
                            detail: format!(
                                " twice in the list of blobs to save to {}",
                                path.display()
                            ),
                        });
                    }
                    selected.push((name.to_string(), self.get_blob(name)?));
                }
            }
        }
        // Recursive read locks: one blob may be visible under two names (forwarding).
        let guards: Vec<(&str, RwLockReadGuard<'_, Blob>)> = selected
            .iter()
            .map(|(n, b)| (n.as_str(), b.read_recursive()))
            .collect();
        let mut entries: Vec<(&str, SaveEntry<'_>)> = Vec::with_capacity(guards.len());
        for (name, guard) in &guards {
            let Ok(t) = guard.get::<Tensor>() else {
                if explicit {
                    return Err(not_a_tensor(name, guard, path));
                }
                continue;
            };
            if *name == METADATA_KEY {
                return Err(format_error(
                    path,
                    format!("a tensor cannot be named {METADATA_KEY:?}: the format reserves it"),
                ));
            }
            entries.push((name, save_entry(name, t, path)?));
        }
        write_file(path, &entries)?;
        let mut saved: Vec<String> = entries.iter().map(|(n, _)| n.to_string()).collect();
        saved.sort();
        Ok(saved)
    }

    /// Reads tensors from the safetensors file `path` onto `device` (host-only tensors for
    /// `None`): the tensors `names`, or all of them. Returns the names loaded, sorted.
    ///
    /// Each tensor goes into the blob [`Workspace::create_blob`] gives for its name (an
    /// existing visible blob, the parent's included, or a new local one), replacing whatever
    /// that blob held. Tensors loaded onto a device are written straight into device memory
    /// (their head is at the device; the host mirror is allocated only when the host reads);
    /// host-only tensors have their head at the host. Each tensor is labelled with its name.
    ///
    /// The whole file is read and validated, and every tensor is built, before the workspace is
    /// touched: on error the workspace is unchanged.
    ///
    /// # Errors
    /// - [`Error::Io`] when the file cannot be read;
    /// - [`Error::Format`] for a file that is not valid safetensors (corrupt header, truncated
    ///   or over-long data, offsets that do not match the shapes, `BOOL` bytes other than 0/1),
    ///   naming the file;
    /// - [`Error::NotFound`] for a requested name the file lacks, or a name forwarded to a
    ///   parent blob that no longer exists;
    /// - [`Error::TypeMismatch`] for an element type syncmem does not have (`F8_*`, `C64`, ...);
    /// - out of memory or a device error while building the tensors.
    pub fn load(
        &self,
        path: impl AsRef<Path>,
        device: Option<&Device>,
        names: Option<&[&str]>,
    ) -> Result<Vec<String>> {
        let path = path.as_ref();
        let buffer = std::fs::read(path).map_err(io_error("read", path))?;
        let file = SafeTensors::deserialize(&buffer).map_err(|e| file_error("read", path, e))?;
        let wanted: Vec<String> = match names {
            None => file.names().into_iter().map(str::to_string).collect(),
            Some(list) => list.iter().map(|n| n.to_string()).collect(),
        };
        let wanted: Vec<String> = wanted
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut built = Vec::with_capacity(wanted.len());
        for name in &wanted {
            let view = file.tensor(name).map_err(|_| Error::NotFound {
                kind: "tensor",
                name: name.clone(),
                detail: format!(" in {}", path.display()),
            })?;
            // `create_blob` fails only for a name forwarded to a removed parent blob: check
            // before anything is created.
            if self.try_get_blob(name).is_none() {
                if let Some((_, target)) = self.forwarded.read().get(name.as_str()) {
                    return Err(Error::NotFound {
                        kind: "blob",
                        name: target.clone(),
                        detail: format!(" in the parent workspace (forwarded as {name:?})"),
                    });
                }
            }
            built.push((name, load_tensor(name, &view, device, path)?));
        }
        for (name, tensor) in built {
            self.create_blob(name)?.write().reset(tensor);
        }
        Ok(wanted)
    }
}

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
