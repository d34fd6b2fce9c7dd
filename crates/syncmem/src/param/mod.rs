//! [`ParamBlob`]: Caffe's `Blob<Dtype>`, a data buffer and a diff (gradient) buffer of one shape.
//!
//! Named `ParamBlob` so as not to clash with the type-erased [`crate::blob::Blob`] (Caffe2's).
//! Each buffer is an [`Arc<SyncedMemory>`] on the blob's device, so where the newest copy lives,
//! and what gets copied when, follows [`SyncedMemory`]'s table.
//!
//! ```
//! use syncmem::{param::ParamBlob, Device};
//! # fn main() -> syncmem::Result<()> {
//! let mut w = ParamBlob::<f32>::with_shape("conv1.w", &[2, 3, 4, 5], &Device::cpu())?;
//! assert_eq!((w.num()?, w.channels()?, w.count()), (2, 3, 120));
//! w.host_data_mut(|d| d.fill(1.0))?;
//! w.host_diff_mut(|g| g.fill(0.25))?;
//! w.update()?;                                   // data -= diff, where the data's head is
//! assert_eq!(w.asum_data()?, 90.0);
//! # Ok(())
//! # }
//! ```
//!
//! # Capacity
//!
//! As in Caffe, capacity only grows: a reshape beyond it replaces **both** buffers with new,
//! uninitialized ones (they read as zeros); a reshape within it keeps the buffers and their
//! bytes. Memory is not released on shrink (Caffe #4910, by design).
//!
//! # Departures from Caffe, on purpose
//!
//! - **Always usable buffers** (Caffe #3625): a fresh blob holds two empty buffers, so a blob
//!   first reshaped to count 0 has working (empty) accessors instead of null pointers.
//! - **Capacity is read from the buffers** (Caffe #5439): it is the element count that both
//!   buffers hold, so after [`ParamBlob::share_data`] it is the shared buffer's, and a reshape
//!   that would overrun the shared buffer detaches cleanly instead.
//! - **`offset(n, c, h, w)` rejects `n == num()`** (Caffe's checks use `<=`).
//! - Every Caffe `CHECK` is an error: more than [`MAX_AXES`] axes, an axis out of range, an
//!   overflowing count, a count mismatch, math on an integer blob (`NOT_IMPLEMENTED`).
//! - Dimensions are `usize` (no negative dims to check) and counts are not capped at `INT_MAX`;
//!   overflow of the element or byte count is an [`Error::SizeOverflow`].
//! - A failed reshape leaves the blob as it was.
//! - No `shape_data_` (Caffe's shape mirrored on the GPU for its kernels): no kernel here needs it.
//! - No global CPU/GPU mode: math runs where the buffer's head is, copies too (see
//!   [`ParamBlob::copy_from`]).

mod math;
mod shape;

pub use shape::ProtoShape;

pub use crate::kernels::{Float, Scalar, ScalarKind};

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::synced::SyncedMemory;

/// Most axes a blob may have (Caffe's `kMaxBlobAxes`).
pub const MAX_AXES: usize = 32;

/// Caffe's `Blob<Dtype>`: data and diff buffers of one shape on one device.
///
/// `T` is `f32` or `f64` for the math; `i32` and `u32` blobs support shape and data only, and
/// their math returns [`Error::Unsupported`] (Caffe: `NOT_IMPLEMENTED`).
///
/// Not `Clone` (Caffe disables copying): share buffers with [`ParamBlob::share_data`] and
/// [`ParamBlob::share_diff`], copy contents with [`ParamBlob::copy_from`].
pub struct ParamBlob<T: Scalar> {
    name: String,
    device: Device,
    shape: Vec<usize>,
    count: usize,
    data: Arc<SyncedMemory>,
    diff: Arc<SyncedMemory>,
    _elem: PhantomData<fn() -> T>,
}

/// Which of the two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Data,
    Diff,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Data => "data",
            Part::Diff => "diff",
        }
    }
}

impl<T: Scalar> ParamBlob<T> {
    /// An empty blob on `device`: no axes, count 0, capacity 0, two empty buffers. Allocates
    /// nothing.
    pub fn new(name: impl Into<String>, device: &Device) -> Self {
        let name = name.into();
        Self {
            data: Arc::new(Self::buffer(&name, Part::Data, 0, device)),
            diff: Arc::new(Self::buffer(&name, Part::Diff, 0, device)),
            name,
            device: device.clone(),
            shape: Vec::new(),
            count: 0,
            _elem: PhantomData,
        }
    }

    /// A blob of `shape` on `device` (Caffe's `Blob(shape)`). Allocates nothing yet.
    ///
    /// # Errors
    /// As [`ParamBlob::reshape`].
    pub fn with_shape(name: impl Into<String>, shape: &[usize], device: &Device) -> Result<Self> {
        let mut b = Self::new(name, device);
        b.reshape(shape)?;
        Ok(b)
    }

    fn buffer(name: &str, part: Part, bytes: usize, device: &Device) -> SyncedMemory {
        SyncedMemory::new(bytes, device).with_label(format!("{name}.{}", part.name()))
    }

    /// Changes the shape (Caffe's `Reshape`). When the new count exceeds
    /// [`ParamBlob::capacity`], both buffers are replaced by new uninitialized ones of exactly
    /// the new count; otherwise both are kept, with their bytes. The empty shape `[]` is a
    /// scalar (count 1); a 0 dimension gives count 0.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for more than [`MAX_AXES`] axes, [`Error::SizeOverflow`] when the
    /// element or byte count overflows. The blob is unchanged on error.
    pub fn reshape(&mut self, shape: &[usize]) -> Result<()> {
        if shape.len() > MAX_AXES {
            return Err(self.shape_error(
                "ParamBlob::reshape",
                format!(
                    "{} axes requested ({shape:?}), at most {MAX_AXES} are allowed",
                    shape.len()
                ),
            ));
        }
        let count = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::SizeOverflow {
                what: format!("element count of shape {shape:?} for blob {}", self.name),
            })?;
        let bytes =
            count
                .checked_mul(std::mem::size_of::<T>())
                .ok_or_else(|| Error::SizeOverflow {
                    what: format!(
                        "byte count of blob {}: {count} elements of {} ({} bytes each)",
                        self.name,
                        T::KIND,
                        std::mem::size_of::<T>()
                    ),
                })?;
        if count > self.capacity() {
            self.data = Arc::new(Self::buffer(&self.name, Part::Data, bytes, &self.device));
            self.diff = Arc::new(Self::buffer(&self.name, Part::Diff, bytes, &self.device));
        }
        self.shape.clear();
        self.shape.extend_from_slice(shape);
        self.count = count;
        Ok(())
    }

    /// Reshapes to `other`'s shape (Caffe's `ReshapeLike`).
    ///
    /// # Errors
    /// As [`ParamBlob::reshape`].
    pub fn reshape_like<U: Scalar>(&mut self, other: &ParamBlob<U>) -> Result<()> {
        self.reshape(other.shape())
    }

    /// The blob's name (used in every error and as the buffers' labels).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device new buffers are created on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of axes.
    pub fn num_axes(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements: the product of the shape (0 for a fresh blob, 1 for shape `[]`).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Elements that both buffers can hold without reallocation: read from the buffers
    /// themselves, so it is always true (also after sharing, see the module docs).
    pub fn capacity(&self) -> usize {
        self.data.len().min(self.diff.len()) / std::mem::size_of::<T>()
    }

    /// The data buffer (Caffe's `data()`). Its first [`ParamBlob::count`] elements are the
    /// blob's data; it may be longer (capacity) or shared with other blobs.
    pub fn data(&self) -> &Arc<SyncedMemory> {
        &self.data
    }

    /// The diff buffer (Caffe's `diff()`); as [`ParamBlob::data`].
    pub fn diff(&self) -> &Arc<SyncedMemory> {
        &self.diff
    }

    fn part(&self, part: Part) -> &Arc<SyncedMemory> {
        match part {
            Part::Data => &self.data,
            Part::Diff => &self.diff,
        }
    }

    /// Makes this blob use `other`'s data buffer (Caffe's `ShareData`): writes through either
    /// blob are seen by both. Only the counts must match, not the shapes. Capacity becomes what
    /// the shared buffer allows (Caffe #5439 fixed).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when the counts differ, [`Error::DeviceMismatch`] when `other`'s
    /// buffer is on another device. The blob is unchanged on error.
    pub fn share_data(&mut self, other: &ParamBlob<T>) -> Result<()> {
        self.share(other, Part::Data)
    }

    /// Makes this blob use `other`'s diff buffer (Caffe's `ShareDiff`); as
    /// [`ParamBlob::share_data`].
    ///
    /// # Errors
    /// As [`ParamBlob::share_data`].
    pub fn share_diff(&mut self, other: &ParamBlob<T>) -> Result<()> {
        self.share(other, Part::Diff)
    }

    fn share(&mut self, other: &ParamBlob<T>, part: Part) -> Result<()> {
        let op = match part {
            Part::Data => "ParamBlob::share_data",
            Part::Diff => "ParamBlob::share_diff",
        };
        if other.count != self.count {
            let size = std::mem::size_of::<T>();
            return Err(Error::SizeMismatch {
                what: format!(
                    "{op}: blob {} has {} elements (shape {}), blob {} has {} (shape {})",
                    self.name,
                    self.count,
                    self.shape_string(),
                    other.name,
                    other.count,
                    other.shape_string()
                ),
                expected: self.count * size,
                actual: other.count * size,
            });
        }
        let theirs = other.part(part);
        if let Some(dev) = theirs.target() {
            if !dev.same(&self.device) {
                return Err(Error::DeviceMismatch {
                    op,
                    expected: format!("{} (blob {})", self.device.label(), self.name),
                    actual: format!("{} (blob {})", dev.label(), other.name),
                });
            }
        }
        let theirs = theirs.clone();
        match part {
            Part::Data => self.data = theirs,
            Part::Diff => self.diff = theirs,
        }
        Ok(())
    }

    // ----- typed host access ----------------------------------------------------------------

    /// Runs `f` on the data's first `count` elements on the host (Caffe's `cpu_data()`): the
    /// host mirror is made current first (a copy if the head is at the device).
    ///
    /// # Errors
    /// As [`SyncedMemory::host`], or [`Error::InvalidState`] when the buffer cannot be viewed
    /// as `T` (adopted external memory of the wrong alignment).
    pub fn host_data<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.host_read(Part::Data, f)
    }

    /// Runs `f` on the diff's first `count` elements on the host (Caffe's `cpu_diff()`).
    ///
    /// # Errors
    /// As [`ParamBlob::host_data`].
    pub fn host_diff<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.host_read(Part::Diff, f)
    }

    /// Runs `f` on the data's first `count` elements, mutably, on the host (Caffe's
    /// `mutable_cpu_data()`): the head moves to the host.
    ///
    /// # Errors
    /// As [`ParamBlob::host_data`].
    pub fn host_data_mut<R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.host_write(Part::Data, f)
    }

    /// Runs `f` on the diff's first `count` elements, mutably, on the host (Caffe's
    /// `mutable_cpu_diff()`).
    ///
    /// # Errors
    /// As [`ParamBlob::host_data`].
    pub fn host_diff_mut<R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.host_write(Part::Diff, f)
    }

    /// A copy of the data's first `count` elements, read on the host.
    ///
    /// # Errors
    /// As [`ParamBlob::host_data`].
    pub fn data_to_vec(&self) -> Result<Vec<T>> {
        self.host_data(<[T]>::to_vec)
    }

    /// A copy of the diff's first `count` elements, read on the host.
    ///
    /// # Errors
    /// As [`ParamBlob::host_data`].
    pub fn diff_to_vec(&self) -> Result<Vec<T>> {
        self.host_diff(<[T]>::to_vec)
    }

    /// One data element by index (Caffe's `data_at`), read on the host.
    ///
    /// # Errors
    /// As [`ParamBlob::offset_of`] and [`ParamBlob::host_data`].
    pub fn data_at(&self, index: &[usize]) -> Result<T> {
        let i = self.offset_of(index)?;
        self.host_data(|d| d.get(i).copied())?
            .ok_or_else(|| self.short_buffer(Part::Data, i))
    }

    /// One diff element by index (Caffe's `diff_at`), read on the host.
    ///
    /// # Errors
    /// As [`ParamBlob::data_at`].
    pub fn diff_at(&self, index: &[usize]) -> Result<T> {
        let i = self.offset_of(index)?;
        self.host_diff(|d| d.get(i).copied())?
            .ok_or_else(|| self.short_buffer(Part::Diff, i))
    }

    fn host_read<R>(&self, part: Part, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let mem = self.part(part);
        let guard = mem.host()?;
        let all = guard.as_slice_of::<T>()?;
        let mine = all
            .get(..self.count)
            .ok_or_else(|| self.short_buffer(part, all.len()))?;
        Ok(f(mine))
    }

    fn host_write<R>(&self, part: Part, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let mem = self.part(part);
        let mut guard = mem.host_mut()?;
        let all = guard.as_mut_slice_of::<T>()?;
        let len = all.len();
        let count = self.count;
        match all.get_mut(..count) {
            Some(mine) => Ok(f(mine)),
            None => Err(self.short_buffer(part, len)),
        }
    }

    /// A buffer shorter than the count: impossible through this type's API, kept as an error.
    fn short_buffer(&self, part: Part, len: usize) -> Error {
        Error::OutOfBounds {
            what: format!("{} of blob {} ({})", part.name(), self.name, T::KIND),
            offset: 0,
            len: self.count,
            size: len,
        }
    }

    /// An [`Error::InvalidShape`] naming the operation, the blob and its shape.
    fn shape_error(&self, op: &'static str, reason: String) -> Error {
        Error::InvalidShape {
            what: format!("blob {} ({op})", self.name),
            shape: self.shape_string(),
            reason,
        }
    }
}

impl<T: Scalar> fmt::Debug for ParamBlob<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParamBlob")
            .field("name", &self.name)
            .field("type", &T::KIND)
            .field("shape", &self.shape)
            .field("count", &self.count)
            .field("capacity", &self.capacity())
            .field("device", &self.device.label())
            .field("data_head", &self.data.head())
            .field("diff_head", &self.diff.head())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ParamBlob<f32>>();
}
