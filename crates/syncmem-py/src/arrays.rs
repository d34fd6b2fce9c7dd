//! NumPy arrays into tensors (feeding: one copy, or none) and tensors into new arrays
//! (fetching: one copy, from whichever side is newest).

use numpy::npyffi::{
    get_type_object, npy_intp, NpyTypes, NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS,
    NPY_ARRAY_OWNDATA, NPY_ARRAY_WRITEABLE, PY_ARRAY_API,
};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use syncmem::workspace::BlobRef;
use syncmem::{DType, Device, Error, Head, Tensor};

use crate::dtypes::{self, Fed};
use crate::errors::{to_py, InvalidStateError, OrRaise, ShapeError, TypeMismatchError};
use crate::views::{self, PyHostView};

/// The NumPy array for `value`: itself when it is an array, else `numpy.asarray(value)`.
pub fn as_array<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = value.cast::<PyUntypedArray>() {
        return Ok(a.clone());
    }
    let np = value.py().import("numpy")?;
    let a = np.call_method1("asarray", (value,))?;
    Ok(a.cast_into::<PyUntypedArray>()?)
}

/// Host memory of a NumPy array adopted by a tensor (`feed_blob(copy=False)`): `_owner` is a
/// private array that owns the memory (see [`take_over`]); the memory lives until the tensor
/// and every array over it are gone.
struct ArrayOwner {
    _owner: Py<PyAny>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr` is the data of the array `_owner` keeps alive (a NumPy array's data does not
// move while the array lives: `_owner` is never handed to Python, so nothing resizes it);
// `Py<PyAny>` is Send + Sync and is released through PyO3's reference pool when dropped
// without the interpreter attached.
unsafe impl Send for ArrayOwner {}
// SAFETY: as above; the bytes are reached through `as_mut` only, under the buffer's locks.
unsafe impl Sync for ArrayOwner {}

impl AsMut<[u8]> for ArrayOwner {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is valid for `len` bytes for as long as `_owner` lives (see above).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *mut u8 {
    // SAFETY: `as_array_ptr` is a live array object; `data` is its data pointer.
    unsafe { (*a.as_array_ptr()).fields.data.cast() }
}

fn nbytes(a: &Bound<'_, PyUntypedArray>) -> usize {
    a.len().saturating_mul(a.dtype().itemsize())
}

fn dims_of(a: &Bound<'_, PyUntypedArray>) -> Vec<usize> {
    a.shape().to_vec()
}

/// A tensor on `device`, labelled `label`, holding the elements of `value` (a NumPy array or
/// anything `numpy.asarray` takes). With `copy`, the elements are copied once into the host
/// mirror (strided or byte-swapped arrays included). Without, a C-contiguous, aligned,
/// native-order, writable array becomes the host mirror itself and is marked read-only.
pub fn tensor_from_value(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    label: &str,
    device: &Device,
    copy: bool,
) -> PyResult<Tensor> {
    let arr = as_array(value)?;
    let dims = dims_of(&arr);
    let descr = arr.dtype();
    let dtype = match dtypes::from_numpy(&descr)? {
        Fed::Strings => {
            if !copy {
                return Err(TypeMismatchError::new_err(format!(
                    "blob {label:?}: str arrays are always copied (syncmem keeps Rust strings): \
                     feed them with copy=True"
                )));
            }
            return strings_tensor(&arr, &dims, label, device);
        }
        Fed::Pod(d) => d,
    };
    let contiguous = arr.is_c_contiguous() && arr.is_aligned();
    let native = descr.is_native_byteorder().unwrap_or(true);
    if !copy {
        return adopt_array(&arr, &dims, dtype, label, device, contiguous && native);
    }
    let mut t = Tensor::on(Some(device)).with_label(label);
    t.resize(&dims).or_raise()?;
    t.set_dtype(dtype).or_raise()?;
    if t.nbytes() == 0 {
        return Ok(t);
    }
    if contiguous && native {
        let src = data_ptr(&arr) as usize;
        let n = nbytes(&arr);
        py.detach(|| -> syncmem::Result<()> {
            let mut g = t.host_bytes_overwrite()?;
            // SAFETY: `src` is the data of `arr`, C-contiguous and `n` bytes long; `arr` is
            // held by this frame, so it stays alive while the GIL is released.
            let src = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
            g.copy_from_slice(src);
            Ok(())
        })
        .or_raise()?;
    } else {
        // Strided or byte-swapped: NumPy copies it once straight into the host mirror.
        let mut g = t.host_bytes_overwrite().or_raise()?;
        let target = temporary_array(py, &descr_native(py, dtype)?, &dims, g.as_mut_ptr())?;
        let np = py.import("numpy")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("casting", "equiv")?;
        let done = np.call_method("copyto", (&target, &arr), Some(&kwargs));
        drop(target);
        done?;
    }
    Ok(t)
}

fn descr_native<'py>(py: Python<'py>, d: DType) -> PyResult<Bound<'py, PyArrayDescr>> {
    dtypes::numpy_descr(py, d, "a fed array")
}

/// A base-less writable array over `len` bytes at `ptr`, for a copy made while the caller
/// holds the memory; it must be dropped before the memory is released.
fn temporary_array<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    dims: &[usize],
    ptr: *mut u8,
) -> PyResult<Bound<'py, PyAny>> {
    let mut dims: Vec<npy_intp> = dims.iter().map(|&d| d as npy_intp).collect();
    let flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    // SAFETY: `ptr` holds the C-contiguous elements of `descr` with `dims`, valid while the
    // caller keeps the array (it drops it before the memory goes). The reference to `descr`
    // is stolen, hence the clone.
    unsafe {
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            ptr.cast(),
            flags,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, raw)
    }
}

/// `PyArrayObject_fields` of NumPy 1.22 and later: the fields of `numpy`'s
/// [`PyArrayObject`](numpy::npyffi::PyArrayObject), then `_buffer_info` and `mem_handler` (the
/// capsule of the allocator that frees the data of an array that owns it).
#[repr(C)]
struct ArrayFields {
    head: numpy::npyffi::PyArrayObject,
    _buffer_info: *mut std::ffi::c_void,
    mem_handler: *mut pyo3::ffi::PyObject,
}

/// NumPy's C API feature version of 1.22, the first with `mem_handler`.
const NPY_1_22_API_VERSION: std::ffi::c_uint = 0x0000_000f;

fn fields(a: &Bound<'_, PyAny>) -> *mut ArrayFields {
    a.as_ptr().cast()
}

fn base_of<'py>(a: &Bound<'py, PyUntypedArray>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: `as_array_ptr` is a live array object; `base` is a borrowed reference or null.
    let base = unsafe { (*a.as_array_ptr()).fields.base };
    // SAFETY: a non-null `base` is a live object the array holds a reference to.
    (!base.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(a.py(), base) })
}

fn owns_data(a: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: `as_array_ptr` is a live array object.
    let flags = unsafe { (*a.as_array_ptr()).fields.flags };
    flags & NPY_ARRAY_OWNDATA != 0 && base_of(a).is_none()
}

/// The array whose memory `copy=False` takes over: `arr` itself when it owns its memory, or
/// the array it views when it covers all of it (a reshape). Refused: memory that already
/// belongs to a tensor, a view of part of an array, memory NumPy does not own.
fn memory_owner<'py>(
    arr: &Bound<'py, PyUntypedArray>,
    label: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let refuse = |why: String| {
        InvalidStateError::new_err(format!(
            "blob {label:?}: copy=False cannot adopt this array: {why}. Feed it with copy=True \
             (one copy)"
        ))
    };
    // A view of a tensor, or of an array adopted before, has a HostView down its bases.
    let mut base = base_of(arr);
    for _ in 0..2 {
        let Some(b) = base else { break };
        if let Ok(view) = b.cast::<PyHostView>() {
            let tensor = view.get().buffer_label().to_string();
            return Err(refuse(format!(
                "its memory already belongs to the tensor {tensor:?} (a blob's host mirror); \
                 share that tensor instead: feed_blob(name, ws.tensor({tensor:?}))"
            )));
        }
        base = b.cast::<PyUntypedArray>().ok().and_then(|a| base_of(a));
    }
    if owns_data(arr) {
        return Ok(arr.clone());
    }
    let Some(base) = base_of(arr) else {
        return Err(refuse(
            "NumPy does not own its memory (it was made over memory from elsewhere)".into(),
        ));
    };
    match base.cast::<PyUntypedArray>() {
        Ok(b) if owns_data(b) => {
            if data_ptr(b) == data_ptr(arr) && nbytes(b) == nbytes(arr) {
                Ok(b.clone())
            } else {
                Err(refuse(format!(
                    "it is a view of part of another array ({} of its {} bytes), which could \
                     still write the memory",
                    nbytes(arr),
                    nbytes(b)
                )))
            }
        }
        _ => Err(refuse(format!(
            "NumPy does not own its memory: it belongs to a {} object, which could still \
             write it",
            base.get_type().name()?
        ))),
    }
}

/// A read-only array over the memory of `owner` (which owns it), not owning it yet.
fn private_array<'py>(
    py: Python<'py>,
    owner: &Bound<'py, PyUntypedArray>,
) -> PyResult<Bound<'py, PyAny>> {
    let o = owner.as_array_ptr();
    // SAFETY: `o` is a live array: its descr is a live dtype (the new array steals the new
    // reference), `nd`, `dimensions` and `strides` describe its data, which it owns and keeps
    // while `owner` lives; the new array only points at it (no NPY_ARRAY_OWNDATA, no
    // NPY_ARRAY_WRITEABLE) until `take_over` hands it the ownership.
    unsafe {
        let f = &(*o).fields;
        pyo3::ffi::Py_INCREF(f.descr.cast());
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            f.descr,
            f.nd,
            f.dimensions,
            f.strides,
            f.data.cast(),
            0,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, raw)
    }
}

/// `InvalidStateError` unless `owner` (which owns its memory) holds the capsule of the
/// allocator its memory came from. Call it only with NumPy 1.22 or later.
fn check_allocator(owner: &Bound<'_, PyUntypedArray>, label: &str) -> PyResult<()> {
    let o = fields(owner.as_any());
    // SAFETY: `o` is a live array of NumPy 1.22 or later, with the layout of `ArrayFields`;
    // `mem_handler` is null or a live object.
    let valid = unsafe {
        let handler = (*o).mem_handler;
        !handler.is_null() && pyo3::ffi::PyCapsule_IsValid(handler, c"mem_handler".as_ptr()) == 1
    };
    if valid {
        Ok(())
    } else {
        Err(InvalidStateError::new_err(format!(
            "blob {label:?}: copy=False cannot adopt this array: its memory has no NumPy \
             allocator to be freed with. Feed it with copy=True (one copy)"
        )))
    }
}

/// Moves the ownership of `owner`'s memory to `private` (made by [`private_array`] over it):
/// `private` frees it with NumPy's allocator when it goes; `owner` becomes a read-only view
/// whose base is `base` (a [`PyHostView`]), which exposes no writable buffer, so NumPy refuses
/// to make `owner`, or any view of it, writable again. Call it after [`check_allocator`].
fn take_over(
    owner: &Bound<'_, PyUntypedArray>,
    private: &Bound<'_, PyAny>,
    base: Bound<'_, PyHostView>,
) -> PyResult<()> {
    let (o, p) = (fields(owner.as_any()), fields(private));
    // SAFETY: `o` and `p` are live arrays of NumPy 1.22 or later (checked by the caller), so
    // their objects have the layout of `ArrayFields`. `o` has no base (it owns its memory): it
    // takes `base`, whose reference `PyArray_SetBaseObject` steals (and releases on failure,
    // when nothing else has changed). Then the allocator capsule moves with the data: `p` owns
    // both and frees the data through it (NumPy's deallocator does, for an array with
    // NPY_ARRAY_OWNDATA), `o` neither (NumPy frees nothing of an array without
    // NPY_ARRAY_OWNDATA). `p` describes the same dtype and dims as `o`, so it frees as many
    // bytes as `o` was allocated. No Python code runs in between.
    unsafe {
        let base = base.into_any().into_ptr();
        if PY_ARRAY_API.PyArray_SetBaseObject(owner.py(), o.cast(), base) != 0 {
            return Err(PyErr::fetch(owner.py()));
        }
        (*p).mem_handler = std::mem::replace(&mut (*o).mem_handler, std::ptr::null_mut());
        (*p).head.fields.flags |= NPY_ARRAY_OWNDATA;
        (*o).head.fields.flags &= !(NPY_ARRAY_OWNDATA | NPY_ARRAY_WRITEABLE);
    }
    Ok(())
}

/// `feed_blob(copy=False)`: the tensor takes the array's memory over (see [`take_over`]); the
/// array, and its base when it views all of it, become read-only views of the host mirror.
fn adopt_array(
    arr: &Bound<'_, PyUntypedArray>,
    dims: &[usize],
    dtype: DType,
    label: &str,
    device: &Device,
    behaved: bool,
) -> PyResult<Tensor> {
    let py = arr.py();
    if !behaved {
        return Err(ShapeError::new_err(format!(
            "blob {label:?}: copy=False needs a C-contiguous, aligned array in native byte order \
             (got shape {dims:?}, strides {:?}); pass copy=True or numpy.ascontiguousarray(a)",
            arr.strides()
        )));
    }
    let owner = memory_owner(arr, label)?;
    if !arr
        .getattr("flags")?
        .getattr("writeable")?
        .extract::<bool>()?
    {
        return Err(InvalidStateError::new_err(format!(
            "blob {label:?}: copy=False needs a writable array: its memory becomes the host \
             mirror, which syncmem writes when it copies back from the device"
        )));
    }
    // SAFETY: a call into NumPy's C API, which is loaded (`arr` is an array).
    let version = unsafe { PY_ARRAY_API.PyArray_GetNDArrayCFeatureVersion(py) };
    if version < NPY_1_22_API_VERSION {
        return Err(InvalidStateError::new_err(format!(
            "blob {label:?}: copy=False needs NumPy 1.22 or later (C API version {version:#x}); \
             feed with copy=True"
        )));
    }
    check_allocator(&owner, label)?;
    let private = private_array(py, &owner)?;
    let memory = ArrayOwner {
        _owner: private.clone().unbind(),
        ptr: data_ptr(arr),
        len: nbytes(arr),
    };
    let mut t = Tensor::on(Some(device)).with_label(label);
    t.resize(dims).or_raise()?;
    t.adopt_bytes(dtype, memory).or_raise()?;
    let view = py.detach(|| views::HostView::read_only(&t, &format!("blob {label:?}")))?;
    take_over(&owner, &private, PyHostView::wrap(py, view)?)?;
    if !arr.is(&owner) {
        arr.call_method1("setflags", (false,))?;
    }
    Ok(t)
}

fn strings_tensor(
    arr: &Bound<'_, PyUntypedArray>,
    dims: &[usize],
    label: &str,
    device: &Device,
) -> PyResult<Tensor> {
    let flat = arr.call_method0("ravel")?.call_method0("tolist")?;
    let flat = flat.cast::<PyList>()?;
    let mut values = Vec::with_capacity(flat.len());
    for item in flat.iter() {
        if let Ok(b) = item.cast::<PyBytes>() {
            let s = std::str::from_utf8(b.as_bytes()).map_err(|e| {
                TypeMismatchError::new_err(format!(
                    "blob {label:?}: bytes that are not UTF-8 ({e})"
                ))
            })?;
            values.push(s.to_string());
        } else {
            values.push(item.extract::<String>().map_err(|_| {
                TypeMismatchError::new_err(format!(
                    "blob {label:?}: an object array must hold str or bytes only, not {}",
                    item.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?);
        }
    }
    // String storage is a host-only vector: the label only names the tensor in errors.
    Tensor::from_slice(dims, &values, Some(device))
        .map(|t| t.with_label(label))
        .or_raise()
}

/// What a fetch reads: dims and element type, read under the blob's lock.
fn meta(blob: &BlobRef, what: &str) -> PyResult<(Vec<usize>, DType)> {
    let b = crate::reentry::read(blob, what)?;
    let t = b.get::<Tensor>().or_raise()?;
    let dtype = t.dtype().ok_or_else(|| {
        InvalidStateError::new_err(format!("{what} has no element type yet (uninitialised)"))
    })?;
    if !t.is_initialized() {
        return Err(InvalidStateError::new_err(format!(
            "{what} is uninitialised"
        )));
    }
    Ok((t.dims().to_vec(), dtype))
}

/// Copies the elements of `t` into `dst` from the newest side: from device memory when only the
/// device is current (no host mirror is made), else from the host mirror.
fn read_bytes(t: &Tensor, dst: &mut [u8], what: &str) -> syncmem::Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let mem = t.synced().ok_or_else(|| Error::InvalidState {
        op: "fetch_blob",
        buffer: what.to_string(),
        reason: "the tensor has elements but no data yet".into(),
    })?;
    if mem.head() == Head::AtDevice {
        return mem.device()?.read_into(dst);
    }
    let g = mem.host()?;
    dst.copy_from_slice(&g[..dst.len()]);
    Ok(())
}

/// A new NumPy array with a copy of the tensor in `blob` (Caffe2's `FetchBlob`). `bfloat16`
/// comes back as `float32`, `str` tensors as object arrays of `str`.
pub fn fetch<'py>(py: Python<'py>, blob: &BlobRef, what: &str) -> PyResult<Bound<'py, PyAny>> {
    loop {
        let (dims, dtype) = py.detach(|| meta(blob, what))?;
        if dtype == DType::String {
            return fetch_strings(py, blob);
        }
        let out_dtype = if dtype == DType::BF16 {
            DType::F32
        } else {
            dtype
        };
        let np = py.import("numpy")?;
        let out = np.call_method1("empty", (dims.clone(), dtypes::name(out_dtype)))?;
        let out_arr = out.cast::<PyUntypedArray>()?;
        let (ptr, len) = (data_ptr(out_arr) as usize, nbytes(out_arr));
        let bf16 = dtype == DType::BF16;
        let read = py.detach(|| {
            views::device_section(
                || Ok(()),
                || {
                    let b = crate::reentry::read(blob, what)?;
                    let t = b.get::<Tensor>().or_raise()?;
                    if t.dims() != dims.as_slice() || t.dtype() != Some(dtype) {
                        return Ok(false); // changed meanwhile: read again
                    }
                    // SAFETY: `ptr` is the data of `out`, a fresh C-contiguous array of `len`
                    // bytes held by the caller's frame.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
                    if bf16 {
                        let mut raw = vec![0u8; len / 2];
                        read_bytes(t, &mut raw, what).or_raise()?;
                        for (o, c) in dst.chunks_exact_mut(4).zip(raw.chunks_exact(2)) {
                            let v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                            o.copy_from_slice(&v.to_ne_bytes());
                        }
                    } else {
                        read_bytes(t, dst, what).or_raise()?;
                    }
                    Ok(true)
                },
            )
        })?;
        if read {
            return Ok(out);
        }
    }
}

fn fetch_strings<'py>(py: Python<'py>, blob: &BlobRef) -> PyResult<Bound<'py, PyAny>> {
    let (dims, values) = py.detach(|| -> PyResult<(Vec<usize>, Vec<String>)> {
        let b = crate::reentry::read(blob, "fetch_blob")?;
        let t = b.get::<Tensor>().or_raise()?;
        let v = t.host::<String>().map_err(to_py)?.to_vec();
        Ok((t.dims().to_vec(), v))
    })?;
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", "object")?;
    let flat = np.call_method("array", (values,), Some(&kwargs))?;
    if dims.is_empty() {
        return flat.call_method1("reshape", ((),));
    }
    flat.call_method1("reshape", (dims,))
}
