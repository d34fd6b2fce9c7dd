//! DLPack import: `syncmem.from_dlpack`, host memory of any producer adopted as a tensor's
//! host mirror without copying (read-only or misaligned sources copied once).

use std::ffi::c_void;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::{DType, Tensor};

use super::{
    DLManagedTensor, DLManagedTensorVersioned, DLTensor, FLAG_READ_ONLY, KDL_CPU, KDL_CUDA,
    KDL_OPENCL, LEGACY, LEGACY_USED, VERSIONED, VERSIONED_USED,
};
use crate::device::device_arg;
use crate::dtypes;
use crate::errors::{to_py, DeviceError, OrRaise, ShapeError, TypeMismatchError};
use crate::tensor::PyTensor;

/// What a tensor adopted from DLPack holds: the producer's managed tensor, released through its
/// deleter when the tensor lets go of the buffer.
struct Imported {
    managed: *mut c_void,
    versioned: bool,
    data: *mut u8,
    len: usize,
}

// SAFETY: DLPack's contract: the memory stays valid until the deleter is called, and the
// deleter may be called from any thread (producers that need the GIL take it themselves).
unsafe impl Send for Imported {}
// SAFETY: as above; the bytes are reached through `as_mut` only, under the buffer's locks.
unsafe impl Sync for Imported {}

impl AsMut<[u8]> for Imported {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the producer's data, `len` bytes, valid until the deleter runs in `drop`.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: `managed` is the producer's managed tensor, handed over with the capsule;
        // its deleter is called exactly once, here.
        unsafe {
            if self.versioned {
                let m = self.managed.cast::<DLManagedTensorVersioned>();
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            } else {
                let m = self.managed.cast::<DLManagedTensor>();
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        }
    }
}

fn capsule_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `PyCapsule_CheckExact` only reads the object's type.
    if unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) } == 1 {
        return Ok(obj.clone());
    }
    if !obj.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "from_dlpack needs an object with __dlpack__ (or a DLPack capsule), not {}",
            obj.get_type().name()?
        )));
    }
    let kwargs = PyDict::new(obj.py());
    kwargs.set_item("max_version", (1, 0))?;
    match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => obj.call_method0("__dlpack__"),
        r => r,
    }
}

/// `syncmem.from_dlpack(obj, device=None)`: a tensor on `device` (default `cpu`) whose host
/// mirror is the producer's memory, without copying. Read-only or misaligned sources are
/// copied once; strided ones raise `ShapeError`, device memory `DeviceError`.
#[pyfunction]
#[pyo3(signature = (obj, device = None))]
pub fn from_dlpack(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let target = device_arg(device, None)?;
    let cap = capsule_of(obj)?;
    // SAFETY: `cap` is a capsule (checked by name below); the pointers read are the producer's
    // managed tensor and its DLTensor, valid until its deleter is called, which happens once
    // (by `Imported::drop`, or right here after a copy or an error) after the capsule was
    // renamed to mark it consumed.
    unsafe {
        let p = cap.as_ptr();
        let versioned = if ffi::PyCapsule_IsValid(p, VERSIONED.as_ptr()) == 1 {
            true
        } else if ffi::PyCapsule_IsValid(p, LEGACY.as_ptr()) == 1 {
            false
        } else {
            return Err(PyTypeError::new_err(
                "not an unconsumed DLPack capsule (a capsule is consumed once)",
            ));
        };
        let name = if versioned { VERSIONED } else { LEGACY };
        let managed = ffi::PyCapsule_GetPointer(p, name.as_ptr());
        if managed.is_null() {
            return Err(PyErr::fetch(py));
        }
        let (t, flags) = if versioned {
            let m = managed.cast::<DLManagedTensorVersioned>();
            if (*m).version.major != 1 {
                return Err(PyBufferError::new_err(format!(
                    "DLPack version {}.{} is not supported (1.x is)",
                    (*m).version.major,
                    (*m).version.minor
                )));
            }
            (&(*m).dl_tensor, (*m).flags)
        } else {
            (&(*managed.cast::<DLManagedTensor>()).dl_tensor, 0)
        };
        let parsed = parse(t)?;
        let used = if versioned {
            VERSIONED_USED
        } else {
            LEGACY_USED
        };
        if ffi::PyCapsule_SetName(p, used.as_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        let owner = Imported {
            managed,
            versioned,
            data: parsed.data,
            len: parsed.nbytes,
        };
        let aligned = (parsed.data as usize).is_multiple_of(parsed.dtype.align());
        let mut tensor = Tensor::on(Some(&target));
        tensor.resize(&parsed.dims).or_raise()?;
        if flags & FLAG_READ_ONLY != 0 || !aligned {
            // Copied once: syncmem writes the host mirror, which must be writable and aligned.
            tensor.set_dtype(parsed.dtype).or_raise()?;
            if parsed.nbytes > 0 {
                let mut g = tensor.host_bytes_overwrite().or_raise()?;
                let src = std::slice::from_raw_parts(parsed.data, parsed.nbytes);
                g.copy_from_slice(src);
            }
            drop(owner);
        } else {
            tensor.adopt_bytes(parsed.dtype, owner).map_err(to_py)?;
        }
        Ok(PyTensor::standalone(tensor))
    }
}

struct Parsed {
    data: *mut u8,
    nbytes: usize,
    dims: Vec<usize>,
    dtype: DType,
}

/// Reads and checks a producer's DLTensor: host memory, a syncmem type, C-contiguous.
///
/// # Safety
/// `t` must be a valid DLTensor whose `shape` (and `strides`, when non-null) hold `ndim`
/// entries.
unsafe fn parse(t: &DLTensor) -> PyResult<Parsed> {
    if t.device.device_type != KDL_CPU {
        let kind = match t.device.device_type {
            KDL_CUDA => "cuda",
            KDL_OPENCL => "opencl",
            3 => "cuda host (pinned)",
            _ => "non-host",
        };
        return Err(DeviceError::new_err(format!(
            "from_dlpack takes host memory (kDLCPU) only; this tensor is {kind} memory \
             (DLPack device type {}, id {})",
            t.device.device_type, t.device.device_id
        )));
    }
    let dtype =
        dtypes::from_dlpack_code(t.dtype.code, t.dtype.bits, t.dtype.lanes).ok_or_else(|| {
            TypeMismatchError::new_err(format!(
                "DLPack type (code {}, bits {}, lanes {}) has no syncmem element type",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ))
        })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| ShapeError::new_err("negative ndim"))?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| ShapeError::new_err(format!("negative dims {shape:?}")))?;
    let numel = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ShapeError::new_err(format!("dims {dims:?} overflow")))?;
    if !t.strides.is_null() && ndim > 0 && numel > 0 {
        // SAFETY: the caller's contract.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expected = 1i64;
        for (k, (&s, &d)) in strides.iter().zip(shape).enumerate().rev() {
            if d != 1 && s != expected {
                return Err(ShapeError::new_err(format!(
                    "from_dlpack needs a C-contiguous tensor: dims {dims:?} have strides \
                     {strides:?} (axis {k}); make it contiguous first"
                )));
            }
            expected = expected.saturating_mul(d);
        }
    }
    let nbytes = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| ShapeError::new_err(format!("bytes of dims {dims:?} overflow")))?;
    let data = if nbytes == 0 {
        std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
    } else {
        // SAFETY: the producer's data pointer plus its byte offset.
        unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }
    };
    Ok(Parsed {
        data,
        nbytes,
        dims,
        dtype,
    })
}
