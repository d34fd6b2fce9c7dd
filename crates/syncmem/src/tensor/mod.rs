//! [`Tensor`]: Caffe2's `Tensor<Context>` on top of [`SyncedMemory`].
//!
//! A tensor is a shape, an element type ([`DType`]) and a storage. Plain-data storage is one
//! [`SyncedMemory`] mirrored on the tensor's device (or host only), so every POD tensor has a
//! host and a device view and the copies between them are lazy; `String` storage is a host-only
//! `Vec<String>`.
//!
//! ```
//! use syncmem::{dtype::DType, tensor::Tensor, Device};
//!
//! # fn main() -> syncmem::Result<()> {
//! let dev = Device::cpu();
//! let mut t = Tensor::new(&dev);            // uninitialised: numel() is None (Caffe2's -1)
//! t.resize(&[2, 3])?;                        // a shape, still no memory
//! t.host_mut::<f32>()?.copy_from_slice(&[0., 1., 2., 3., 4., 5.]); // allocated, typed f32
//! assert_eq!(t.dtype(), Some(DType::F32));
//! let on_device = t.device::<f32>()?;        // copied host -> device once
//! assert_eq!(on_device.to_vec()?, vec![0., 1., 2., 3., 4., 5.]);
//! # Ok(())
//! # }
//! ```
//!
//! # Lifecycle (as Caffe2)
//!
//! - **Uninitialised** until the first [`Tensor::resize`]: [`Tensor::numel`] is `None`, data
//!   accessors fail.
//! - **Lazy allocation**: a resize records the shape only. The first typed mutable access
//!   ([`Tensor::host_mut`], [`Tensor::device_mut`], the overwrite forms, or
//!   [`Tensor::set_dtype`]) fixes the element type and creates the storage; the bytes themselves
//!   are allocated by the [`SyncedMemory`] on the side first touched. Read accessors need data.
//! - **Type change**: a mutable access with another type reuses the storage when neither type is
//!   `String` and the bytes fit (int → float → f16 keep the same memory, the bytes are
//!   reinterpreted); otherwise a new storage replaces the old one, whose contents are lost.
//! - **Resize** keeps the storage when the element count is unchanged; otherwise it follows the
//!   tensor's [`ShrinkPolicy`] (keep on shrink, bounded slack) unless capacity was reserved.
//!
//! # Departures from Caffe2, on purpose
//!
//! | Caffe2 | here | why |
//! |---|---|---|
//! | size −1, `nbytes()` meaningless | `numel() -> Option<usize>`, `nbytes()` 0 | no sentinel |
//! | `int64` dims, negatives accepted | `usize` dims, checked products ([`Error::SizeOverflow`]); [`dims_from_i64`] rejects negatives | bad shapes are errors |
//! | global `caffe2_keep_on_shrink` flags | per-tensor [`ShrinkPolicy`] | no hidden global state |
//! | `ShareData` sets the meta, then checks | [`Tensor::share_data`] checks count, data and device first | a failed call changes nothing |
//! | Caffe's `ShareData` keeps a stale capacity (BVLC/caffe#5439) | capacity is read from the storage | cannot go stale |
//! | `shares_data_` never cleared | [`Tensor::shares_data`] is computed | it tells the truth |
//! | same-context copy constructor is shallow | no `Clone`; [`Tensor::clone_deep`] | no silent aliasing |
//! | `Shrink` accepts negatives | [`Tensor::shrink`] takes `usize`, rejects > current | |
//! | `CopyFrom` sets the meta first, so `raw_mutable_data()` can hand back the old, smaller buffer | [`Tensor::copy_from`] sizes the buffer for the new type | no overrun |
//! | `Reserve` without a meta is a silent no-op | an error | |
//! | `ResizeLike` of an uninitialised tensor gives a scalar | an error | |
//! | `size_between_dim` checks one axis, `dim` checks in debug only | every axis checked | |
//! | null pointers for size 0 | empty views, nothing allocated | |
//! | new elements after `Reserve`/`Extend` unspecified | zero | determinism |
//! | `ShareExternalPointer(p, capacity)` trusts the capacity | [`Tensor::adopt`] takes ownership; the length must cover the shape | |
//! | `CopyFrom` asynchronous on a CUDA context | blocking | the source may be freed right after |
//!
//! `bool` is stored as bytes and validated when viewed (see [`crate::dtype`]); a type change
//! that reinterprets other bytes as `bool` fails on access unless the access overwrites
//! ([`Tensor::host_overwrite`] zero-fills invalid bytes first).
//!
//! # Threads
//!
//! `Tensor` is `Send + Sync`. Views borrow the tensor: mutable views need `&mut Tensor`. Two
//! tensors that share a storage share its reader-writer lock: as with [`SyncedMemory`], taking a
//! write view of one while the same thread holds a view of the other waits forever.

mod grow;
mod shape;
mod storage;
mod view;

pub use shape::dims_from_i64;
pub use view::{DeviceSlice, DeviceSliceMut, HostBytes, HostBytesMut, HostSlice, HostSliceMut};

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc::stats::CopyStats;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::synced::{Head, SyncedMemory};
use shape::Shape;
use storage::Storage;

/// When a resize that changes the element count frees the storage (Caffe2's
/// `caffe2_keep_on_shrink` and `caffe2_max_keep_on_shrink_memory` flags, per tensor).
///
/// A resize always frees when the storage is too small. Otherwise, unless capacity was
/// [reserved](Tensor::reserve), it frees when `keep_on_shrink` is off, or when the unused bytes
/// (`capacity - new bytes`) exceed `max_slack_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShrinkPolicy {
    /// Keep the storage when the tensor shrinks (default `true`).
    pub keep_on_shrink: bool,
    /// Largest slack kept, in bytes; `None` is unlimited (the default, Caffe2's `LLONG_MAX`).
    pub max_slack_bytes: Option<usize>,
}

impl Default for ShrinkPolicy {
    fn default() -> Self {
        Self {
            keep_on_shrink: true,
            max_slack_bytes: None,
        }
    }
}

impl ShrinkPolicy {
    /// The policy with [`ShrinkPolicy::keep_on_shrink`] set to `keep`.
    pub fn with_keep_on_shrink(mut self, keep: bool) -> Self {
        self.keep_on_shrink = keep;
        self
    }

    /// The policy with [`ShrinkPolicy::max_slack_bytes`] set to `max` (`None`: unlimited).
    pub fn with_max_slack_bytes(mut self, max: Option<usize>) -> Self {
        self.max_slack_bytes = max;
        self
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A Caffe2-style tensor: dims, an element type, and a storage mirrored on its device.
///
/// See the [module docs](self) for the lifecycle and the departures from Caffe2.
///
/// `Tensor` deliberately does not implement `Clone`: Caffe2's copy constructor silently shares
/// the buffer. Use [`Tensor::clone_deep`] for a copy, [`Tensor::share_data`] to share.
///
/// ```compile_fail
/// let t = syncmem::tensor::Tensor::host_only();
/// let copy: syncmem::tensor::Tensor = t.clone(); // no implicit copy, shallow or deep
/// ```
pub struct Tensor {
    label: String,
    device: Option<Device>,
    shape: Option<Shape>,
    dtype: Option<DType>,
    storage: Option<Storage>,
    reserved: bool,
    policy: ShrinkPolicy,
    /// Host mirrors of the storage come from the device's pinned pool
    /// ([`Tensor::set_pinned_host`]).
    pinned_host: bool,
}

impl Tensor {
    /// An uninitialised tensor whose storage will be mirrored on `device`.
    pub fn new(device: &Device) -> Tensor {
        Self::on(Some(device))
    }

    /// An uninitialised host-only tensor: device accesses return [`Error::NoDevice`].
    pub fn host_only() -> Tensor {
        Self::on(None)
    }

    /// An uninitialised tensor on `device`, or host-only for `None`.
    pub fn on(device: Option<&Device>) -> Tensor {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Tensor {
            label: format!("tensor#{id}"),
            device: device.cloned(),
            shape: None,
            dtype: None,
            storage: None,
            reserved: false,
            policy: ShrinkPolicy::default(),
            pinned_host: false,
        }
    }

    /// A tensor with a shape and an element type; nothing is allocated until first access,
    /// which reads zeros (or empty strings).
    ///
    /// # Errors
    /// [`Error::SizeOverflow`] when the element or byte count does not fit in `usize`.
    pub fn with_shape(dims: &[usize], dtype: DType, device: Option<&Device>) -> Result<Tensor> {
        let mut t = Self::on(device);
        t.resize(dims)?;
        t.set_dtype(dtype)?;
        Ok(t)
    }

    /// A tensor holding a copy of `values` (Caffe2's `(dims, values, context)` constructor).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when `values.len()` differs from the element count of `dims`;
    /// [`Error::SizeOverflow`]; out of memory.
    pub fn from_slice<T: Element>(
        dims: &[usize],
        values: &[T],
        device: Option<&Device>,
    ) -> Result<Tensor> {
        let mut t = Self::on(device);
        t.resize(dims)?;
        if t.numel() != Some(values.len()) {
            return Err(Error::SizeMismatch {
                what: format!(
                    "from_slice of {} values of {} for dims {dims:?} ({} elements)",
                    values.len(),
                    T::DTYPE,
                    t.numel().unwrap_or(0)
                ),
                expected: t.nbytes_for(T::DTYPE),
                actual: values.len().saturating_mul(T::DTYPE.size()),
            });
        }
        t.host_overwrite::<T>()?.clone_from_slice(values);
        Ok(t)
    }

    /// A 0-dimensional tensor (dims `[]`, one element) holding `value`.
    ///
    /// # Errors
    /// Out of memory.
    pub fn scalar<T: Element>(value: T, device: Option<&Device>) -> Result<Tensor> {
        Self::from_slice(&[], std::slice::from_ref(&value), device)
    }

    /// Names the tensor in errors and reports (e.g. its blob name). Storage created later
    /// carries the same label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Sets the shrink policy (see [`ShrinkPolicy`]).
    pub fn with_policy(mut self, policy: ShrinkPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Changes the shrink policy; it applies from the next resize.
    pub fn set_policy(&mut self, policy: ShrinkPolicy) {
        self.policy = policy;
    }

    /// The shrink policy.
    pub fn policy(&self) -> ShrinkPolicy {
        self.policy
    }

    /// Sets where the host mirrors of the tensor's storage come from: the device's pinned
    /// pool (page-locked memory: a discrete device's copies to and from it run at full speed
    /// and need no host wait) or ordinary host memory, for the storage it has (shared with
    /// every tensor sharing it) and the storage it makes later. See
    /// [`SyncedMemory::set_pinned_host`]: a host mirror that exists stays where it is, and a
    /// pinned buffer keeps two mirrors where the device could share host memory in place.
    pub fn set_pinned_host(&mut self, pinned: bool) {
        self.pinned_host = pinned;
        if let Some(mem) = self.synced() {
            mem.set_pinned_host(pinned);
        }
    }

    /// Whether the tensor's new host mirrors come from the device's pinned pool
    /// ([`Tensor::set_pinned_host`]).
    pub fn pinned_host(&self) -> bool {
        self.pinned_host
    }

    /// The label used in errors.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The device the storage is mirrored on (`None` for a host-only tensor). (Named like
    /// [`SyncedMemory::target`]: [`Tensor::device`] is the device view.)
    pub fn target(&self) -> Option<&Device> {
        self.device.as_ref()
    }

    /// The element type, once known (Caffe2's `meta()`).
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// True when the elements are of type `T` (Caffe2's `IsType<T>()`).
    pub fn is_type<T: Element>(&self) -> bool {
        self.dtype == Some(T::DTYPE)
    }

    /// Bytes usable without reallocating: the storage's size, 0 without storage (Caffe2's
    /// `capacity_nbytes()`). Read from the storage itself, so it is never stale.
    pub fn capacity_bytes(&self) -> usize {
        self.storage.as_ref().map_or(0, Storage::capacity_bytes)
    }

    /// True once [`Tensor::reserve`] set the capacity (cleared when the storage is replaced).
    pub fn is_reserved(&self) -> bool {
        self.reserved
    }

    /// True when the storage is also used by another tensor, or was adopted from outside
    /// ([`Tensor::adopt`]). Unlike Caffe2's `shares_data_`, this clears when the tensor lets go
    /// of the storage (free, reallocating resize).
    pub fn shares_data(&self) -> bool {
        self.storage
            .as_ref()
            .is_some_and(|s| s.ref_count() > 1 || s.adopted())
    }

    /// True when both tensors use the same storage.
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        match (&self.storage, &other.storage) {
            (Some(a), Some(b)) => a.same(b),
            _ => false,
        }
    }

    /// True when storage exists (Caffe2: `data_` non-null). Even then, the [`SyncedMemory`]
    /// may not have allocated any bytes yet.
    pub fn has_storage(&self) -> bool {
        self.storage.is_some()
    }

    /// The byte storage, for code that works on [`SyncedMemory`] directly (prefetch, statistics).
    /// `None` without storage or for `String` tensors. It may be larger than
    /// [`Tensor::nbytes`] (capacity kept after a shrink).
    pub fn synced(&self) -> Option<&SyncedMemory> {
        self.storage.as_ref().and_then(Storage::synced)
    }

    /// Which mirror holds the newest data (`None` without byte storage).
    pub fn head(&self) -> Option<Head> {
        self.synced().map(SyncedMemory::head)
    }

    /// Host-device copies made by the storage's transitions (zero without byte storage).
    /// Device-to-device copies made by [`Tensor::copy_from`] and growth are counted in
    /// [`crate::stats`] only.
    pub fn copy_stats(&self) -> CopyStats {
        self.synced()
            .map(SyncedMemory::copy_stats)
            .unwrap_or_default()
    }

    /// A one-line description: label, type, dims, device, bytes, capacity and head.
    pub fn debug_string(&self) -> String {
        let ty = self.dtype.map_or("no type", DType::name);
        let dims = match &self.shape {
            Some(s) => format!("{:?}", s.dims),
            None => "uninitialised".to_string(),
        };
        let dev = self.device.as_ref().map_or("host only", Device::label);
        let mut s = format!("Tensor {}: {ty} {dims} on {dev}", self.label);
        if self.shape.is_some() {
            s.push_str(&format!(
                ", {} bytes (capacity {})",
                self.nbytes(),
                self.capacity_bytes()
            ));
        }
        if let Some(h) = self.head() {
            s.push_str(&format!(", head {h}"));
        }
        if self.shares_data() {
            s.push_str(", shared");
        }
        s
    }

    // ----- internal helpers --------------------------------------------------------------------

    /// `numel * dtype.size()`, saturating (only for messages).
    fn nbytes_for(&self, dtype: DType) -> usize {
        self.numel().unwrap_or(0).saturating_mul(dtype.size())
    }

    fn err_state(&self, op: &'static str, reason: String) -> Error {
        Error::InvalidState {
            op,
            buffer: format!("tensor {}", self.label),
            reason,
        }
    }

    fn uninit(&self, op: &'static str) -> Error {
        self.err_state(
            op,
            "the tensor is uninitialised (no shape, Caffe2's size -1): call resize first".into(),
        )
    }

    fn type_mismatch(&self, op: &'static str, expected: DType) -> Error {
        let actual = self.dtype.map_or("no type yet", DType::name);
        Error::TypeMismatch {
            what: format!("tensor {} ({op})", self.label),
            stored: actual.to_string(),
            requested: expected.to_string(),
        }
    }

    fn no_data(&self, op: &'static str) -> Error {
        self.err_state(
            op,
            format!(
                "the tensor has {} elements but no data: allocation is lazy, write it first \
                 (host_mut, device_mut, set_dtype)",
                self.numel().unwrap_or(0)
            ),
        )
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("label", &self.label)
            .field("dtype", &self.dtype)
            .field("dims", &self.shape.as_ref().map(|s| &s.dims))
            .field("device", &self.device.as_ref().map(Device::label))
            .field("capacity_bytes", &self.capacity_bytes())
            .field("reserved", &self.reserved)
            .field("head", &self.head())
            .field("shares_data", &self.shares_data())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tensor>();
}
