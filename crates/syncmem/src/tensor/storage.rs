//! Storage and its lifecycle: resize, reshape, type change, free, share, adopt, swap.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use parking_lot::RwLock;

use super::shape::Shape;
use super::Tensor;
use crate::device::Device;
use crate::dtype::sealed::Adopted;
use crate::dtype::{DType, Element, PodElement};
use crate::error::{checked_mul, Error, OomReport, Result};
use crate::synced::held::{self, Named, ReadHeld, WriteHeld};
use crate::synced::SyncedMemory;

/// Plain-data storage: one buffer mirrored on host and device.
pub(crate) struct ByteStorage {
    pub(crate) mem: SyncedMemory,
    /// Adopted from outside (Caffe2's `ShareExternalPointer`).
    adopted: bool,
}

/// `String` storage: a host-only vector whose length (the capacity) never changes.
pub(crate) struct StringStorage {
    pub(crate) data: RwLock<Vec<String>>,
    pub(crate) len: usize,
    adopted: bool,
}

/// A tensor's storage. Cloning it shares it (Caffe2's `shared_ptr<void> data_`).
#[derive(Clone)]
pub(crate) enum Storage {
    Bytes(Arc<ByteStorage>),
    Strings(Arc<StringStorage>),
}

/// A shared view of `String` elements, recorded as held by this thread (see
/// [`crate::synced`]: a conflicting access of this thread is an error, not a wait).
pub(crate) struct StringsRead<'a> {
    guard: ReadHeld<'a, Vec<String>>,
    _named: Named,
}

/// An exclusive view of `String` elements, recorded as held by this thread.
pub(crate) struct StringsWrite<'a> {
    guard: WriteHeld<'a, Vec<String>>,
    _named: Named,
}

impl Deref for StringsRead<'_> {
    type Target = Vec<String>;
    fn deref(&self) -> &Vec<String> {
        &self.guard
    }
}

impl Deref for StringsWrite<'_> {
    type Target = Vec<String>;
    fn deref(&self) -> &Vec<String> {
        &self.guard
    }
}

impl DerefMut for StringsWrite<'_> {
    fn deref_mut(&mut self) -> &mut Vec<String> {
        &mut self.guard
    }
}

impl StringStorage {
    /// The elements, shared, for a view of the tensor named `tensor`: waits for a writer of
    /// another thread only, as the accessors of [`SyncedMemory`] do.
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a write view of this storage.
    pub(crate) fn read_for(&self, tensor: &str) -> Result<StringsRead<'_>> {
        let guard = held::read_lock(&self.data, |h| busy(tensor, h))?;
        Ok(StringsRead {
            guard,
            _named: Named::new(held::lock_key(&self.data), tensor),
        })
    }

    /// The elements, exclusive, for a view of the tensor named `tensor`.
    ///
    /// # Errors
    /// [`Error::Busy`] when this thread holds a view of this storage.
    pub(crate) fn write_for(&self, tensor: &str) -> Result<StringsWrite<'_>> {
        let guard = held::write_lock(&self.data, |h| busy(tensor, h))?;
        Ok(StringsWrite {
            guard,
            _named: Named::new(held::lock_key(&self.data), tensor),
        })
    }
}

fn busy(tensor: &str, h: held::Held) -> Error {
    held::self_deadlock(Some(tensor), "its String storage", h)
}

impl Storage {
    /// Fresh storage for `numel` elements of `dtype`, its host mirrors pinned with
    /// `pinned_host` ([`SyncedMemory::set_pinned_host`]). Byte storage allocates nothing yet.
    pub(crate) fn new(
        dtype: DType,
        numel: usize,
        device: Option<&Device>,
        label: &str,
        pinned_host: bool,
    ) -> Result<Storage> {
        let nbytes = checked_mul(numel, dtype.size(), format_args!("bytes of tensor {label}"))?;
        if dtype.is_pod() {
            let mem = match device {
                Some(d) => SyncedMemory::new(nbytes, d),
                None => SyncedMemory::host_only(nbytes),
            };
            return Ok(Storage::Bytes(Arc::new(ByteStorage {
                mem: mem.with_label(label).with_pinned_host(pinned_host),
                adopted: false,
            })));
        }
        let mut v: Vec<String> = Vec::new();
        v.try_reserve_exact(numel).map_err(|e| {
            Error::from(
                OomReport::new("host", nbytes, e.to_string())
                    .with_purpose(format!("{numel} String elements of tensor {label}")),
            )
        })?;
        v.resize(numel, String::new());
        Ok(Self::strings(v, false))
    }

    fn strings(v: Vec<String>, adopted: bool) -> Storage {
        Storage::Strings(Arc::new(StringStorage {
            len: v.len(),
            data: RwLock::new(v),
            adopted,
        }))
    }

    fn adopted_bytes(mem: SyncedMemory) -> Storage {
        Storage::Bytes(Arc::new(ByteStorage { mem, adopted: true }))
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        match self {
            Storage::Bytes(b) => b.mem.len(),
            Storage::Strings(s) => s.len.saturating_mul(DType::String.size()),
        }
    }

    pub(crate) fn synced(&self) -> Option<&SyncedMemory> {
        match self {
            Storage::Bytes(b) => Some(&b.mem),
            Storage::Strings(_) => None,
        }
    }

    pub(crate) fn same(&self, other: &Storage) -> bool {
        match (self, other) {
            (Storage::Bytes(a), Storage::Bytes(b)) => Arc::ptr_eq(a, b),
            (Storage::Strings(a), Storage::Strings(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    pub(crate) fn ref_count(&self) -> usize {
        match self {
            Storage::Bytes(b) => Arc::strong_count(b),
            Storage::Strings(s) => Arc::strong_count(s),
        }
    }

    pub(crate) fn adopted(&self) -> bool {
        match self {
            Storage::Bytes(b) => b.adopted,
            Storage::Strings(s) => s.adopted,
        }
    }

    /// True when this storage can hold elements of `dtype` (bytes for POD, strings for String).
    fn holds(&self, dtype: DType) -> bool {
        matches!(self, Storage::Bytes(_)) == dtype.is_pod()
    }
}

impl Tensor {
    /// Sets the dims (Caffe2's `Resize`). Nothing is allocated. When the element count changes,
    /// the storage is freed if it is too small, or if the [`super::ShrinkPolicy`] says so
    /// (unless capacity was reserved); the contents of a freed storage are lost.
    ///
    /// # Errors
    /// [`Error::SizeOverflow`] when the element count (or the product of the non-zero dims) or
    /// the byte count does not fit in `usize`. The tensor is unchanged on error.
    pub fn resize(&mut self, dims: &[usize]) -> Result<()> {
        if self
            .shape
            .as_ref()
            .is_some_and(|s| same_dims(s.dims.as_slice(), dims))
        {
            // The same dims: nothing changes (and nothing is allocated for a new shape).
            return Ok(());
        }
        let shape = Shape::new(dims, format_args!("resize of tensor {}", self.label))?;
        self.resize_shape(shape, self.itemsize().unwrap_or(0))
    }

    /// Resizes to `other`'s dims (Caffe2's `ResizeLike`).
    ///
    /// # Errors
    /// [`Error::InvalidState`] when `other` is uninitialised (Caffe2 makes this tensor a
    /// scalar), or as [`Tensor::resize`].
    pub fn resize_like(&mut self, other: &Tensor) -> Result<()> {
        let shape = other.shape.clone().ok_or_else(|| {
            self.err_state(
                "resize_like",
                format!("the model tensor {} is uninitialised", other.label),
            )
        })?;
        self.resize_shape(shape, self.itemsize().unwrap_or(0))
    }

    /// Resizes, deciding whether to free with `itemsize` bytes per element.
    pub(crate) fn resize_shape(&mut self, shape: Shape, itemsize: usize) -> Result<()> {
        let new_bytes = checked_mul(
            shape.numel,
            itemsize,
            format_args!("bytes of tensor {} with dims {:?}", self.label, shape.dims),
        )?;
        let same_count = self.numel() == Some(shape.numel);
        self.shape = Some(shape);
        if same_count {
            return Ok(());
        }
        if let Some(st) = &self.storage {
            let cap = st.capacity_bytes();
            let slack_too_big = self
                .policy
                .max_slack_bytes
                .is_some_and(|max| cap.saturating_sub(new_bytes) > max);
            let free = cap < new_bytes
                || (!self.reserved && (!self.policy.keep_on_shrink || slack_too_big));
            if free {
                self.free_memory();
            }
        }
        Ok(())
    }

    /// Changes the dims keeping the element count and the storage (Caffe2's `Reshape`).
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised or the element counts differ
    /// (use [`Tensor::resize`] for that); [`Error::SizeOverflow`].
    pub fn reshape(&mut self, dims: &[usize]) -> Result<()> {
        let shape = Shape::new(dims, format_args!("reshape of tensor {}", self.label))?;
        let old = self.numel().ok_or_else(|| self.uninit("reshape"))?;
        if shape.numel != old {
            return Err(self.err_state(
                "reshape",
                format!(
                    "new size {} (dims {dims:?}) and old size {old} (dims {:?}) are not equal: \
                     use resize to change the element count",
                    shape.numel,
                    self.dims()
                ),
            ));
        }
        self.shape = Some(shape);
        Ok(())
    }

    /// Fixes the element type and makes sure a storage exists (Caffe2's
    /// `raw_mutable_data(meta)`). The storage is reused when the type is unchanged, or when
    /// neither type is `String` and the capacity holds the new bytes (the bytes are then
    /// reinterpreted); otherwise a fresh storage replaces it and the old contents are lost.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised, [`Error::SizeOverflow`],
    /// out of memory (for `String` elements, which are constructed at once).
    pub fn set_dtype(&mut self, dtype: DType) -> Result<()> {
        self.prepare(dtype, "set_dtype")
    }

    pub(crate) fn prepare(&mut self, dtype: DType, op: &'static str) -> Result<()> {
        let numel = self.numel().ok_or_else(|| self.uninit(op))?;
        let kept = self.storage.as_ref().filter(|s| s.holds(dtype));
        if self.dtype == Some(dtype) && (kept.is_some() || numel == 0) {
            return Ok(());
        }
        let nbytes = checked_mul(
            numel,
            dtype.size(),
            format_args!("bytes of tensor {} as {dtype}", self.label),
        )?;
        let reuse = match kept {
            // Caffe2 reuses when neither type has a constructor / destructor and the bytes fit.
            Some(Storage::Bytes(b)) => b.mem.len() >= nbytes,
            // Strings to strings with the same type returned above; fits when long enough.
            Some(Storage::Strings(s)) => s.len >= numel,
            None => false,
        };
        if !reuse {
            self.storage = None;
            self.reserved = false;
            if numel > 0 {
                let st = Storage::new(
                    dtype,
                    numel,
                    self.device.as_ref(),
                    &self.label,
                    self.pinned_host,
                )?;
                self.storage = Some(st);
            }
        }
        self.dtype = Some(dtype);
        Ok(())
    }

    /// Lets go of the storage (Caffe2's `FreeMemory`): the memory is freed unless another
    /// tensor shares it, which keeps it. Dims and type are kept; the next mutable access
    /// allocates again.
    pub fn free_memory(&mut self) {
        self.storage = None;
        self.reserved = false;
    }

    /// Makes this tensor use `src`'s storage and element type (Caffe2's `ShareData`). Only the
    /// element counts must match: the dims stay this tensor's own. Every check runs before
    /// anything changes (Caffe2 sets the type first), and the capacity comes with the storage
    /// (no stale capacity, BVLC/caffe#5439).
    ///
    /// A later resize that frees, [`Tensor::free_memory`], or a reallocating type change
    /// detaches only the tensor it is called on.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when either tensor is uninitialised, when the element counts
    /// differ, or when `src` has elements but no data; [`Error::DeviceMismatch`] when the two
    /// tensors are not on the same device.
    pub fn share_data(&mut self, src: &Tensor) -> Result<()> {
        let op = "share_data";
        let n = src.numel().ok_or_else(|| {
            self.err_state(
                op,
                format!("the source tensor {} is uninitialised", src.label),
            )
        })?;
        let mine = self.numel().ok_or_else(|| self.uninit(op))?;
        if mine != n {
            return Err(self.err_state(
                op,
                format!(
                    "size mismatch: this tensor has {mine} elements (dims {:?}), the source {} \
                     has {n} (dims {:?}); did you resize before sharing?",
                    self.dims(),
                    src.label,
                    src.dims()
                ),
            ));
        }
        if n > 0 && src.storage.is_none() {
            return Err(self.err_state(
                op,
                format!(
                    "the source tensor {} has {n} elements but no content",
                    src.label
                ),
            ));
        }
        let same_device = match (&self.device, &src.device) {
            (Some(a), Some(b)) => a.same(b),
            (None, None) => true,
            _ => false,
        };
        if !same_device {
            let name =
                |d: &Option<Device>| d.as_ref().map_or("host only", Device::label).to_string();
            return Err(Error::DeviceMismatch {
                op: "Tensor::share_data",
                expected: format!("{} (tensor {})", name(&self.device), self.label),
                actual: format!("{} (tensor {})", name(&src.device), src.label),
            });
        }
        self.dtype = src.dtype;
        self.storage = src.storage.clone();
        self.reserved = false;
        Ok(())
    }

    /// Adopts `data` as the storage, without copying (Caffe2's `ShareExternalPointer` with an
    /// owner: here the tensor owns the vector and drops it with the storage). `bool` vectors are
    /// converted to bytes (one copy). The type becomes `T`; the capacity is `data.len()`
    /// elements, and the device mirror is filled from it on first device access.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised (set the shape first);
    /// [`Error::SizeMismatch`] when `data` is shorter than the element count.
    pub fn adopt<T: Element>(&mut self, data: impl Into<Vec<T>>) -> Result<()> {
        let numel = self.numel().ok_or_else(|| self.uninit("adopt"))?;
        let data: Vec<T> = data.into();
        self.check_adopt_len("adopt", T::DTYPE, numel, data.len())?;
        let storage = match T::adopt(data) {
            Adopted::Bytes(mut owner) => {
                let len = owner.as_mut().len();
                let mem = self.adopt_mem(len);
                mem.set_host_data(owner)?;
                Storage::adopted_bytes(mem)
            }
            Adopted::Strings(v) => Storage::strings(v, true),
        };
        self.install(T::DTYPE, storage);
        Ok(())
    }

    /// Adopts host memory owned by `owner` as the storage of a plain-data `dtype`, without
    /// copying (e.g. a memory map). The capacity is the owner's length.
    ///
    /// `owner.as_mut()` must keep returning the same memory while owned.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised, `dtype` is `String`, or the
    /// memory is not aligned for `dtype`; [`Error::SizeMismatch`] when it is shorter than
    /// the tensor's bytes.
    pub fn adopt_bytes<O>(&mut self, dtype: DType, mut owner: O) -> Result<()>
    where
        O: AsMut<[u8]> + Send + Sync + 'static,
    {
        let numel = self.numel().ok_or_else(|| self.uninit("adopt_bytes"))?;
        if !dtype.is_pod() {
            return Err(self.err_state("adopt_bytes", format!("{dtype} is not plain data")));
        }
        let bytes = owner.as_mut();
        let (len, addr) = (bytes.len(), bytes.as_ptr() as usize);
        if len > 0 {
            self.check_adopt_ptr("adopt_bytes", dtype, addr)?;
        }
        self.check_adopt_len("adopt_bytes", dtype, numel, len / dtype.size())?;
        let mem = self.adopt_mem(len);
        mem.set_host_data(owner)?;
        self.install(dtype, Storage::adopted_bytes(mem));
        Ok(())
    }

    /// Uses `len` elements at `ptr` as the storage, without copying or taking ownership
    /// (Caffe2's `ShareExternalPointer` without a deleter). The type becomes `T`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` elements of `T`, aligned, initialised
    /// with valid values of `T`, and must stay so until the storage is released: until this
    /// tensor and every tensor sharing its storage have been dropped, freed, or moved to
    /// another storage. In that time the memory must not be accessed other than through
    /// those tensors.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for an uninitialised tensor, a null or misaligned pointer;
    /// [`Error::SizeMismatch`] when `len` is below the element count; [`Error::SizeOverflow`].
    pub unsafe fn adopt_raw<T: PodElement>(&mut self, ptr: *mut T, len: usize) -> Result<()> {
        let numel = self.numel().ok_or_else(|| self.uninit("adopt_raw"))?;
        if ptr.is_null() {
            return Err(self.err_state("adopt_raw", "null pointer".into()));
        }
        if len > 0 {
            self.check_adopt_ptr("adopt_raw", T::DTYPE, ptr as usize)?;
        }
        self.check_adopt_len("adopt_raw", T::DTYPE, numel, len)?;
        let nbytes = checked_mul(len, T::DTYPE.size(), "adopt_raw length in bytes")?;
        let mem = self.adopt_mem(nbytes);
        // SAFETY: the caller guarantees `ptr` is valid for reads and writes of `len` elements
        // (`nbytes` bytes), initialised, and used only through this storage until the storage
        // (and with it the SyncedMemory) is dropped — which is `set_host_ptr`'s contract.
        unsafe { mem.set_host_ptr(ptr.cast::<u8>(), nbytes)? };
        self.install(T::DTYPE, Storage::adopted_bytes(mem));
        Ok(())
    }

    /// Exchanges shape, type, storage, reserved flag and device with `other` (Caffe2's
    /// `swap`). Each tensor keeps its label and shrink policy.
    pub fn swap(&mut self, other: &mut Tensor) {
        std::mem::swap(&mut self.shape, &mut other.shape);
        std::mem::swap(&mut self.dtype, &mut other.dtype);
        std::mem::swap(&mut self.storage, &mut other.storage);
        std::mem::swap(&mut self.reserved, &mut other.reserved);
        std::mem::swap(&mut self.device, &mut other.device);
    }

    fn adopt_mem(&self, nbytes: usize) -> SyncedMemory {
        let mem = match &self.device {
            Some(d) => SyncedMemory::new(nbytes, d),
            None => SyncedMemory::host_only(nbytes),
        };
        mem.with_label(self.label.clone())
            .with_pinned_host(self.pinned_host)
    }

    fn install(&mut self, dtype: DType, storage: Storage) {
        self.dtype = Some(dtype);
        self.storage = Some(storage);
        self.reserved = false;
    }

    fn check_adopt_len(
        &self,
        op: &'static str,
        dtype: DType,
        numel: usize,
        len: usize,
    ) -> Result<()> {
        if len < numel {
            return Err(Error::SizeMismatch {
                what: format!(
                    "{op} into tensor {} with dims {:?}: {len} elements of {dtype} given, \
                     {numel} needed",
                    self.label,
                    self.dims()
                ),
                expected: numel.saturating_mul(dtype.size()),
                actual: len.saturating_mul(dtype.size()),
            });
        }
        Ok(())
    }

    fn check_adopt_ptr(&self, op: &'static str, dtype: DType, addr: usize) -> Result<()> {
        if !addr.is_multiple_of(dtype.align()) {
            return Err(self.err_state(
                op,
                format!(
                    "memory at {addr:#x} is not aligned for {dtype} ({})",
                    dtype.align()
                ),
            ));
        }
        Ok(())
    }
}

/// `a == b`, element by element inline: a few dims, where the slice comparison calls
/// `memcmp` (about 1% of a small `cpu` training step, a net resizing its outputs each run).
#[inline]
fn same_dims(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}
