//! DLPack: tensors exported without copying (`Tensor.__dlpack__`: host tensors as their host
//! mirror, OpenCL and CUDA tensors as their device memory) and host memory imported without
//! copying (`syncmem.from_dlpack`), with both the versioned (1.x, `dltensor_versioned`) and the
//! legacy (`dltensor`) capsules.
//!
//! A device export takes the device mirror for writing (it becomes the only current copy, so
//! what the consumer writes there is what the next access sees), waits for the work queued on
//! it unless the consumer passes `stream=-1` (DLPack's "no synchronisation"; OpenCL has no
//! stream convention in DLPack, and a foreign CUDA stream is not waited on through an event:
//! the host waits instead), and hands out `data` = the `cl_mem` handle (OpenCL, as DLPack
//! specifies) or the device pointer (CUDA), keeping the memory allocated until the deleter
//! runs. Accesses through syncmem while the consumer still works on the memory race with it.
//!
//! The structs are DLPack's C ABI (`dlpack.h`, version 1.0). An exported capsule owns one boxed
//! [`Export`]: the managed tensor, the shape it points to, and what keeps the memory alive (a
//! writable host view, or a copy). The box is freed by the managed tensor's deleter, called by
//! the consumer once it is done, or by the capsule's destructor when nobody consumed it.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::synced::PlacementPin;
use syncmem::{BackendKind, DType, Device, Tensor};

use crate::device::device_arg;
use crate::dtypes;
use crate::errors::{to_py, DeviceError, OrRaise, ShapeError, TypeMismatchError};
use crate::tensor::PyTensor;
use crate::views::HostView;

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_OPENCL: i32 = 4;
const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 2;

const LEGACY: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// `(device_type, device_id)` of a tensor mirrored on `dev` (`None`: host only).
pub fn device_of(dev: Option<&Device>) -> (i32, i32) {
    match dev.map(|d| (d.backend(), d.info().ordinal)) {
        None | Some((BackendKind::Cpu, _)) => (KDL_CPU, 0),
        Some((BackendKind::OpenCl, n)) => (KDL_OPENCL, n as i32),
        Some((BackendKind::Cuda, n)) => (KDL_CUDA, n as i32),
        Some(_) => (KDL_CPU, 0),
    }
}

/// One exported tensor: the managed struct first (its address is the capsule's pointer), then
/// what it points to.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Vec<i64>,
    _keep: Keep,
}

/// What keeps an export's memory alive, and where it is: the buffer's placement stays pinned
/// until the export is released, so a spill or a zero-copy re-sharing never moves the memory
/// the consumer was handed.
enum Keep {
    /// A host view (it pins the buffer itself).
    Host(#[allow(dead_code)] HostView),
    /// The device memory (allocated until this goes).
    Device(#[allow(dead_code)] DeviceKeep),
}

/// A device export's memory: the buffer, a tensor sharing its storage, and its pin.
struct DeviceKeep {
    _buf: std::sync::Arc<syncmem::DeviceBuffer>,
    _pin: PlacementPin,
    _keeper: Tensor,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of a boxed `Export` made by `export`; the consumer
        // calls the deleter once. Dropping never unwinds across the boundary.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            drop(Box::from_raw(m.cast::<Export<DLManagedTensor>>()));
        }));
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as `delete_legacy`.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            drop(Box::from_raw(m.cast::<Export<DLManagedTensorVersioned>>()));
        }));
    }
}

/// Frees an export nobody consumed (the capsule still has its original name).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on a capsule made by `export`. `IsValid`
    // never raises; the pointer is read under the name that `IsValid` confirmed.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            delete_legacy(m.cast());
        } else if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            delete_versioned(m.cast());
        }
    }
}

fn dl_tensor(
    data: *mut c_void,
    dtype: DType,
    shape: &mut [i64],
    device: DLDevice,
) -> PyResult<DLTensor> {
    let (code, bits) = dtypes::dlpack_code(dtype).ok_or_else(|| {
        TypeMismatchError::new_err(format!("{dtype} elements have no DLPack type"))
    })?;
    Ok(DLTensor {
        data,
        device,
        ndim: shape.len() as i32,
        dtype: DLDataType {
            code,
            bits,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(), // C-contiguous
        byte_offset: 0,
    })
}

/// `Tensor.__dlpack__`.
pub fn export<'py>(
    py: Python<'py>,
    t: &PyTensor,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let what = t.what();
    let dev = t.read(py, |x| Ok(x.target().cloned()))?;
    let (device_type, device_id) = device_of(dev.as_ref());
    let copied = copy == Some(true);
    if let Some(req) = dl_device {
        if req != (device_type, device_id) {
            return Err(PyBufferError::new_err(format!(
                "{what} is on ({device_type}, {device_id}) in DLPack's terms; it cannot be \
                 exported to device {req:?}"
            )));
        }
    }
    let (keep, data, dtype, dims) = if device_type != KDL_CPU {
        let dev = dev.ok_or_else(|| DeviceError::new_err(format!("{what}: no device")))?;
        let sync = !stream.is_some_and(|s| s.extract::<i64>().is_ok_and(|v| v == -1));
        let (keep, dtype, dims) = device_export(py, t, &what, &dev, copied, sync)?;
        let data = keep._buf.native_address().unwrap_or(0) as *mut c_void;
        (Keep::Device(keep), data, dtype, dims)
    } else {
        let view = if copied {
            let blob = &t.blob;
            let w = what.clone();
            py.detach(move || -> PyResult<HostView> {
                let b = blob.read();
                let src = b.get::<Tensor>().or_raise()?;
                let c = src.clone_deep().or_raise()?;
                HostView::read_only(&c, &w)
            })?
        } else {
            py.detach(|| HostView::of_blob(&t.blob, &what, true))?
        };
        let (data, dtype, dims) = (view.ptr().cast(), view.dtype(), view.dims().to_vec());
        (Keep::Host(view), data, dtype, dims)
    };
    let device = DLDevice {
        device_type,
        device_id,
    };
    let mut shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let tensor = dl_tensor(data, dtype, &mut shape, device)?;
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    let (ptr, name): (*mut c_void, &CStr) = if versioned {
        let b = Box::new(Export {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if copied { FLAG_IS_COPIED } else { 0 },
                dl_tensor: tensor,
            },
            shape,
            _keep: keep,
        });
        let raw = Box::into_raw(b);
        // SAFETY: `raw` is a live box; the context points at the box itself.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        (raw.cast(), VERSIONED)
    } else {
        let b = Box::new(Export {
            managed: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape,
            _keep: keep,
        });
        let raw = Box::into_raw(b);
        // SAFETY: as above.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        (raw.cast(), LEGACY)
    };
    // The shape vector moved into the box: point the tensor at its new home.
    // SAFETY: `ptr` is the box made above, whose first field is the managed tensor.
    unsafe {
        if versioned {
            let e = ptr.cast::<Export<DLManagedTensorVersioned>>();
            (*e).managed.dl_tensor.shape = (*e).shape.as_mut_ptr();
        } else {
            let e = ptr.cast::<Export<DLManagedTensor>>();
            (*e).managed.dl_tensor.shape = (*e).shape.as_mut_ptr();
        }
    }
    // SAFETY: `ptr` is non-null; on failure the box is freed through its deleter.
    unsafe {
        let cap = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor));
        if cap.is_null() {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, cap))
    }
}

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

/// The device memory of `t` for a device export (see the module docs): taken for writing (the
/// device becomes the only current copy), its queued work waited for when `sync`; with
/// `copied`, that of a deep copy on the same device.
fn device_export(
    py: Python<'_>,
    t: &PyTensor,
    what: &str,
    dev: &Device,
    copied: bool,
    sync: bool,
) -> PyResult<(DeviceKeep, DType, Vec<usize>)> {
    let blob = &t.blob;
    py.detach(|| {
        crate::views::device_section(
            || Ok(()),
            || {
                let b = blob.read();
                let src = b.get::<Tensor>().or_raise()?;
                crate::views::check_no_writable_view(src, what)?;
                let owned;
                let t = if copied {
                    owned = src.clone_deep().or_raise()?;
                    &owned
                } else {
                    src
                };
                let dtype = t.dtype().ok_or_else(|| {
                    TypeMismatchError::new_err(format!("{what} has no element type to export"))
                })?;
                let mem = t.synced().filter(|_| t.nbytes() > 0).ok_or_else(|| {
                    PyBufferError::new_err(format!(
                        "{what} on {} holds no device memory (it is empty)",
                        dev.label()
                    ))
                })?;
                let keeper = crate::views::share(t).or_raise()?;
                // The pin before the address is read: the one it protects.
                let pin = mem.pin_placement();
                let g = mem.device_mut().or_raise()?;
                if sync {
                    g.stream().synchronize().or_raise()?;
                }
                let keep = DeviceKeep {
                    _buf: g.shared_buffer(),
                    _pin: pin,
                    _keeper: keeper,
                };
                Ok((keep, dtype, t.dims().to_vec()))
            },
        )
    })
}
