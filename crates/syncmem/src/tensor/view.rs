//! Typed views of a tensor's elements on the host and on the device.
//!
//! Views cover exactly [`Tensor::numel`] elements, even when the storage is larger (capacity
//! kept after a shrink). They hold the storage's access lock: read views are shared, write views
//! exclusive, and a write view moves the head when it is taken (see [`crate::synced`]).
//!
//! A view that conflicts with a view this thread already holds on the same storage (through
//! this tensor or through another tensor that shares it) is [`Error::Busy`] naming both
//! tensors, never a wait: only views of other threads are waited for.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use super::storage::{Storage, StringsRead, StringsWrite};
use super::Tensor;
use crate::device::{DeviceBuffer, Stream};
use crate::dtype::{DType, Element};
use crate::error::{checked_mul, Error, OomReport, Result};
use crate::synced::held::Named;
use crate::synced::{DeviceRead, DeviceWrite, HostRead, HostWrite};

enum ReadInner<'a> {
    /// No storage: the tensor has no elements.
    Empty,
    Bytes(HostRead<'a>),
    Strings(StringsRead<'a>),
}

enum WriteInner<'a> {
    Empty,
    Bytes(HostWrite<'a>),
    Strings(StringsWrite<'a>),
}

/// Shared host view of a tensor's elements: derefs to `&[T]`.
pub struct HostSlice<'a, T> {
    inner: ReadInner<'a>,
    len: usize,
    _t: PhantomData<fn() -> T>,
    _named: Option<Named>,
}

/// Exclusive host view of a tensor's elements: derefs to `&mut [T]`. Taking it made the host
/// the only current mirror.
pub struct HostSliceMut<'a, T> {
    inner: WriteInner<'a>,
    len: usize,
    _t: PhantomData<fn() -> T>,
    _named: Option<Named>,
}

/// Checked when the view was made, so the fallbacks below are never taken.
fn bytes_of<T: Element>(bytes: &[u8], len: usize) -> &[T] {
    bytes
        .get(..len.saturating_mul(T::DTYPE.size()))
        .and_then(|b| T::view(b).ok())
        .unwrap_or_default()
}

fn bytes_of_mut<T: Element>(bytes: &mut [u8], len: usize) -> &mut [T] {
    bytes
        .get_mut(..len.saturating_mul(T::DTYPE.size()))
        .and_then(|b| T::view_mut(b).ok())
        .unwrap_or_default()
}

impl<T: Element> Deref for HostSlice<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            ReadInner::Empty => &[],
            ReadInner::Bytes(g) => bytes_of(g, self.len),
            ReadInner::Strings(g) => g.get(..self.len).and_then(T::strings).unwrap_or_default(),
        }
    }
}

impl<T: Element> Deref for HostSliceMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            WriteInner::Empty => &[],
            WriteInner::Bytes(g) => bytes_of(g, self.len),
            WriteInner::Strings(g) => g.get(..self.len).and_then(T::strings).unwrap_or_default(),
        }
    }
}

impl<T: Element> DerefMut for HostSliceMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let len = self.len;
        match &mut self.inner {
            WriteInner::Empty => &mut [],
            WriteInner::Bytes(g) => bytes_of_mut(g, len),
            WriteInner::Strings(g) => g
                .get_mut(..len)
                .and_then(T::strings_mut)
                .unwrap_or_default(),
        }
    }
}

/// Shared host view of a plain-data tensor's bytes (Caffe2's `raw_data()`).
pub struct HostBytes<'a> {
    guard: Option<HostRead<'a>>,
    len: usize,
    _named: Option<Named>,
}

/// Exclusive host view of a plain-data tensor's bytes (Caffe2's `raw_mutable_data()`).
pub struct HostBytesMut<'a> {
    guard: Option<HostWrite<'a>>,
    len: usize,
    _named: Option<Named>,
}

impl Deref for HostBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.guard
            .as_deref()
            .and_then(|b| b.get(..self.len))
            .unwrap_or_default()
    }
}

impl Deref for HostBytesMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.guard
            .as_deref()
            .and_then(|b| b.get(..self.len))
            .unwrap_or_default()
    }
}

impl DerefMut for HostBytesMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.guard
            .as_deref_mut()
            .and_then(|b| b.get_mut(..len))
            .unwrap_or_default()
    }
}

/// Shared device view of a tensor's elements: pass [`DeviceSlice::buffer`] to kernels, which
/// must use only its first [`DeviceSlice::nbytes`] bytes (the buffer may be larger).
pub struct DeviceSlice<'a, T> {
    guard: Option<DeviceRead<'a>>,
    len: usize,
    _t: PhantomData<fn() -> T>,
    _named: Option<Named>,
}

/// Exclusive device view of a tensor's elements. Taking it made the device the only current
/// mirror.
pub struct DeviceSliceMut<'a, T> {
    guard: Option<DeviceWrite<'a>>,
    len: usize,
    _t: PhantomData<fn() -> T>,
    _named: Option<Named>,
}

macro_rules! device_common {
    ($ty:ident) => {
        impl<T: Element> $ty<'_, T> {
            /// The device memory; `None` only for a tensor with no elements and no storage.
            pub fn buffer(&self) -> Option<&DeviceBuffer> {
                self.guard.as_ref().map(|g| g.buffer())
            }

            /// The storage's stream (`None` when [`Self::buffer`] is).
            pub fn stream(&self) -> Option<&Stream> {
                self.guard.as_ref().map(|g| g.stream())
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// True when the tensor has no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Bytes of the elements: the prefix of [`Self::buffer`] that holds them.
            pub fn nbytes(&self) -> usize {
                self.len.saturating_mul(T::DTYPE.size())
            }

            /// Copies the elements from the device into a vector (blocking), bypassing the
            /// host mirror. For checks and small reads.
            ///
            /// # Errors
            /// A backend error; [`Error::InvalidState`] when the bytes are not valid `bool`s.
            pub fn to_vec(&self) -> Result<Vec<T>> {
                let Some(g) = &self.guard else {
                    return Ok(Vec::new());
                };
                let n = self.nbytes();
                let mut bytes = Vec::new();
                bytes.try_reserve_exact(n).map_err(|e| {
                    Error::from(
                        OomReport::new("host", n, e.to_string()).with_purpose("a device read-back"),
                    )
                })?;
                bytes.resize(n, 0u8);
                g.read_into(&mut bytes)?;
                T::collect(&bytes).map_err(|reason| Error::InvalidState {
                    op: "DeviceSlice::to_vec",
                    buffer: format!("{:?}", g.buffer()),
                    reason,
                })
            }
        }

        impl<T> fmt::Debug for $ty<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("type", &std::any::type_name::<T>())
                    .field("len", &self.len)
                    .field("buffer", &self.guard.as_ref().map(|g| g.buffer()))
                    .finish()
            }
        }
    };
}

device_common!(DeviceSlice);
device_common!(DeviceSliceMut);

impl<T: Element> DeviceSliceMut<'_, T> {
    /// Copies `src` into the device elements (blocking).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when `src.len()` differs from [`Self::len`]; a backend error.
    pub fn write(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::SizeMismatch {
                what: format!("device write of {} elements of {}", src.len(), T::DTYPE),
                expected: self.nbytes(),
                actual: src.len().saturating_mul(T::DTYPE.size()),
            });
        }
        match (&mut self.guard, T::as_bytes(src)) {
            (Some(g), Some(bytes)) => g.write_from(0, bytes),
            _ => Ok(()),
        }
    }

    /// Sets every element to zero (`0`, `false`, `+0.0`) on the device.
    ///
    /// # Errors
    /// A backend error.
    pub fn fill_zero(&mut self) -> Result<()> {
        match &mut self.guard {
            Some(g) => g.fill(0),
            None => Ok(()),
        }
    }

    /// Announces work on the elements queued on another `stream`, so that the next access
    /// waits for it (see [`DeviceWrite::queued_on`]).
    ///
    /// # Errors
    /// A backend error while recording.
    pub fn queued_on(&self, stream: &Stream) -> Result<()> {
        match &self.guard {
            Some(g) => g.queued_on(stream),
            None => Ok(()),
        }
    }
}

impl<T> fmt::Debug for HostSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSlice")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .finish()
    }
}

impl<T> fmt::Debug for HostSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostSliceMut")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .finish()
    }
}

impl fmt::Debug for HostBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBytes").field("len", &self.len).finish()
    }
}

impl fmt::Debug for HostBytesMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBytesMut")
            .field("len", &self.len)
            .finish()
    }
}

impl Tensor {
    /// Host read view of the elements as `T` (Caffe2's `data<T>()`). From a head at device,
    /// copies device to host once.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised, holds another type (the
    /// message names both), or has elements but no data yet (allocation is lazy: write
    /// first); out of memory or a backend error from the copy.
    pub fn host<T: Element>(&self) -> Result<HostSlice<'_, T>> {
        let n = self.check_read::<T>("host")?;
        let inner = match &self.storage {
            None => ReadInner::Empty,
            Some(Storage::Bytes(b)) => {
                let g = b.mem.host_for(Some(&self.label))?;
                self.check_bytes::<T>(&g, n, "host")?;
                ReadInner::Bytes(g)
            }
            Some(Storage::Strings(s)) => {
                let g = s.read_for(&self.label)?;
                self.check_strings(g.len(), n, "host")?;
                ReadInner::Strings(g)
            }
        };
        Ok(HostSlice {
            inner,
            len: n,
            _t: PhantomData,
            _named: self.named(),
        })
    }

    /// Host write view as `T` (Caffe2's `mutable_data<T>()`): sets the type to `T` (see
    /// [`Tensor::set_dtype`] for when the storage is reused), allocates lazily, copies from the
    /// device when its copy is newer, and makes the host the only current mirror.
    ///
    /// # Errors
    /// As [`Tensor::set_dtype`]; [`Error::InvalidState`] when the reused bytes are not valid
    /// `bool`s; out of memory or a backend error.
    pub fn host_mut<T: Element>(&mut self) -> Result<HostSliceMut<'_, T>> {
        self.host_write("host_mut", false)
    }

    /// As [`Tensor::host_mut`], for a caller that overwrites every element: no copy from the
    /// device, no zero fill; the previous contents are unspecified (but valid values).
    ///
    /// # Errors
    /// As [`Tensor::host_mut`], except for invalid `bool` bytes, which are zeroed.
    pub fn host_overwrite<T: Element>(&mut self) -> Result<HostSliceMut<'_, T>> {
        self.host_write("host_overwrite", true)
    }

    /// Device read view as `T`. From a head at host, copies host to device once.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `String`; [`Error::NoDevice`] for a host-only tensor; as
    /// [`Tensor::host`] otherwise.
    pub fn device<T: Element>(&self) -> Result<DeviceSlice<'_, T>> {
        self.check_device_side::<T>("device")?;
        let n = self.check_read::<T>("device")?;
        let guard = match &self.storage {
            Some(Storage::Bytes(b)) => Some(b.mem.device_for(Some(&self.label))?),
            _ => None,
        };
        Ok(DeviceSlice {
            guard,
            len: n,
            _t: PhantomData,
            _named: self.named(),
        })
    }

    /// Device write view as `T`: sets the type as [`Tensor::host_mut`] does, and makes the
    /// device the only current mirror.
    ///
    /// # Errors
    /// As [`Tensor::device`] and [`Tensor::set_dtype`].
    pub fn device_mut<T: Element>(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        self.device_write("device_mut", false)
    }

    /// As [`Tensor::device_mut`], for a caller that overwrites every element: no copy from the
    /// host and no zero fill.
    ///
    /// # Errors
    /// As [`Tensor::device_mut`].
    pub fn device_overwrite<T: Element>(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        self.device_write("device_overwrite", true)
    }

    /// Host read view of the bytes of a plain-data tensor (Caffe2's `raw_data()`).
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised, holds `String`s, or has
    /// elements but no data; out of memory or a backend error.
    pub fn host_bytes(&self) -> Result<HostBytes<'_>> {
        let n = self.numel().ok_or_else(|| self.uninit("host_bytes"))?;
        self.check_not_strings("host_bytes")?;
        let guard = match &self.storage {
            Some(Storage::Bytes(b)) => Some(b.mem.host_for(Some(&self.label))?),
            _ if n == 0 => None,
            _ => return Err(self.no_data("host_bytes")),
        };
        Ok(HostBytes {
            guard,
            len: self.nbytes(),
            _named: self.named(),
        })
    }

    /// Host write view of the bytes (Caffe2's `raw_mutable_data()`): allocates for the current
    /// type. Writing bytes that are not valid `bool`s into a `bool` tensor is allowed; `bool`
    /// views then report an error.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the type is not known yet or is `String`; as
    /// [`Tensor::host_mut`].
    pub fn host_bytes_mut(&mut self) -> Result<HostBytesMut<'_>> {
        self.host_bytes_write("host_bytes_mut", false)
    }

    /// As [`Tensor::host_bytes_mut`] for a caller that overwrites every byte (no copy from the
    /// device, no zero fill), e.g. when loading.
    ///
    /// # Errors
    /// As [`Tensor::host_bytes_mut`].
    pub fn host_bytes_overwrite(&mut self) -> Result<HostBytesMut<'_>> {
        self.host_bytes_write("host_bytes_overwrite", true)
    }

    // ----- internals ---------------------------------------------------------------------------

    fn host_write<T: Element>(
        &mut self,
        op: &'static str,
        overwrite: bool,
    ) -> Result<HostSliceMut<'_, T>> {
        self.prepare(T::DTYPE, op)?;
        let n = self.numel().unwrap_or(0);
        let nbytes = self.elem_bytes::<T>(n)?;
        let inner = match &self.storage {
            None => WriteInner::Empty,
            Some(Storage::Bytes(b)) => {
                let mut g = b.mem.host_write_for(Some(&self.label), overwrite)?;
                let region = g.get_mut(..nbytes).ok_or_else(|| self.short(op))?;
                if let Err(reason) = T::view_mut(region) {
                    if !(overwrite && T::DTYPE == DType::Bool) {
                        return Err(self.err_state(op, reason));
                    }
                    region.fill(0);
                }
                WriteInner::Bytes(g)
            }
            Some(Storage::Strings(s)) => {
                let g = s.write_for(&self.label)?;
                self.check_strings(g.len(), n, op)?;
                WriteInner::Strings(g)
            }
        };
        Ok(HostSliceMut {
            inner,
            len: n,
            _t: PhantomData,
            _named: self.named(),
        })
    }

    fn device_write<T: Element>(
        &mut self,
        op: &'static str,
        overwrite: bool,
    ) -> Result<DeviceSliceMut<'_, T>> {
        self.check_device_side::<T>(op)?;
        self.prepare(T::DTYPE, op)?;
        let n = self.numel().unwrap_or(0);
        let guard = match &self.storage {
            Some(Storage::Bytes(b)) => Some(b.mem.device_write_for(Some(&self.label), overwrite)?),
            _ => None,
        };
        Ok(DeviceSliceMut {
            guard,
            len: n,
            _t: PhantomData,
            _named: self.named(),
        })
    }

    fn host_bytes_write(&mut self, op: &'static str, overwrite: bool) -> Result<HostBytesMut<'_>> {
        let dtype = self.dtype.ok_or_else(|| {
            self.err_state(
                op,
                "the element type is not known yet: call set_dtype".into(),
            )
        })?;
        self.check_not_strings(op)?;
        self.prepare(dtype, op)?;
        let guard = match &self.storage {
            Some(Storage::Bytes(b)) => Some(b.mem.host_write_for(Some(&self.label), overwrite)?),
            _ => None,
        };
        Ok(HostBytesMut {
            guard,
            len: self.nbytes(),
            _named: self.named(),
        })
    }

    /// Records this tensor's name with the view of its byte storage just taken (a `String`
    /// storage's view records it itself), for the error of a conflicting access.
    fn named(&self) -> Option<Named> {
        match &self.storage {
            Some(Storage::Bytes(b)) => Some(Named::new(b.mem.lock_key(), &self.label)),
            _ => None,
        }
    }

    /// Initialised, of type `T`, with data unless empty. Returns the element count.
    fn check_read<T: Element>(&self, op: &'static str) -> Result<usize> {
        let n = self.numel().ok_or_else(|| self.uninit(op))?;
        if self.dtype != Some(T::DTYPE) {
            return Err(self.type_mismatch(op, T::DTYPE));
        }
        if n > 0 && self.storage.is_none() {
            return Err(self.no_data(op));
        }
        Ok(n)
    }

    fn check_device_side<T: Element>(&self, op: &'static str) -> Result<()> {
        let Some(dev) = &self.device else {
            return Err(Error::NoDevice {
                buffer: format!("tensor {}", self.label),
            });
        };
        if !T::DTYPE.is_pod() {
            return Err(Error::Unsupported {
                device: dev.label().to_string(),
                what: format!(
                    "{op} of tensor {}: {} elements live on the host only",
                    self.label,
                    T::DTYPE
                ),
            });
        }
        Ok(())
    }

    fn check_not_strings(&self, op: &'static str) -> Result<()> {
        if self.dtype == Some(DType::String) {
            return Err(self.err_state(op, "String elements have no byte view".into()));
        }
        Ok(())
    }

    fn elem_bytes<T: Element>(&self, n: usize) -> Result<usize> {
        checked_mul(
            n,
            T::DTYPE.size(),
            format_args!("bytes of tensor {}", self.label),
        )
    }

    fn check_bytes<T: Element>(&self, bytes: &[u8], n: usize, op: &'static str) -> Result<()> {
        let nbytes = self.elem_bytes::<T>(n)?;
        let region = bytes.get(..nbytes).ok_or_else(|| self.short(op))?;
        T::view(region)
            .map(|_| ())
            .map_err(|reason| self.err_state(op, reason))
    }

    fn check_strings(&self, have: usize, n: usize, op: &'static str) -> Result<()> {
        if have < n {
            return Err(self.short(op));
        }
        Ok(())
    }

    fn short(&self, op: &'static str) -> Error {
        self.err_state(
            op,
            format!(
                "storage of {} bytes is smaller than the {} bytes of dims {:?}",
                self.capacity_bytes(),
                self.nbytes(),
                self.dims()
            ),
        )
    }
}
