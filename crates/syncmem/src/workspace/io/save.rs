//! [`Workspace::save`]: the tensors' host bytes, checked, written through a temporary file
//! ([`crate::file::write_atomic`]).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Deref;
use std::path::Path;

use ::safetensors::tensor::{Metadata, TensorInfo};
use ::safetensors::Dtype;
use parking_lot::RwLockReadGuard;

use super::{file_dtype, file_error, format_error, le_to_native, MAX_HEADER_BYTES, METADATA_KEY};
use crate::blob::Blob;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::file::{check_target, write_atomic};
use crate::tensor::{HostBytes, Tensor};
use crate::workspace::{BlobRef, Workspace};

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

/// One tensor being saved.
struct SaveEntry<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: SaveBytes<'a>,
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

/// Writes the file as the safetensors crate lays one out (tensors by descending element
/// alignment, then by name; the header padded with spaces to a multiple of 8 bytes), streamed
/// through [`write_atomic`]: a temporary file renamed over `path`.
fn write_file(path: &Path, entries: &[(&str, SaveEntry<'_>)]) -> Result<()> {
    let mut order: Vec<&(&str, SaveEntry<'_>)> = entries.iter().collect();
    order.sort_by(|(ln, l), (rn, r)| r.dtype.cmp(&l.dtype).then(ln.cmp(rn)));
    let mut infos = Vec::with_capacity(order.len());
    let mut offset = 0usize;
    for (name, e) in &order {
        let end = offset
            .checked_add(e.bytes.len())
            .ok_or_else(|| format_error(path, "the tensors hold more bytes than fit in usize"))?;
        infos.push((
            name.to_string(),
            TensorInfo {
                dtype: e.dtype,
                shape: e.shape.clone(),
                data_offsets: (offset, end),
            },
        ));
        offset = end;
    }
    let meta = Metadata::new(None, infos).map_err(|e| file_error("write", path, e))?;
    let mut header = serde_json::to_vec(&meta)
        .map_err(|e| format_error(path, format!("the header cannot be written: {e}")))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    if header.len() as u64 > MAX_HEADER_BYTES {
        return Err(format_error(
            path,
            format!(
                "the header would be {} bytes, over the format's {MAX_HEADER_BYTES}-byte limit",
                header.len()
            ),
        ));
    }
    write_atomic(path, |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for (_, e) in &order {
            w.write_all(&e.bytes)?;
        }
        Ok(())
    })
}

impl Workspace {
    /// Writes tensors to the safetensors file `path`, replacing it: the tensors of the blobs
    /// `names`, or with `None` every visible blob that holds a [`Tensor`] (local, forwarded and
    /// the parent's; other blobs are skipped). Returns the names written, sorted.
    ///
    /// Each tensor is read from its newest data: when only its device copy is current, it is
    /// copied to the host once (which leaves the host mirror current too). The saved blobs are
    /// read-locked while the file is written, so the file is a consistent snapshot of them.
    /// The file is written next to `path` and renamed over it ([`write_atomic`]), so a failed
    /// save leaves an existing file as it was; it keeps the permissions of the file it
    /// replaces (a new file gets those of a plain create). A symbolic link is followed (its
    /// target is written); a directory, a device node, a FIFO or a socket at `path` is refused.
    ///
    /// # Errors
    /// - [`Error::NotFound`] for a named blob that does not exist;
    /// - [`Error::TypeMismatch`] for a named blob that holds no tensor, and for any `String`
    ///   tensor (safetensors has no strings), naming the blob;
    /// - [`Error::InvalidState`] for an uninitialised or never-written tensor, or one without an
    ///   element type; [`Error::AlreadyExists`] for a name given twice; [`Error::Format`] for
    ///   the name `__metadata__`, which the format reserves;
    /// - [`Error::Io`] when the file cannot be written, or `path` is not a regular file (a
    ///   directory, `/dev/null`, a FIFO): nothing is written then; a device error from the
    ///   copy to host.
    pub fn save(&self, path: impl AsRef<Path>, names: Option<&[&str]>) -> Result<Vec<String>> {
        let path = path.as_ref();
        // A target that cannot be written fails before any tensor is copied to the host.
        check_target(path)?;
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
}
