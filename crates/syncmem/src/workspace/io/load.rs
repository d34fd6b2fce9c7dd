//! [`Workspace::load`]: the whole file validated and every tensor built before the workspace
//! changes.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;

use ::safetensors::tensor::TensorInfo;

use super::header::{check_data_len, read_header};
use super::{element_dtype, format_error, io_error, le_to_native, native_in_place};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::workspace::Workspace;

/// Bytes read at a time while streaming a tensor (a multiple of every element size).
const CHUNK: usize = 4 << 20;

/// The error of a read inside tensor `name`: a short read is a truncated file.
fn read_error(path: &Path, name: &str, e: std::io::Error) -> Error {
    if e.kind() == ErrorKind::UnexpectedEof {
        format_error(
            path,
            format!("the file ends inside the data of tensor {name:?}: truncated?"),
        )
    } else {
        io_error("read", path)(e)
    }
}

/// Checks that every byte of a `BOOL` chunk starting at element `start` is 0 or 1.
fn check_bools(path: &Path, name: &str, start: usize, chunk: &[u8]) -> Result<()> {
    match chunk.iter().position(|&b| b > 1) {
        None => Ok(()),
        Some(pos) => Err(format_error(
            path,
            format!(
                "element {} of the BOOL tensor {name:?} is the byte {}, not 0 or 1",
                start + pos,
                chunk[pos]
            ),
        )),
    }
}

/// Builds the tensor `name` (described by `info` in a validated header) on `device` (host
/// only for `None`), reading its bytes from `input` in chunks of at most [`CHUNK`] bytes.
fn load_tensor(
    name: &str,
    info: &TensorInfo,
    input: &mut impl Read,
    device: Option<&Device>,
    path: &Path,
) -> Result<Tensor> {
    let dtype = element_dtype(info.dtype).ok_or_else(|| Error::TypeMismatch {
        what: format!("tensor {name:?} in {}", path.display()),
        stored: info.dtype.to_string(),
        requested: "an element type syncmem has (BOOL, U8, I8, U16, I16, U32, I32, U64, I64, \
                    F16, BF16, F32, F64)"
            .into(),
    })?;
    let len = info.data_offsets.1 - info.data_offsets.0;
    // Label first: the storage takes the tensor's label when it is created.
    let mut t = Tensor::on(device).with_label(name);
    t.resize(&info.shape)?;
    t.set_dtype(dtype)?;
    if len == 0 {
        return Ok(t);
    }
    let size = dtype.size();
    if device.is_some() {
        // Straight into device memory (as Caffe2's deserializer does): the head ends at the
        // device and no host mirror is allocated until the host asks.
        let mem = t.synced().ok_or_else(|| Error::InvalidState {
            op: "Workspace::load",
            buffer: format!("tensor {name:?}"),
            reason: "a plain-data tensor with elements has no byte storage".into(),
        })?;
        let mut dst = mem.device_overwrite()?;
        let mut buf = vec![0u8; len.min(CHUNK)];
        let mut done = 0;
        while done < len {
            let chunk = &mut buf[..(len - done).min(CHUNK)];
            input
                .read_exact(chunk)
                .map_err(|e| read_error(path, name, e))?;
            if dtype == DType::Bool {
                check_bools(path, name, done, chunk)?;
            }
            dst.write_from(done, &le_to_native(chunk, size))?;
            done += chunk.len();
        }
    } else {
        let mut host = t.host_bytes_overwrite()?;
        for (k, chunk) in host.chunks_mut(CHUNK).enumerate() {
            input
                .read_exact(chunk)
                .map_err(|e| read_error(path, name, e))?;
            if dtype == DType::Bool {
                check_bools(path, name, k * CHUNK, chunk)?;
            }
            native_in_place(chunk, size);
        }
    }
    Ok(t)
}

impl Workspace {
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
    /// touched: on error the workspace is unchanged. The file is streamed: its header (at most
    /// 100 MB, the format's limit) is read first, then each tensor's bytes straight into the
    /// tensor, a few megabytes at a time; the bytes of tensors not asked for are skipped. A
    /// regular file's size must match its header before anything is read; a stream (a pipe, a
    /// device such as `/dev/zero`) is read no further than its header describes, plus one
    /// byte to check that it ends there.
    ///
    /// # Errors
    /// - [`Error::Io`] when the file cannot be opened or read;
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
        let file = File::open(path).map_err(io_error("open", path))?;
        let stat = file.metadata().map_err(io_error("stat", path))?;
        let file_bytes = stat.is_file().then_some(stat.len());
        let mut input = BufReader::new(file);
        let (header_bytes, meta) = read_header(&mut input, path, file_bytes)?;
        if let Some(n) = file_bytes {
            check_data_len(path, &meta, n - 8 - header_bytes)?;
        }
        let wanted: BTreeSet<String> = match names {
            None => meta.tensors().into_keys().collect(),
            Some(list) => list.iter().map(|n| n.to_string()).collect(),
        };
        for name in &wanted {
            if meta.info(name).is_none() {
                return Err(Error::NotFound {
                    kind: "tensor",
                    name: name.clone(),
                    detail: format!(" in {}", path.display()),
                });
            }
            // `create_blob` fails only for a name forwarded to a removed parent blob: check
            // before anything is created.
            if self.try_get_blob(name).is_none() {
                if let Some((_, target)) = self.forwarded.read().get(name.as_str()) {
                    return Err(Error::NotFound {
                        kind: "blob",
                        name: target.to_string(),
                        detail: format!(" in the parent workspace (forwarded as {name:?})"),
                    });
                }
            }
        }
        // The tensors in file order: each is read or skipped as the stream reaches it.
        let mut in_order: Vec<(String, &TensorInfo)> = meta.tensors().into_iter().collect();
        in_order.sort_by_key(|(_, info)| info.data_offsets);
        let mut built = Vec::with_capacity(wanted.len());
        for (name, info) in in_order {
            if wanted.contains(&name) {
                let tensor = load_tensor(&name, info, &mut input, device, path)?;
                built.push((name, tensor));
            } else {
                let len = (info.data_offsets.1 - info.data_offsets.0) as u64;
                let skipped = std::io::copy(&mut (&mut input).take(len), &mut std::io::sink())
                    .map_err(io_error("read", path))?;
                if skipped != len {
                    return Err(read_error(path, &name, ErrorKind::UnexpectedEof.into()));
                }
            }
        }
        if file_bytes.is_none() {
            let mut extra = [0u8; 1];
            if input.read(&mut extra).map_err(io_error("read", path))? > 0 {
                return Err(format_error(
                    path,
                    format!(
                        "the data goes on past the {} bytes the header describes",
                        meta.data_len()
                    ),
                ));
            }
        }
        for (name, tensor) in built {
            self.create_blob(&name)?.write().reset(tensor);
        }
        Ok(wanted.into_iter().collect())
    }
}
