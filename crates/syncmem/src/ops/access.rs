//! Where an operator runs ([`Backend`]) and typed device views of its tensors ([`In`], [`Out`]).
//!
//! Operators work on the tensors' device mirror on every backend, the `cpu` device included:
//! an input whose newest copy is on the host is copied to the device once by the read guard
//! (SyncedMemory's transition table), and an output is taken with `device_overwrite` (no copy,
//! no zero fill) when every element is written.

use std::marker::PhantomData;
#[cfg(any(feature = "opencl", feature = "cuda"))]
use std::sync::Arc;

use bytemuck::Pod;

use super::OperatorDef;
use crate::context::Context;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{BackendKind, Error, Result};
use crate::synced::{DeviceRead, DeviceWrite};
use crate::tensor::Tensor;

/// The backend an operator runs on, with its compiled kernels.
pub(crate) enum Backend {
    /// Host loops over the `cpu` device's memory.
    Cpu,
    /// OpenCL kernels of the context's device.
    #[cfg(feature = "opencl")]
    OpenCl(Arc<super::opencl::Kernels>),
    /// CUDA kernels of the context's device (compiled by NVRTC on first use).
    #[cfg(feature = "cuda")]
    Cuda(Arc<super::cuda::Kernels>),
}

impl Backend {
    /// Fails for a backend without operator kernels in this build (its feature is off).
    pub(crate) fn check_supported(device: &Device, def: &OperatorDef) -> Result<()> {
        match device.backend() {
            BackendKind::Cpu => Ok(()),
            #[cfg(feature = "opencl")]
            BackendKind::OpenCl => Ok(()),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Ok(()),
            #[allow(unreachable_patterns)]
            _ => Err(unsupported(device, def)),
        }
    }

    /// The backend for a run of `def`, built for `op_device`, on `ctx`. Builds (once per
    /// device) the OpenCL or CUDA kernels.
    pub(crate) fn for_run(def: &OperatorDef, op_device: &Device, ctx: &Context) -> Result<Self> {
        check_context(def, op_device, ctx)?;
        let dev = ctx.device();
        match dev.backend() {
            BackendKind::Cpu => Ok(Backend::Cpu),
            #[cfg(feature = "opencl")]
            BackendKind::OpenCl => Ok(Backend::OpenCl(super::opencl::kernels(dev)?)),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let stream = super::cuda::stream(ctx)?;
                Ok(Backend::Cuda(super::cuda::kernels(dev, stream)?))
            }
            #[allow(unreachable_patterns)]
            _ => Err(unsupported(dev, def)),
        }
    }
}

/// The context must be on the device the operator was built for.
pub(crate) fn check_context(def: &OperatorDef, op_device: &Device, ctx: &Context) -> Result<()> {
    if ctx.device().same(op_device) {
        return Ok(());
    }
    Err(Error::DeviceMismatch {
        op: "Operator::run",
        expected: format!(
            "{} (operator {} was built for it)",
            op_device.label(),
            def.label()
        ),
        actual: format!("{} (the context's device)", ctx.device().label()),
    })
}

fn unsupported(dev: &Device, def: &OperatorDef) -> Error {
    Error::Unsupported {
        device: dev.label().to_string(),
        what: format!(
            "operator {}: this backend has no operator kernels in this build",
            def.label()
        ),
    }
}

/// Checks that `t` holds elements of type `T`.
pub(crate) fn expect_dtype<T: Element>(t: &Tensor, what: &dyn Fn() -> String) -> Result<()> {
    if t.dtype() == Some(T::DTYPE) {
        return Ok(());
    }
    Err(Error::TypeMismatch {
        what: what(),
        stored: t
            .dtype()
            .map_or("no element type yet".to_string(), |d| d.to_string()),
        requested: T::DTYPE.to_string(),
    })
}

/// A shape error naming the operator's input or output.
pub(crate) fn shape_error(what: String, dims: &[usize], reason: String) -> Error {
    Error::InvalidShape {
        what,
        shape: format!("{dims:?}"),
        reason,
    }
}

/// A read view of an input's device mirror as `T`.
pub(crate) struct In<'a, T> {
    guard: Option<DeviceRead<'a>>,
    len: usize,
    what: String,
    _t: PhantomData<fn() -> T>,
}

impl<'a, T: Element + Pod> In<'a, T> {
    /// Makes `t`'s device mirror current (one host-to-device copy when the host is newer) and
    /// views it. `what` names the input in errors.
    pub(crate) fn open(t: &'a Tensor, what: String) -> Result<Self> {
        expect_dtype::<T>(t, &|| what.clone())?;
        let len = t.numel().unwrap_or(0);
        let guard = match t.synced() {
            Some(s) if len > 0 => Some(s.device()?),
            None if len > 0 => {
                return Err(Error::InvalidState {
                    op: "Operator::run",
                    buffer: what,
                    reason: format!("the tensor has {len} elements but no data"),
                })
            }
            _ => None,
        };
        Ok(Self {
            guard,
            len,
            what,
            _t: PhantomData,
        })
    }

    /// The guard, for the kernels of [`crate::kernels`] (`None` when empty).
    pub(crate) fn guard(&self) -> Option<&DeviceRead<'a>> {
        self.guard.as_ref()
    }

    /// The elements in `cpu`-device memory.
    pub(crate) fn cpu(&self) -> Result<&[T]> {
        let Some(g) = &self.guard else {
            return Ok(&[]);
        };
        cpu_view(g.buffer().as_cpu_slice(), self.len, &self.what)
    }

    /// The OpenCL memory object (null when empty).
    #[cfg(feature = "opencl")]
    pub(crate) fn mem(&self) -> Result<opencl3::types::cl_mem> {
        match &self.guard {
            None => Ok(std::ptr::null_mut()),
            Some(g) => cl_mem_of(g.buffer(), &self.what),
        }
    }

    /// The CUDA memory (`None` when empty: the kernels get a null pointer).
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(&self) -> Result<super::cuda::DevPtr<'_>> {
        match &self.guard {
            None => Ok(None),
            Some(g) => cuda_slice_of(g.buffer(), &self.what).map(Some),
        }
    }
}

/// A write view of an output's device mirror as `T`.
pub(crate) struct Out<'a, T> {
    guard: Option<DeviceWrite<'a>>,
    len: usize,
    what: String,
    _t: PhantomData<fn() -> T>,
}

impl<'a, T: Element + Pod> Out<'a, T> {
    /// Resizes `t` to `dims` as `T` and takes its device mirror for overwriting: no copy and
    /// no zero fill. The caller writes every element.
    pub(crate) fn overwrite(t: &'a mut Tensor, dims: &[usize], what: String) -> Result<Self> {
        t.resize(dims)?;
        t.set_dtype(T::DTYPE)?;
        let t: &'a Tensor = t;
        let len = t.numel().unwrap_or(0);
        let guard = match t.synced() {
            Some(s) if len > 0 => Some(s.device_overwrite()?),
            _ => None,
        };
        Ok(Self {
            guard,
            len,
            what,
            _t: PhantomData,
        })
    }

    /// Takes `t`'s device mirror for reading and writing in place (a copy from the host when the
    /// host is newer).
    pub(crate) fn in_place(t: &'a mut Tensor, what: String) -> Result<Self> {
        expect_dtype::<T>(t, &|| what.clone())?;
        let t: &'a Tensor = t;
        let len = t.numel().unwrap_or(0);
        let guard = match t.synced() {
            Some(s) if len > 0 => Some(s.device_mut()?),
            None if len > 0 => {
                return Err(Error::InvalidState {
                    op: "Operator::run",
                    buffer: what,
                    reason: format!("the tensor has {len} elements but no data"),
                })
            }
            _ => None,
        };
        Ok(Self {
            guard,
            len,
            what,
            _t: PhantomData,
        })
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The guard, for the kernels of [`crate::kernels`] (`None` when empty).
    pub(crate) fn guard_mut(&mut self) -> Option<&mut DeviceWrite<'a>> {
        self.guard.as_mut()
    }

    /// The elements in `cpu`-device memory.
    pub(crate) fn cpu(&mut self) -> Result<&mut [T]> {
        let Some(g) = &mut self.guard else {
            return Ok(&mut []);
        };
        let len = self.len;
        let what = &self.what;
        let bytes = g.cpu_slice_mut().ok_or_else(|| not_cpu(what))?;
        let n = len.saturating_mul(std::mem::size_of::<T>());
        let bytes = bytes.get_mut(..n).ok_or_else(|| too_small(what))?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error(what, e))
    }

    /// Copies `values` (one per element) into the device mirror, blocking.
    pub(crate) fn upload(&mut self, values: &[T]) -> Result<()> {
        if values.len() != self.len {
            return Err(Error::SizeMismatch {
                what: format!("upload into {}", self.what),
                expected: self.len.saturating_mul(std::mem::size_of::<T>()),
                actual: std::mem::size_of_val(values),
            });
        }
        match &mut self.guard {
            Some(g) => g.write_from(0, bytemuck::cast_slice(values)),
            None => Ok(()),
        }
    }

    /// The OpenCL memory object (null when empty).
    #[cfg(feature = "opencl")]
    pub(crate) fn mem(&self) -> Result<opencl3::types::cl_mem> {
        match &self.guard {
            None => Ok(std::ptr::null_mut()),
            Some(g) => cl_mem_of(g.buffer(), &self.what),
        }
    }

    /// The CUDA memory (`None` when empty: the kernels get a null pointer).
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(&self) -> Result<super::cuda::DevPtr<'_>> {
        match &self.guard {
            None => Ok(None),
            Some(g) => cuda_slice_of(g.buffer(), &self.what).map(Some),
        }
    }
}

fn cpu_view<'b, T: Pod>(bytes: Option<&'b [u8]>, len: usize, what: &str) -> Result<&'b [T]> {
    let bytes = bytes.ok_or_else(|| not_cpu(what))?;
    let n = len.saturating_mul(std::mem::size_of::<T>());
    let bytes = bytes.get(..n).ok_or_else(|| too_small(what))?;
    bytemuck::try_cast_slice(bytes).map_err(|e| cast_error(what, e))
}

#[cfg(feature = "opencl")]
fn cl_mem_of(buf: &crate::device::DeviceBuffer, what: &str) -> Result<opencl3::types::cl_mem> {
    use opencl3::memory::ClMem as _;
    buf.as_opencl()
        .map(|b| b.get())
        .ok_or_else(|| Error::InvalidState {
            op: "Operator::run",
            buffer: what.to_string(),
            reason: format!("the device memory is not OpenCL memory ({buf:?})"),
        })
}

#[cfg(feature = "cuda")]
fn cuda_slice_of<'b>(
    buf: &'b crate::device::DeviceBuffer,
    what: &str,
) -> Result<&'b cudarc::driver::CudaSlice<u8>> {
    buf.as_cuda().ok_or_else(|| Error::InvalidState {
        op: "Operator::run",
        buffer: what.to_string(),
        reason: format!("the device memory is not CUDA memory ({buf:?})"),
    })
}

fn not_cpu(what: &str) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: what.to_string(),
        reason: "the device memory is not cpu-device memory".into(),
    }
}

fn too_small(what: &str) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: what.to_string(),
        reason: "the device memory is smaller than the tensor".into(),
    }
}

fn cast_error(what: &str, e: bytemuck::PodCastError) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: what.to_string(),
        reason: format!("cannot view the device memory as elements: {e:?}"),
    }
}
