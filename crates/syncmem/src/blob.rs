//! [`Blob`]: Caffe2's type-erased holder of one object of any type.
//!
//! ```
//! use std::sync::Arc;
//! use syncmem::blob::Blob;
//!
//! # fn main() -> syncmem::Result<()> {
//! let mut blob = Blob::new();
//! let (n, is_new) = blob.get_or_insert_default::<i32>()?;   // Caffe2 GetMutable<int>
//! *n = 5;
//! assert!(is_new);
//! assert_eq!(*blob.get::<i32>()?, 5);
//! assert!(blob.get::<String>().is_err());                   // names i32 and String
//!
//! let shared = Arc::new(String::from("weights"));
//! blob.share(shared.clone());                               // ShareExternal
//! blob.reset_empty();                                       // does not free the caller's object
//! assert_eq!(*shared, "weights");
//! # Ok(())
//! # }
//! ```
//!
//! # Mapping to Caffe2
//!
//! | Caffe2 | here |
//! |---|---|
//! | `Get<T>()` | [`Blob::get`] (error names the stored and the requested type) |
//! | `GetMutable<T>(&is_new)` | [`Blob::get_or_insert_default`] returns `(&mut T, is_new)` |
//! | `Reset(new T)` / `Reset()` | [`Blob::reset`] / [`Blob::reset_empty`] |
//! | `Release()` | [`Blob::take`] |
//! | `ShareExternal<T>(p)` | [`Blob::share`] with an `Arc<T>` |
//! | `IsType<T>()`, `TypeName()` | [`Blob::is_type`], [`Blob::type_name`] |
//! | `swap`, move constructor | [`Blob::swap`], Rust moves (and [`std::mem::take`]) |
//!
//! # Departures from Caffe2, on purpose
//!
//! - Shared objects are `Arc<T>`, not raw pointers: the blob keeps the object alive while it
//!   holds it, and dropping or resetting the blob only drops its reference. There is no
//!   dangling `ShareExternal` pointer and no `Reset(p)`-with-the-held-pointer double free.
//! - A shared object is read-only through the blob ([`Blob::get`]); [`Blob::get_mut`] works on
//!   it only while the blob holds the last reference. Share a `Mutex<T>` for shared mutation.
//! - [`Blob::take`] moves the object out and leaves the blob empty. Caffe2's `Release` only
//!   gave up ownership and kept pointing at the object.
//! - Move assignment cannot leak the previous object (Caffe2's March-2018 bug): Rust drops it.
//! - Errors are values ([`Error::TypeMismatch`] for a wrong type) instead of `EnforceNotMet`
//!   exceptions.
//! - Serialisation is not part of this type.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// How the object is held.
enum Held {
    /// Owned by the blob: dropped when the blob drops it.
    Owned(Box<dyn Any + Send + Sync>),
    /// A reference to an object that others may hold too.
    Shared(Arc<dyn Any + Send + Sync>),
}

struct Content {
    held: Held,
    /// `std::any::type_name` of the object, recorded when it was stored.
    type_name: &'static str,
}

impl Content {
    fn any(&self) -> &(dyn Any + Send + Sync) {
        match &self.held {
            Held::Owned(b) => &**b,
            Held::Shared(a) => &**a,
        }
    }
}

/// A type-erased holder of one object (Caffe2's `Blob`): empty, or one value of any
/// `T: Any + Send + Sync`, owned or shared.
///
/// `Send + Sync`; not `Clone` (Caffe2 disables copying). Moving a blob moves its content;
/// [`std::mem::take`] leaves an empty blob behind.
#[derive(Default)]
pub struct Blob {
    content: Option<Content>,
}

const OP_GET: &str = "Blob::get";

impl Blob {
    /// An empty blob.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when the blob holds nothing.
    pub fn is_empty(&self) -> bool {
        self.content.is_none()
    }

    /// True when the blob holds a `T` (Caffe2's `IsType<T>`).
    pub fn is_type<T: Any>(&self) -> bool {
        self.content.as_ref().is_some_and(|c| c.any().is::<T>())
    }

    /// The `std::any::type_name` of the held object, recorded when it was stored; `None` when
    /// empty (Caffe2's `TypeName`).
    pub fn type_name(&self) -> Option<&'static str> {
        self.content.as_ref().map(|c| c.type_name)
    }

    /// True when the held object was given with [`Blob::share`] (the blob does not own it
    /// exclusively).
    pub fn is_shared(&self) -> bool {
        matches!(
            self.content,
            Some(Content {
                held: Held::Shared(_),
                ..
            })
        )
    }

    /// The held `T` (Caffe2's `Get<T>`).
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] when the blob is empty or holds another type; the message names
    /// the stored type and `T`.
    pub fn get<T: Any>(&self) -> Result<&T> {
        self.content
            .as_ref()
            .and_then(|c| c.any().downcast_ref::<T>())
            .ok_or_else(|| self.wrong_type::<T>(OP_GET))
    }

    /// The held `T`, mutably.
    ///
    /// # Errors
    /// As [`Blob::get`], and [`Error::InvalidState`] when the object is shared and others still
    /// hold it (see the module docs).
    pub fn get_mut<T: Any>(&mut self) -> Result<&mut T> {
        if !self.is_type::<T>() {
            return Err(self.wrong_type::<T>("Blob::get_mut"));
        }
        let type_name = self.type_name().unwrap_or("?");
        match self.content.as_mut().map(|c| &mut c.held) {
            Some(Held::Owned(b)) => b
                .downcast_mut::<T>()
                .ok_or_else(|| mismatch::<T>("Blob::get_mut", type_name)),
            Some(Held::Shared(a)) => {
                let others = Arc::strong_count(a) - 1;
                Arc::get_mut(a)
                    .and_then(|v| v.downcast_mut::<T>())
                    .ok_or_else(|| Error::InvalidState {
                        op: "Blob::get_mut",
                        buffer: "Blob".into(),
                        reason: format!(
                            "the {type_name} it holds is shared with {others} other holder(s): \
                             the blob can only lend it immutably (share a Mutex for mutation)"
                        ),
                    })
            }
            None => Err(mismatch::<T>("Blob::get_mut", type_name)),
        }
    }

    /// The held `T`, or a new `T::default()` in place of whatever the blob held (Caffe2's
    /// `GetMutable<T>(&is_new)`). `is_new` is true when the default was just stored.
    ///
    /// # Errors
    /// As [`Blob::get_mut`] when the blob holds a shared `T` that others still hold.
    pub fn get_or_insert_default<T: Any + Send + Sync + Default>(
        &mut self,
    ) -> Result<(&mut T, bool)> {
        self.get_or_insert_with(T::default)
    }

    /// The held `T`, or `make()` in place of whatever the blob held; `is_new` as in
    /// [`Blob::get_or_insert_default`].
    ///
    /// # Errors
    /// As [`Blob::get_or_insert_default`].
    pub fn get_or_insert_with<T: Any + Send + Sync>(
        &mut self,
        make: impl FnOnce() -> T,
    ) -> Result<(&mut T, bool)> {
        if self.is_type::<T>() {
            return self.get_mut::<T>().map(|v| (v, false));
        }
        Ok((self.reset(make()), true))
    }

    /// Stores `value`, owned, dropping what the blob held (or its reference to a shared
    /// object) first, and returns it (Caffe2's `Reset(new T)`).
    pub fn reset<T: Any + Send + Sync>(&mut self, value: T) -> &mut T {
        self.content = None;
        let content = self.content.insert(Content {
            held: Held::Owned(Box::new(value)),
            type_name: std::any::type_name::<T>(),
        });
        match &mut content.held {
            Held::Owned(b) => match b.downcast_mut::<T>() {
                Some(v) => v,
                None => unreachable!("a Box<T> just stored downcasts to T"),
            },
            Held::Shared(_) => unreachable!("an owned value was just stored"),
        }
    }

    /// Drops what the blob holds (its reference, for a shared object) and leaves it empty
    /// (Caffe2's `Reset()`).
    pub fn reset_empty(&mut self) {
        self.content = None;
    }

    /// Moves the held `T` out, leaving the blob empty (Caffe2's `Release`, see the module
    /// docs). A shared object can be taken only when the blob holds its last reference.
    ///
    /// # Errors
    /// As [`Blob::get`], and [`Error::InvalidState`] for a shared object that others still
    /// hold. On error the blob is unchanged.
    pub fn take<T: Any + Send + Sync>(&mut self) -> Result<T> {
        if !self.is_type::<T>() {
            return Err(self.wrong_type::<T>("Blob::take"));
        }
        let Some(Content { held, type_name }) = self.content.take() else {
            return Err(mismatch::<T>("Blob::take", "nothing"));
        };
        let restore = |held| Some(Content { held, type_name });
        match held {
            Held::Owned(b) => match b.downcast::<T>() {
                Ok(v) => Ok(*v),
                Err(b) => {
                    self.content = restore(Held::Owned(b));
                    Err(mismatch::<T>("Blob::take", type_name))
                }
            },
            Held::Shared(a) => match a.downcast::<T>() {
                Ok(typed) => Arc::try_unwrap(typed).map_err(|typed| {
                    let others = Arc::strong_count(&typed) - 1;
                    self.content = restore(Held::Shared(typed));
                    Error::InvalidState {
                        op: "Blob::take",
                        buffer: "Blob".into(),
                        reason: format!(
                            "the {type_name} it holds is shared with {others} other holder(s)"
                        ),
                    }
                }),
                Err(a) => {
                    self.content = restore(Held::Shared(a));
                    Err(mismatch::<T>("Blob::take", type_name))
                }
            },
        }
    }

    /// Holds `object` without owning it exclusively (Caffe2's `ShareExternal`), dropping what
    /// the blob held first. Resetting or dropping the blob later only drops its reference.
    pub fn share<T: Any + Send + Sync>(&mut self, object: Arc<T>) -> &T {
        self.content = None;
        let content = self.content.insert(Content {
            held: Held::Shared(object),
            type_name: std::any::type_name::<T>(),
        });
        match content.any().downcast_ref::<T>() {
            Some(v) => v,
            None => unreachable!("an Arc<T> just stored downcasts to T"),
        }
    }

    /// The `Arc` of a shared `T` (a new reference to it).
    ///
    /// # Errors
    /// As [`Blob::get`], and [`Error::InvalidState`] when the blob owns its object instead of
    /// sharing it.
    pub fn get_shared<T: Any + Send + Sync>(&self) -> Result<Arc<T>> {
        if !self.is_type::<T>() {
            return Err(self.wrong_type::<T>("Blob::get_shared"));
        }
        match self.content.as_ref().map(|c| &c.held) {
            Some(Held::Shared(a)) => a
                .clone()
                .downcast::<T>()
                .map_err(|_| mismatch::<T>("Blob::get_shared", self.type_name().unwrap_or("?"))),
            _ => Err(Error::InvalidState {
                op: "Blob::get_shared",
                buffer: "Blob".into(),
                reason: format!(
                    "the {} it holds is owned by the blob, not shared",
                    std::any::type_name::<T>()
                ),
            }),
        }
    }

    /// Exchanges the contents of two blobs.
    pub fn swap(&mut self, other: &mut Blob) {
        std::mem::swap(&mut self.content, &mut other.content);
    }

    fn wrong_type<T: Any>(&self, op: &'static str) -> Error {
        mismatch::<T>(
            op,
            self.type_name().unwrap_or("nothing (the blob is empty)"),
        )
    }
}

/// The wrong-type error: names the stored and the requested type on one line.
fn mismatch<T: Any>(op: &'static str, stored: &str) -> Error {
    Error::TypeMismatch {
        what: format!("Blob ({op})"),
        stored: stored.to_string(),
        requested: std::any::type_name::<T>().to_string(),
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("type", &self.type_name())
            .field("shared", &self.is_shared())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Blob>();
}
