//! [`Workspace::load`]: the whole file validated and every tensor built before the workspace
//! changes.

use std::collections::BTreeSet;
use std::path::Path;

use ::safetensors::tensor::TensorView;
use ::safetensors::SafeTensors;

use super::{element_dtype, file_error, format_error, io_error, le_to_native};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::workspace::Workspace;

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
