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
//! Asked for the host (`dl_device=(kDLCPU, 0)`) with `copy=True`, a device tensor exports a
//! host copy instead (flagged as copied); without `copy=True` that request raises
//! `BufferError`, as DLPack's Python protocol says.
//!
//! The structs are DLPack's C ABI (`dlpack.h`, version 1.0). An exported capsule owns one boxed
//! [`Export`]: the managed tensor, the shape it points to, and what keeps the memory alive (a
//! writable host view, or a copy). The memory is released by the managed tensor's deleter,
//! called by the consumer once it is done, or by the capsule's destructor when nobody consumed
//! it; it is released once however often the deleter runs while the capsule lives (see
//! [`Export`]).

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use syncmem::synced::PlacementPin;
use syncmem::{BackendKind, DType, Device, Tensor};

use crate::dtypes;
use crate::errors::{DeviceError, OrRaise, TypeMismatchError};
use crate::tensor::PyTensor;
use crate::views::HostView;

mod import;
pub use import::from_dlpack;

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
/// what it points to and what keeps its memory alive.
///
/// Two owners share the box: the DLPack ownership (ended by the managed tensor's deleter) and
/// the capsule (ended by its destructor). The deleter releases the memory once, however often
/// and by whomever it is called while the box lives (`released`): a consumer that calls it and
/// leaves the capsule's name unchanged (PyTorch does when it refuses a device type) is followed
/// by the capsule's destructor, which sees the export released. The box itself is freed when
/// the second owner is done (`owners`), so the destructor never reads freed memory.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Vec<i64>,
    keep: Mutex<Option<Keep>>,
    released: AtomicBool,
    owners: AtomicUsize,
}

/// The two managed-tensor layouts (legacy and versioned), as [`new_export`] fills them.
trait Managed {
    fn set_context(&mut self, ctx: *mut c_void);
    fn tensor(&mut self) -> &mut DLTensor;
}

impl Managed for DLManagedTensor {
    fn set_context(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
}

impl Managed for DLManagedTensorVersioned {
    fn set_context(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
}

/// A new export of two owners (the DLPack side and the capsule), on the heap: its context
/// points at itself and its tensor at the shape it keeps. Returns the box, which
/// `delete_legacy`/`delete_versioned` and the capsule's destructor end.
fn new_export<M: Managed>(managed: M, shape: Vec<i64>, keep: Keep) -> *mut c_void {
    let mut b = Box::new(Export {
        managed,
        shape,
        keep: Mutex::new(Some(keep)),
        released: AtomicBool::new(false),
        owners: AtomicUsize::new(2),
    });
    // The shape vector lives in the box from now on: the tensor points at it there.
    let e = &mut *b;
    e.managed.tensor().shape = e.shape.as_mut_ptr();
    let raw = Box::into_raw(b);
    // SAFETY: `raw` is the live box just leaked; the context points at the box itself.
    unsafe { (*raw).managed.set_context(raw.cast()) };
    raw.cast()
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

/// Ends one owner of the export at `e`; the last one frees the box.
///
/// # Safety
/// `e` is a box made by `export` whose owner count includes the caller's share.
unsafe fn disown<M>(e: *mut Export<M>) {
    // SAFETY: the caller's share keeps the box alive until the decrement.
    if unsafe { (*e).owners.fetch_sub(1, Ordering::AcqRel) } == 1 {
        // SAFETY: the last owner: nobody else reaches the box.
        drop(unsafe { Box::from_raw(e) });
    }
}

/// The deleter's work: the memory is released and the DLPack owner ends, the first time only.
///
/// # Safety
/// `e` is a box made by `export` that is still alive (the capsule's share, or the DLPack one
/// not yet ended, holds it).
unsafe fn release<M>(e: *mut Export<M>) {
    // SAFETY: alive per the contract; the fields read are atomics and a mutex.
    let first = unsafe { !(*e).released.swap(true, Ordering::AcqRel) };
    if first {
        // SAFETY: as above.
        let keep = unsafe { (*e).keep.lock().take() };
        drop(keep);
        // SAFETY: the DLPack share, ended exactly once (guarded by `released`).
        unsafe { disown(e) };
    }
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of a boxed `Export` made by `export`, alive until
        // both owners ended; a repeated call finds it released. Dropping never unwinds across
        // the boundary.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            release(m.cast::<Export<DLManagedTensor>>());
        }));
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as `delete_legacy`.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            release(m.cast::<Export<DLManagedTensorVersioned>>());
        }));
    }
}

/// Releases an export that no capsule ended up holding, ending both of its shares.
///
/// # Safety
/// `ptr` is a box made by `export` (of the versioned layout when `versioned`) with both shares
/// held by the caller.
unsafe fn abandon(ptr: *mut c_void, versioned: bool) {
    // SAFETY: the caller's contract: `release` ends the DLPack share, `disown` the other.
    unsafe {
        if versioned {
            let e = ptr.cast::<Export<DLManagedTensorVersioned>>();
            release(e);
            disown(e);
        } else {
            let e = ptr.cast::<Export<DLManagedTensor>>();
            release(e);
            disown(e);
        }
    }
}

/// The capsule's context: which export it holds a share of.
struct CapsuleShare {
    export: *mut c_void,
    versioned: bool,
}

/// Ends the capsule's share; releases the export first when nobody consumed it (the capsule
/// still has its original name, and the deleter did not run).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on a capsule made by `export`, whose context
    // is a boxed `CapsuleShare` naming a box that the capsule's share keeps alive. `IsValid`
    // never raises, nor does `GetContext` on a valid capsule (its pointer is non-null).
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        let ctx = ffi::PyCapsule_GetContext(capsule);
        if ctx.is_null() {
            return; // no share to end (see `export`)
        }
        let share = Box::from_raw(ctx.cast::<CapsuleShare>());
        let name = if share.versioned { VERSIONED } else { LEGACY };
        let unconsumed = ffi::PyCapsule_IsValid(capsule, name.as_ptr()) == 1;
        if share.versioned {
            let e = share.export.cast::<Export<DLManagedTensorVersioned>>();
            if unconsumed {
                release(e);
            }
            disown(e);
        } else {
            let e = share.export.cast::<Export<DLManagedTensor>>();
            if unconsumed {
                release(e);
            }
            disown(e);
        }
    }));
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
    let copied = copy == Some(true);
    let (device_type, device_id, to_host) =
        export_device(&what, device_of(dev.as_ref()), dl_device, copied)?;
    let (keep, data, dtype, dims) = if device_type != KDL_CPU {
        let dev = dev.ok_or_else(|| DeviceError::new_err(format!("{what}: no device")))?;
        let sync = !stream.is_some_and(|s| s.extract::<i64>().is_ok_and(|v| v == -1));
        let (keep, dtype, dims) = device_export(py, t, &what, &dev, copied, sync)?;
        let data = keep._buf.native_address().unwrap_or(0) as *mut c_void;
        (Keep::Device(keep), data, dtype, dims)
    } else {
        let view = host_export(py, t, &what, to_host, copied)?;
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
        let managed = DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if copied { FLAG_IS_COPIED } else { 0 },
            dl_tensor: tensor,
        };
        (new_export(managed, shape, keep), VERSIONED)
    } else {
        let managed = DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        (new_export(managed, shape, keep), LEGACY)
    };
    into_capsule(py, ptr, name, versioned)
}

/// The DLPack device an export of a tensor on `(device_type, device_id)` goes to, and whether
/// it is a host copy of a device tensor: a device tensor asked for on the host with
/// `copy=True` (DLPack lets a producer copy across devices when asked to copy). Any other
/// device than the tensor's own is refused.
fn export_device(
    what: &str,
    (device_type, device_id): (i32, i32),
    dl_device: Option<(i32, i32)>,
    copied: bool,
) -> PyResult<(i32, i32, bool)> {
    let to_host = copied && device_type != KDL_CPU && dl_device == Some((KDL_CPU, 0));
    if let Some(req) = dl_device {
        if req != (device_type, device_id) && !to_host {
            let hint = if device_type != KDL_CPU && req == (KDL_CPU, 0) {
                " without copying (copy=True gives a host copy)"
            } else {
                ""
            };
            return Err(PyBufferError::new_err(format!(
                "{what} is on ({device_type}, {device_id}) in DLPack's terms; it cannot be \
                 exported to device {req:?}{hint}"
            )));
        }
    }
    Ok(if to_host {
        (KDL_CPU, 0, true)
    } else {
        (device_type, device_id, false)
    })
}

/// The host memory of a host export: the tensor's host mirror, a deep copy of it (`copied`),
/// or a host copy of a device tensor (`to_host`).
fn host_export(
    py: Python<'_>,
    t: &PyTensor,
    what: &str,
    to_host: bool,
    copied: bool,
) -> PyResult<HostView> {
    if to_host {
        py.detach(|| host_copy(t, what))
    } else if copied {
        let blob = &t.blob;
        py.detach(move || -> PyResult<HostView> {
            let b = crate::reentry::read(blob, what)?;
            let src = b.get::<Tensor>().or_raise()?;
            let c = src.clone_deep().or_raise()?;
            HostView::read_only(&c, what)
        })
    } else {
        py.detach(|| HostView::of_blob(&t.blob, what, true))
    }
}

/// The capsule named `name` of the export `ptr` (made by [`new_export`]), which shares the
/// export with the DLPack consumer.
fn into_capsule<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let share = Box::into_raw(Box::new(CapsuleShare {
        export: ptr,
        versioned,
    }));
    // SAFETY: `ptr` is non-null. On failure the capsule's share is ended here (it never
    // existed as a capsule) and the DLPack one through the deleter; once the capsule exists
    // its destructor owns `share`.
    unsafe {
        let cap = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor));
        if cap.is_null() {
            let err = PyErr::fetch(py);
            drop(Box::from_raw(share));
            abandon(ptr, versioned);
            return Err(err);
        }
        let cap = Bound::from_owned_ptr(py, cap);
        if ffi::PyCapsule_SetContext(cap.as_ptr(), share.cast()) != 0 {
            // The capsule's destructor finds no context and does nothing: both shares end here.
            let err = PyErr::fetch(py);
            drop(Box::from_raw(share));
            abandon(ptr, versioned);
            return Err(err);
        }
        Ok(cap)
    }
}

/// A view of a host-only copy of `t`'s elements, copied from its host mirror once that is
/// current (one device-to-host copy when only the device is, counted as one).
fn host_copy(t: &PyTensor, what: &str) -> PyResult<HostView> {
    crate::views::device_section(
        || Ok(()),
        || {
            let b = crate::reentry::read(&t.blob, what)?;
            let src = b.get::<Tensor>().or_raise()?;
            let dtype = src.dtype().ok_or_else(|| {
                TypeMismatchError::new_err(format!("{what} has no element type to export"))
            })?;
            if !dtype.is_pod() {
                return Err(TypeMismatchError::new_err(format!(
                    "{what} holds {dtype} elements, which have no DLPack type"
                )));
            }
            let mut c = Tensor::on(None).with_label(src.label());
            c.resize(src.dims()).or_raise()?;
            c.set_dtype(dtype).or_raise()?;
            if let Some(mem) = src.synced().filter(|_| c.nbytes() > 0) {
                // Through the host mirror: made current (the copy counted as device to host),
                // then copied.
                let from = mem.host().or_raise()?;
                let mut g = c.host_bytes_overwrite().or_raise()?;
                let n = g.len();
                g.copy_from_slice(&from[..n]);
            }
            HostView::read_only(&c, what)
        },
    )
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
                let b = crate::reentry::read(blob, what)?;
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
