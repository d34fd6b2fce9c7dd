//! [`Workspace`]: named blobs, with parent and forwarded lookups (Caffe2's `Workspace`).
//!
//! ```
//! use syncmem::workspace::Workspace;
//! use std::sync::Arc;
//!
//! # fn main() -> syncmem::Result<()> {
//! let parent = Arc::new(Workspace::new());
//! parent.create_blob("a")?.write().reset(1_i32);
//!
//! let child = Workspace::with_parent(parent.clone());
//! assert!(child.has_blob("a"));                       // visible through the parent
//! child.create_local_blob("a")?.write().reset(2_i32); // hides the parent's "a"
//! assert_eq!(*child.get_blob("a")?.read().get::<i32>()?, 2);
//! assert_eq!(*parent.get_blob("a")?.read().get::<i32>()?, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Tensors, saving and loading
//!
//! Tensor blobs take one call for the common cases: [`Workspace::feed`] puts a tensor in a
//! blob and [`Workspace::fetch`] copies its elements out into a `Vec` (Caffe2's `FeedBlob` and
//! `FetchBlob`); [`Workspace::with_tensor`] and [`Workspace::with_tensor_mut`] lend the tensor
//! to a closure for anything else. There are more conveniences ([`Workspace::create_tensor`],
//! [`Workspace::tensor`], [`Workspace::copy_forwarded_tensors`]), and the workspace saves and
//! loads tensors as safetensors files ([`Workspace::save`], [`Workspace::load`]; see [`io`]).
//!
//! ```
//! use syncmem::{dtype::DType, workspace::Workspace, Device};
//!
//! # fn main() -> syncmem::Result<()> {
//! let ws = Workspace::new();
//! ws.create_tensor("x", &[2, 3], DType::F32, Some(&Device::cpu()))?;
//! ws.tensor("x")?.write()?.host_mut::<f32>()?.copy_from_slice(&[0., 1., 2., 3., 4., 5.]);
//!
//! let path = std::env::temp_dir().join(format!("syncmem-doc-{}.safetensors", std::process::id()));
//! ws.save(&path, None)?;                                   // every tensor blob
//!
//! let fresh = Workspace::new();
//! assert_eq!(fresh.load(&path, Some(&Device::cpu()), None)?, ["x"]);
//! fresh.with_tensor("x", |x| {
//!     assert_eq!((x.dims(), x.dtype()), (&[2, 3][..], Some(DType::F32)));
//!     assert_eq!(x.host::<f32>()?.to_vec(), [0., 1., 2., 3., 4., 5.]);
//!     Ok(())
//! })?;
//! # std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```
//!
//! # Concurrency
//!
//! A workspace is `Send + Sync`. Its name maps sit behind reader-writer locks, and each blob is
//! a [`BlobRef`] (`Arc<RwLock<Blob>>`): distinct blobs are used from different threads at once,
//! the same blob is protected by its own lock. (Caffe2's workspace has no locking at all.)
//!
//! # Departures from Caffe2, on purpose
//!
//! - Lookups that miss return [`Error::NotFound`] naming the blob (Caffe2: a warning and a null
//!   pointer); [`Workspace::try_get_blob`] gives an `Option`.
//! - [`Workspace::create_blob`] on a forwarded name whose parent blob was removed is an error
//!   (Caffe2 returns null).
//! - [`Workspace::blobs`] lists every visible name once (Caffe2 can repeat a name that a local
//!   blob hides).
//! - Parents are held by `Arc`, so they cannot be dropped while a child uses them.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::blob::Blob;
use crate::error::{Error, Result};

mod feed;
pub mod io;
mod tensors;

pub use tensors::{TensorReadGuard, TensorRef, TensorWriteGuard};

/// A blob shared between a workspace and its users.
pub type BlobRef = Arc<RwLock<Blob>>;

/// Changes to the names of every workspace of the process: a blob added, removed or renamed, a
/// name forwarded or no longer forwarded, a workspace dropped. A lookup made at one count
/// still gives the same blobs while the count is unchanged, which lets a net keep its
/// operators' blobs between runs (`ops`' lookup cache).
static NAMES_CHANGED: AtomicU64 = AtomicU64::new(0);

/// Counts a change of names (see [`NAMES_CHANGED`]); called while the changed map is locked.
fn names_changed() {
    NAMES_CHANGED.fetch_add(1, Ordering::AcqRel);
}

/// The count of name changes so far (see [`NAMES_CHANGED`]).
pub(crate) fn names_generation() -> u64 {
    NAMES_CHANGED.load(Ordering::Acquire)
}

/// Objects of a higher layer kept by name in a workspace (the nets).
pub(crate) type NamedObjects = RwLock<BTreeMap<String, Arc<dyn Any + Send + Sync>>>;

/// Local name -> (parent workspace, name in the parent).
type Forwarded = BTreeMap<String, (Arc<Workspace>, Arc<str>)>;

/// Named blobs, an optional parent, and forwarded names (Caffe2's `Workspace`).
///
/// Tensors by name, one call each:
///
/// | call | does |
/// |---|---|
/// | [`feed(name, tensor)`](Workspace::feed) | puts a [`Tensor`](crate::Tensor) in the blob (Caffe2's `FeedBlob`) |
/// | [`fetch::<T>(name)`](Workspace::fetch) | copies its elements into a `Vec<T>`, from the newest side (`FetchBlob`) |
/// | [`with_tensor(name, f)`](Workspace::with_tensor) | lends the tensor to `f` (dims, views, device access) and returns what `f` returns |
/// | [`with_tensor_mut(name, f)`](Workspace::with_tensor_mut) | the same, mutably |
/// | [`create_tensor`](Workspace::create_tensor), [`tensor`](Workspace::tensor) | a tensor blob of a shape; a handle to lock one yourself |
/// | [`save`](Workspace::save), [`load`](Workspace::load) | tensors to and from a safetensors file |
///
/// The lock taken by `fetch` and `with_tensor` ends with the call, so what they return can be
/// kept and returned freely. A view reached by a chain such as
/// `let v = ws.tensor(name)?.read()?.host::<f32>()?;` cannot be kept: it borrows temporary
/// guards that are dropped at the end of the statement.
///
/// ```
/// use syncmem::{workspace::Workspace, Tensor};
///
/// # fn main() -> syncmem::Result<()> {
/// let ws = Workspace::new();
/// ws.feed("x", Tensor::from_slice(&[2, 3], &[1.0_f32, 2., 3., 4., 5., 6.], None)?)?;
/// assert_eq!(ws.fetch::<f32>("x")?, [1., 2., 3., 4., 5., 6.]);
/// let (dims, first_row) = ws.with_tensor("x", |t| Ok((t.dims().to_vec(), t.host::<f32>()?[..3].to_vec())))?;
/// assert_eq!((dims, first_row), (vec![2, 3], vec![1., 2., 3.]));
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct Workspace {
    blobs: RwLock<BTreeMap<String, BlobRef>>,
    /// Local name -> (parent workspace, name in the parent). The name is shared, so that a
    /// lookup through it copies no string.
    forwarded: RwLock<Forwarded>,
    /// Full fallback for lookups.
    shared: Option<Arc<Workspace>>,
    /// Nets created in this workspace, by name. The net layer above stores its nets here and
    /// takes them back by downcasting (a workspace knows nothing about nets).
    pub(crate) nets: NamedObjects,
}

impl Workspace {
    /// An empty workspace with no parent.
    pub fn new() -> Self {
        Self::default()
    }

    /// A workspace that sees every blob of `parent` it does not define itself.
    pub fn with_parent(parent: Arc<Workspace>) -> Self {
        let mut ws = Self::default();
        ws.shared = Some(parent);
        ws
    }

    /// A workspace that sees only the listed blobs of `parent`, under local names
    /// (`local name -> parent name`).
    ///
    /// # Errors
    /// [`Error::NotFound`] when `parent` lacks one of the targets.
    pub fn with_forwarded<'a>(
        parent: Arc<Workspace>,
        mapping: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self> {
        let ws = Self::new();
        ws.add_blob_mapping(&parent, mapping, false)?;
        Ok(ws)
    }

    /// The fallback workspace, if any.
    pub fn parent(&self) -> Option<&Arc<Workspace>> {
        self.shared.as_ref()
    }

    /// True when `name` is visible: local, forwarded (and the target exists), or in the parent.
    pub fn has_blob(&self, name: &str) -> bool {
        self.try_get_blob(name).is_some()
    }

    /// The blob visible as `name` (local first, then forwarded, then the parent's).
    ///
    /// # Errors
    /// [`Error::NotFound`] naming the blob.
    pub fn get_blob(&self, name: &str) -> Result<BlobRef> {
        self.try_get_blob(name).ok_or_else(|| Error::NotFound {
            kind: "blob",
            name: name.to_string(),
            detail: " in the workspace".into(),
        })
    }

    /// The blob visible as `name`, or `None`.
    ///
    /// The chain of parents is walked in a loop (not by recursion), so a chain of any depth
    /// cannot overflow the stack.
    pub fn try_get_blob(&self, name: &str) -> Option<BlobRef> {
        // The workspace and name a forwarded name leads to; `None`: `self` and `name`.
        let mut hop: Option<(Arc<Workspace>, Arc<str>)> = None;
        loop {
            let (mut ws, name): (&Workspace, &str) = match &hop {
                Some((w, n)) => (w, n),
                None => (self, name),
            };
            let next = loop {
                if let Some(b) = ws.blobs.read().get(name) {
                    return Some(b.clone());
                }
                if let Some((parent, target)) = ws.forwarded.read().get(name) {
                    break (parent.clone(), target.clone());
                }
                ws = ws.shared.as_deref()?;
            };
            hop = Some(next);
        }
    }

    /// Returns the blob visible as `name`, creating an empty local one when none is visible
    /// (Caffe2's `CreateBlob`: a blob of the parent is returned, not hidden).
    ///
    /// # Errors
    /// [`Error::NotFound`] when `name` is forwarded to a parent blob that no longer exists.
    pub fn create_blob(&self, name: &str) -> Result<BlobRef> {
        if let Some(b) = self.try_get_blob(name) {
            return Ok(b);
        }
        if let Some((_, target)) = self.forwarded.read().get(name) {
            return Err(Error::NotFound {
                kind: "blob",
                name: target.to_string(),
                detail: format!(" in the parent workspace (forwarded as {name:?})"),
            });
        }
        Ok(self.insert_local(name))
    }

    /// Creates `name` in this workspace unless a local blob of that name exists, hiding any
    /// blob of the parent with that name (Caffe2's `CreateLocalBlob`).
    ///
    /// # Errors
    /// None today; the `Result` leaves room for name validation.
    pub fn create_local_blob(&self, name: &str) -> Result<BlobRef> {
        Ok(self.insert_local(name))
    }

    fn insert_local(&self, name: &str) -> BlobRef {
        let mut map = self.blobs.write();
        if let Some(b) = map.get(name) {
            return b.clone();
        }
        names_changed();
        map.entry(name.to_string())
            .or_insert_with(|| Arc::new(RwLock::new(Blob::new())))
            .clone()
    }

    /// Removes the local blob `name`; returns whether there was one. Parents and forwarded
    /// names are never touched. Holders of the [`BlobRef`] keep it alive.
    pub fn remove_blob(&self, name: &str) -> bool {
        let mut map = self.blobs.write();
        names_changed();
        map.remove(name).is_some()
    }

    /// Renames the local blob `old` to `new`, keeping the same blob object.
    ///
    /// # Errors
    /// [`Error::NotFound`] when `old` is not local, [`Error::AlreadyExists`] when `new` is
    /// visible anywhere.
    pub fn rename_blob(&self, old: &str, new: &str) -> Result<BlobRef> {
        if old == new && self.blobs.read().contains_key(old) {
            return self.get_blob(old);
        }
        if self.has_blob(new) {
            return Err(Error::AlreadyExists {
                kind: "blob",
                name: new.to_string(),
                detail: format!(" (cannot rename {old:?} to it)"),
            });
        }
        let mut map = self.blobs.write();
        names_changed();
        let blob = map.remove(old).ok_or_else(|| Error::NotFound {
            kind: "blob",
            name: old.to_string(),
            detail: " in the local blob list".into(),
        })?;
        map.insert(new.to_string(), blob.clone());
        Ok(blob)
    }

    /// Forwards local names to blobs of `parent` (Caffe2's `AddBlobMapping`). A name already
    /// forwarded must point at the same parent blob. With `skip_defined`, names already visible
    /// are skipped; without it they are an error.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a target `parent` lacks, [`Error::AlreadyExists`] for a
    /// redefinition. On error no mapping of the call is added.
    pub fn add_blob_mapping<'a>(
        &self,
        parent: &Arc<Workspace>,
        mapping: impl IntoIterator<Item = (&'a str, &'a str)>,
        skip_defined: bool,
    ) -> Result<()> {
        let mapping: Vec<(&str, &str)> = mapping.into_iter().collect();
        let mut to_add = Vec::new();
        {
            let fwd = self.forwarded.read();
            for &(local, target) in &mapping {
                if !parent.has_blob(target) {
                    return Err(Error::NotFound {
                        kind: "blob",
                        name: target.to_string(),
                        detail: format!(" in the parent workspace (to forward as {local:?})"),
                    });
                }
                if let Some((p, t)) = fwd.get(local) {
                    if Arc::ptr_eq(p, parent) && **t == *target {
                        continue;
                    }
                    return Err(redefinition(local, target));
                }
                if self.has_blob(local) {
                    if skip_defined {
                        continue;
                    }
                    return Err(redefinition(local, target));
                }
                to_add.push((local.to_string(), target.to_string()));
            }
        }
        let mut fwd = self.forwarded.write();
        names_changed();
        for (local, target) in to_add {
            fwd.insert(local, (parent.clone(), target.into()));
        }
        Ok(())
    }

    /// Replaces forwarded names by local deep copies of the parent's objects (Caffe2's
    /// `CopyForwardedTensors`, for any held type `T`; `copy` makes the copy, e.g. a tensor copy
    /// onto another device). Names that are not forwarded are ignored.
    ///
    /// # Errors
    /// [`Error::NotFound`] when a forwarded target no longer exists, [`Error::TypeMismatch`]
    /// when it does not hold a `T`, or the error of `copy`. Names handled before the failing
    /// one stay copied; the failing one stays forwarded.
    pub fn copy_forwarded<T, F>(&self, names: &[&str], copy: F) -> Result<()>
    where
        T: std::any::Any + Send + Sync,
        F: Fn(&T) -> Result<T>,
    {
        for &name in names {
            let Some((parent, target)) = self.forwarded.read().get(name).cloned() else {
                continue;
            };
            let src = parent
                .try_get_blob(&target)
                .ok_or_else(|| Error::NotFound {
                    kind: "blob",
                    name: target.to_string(),
                    detail: format!(" in the parent workspace (forwarded as {name:?})"),
                })?;
            let copied = copy(src.read().get::<T>()?)?;
            {
                let mut fwd = self.forwarded.write();
                names_changed();
                fwd.remove(name);
            }
            self.insert_local(name).write().reset(copied);
        }
        Ok(())
    }

    /// True when `name` is currently forwarded to a parent.
    pub fn is_forwarded(&self, name: &str) -> bool {
        self.forwarded.read().contains_key(name)
    }

    /// Names of the local blobs, sorted.
    pub fn local_blobs(&self) -> Vec<String> {
        self.blobs.read().keys().cloned().collect()
    }

    /// Every visible name, sorted, each once: local, forwarded (when the target exists), and
    /// the parent's (walked in a loop: a chain of any depth cannot overflow the stack).
    pub fn blobs(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = BTreeSet::new();
        let mut next = Some(self);
        while let Some(ws) = next {
            all.extend(ws.blobs.read().keys().cloned());
            for (local, (parent, target)) in ws.forwarded.read().iter() {
                if parent.has_blob(target) {
                    all.insert(local.clone());
                }
            }
            next = ws.shared.as_deref();
        }
        all.into_iter().collect()
    }

    /// The workspaces this one holds (its parent, the targets of its forwarded names), taken
    /// out so that dropping them is the caller's business.
    fn take_parents(&mut self) -> impl Iterator<Item = Arc<Workspace>> {
        let forwarded = std::mem::take(self.forwarded.get_mut());
        self.shared
            .take()
            .into_iter()
            .chain(forwarded.into_values().map(|(p, _)| p))
    }
}

impl Drop for Workspace {
    /// Drops the chain of parents in a loop: a parent held only by this workspace is taken
    /// apart here instead of dropping its own parent recursively, so a chain of any depth
    /// cannot overflow the stack.
    fn drop(&mut self) {
        // Another workspace may later live at this address.
        names_changed();
        let mut pending: Vec<Arc<Workspace>> = self.take_parents().collect();
        while let Some(parent) = pending.pop() {
            // The last holder takes it apart; any other holder just lets go of its count.
            if let Some(mut ws) = Arc::into_inner(parent) {
                pending.extend(ws.take_parents());
            }
        }
    }
}

fn redefinition(local: &str, target: &str) -> Error {
    Error::AlreadyExists {
        kind: "blob",
        name: local.to_string(),
        detail: format!(" (redefinition: cannot forward it to parent blob {target:?})"),
    }
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("local", &self.local_blobs())
            .field(
                "forwarded",
                &self.forwarded.read().keys().collect::<Vec<_>>(),
            )
            .field("has_parent", &self.shared.is_some())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Workspace>();
}
