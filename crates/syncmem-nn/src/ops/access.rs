//! Typed device views of an operator's tensors ([`In`], [`Out`]) and the errors that name them
//! (through [`syncmem::ops::Operand`]).
//!
//! Operators work on the tensors' device mirror on every backend, the `cpu` device included:
//! an input whose newest copy is on the host is copied to the device once by the read guard
//! (SyncedMemory's transition table), and an output is taken with `device_overwrite` (no copy,
//! no zero fill) when every element is written. The views hand their guards to the library's
//! kernels ([`syncmem::kernels`]) as operands; an empty tensor gives an
//! [`Empty`](syncmem::kernels::Empty) operand.

use std::marker::PhantomData;

use bytemuck::Pod;

use syncmem::kernels::{Dst, Empty, Src};
use syncmem::ops::Operand as What;
use syncmem::synced::{DeviceRead, DeviceWrite};
use syncmem::{Device, Element, Error, Result, Tensor};

/// Checks that `t` holds elements of type `T`.
pub(crate) fn expect_dtype<T: Element>(t: &Tensor, what: What<'_>) -> Result<()> {
    if t.dtype() == Some(T::DTYPE) {
        return Ok(());
    }
    Err(Error::TypeMismatch {
        what: what.to_string(),
        stored: t
            .dtype()
            .map_or("no element type yet".to_string(), |d| d.to_string()),
        requested: T::DTYPE.to_string(),
    })
}

/// A shape error naming the operator's input or output.
pub(crate) fn shape_error(what: What<'_>, dims: &[usize], reason: String) -> Error {
    Error::InvalidShape {
        what: what.to_string(),
        shape: format!("{dims:?}"),
        reason,
    }
}

fn no_data(what: What<'_>, len: usize) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: what.to_string(),
        reason: format!("the tensor has {len} elements but no data"),
    }
}

/// The device memory a view hands out: a guard's, or an empty operand for an empty tensor
/// (boxed: rare, and much larger than a guard).
enum Mem<G> {
    Guard(G),
    Empty(Box<Empty>),
}

/// A read view of an input's device mirror as `T`.
pub(crate) struct In<'a, T> {
    mem: Mem<DeviceRead<'a>>,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<'a, T: Element + Pod> In<'a, T> {
    /// Makes `t`'s device mirror current (one host-to-device copy when the host is newer) and
    /// views it. `what` names the input in errors.
    pub(crate) fn open(t: &'a Tensor, dev: &Device, what: What<'_>) -> Result<Self> {
        expect_dtype::<T>(t, what)?;
        let len = t.numel().unwrap_or(0);
        let mem = match t.synced() {
            // On the operator's device: a tensor of another device is read through its
            // replica there.
            Some(s) if len > 0 => Mem::Guard(s.device_on(dev)?),
            None if len > 0 => return Err(no_data(what, len)),
            _ => Mem::Empty(Box::new(Empty::new(dev))),
        };
        Ok(Self {
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// Number of elements.
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The operand for a kernel that reads it.
    pub(crate) fn src(&self) -> &dyn Src {
        match &self.mem {
            Mem::Guard(g) => g,
            Mem::Empty(b) => &**b,
        }
    }
}

/// A write view of an output's device mirror as `T`.
pub(crate) struct Out<'a, T> {
    mem: Mem<DeviceWrite<'a>>,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<'a, T: Element + Pod> Out<'a, T> {
    /// Resizes `t` to `dims` as `T` and takes its device mirror for overwriting: no copy and
    /// no zero fill. The caller writes every element.
    pub(crate) fn overwrite(t: &'a mut Tensor, dims: &[usize], dev: &Device) -> Result<Self> {
        t.resize(dims)?;
        t.set_dtype(T::DTYPE)?;
        let t: &'a Tensor = t;
        let len = t.numel().unwrap_or(0);
        let mem = match t.synced() {
            Some(s) if len > 0 => Mem::Guard(s.device_overwrite_on(dev)?),
            _ => Mem::Empty(Box::new(Empty::new(dev))),
        };
        Ok(Self {
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// Takes `t`'s device mirror for reading and writing in place (a copy from the host when the
    /// host is newer).
    pub(crate) fn in_place(t: &'a mut Tensor, dev: &Device, what: What<'_>) -> Result<Self> {
        expect_dtype::<T>(t, what)?;
        let t: &'a Tensor = t;
        let len = t.numel().unwrap_or(0);
        let mem = match t.synced() {
            Some(s) if len > 0 => Mem::Guard(s.device_mut_on(dev)?),
            None if len > 0 => return Err(no_data(what, len)),
            _ => Mem::Empty(Box::new(Empty::new(dev))),
        };
        Ok(Self {
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The operand for a kernel that writes it.
    pub(crate) fn dst(&mut self) -> &mut dyn Dst {
        match &mut self.mem {
            Mem::Guard(g) => g,
            Mem::Empty(b) => &mut **b,
        }
    }

    /// The elements, when the device memory is directly addressable by the host (the `cpu`
    /// device, zero-copy memory shared in place): values can be written in place instead of
    /// uploaded (after the device work queued on the memory).
    ///
    /// # Errors
    /// The error of device work that failed.
    pub(crate) fn host_view_mut(&mut self) -> Result<Option<&mut [T]>> {
        let len = self.len;
        let bytes = match &mut self.mem {
            Mem::Guard(g) => match g.host_slice_mut()? {
                Some(b) => b,
                None => return Ok(None),
            },
            _ => return Ok(Some(&mut [])),
        };
        let n = len.checked_mul(std::mem::size_of::<T>());
        Ok(n.and_then(|n| bytemuck::try_cast_slice_mut(bytes.get_mut(..n)?).ok()))
    }

    /// Copies `values` (one per element) into the device mirror, blocking.
    pub(crate) fn upload(&mut self, values: &[T], what: What<'_>) -> Result<()> {
        if values.len() != self.len {
            return Err(Error::SizeMismatch {
                what: format!("upload into {what}"),
                expected: self.len.saturating_mul(std::mem::size_of::<T>()),
                actual: std::mem::size_of_val(values),
            });
        }
        match &mut self.mem {
            Mem::Guard(g) => g.write_from(0, bytemuck::cast_slice(values)),
            _ => Ok(()),
        }
    }
}
