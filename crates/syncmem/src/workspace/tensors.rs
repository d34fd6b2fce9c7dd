//! Tensor conveniences on a [`Workspace`]: create tensor blobs, lock them as tensors, copy
//! forwarded tensors.

use std::fmt;

use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLockReadGuard, RwLockWriteGuard,
};

use super::{BlobRef, Workspace};
use crate::blob::Blob;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Shared access to the [`Tensor`] of a blob: holds the blob's read lock.
pub type TensorReadGuard<'a> = MappedRwLockReadGuard<'a, Tensor>;

/// Exclusive access to the [`Tensor`] of a blob: holds the blob's write lock.
pub type TensorWriteGuard<'a> = MappedRwLockWriteGuard<'a, Tensor>;

/// A blob known by its name, to be used as a [`Tensor`] (from [`Workspace::tensor`]).
///
/// It keeps the blob alive, not locked: [`TensorRef::read`] and [`TensorRef::write`] lock it
/// for as long as their guard lives, and check each time that it still holds a tensor.
///
/// ```
/// use syncmem::{dtype::DType, workspace::Workspace};
///
/// # fn main() -> syncmem::Result<()> {
/// let ws = Workspace::new();
/// ws.create_tensor("b", &[3], DType::I32, None)?;
/// let b = ws.tensor("b")?;
/// b.write()?.host_mut::<i32>()?.copy_from_slice(&[1, 2, 3]);
/// assert_eq!(b.read()?.host::<i32>()?.to_vec(), [1, 2, 3]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TensorRef {
    name: String,
    blob: BlobRef,
}

impl TensorRef {
    /// The name it was looked up by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The blob.
    pub fn blob(&self) -> &BlobRef {
        &self.blob
    }

    /// Read-locks the blob and lends its tensor. Like [`parking_lot::RwLock::read`], taking a
    /// second lock on the same blob from one thread may deadlock.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] naming the blob when it no longer holds a [`Tensor`].
    pub fn read(&self) -> Result<TensorReadGuard<'_>> {
        RwLockReadGuard::try_map(self.blob.read(), |b| b.get::<Tensor>().ok())
            .map_err(|g| not_a_tensor(&self.name, &g))
    }

    /// Write-locks the blob and lends its tensor mutably.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] naming the blob when it no longer holds a [`Tensor`];
    /// [`Error::InvalidState`] when the tensor was put in the blob with [`Blob::share`] and
    /// others still hold it.
    pub fn write(&self) -> Result<TensorWriteGuard<'_>> {
        RwLockWriteGuard::try_map(self.blob.write(), |b| b.get_mut::<Tensor>().ok()).map_err(
            |mut g| match g.get_mut::<Tensor>() {
                Err(Error::InvalidState { op, reason, .. }) => Error::InvalidState {
                    op,
                    buffer: format!("blob {:?}", self.name),
                    reason,
                },
                _ => not_a_tensor(&self.name, &g),
            },
        )
    }
}

impl fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("name", &self.name)
            .field(
                "blob",
                &self.blob.try_read().as_deref().map(|b| b.type_name()),
            )
            .finish()
    }
}

/// The error for a blob that holds something other than a tensor (or nothing).
fn not_a_tensor(name: &str, blob: &Blob) -> Error {
    Error::TypeMismatch {
        what: format!("blob {name:?}"),
        stored: blob
            .type_name()
            .unwrap_or("nothing (the blob is empty)")
            .to_string(),
        requested: std::any::type_name::<Tensor>().to_string(),
    }
}

impl Workspace {
    /// Creates a tensor blob: `dims` of `dtype`, mirrored on `device` (host only for `None`),
    /// labelled `name`. Nothing is allocated until the tensor is first accessed; it reads as
    /// zeros until written.
    ///
    /// The blob is the one [`Workspace::create_blob`] gives: an existing empty blob visible as
    /// `name` (the parent's included), or a new local one.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when a blob visible as `name` already holds something (remove
    /// it first to replace it); [`Error::SizeOverflow`] for dims whose size overflows (nothing
    /// is created then); as [`Workspace::create_blob`].
    pub fn create_tensor(
        &self,
        name: &str,
        dims: &[usize],
        dtype: DType,
        device: Option<&Device>,
    ) -> Result<BlobRef> {
        // Label before the storage exists: the storage takes the tensor's label.
        let mut t = Tensor::on(device).with_label(name);
        t.resize(dims)?;
        t.set_dtype(dtype)?;
        let blob = self.create_blob(name)?;
        {
            let mut b = blob.write();
            if !b.is_empty() {
                return Err(Error::AlreadyExists {
                    kind: "blob",
                    name: name.to_string(),
                    detail: format!(
                        " and holds {} (cannot create a tensor in it)",
                        b.type_name().unwrap_or("an object")
                    ),
                });
            }
            b.reset(t);
        }
        Ok(blob)
    }

    /// The blob visible as `name`, to be used as a tensor (see [`TensorRef`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] naming the blob; [`Error::TypeMismatch`] naming the blob when it
    /// does not hold a [`Tensor`].
    pub fn tensor(&self, name: &str) -> Result<TensorRef> {
        let blob = self.get_blob(name)?;
        {
            let b = blob.read();
            if !b.is_type::<Tensor>() {
                return Err(not_a_tensor(name, &b));
            }
        }
        Ok(TensorRef {
            name: name.to_string(),
            blob,
        })
    }

    /// Runs `f` on the tensor of blob `name` under the blob's read lock, and returns what `f`
    /// returns.
    ///
    /// ```
    /// use syncmem::{dtype::DType, workspace::Workspace};
    ///
    /// # fn main() -> syncmem::Result<()> {
    /// let ws = Workspace::new();
    /// ws.create_tensor("x", &[2], DType::F64, None)?;
    /// ws.with_tensor_mut("x", |t| {
    ///     t.host_mut::<f64>()?.copy_from_slice(&[0.5, 1.5]);
    ///     Ok(())
    /// })?;
    /// let sum = ws.with_tensor("x", |t| Ok(t.host::<f64>()?.iter().sum::<f64>()))?;
    /// assert_eq!(sum, 2.0);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Workspace::tensor`] and [`TensorRef::read`], or the error of `f`.
    pub fn with_tensor<R>(&self, name: &str, f: impl FnOnce(&Tensor) -> Result<R>) -> Result<R> {
        let t = self.tensor(name)?;
        let guard = t.read()?;
        f(&guard)
    }

    /// Runs `f` on the tensor of blob `name` under the blob's write lock, and returns what `f`
    /// returns.
    ///
    /// # Errors
    /// As [`Workspace::tensor`] and [`TensorRef::write`], or the error of `f`.
    pub fn with_tensor_mut<R>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Tensor) -> Result<R>,
    ) -> Result<R> {
        let t = self.tensor(name)?;
        let mut guard = t.write()?;
        f(&mut guard)
    }

    /// Names of the visible blobs that hold a [`Tensor`], sorted.
    pub fn tensor_blobs(&self) -> Vec<String> {
        self.blobs()
            .into_iter()
            .filter(|n| {
                self.try_get_blob(n)
                    .is_some_and(|b| b.read().is_type::<Tensor>())
            })
            .collect()
    }

    /// Replaces forwarded names by local deep copies of the parent's tensors on `device` (host
    /// only for `None`): Caffe2's `CopyForwardedTensors<Context>`, on top of
    /// [`Workspace::copy_forwarded`]. Each copy is labelled with its local name, keeps the
    /// source's shrink policy, and is made with [`Tensor::copy_from`] (device to device when
    /// the source's newest data is on the same device, otherwise through the host). Names that
    /// are not forwarded are ignored.
    ///
    /// # Errors
    /// [`Error::NotFound`] when a forwarded target no longer exists, [`Error::TypeMismatch`]
    /// naming the blob when it holds no tensor, or the error of the copy. Names handled before
    /// the failing one stay copied; the failing one stays forwarded.
    pub fn copy_forwarded_tensors(&self, names: &[&str], device: Option<&Device>) -> Result<()> {
        for &name in names {
            let Some(target) = self.forwarded.read().get(name).map(|(_, t)| t.clone()) else {
                continue;
            };
            self.copy_forwarded::<Tensor, _>(&[name], |src| {
                let mut t = Tensor::on(device)
                    .with_label(name)
                    .with_policy(src.policy());
                t.copy_from(src)?;
                Ok(t)
            })
            .map_err(|e| match e {
                Error::TypeMismatch {
                    stored, requested, ..
                } => Error::TypeMismatch {
                    what: format!("blob {name:?} (forwarded to parent blob {target:?})"),
                    stored,
                    requested,
                },
                e => e,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Head;

    #[test]
    fn create_tensor_and_access() {
        let ws = Workspace::new();
        let blob = ws
            .create_tensor("x", &[2, 3], DType::F32, Some(&Device::cpu()))
            .unwrap();
        assert!(blob.read().is_type::<Tensor>());
        let x = ws.tensor("x").unwrap();
        assert_eq!(x.name(), "x");
        {
            let t = x.read().unwrap();
            assert_eq!(t.dims(), [2, 3]);
            assert_eq!(t.dtype(), Some(DType::F32));
            assert_eq!(t.label(), "x");
            assert_eq!(t.host::<f32>().unwrap().to_vec(), [0.0; 6]);
        }
        x.write()
            .unwrap()
            .host_mut::<f32>()
            .unwrap()
            .copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
        let v = ws
            .with_tensor("x", |t| Ok(t.host::<f32>()?.to_vec()))
            .unwrap();
        assert_eq!(v, [1., 2., 3., 4., 5., 6.]);
        // The storage carries the blob's name.
        ws.with_tensor("x", |t| {
            assert_eq!(
                t.synced().map(|m| m.label().to_string()).as_deref(),
                Some("x")
            );
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn create_tensor_refuses_a_full_blob() {
        let ws = Workspace::new();
        ws.create_blob("n").unwrap().write().reset(3_i32);
        let e = ws
            .create_tensor("n", &[1], DType::U8, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"n\"") && e.contains("i32"), "{e}");
        // An empty blob is filled.
        ws.create_blob("empty").unwrap();
        ws.create_tensor("empty", &[1], DType::U8, None).unwrap();
        assert!(ws.tensor("empty").is_ok());
        // Overflowing dims create nothing.
        assert!(matches!(
            ws.create_tensor("big", &[usize::MAX, 2], DType::F32, None),
            Err(Error::SizeOverflow { .. })
        ));
        assert!(!ws.has_blob("big"));
    }

    #[test]
    fn errors_name_the_blob() {
        let ws = Workspace::new();
        let e = ws.tensor("missing").unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }) && e.to_string().contains("\"missing\""));
        ws.create_blob("s")
            .unwrap()
            .write()
            .reset(String::from("hi"));
        let e = ws.tensor("s").unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
        assert!(e.to_string().contains("blob \"s\""), "{e}");
        ws.create_blob("empty").unwrap();
        let e = ws.with_tensor("empty", |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("blob \"empty\"") && e.contains("empty"), "{e}");
        // A TensorRef whose blob changed type reports it on access.
        ws.create_tensor("t", &[1], DType::I8, None).unwrap();
        let t = ws.tensor("t").unwrap();
        t.blob().write().reset(1_u64);
        let e = t.read().unwrap_err().to_string();
        assert!(e.contains("blob \"t\"") && e.contains("u64"), "{e}");
        assert!(t.write().is_err());
        // A shared tensor cannot be written through the blob.
        let shared = Arc::new(Tensor::scalar(1_i32, None).unwrap());
        t.blob().write().share(shared.clone());
        assert!(t.read().is_ok());
        let e = t.write().unwrap_err();
        assert!(matches!(e, Error::InvalidState { .. }), "{e}");
        assert!(e.to_string().contains("blob \"t\""), "{e}");
        assert!(ws.with_tensor_mut("t", |_| Ok(())).is_err());
        // Errors of the closure come back as they are.
        ws.create_tensor("u", &[1], DType::I8, None).unwrap();
        let e = ws
            .with_tensor_mut("u", |_| -> Result<()> {
                Err(Error::Unsupported {
                    device: "x".into(),
                    what: "y".into(),
                })
            })
            .unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        // The tensor's own errors carry its label, the blob name.
        let e = ws
            .with_tensor("u", |t| t.host::<f32>().map(|_| ()))
            .unwrap_err();
        assert!(e.to_string().contains("tensor u"), "{e}");
    }

    #[test]
    fn tensor_blobs_lists_tensors_only() {
        let parent = Arc::new(Workspace::new());
        parent.create_tensor("p", &[1], DType::F32, None).unwrap();
        let ws = Workspace::with_parent(parent);
        ws.create_tensor("a", &[1], DType::F32, None).unwrap();
        ws.create_blob("n").unwrap().write().reset(1_i32);
        ws.create_blob("e").unwrap();
        assert_eq!(ws.tensor_blobs(), ["a", "p"]);
    }

    fn copy_forwarded_onto(dev: Option<&Device>) {
        let parent = Arc::new(Workspace::new());
        parent
            .create_tensor("w", &[2, 2], DType::I32, Some(&Device::cpu()))
            .unwrap();
        parent
            .with_tensor_mut("w", |t| {
                t.device_mut::<i32>()?.write(&[1, 2, 3, 4])?;
                Ok(())
            })
            .unwrap();
        parent.create_blob("n").unwrap().write().reset(7_i32);
        let child = Workspace::with_forwarded(parent.clone(), [("local_w", "w"), ("local_n", "n")])
            .unwrap();
        child
            .copy_forwarded_tensors(&["local_w", "not_forwarded"], dev)
            .unwrap();
        assert!(!child.is_forwarded("local_w"));
        assert_eq!(child.local_blobs(), ["local_w"]);
        child
            .with_tensor("local_w", |t| {
                assert_eq!(t.label(), "local_w");
                assert_eq!(t.dims(), [2, 2]);
                assert_eq!(t.target().map(Device::label), dev.map(Device::label));
                assert_eq!(t.host::<i32>()?.to_vec(), [1, 2, 3, 4]);
                Ok(())
            })
            .unwrap();
        // A deep copy: writing the copy leaves the parent's tensor alone.
        child
            .with_tensor_mut("local_w", |t| {
                t.host_mut::<i32>()?[0] = 100;
                Ok(())
            })
            .unwrap();
        let p = parent
            .with_tensor("w", |t| Ok(t.host::<i32>()?.to_vec()))
            .unwrap();
        assert_eq!(p, [1, 2, 3, 4]);
        // A forwarded non-tensor is an error naming the blob, and stays forwarded.
        let e = child
            .copy_forwarded_tensors(&["local_n"], dev)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"local_n\"") && e.contains("\"n\""), "{e}");
        assert!(child.is_forwarded("local_n"));
    }

    #[test]
    fn copy_forwarded_tensors_cpu_and_host() {
        copy_forwarded_onto(Some(&Device::cpu()));
        copy_forwarded_onto(None);
    }

    #[cfg(feature = "opencl")]
    #[test]
    fn copy_forwarded_tensors_opencl() {
        if let Some(d) = crate::testing::opencl_or_skip("copy_forwarded_tensors_opencl") {
            copy_forwarded_onto(Some(&d));
        }
    }

    #[test]
    fn copy_forwarded_same_device_stays_on_device() {
        let dev = Device::cpu();
        let parent = Arc::new(Workspace::new());
        parent
            .create_tensor("w", &[4], DType::F32, Some(&dev))
            .unwrap();
        parent
            .with_tensor_mut("w", |t| t.device_mut::<f32>()?.write(&[1., 2., 3., 4.]))
            .unwrap();
        let child = Workspace::with_forwarded(parent, [("w", "w")]).unwrap();
        child.copy_forwarded_tensors(&["w"], Some(&dev)).unwrap();
        child
            .with_tensor("w", |t| {
                assert_eq!(t.head(), Some(Head::AtDevice));
                assert_eq!(t.copy_stats().device_to_host.count, 0);
                assert_eq!(t.device::<f32>()?.to_vec()?, [1., 2., 3., 4.]);
                Ok(())
            })
            .unwrap();
    }
}
