//! Host views without copies: a NumPy array (or a DLPack export) over a tensor's host mirror.
//!
//! A [`HostView`] keeps the buffer alive by sharing the tensor's storage (a second tensor that
//! [`Tensor::share_data`]s it), so the view outlives the tensor, its blob and its workspace,
//! and pins the buffer's placement ([`SyncedMemory::pin_placement`]) so that the address it
//! hands out stays the buffer's host memory: while the view lives the buffer is neither
//! spilled nor evicted under a memory cap, and a host mirror that is the device memory itself
//! (zero copy) stays so.
//!
//! A view is live: it shows the buffer's host memory, not a snapshot. Without zero copy that
//! memory is the host mirror, refreshed by host reads (another view, `fetch_blob`); with zero
//! copy (the default on `cpu` and PoCL) it is the device memory, which kernels write in place.
//! `Tensor.numpy(copy=True)` gives a snapshot.
//!
//! A read-only view makes the host current once (a device-to-host copy when the device is
//! newer) and shows the host mirror from then on. A writable view also makes the host the head.
//! Writes through it are not seen by the head state machine, so while a writable view lives,
//! device access to its buffer through this package (`run_net`, `Tensor.to_device`) raises
//! `BusyError`: it would upload stale data, or overwrite the host mirror under the view.
//!
//! The check is made race-free by one process-wide gate: device work taken through this
//! package holds it shared while it checks and runs, and making a writable view holds it
//! exclusively, so a writable view is never made while such work is in flight.

use std::collections::HashMap;

use numpy::npyffi::{
    get_type_object, npy_intp, NpyTypes, PyArrayObject, NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS,
    NPY_ARRAY_WRITEABLE, PY_ARRAY_API,
};
use numpy::PyArrayDescrMethods;
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use syncmem::synced::PlacementPin;
use syncmem::workspace::BlobRef;
use syncmem::{DType, SyncedMemory, Tensor};

use crate::dtypes;
use crate::errors::{to_py, BusyError, InvalidStateError, OrRaise, TypeMismatchError};

/// A buffer with live views, for the checks and the memory snapshot.
#[derive(Clone, Debug)]
pub struct ViewEntry {
    /// The buffer's label.
    pub label: String,
    /// Its device (`None`: host only).
    pub device: Option<String>,
    /// Bytes of the buffer.
    pub bytes: usize,
    /// Read-only views alive.
    pub read_only: usize,
    /// Writable views alive.
    pub writable: usize,
}

/// Buffers with live views, keyed by the buffer's address (stable while a view keeps the
/// buffer alive).
static VIEWS: Mutex<Option<HashMap<usize, ViewEntry>>> = Mutex::new(None);

/// Held shared by device work started here, exclusively while a writable view is made.
static GATE: RwLock<()> = RwLock::new(());

/// The key of a buffer in the view registry.
pub fn key(mem: &SyncedMemory) -> usize {
    mem as *const SyncedMemory as usize
}

/// Number of writable views alive on `mem`.
pub fn writable_views(mem: &SyncedMemory) -> usize {
    view_counts(mem).1
}

/// `(read-only, writable)` views alive on `mem`.
pub fn view_counts(mem: &SyncedMemory) -> (usize, usize) {
    VIEWS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&key(mem)).map(|e| (e.read_only, e.writable)))
        .unwrap_or((0, 0))
}

/// Every buffer with live views.
pub fn live_views() -> Vec<(usize, ViewEntry)> {
    let mut v: Vec<(usize, ViewEntry)> = VIEWS
        .lock()
        .as_ref()
        .map(|m| m.iter().map(|(k, e)| (*k, e.clone())).collect())
        .unwrap_or_default();
    v.sort_by(|a, b| a.1.label.cmp(&b.1.label));
    v
}

fn register(t: &Tensor, mem: &SyncedMemory, writable: bool) {
    let mut guard = VIEWS.lock();
    let e = guard
        .get_or_insert_with(HashMap::new)
        .entry(key(mem))
        .or_insert_with(|| ViewEntry {
            label: mem.label().to_string(),
            device: t.target().map(|d| d.label().to_string()),
            bytes: mem.len(),
            read_only: 0,
            writable: 0,
        });
    if writable {
        e.writable += 1;
    } else {
        e.read_only += 1;
    }
}

fn unregister(k: usize, writable: bool) {
    let mut guard = VIEWS.lock();
    if let Some(m) = guard.as_mut() {
        if let Some(e) = m.get_mut(&k) {
            if writable {
                e.writable = e.writable.saturating_sub(1);
            } else {
                e.read_only = e.read_only.saturating_sub(1);
            }
            if e.read_only == 0 && e.writable == 0 {
                m.remove(&k);
            }
        }
    }
}

/// Runs `f` (device work) after `check` passed, with the gate held shared so that no writable
/// view can be made in between. Call it without the GIL.
pub fn device_section<R>(
    check: impl FnOnce() -> PyResult<()>,
    f: impl FnOnce() -> PyResult<R>,
) -> PyResult<R> {
    // Inside an operator function the running net holds the gate shared already: taken
    // again recursively, it never queues behind a writer waiting for the net.
    let _gate = if crate::reentry::running_op().is_some() {
        GATE.read_recursive()
    } else {
        GATE.read()
    };
    check()?;
    f()
}

/// The error for device access to a tensor with a writable view alive.
pub fn busy(what: &str, n: usize) -> PyErr {
    BusyError::new_err(format!(
        "{what} has {n} writable host view(s) alive (a NumPy array from numpy(writable=True) or \
         a DLPack export): device access would race with writes through it. Delete the view \
         (del array) first, or take a read-only view"
    ))
}

/// `BusyError` when `t`'s buffer has a writable view alive.
pub fn check_no_writable_view(t: &Tensor, what: &str) -> PyResult<()> {
    match t.synced().map(writable_views) {
        Some(n) if n > 0 => Err(busy(what, n)),
        _ => Ok(()),
    }
}

/// A tensor sharing `t`'s storage: it keeps the buffer alive.
pub fn share(t: &Tensor) -> syncmem::Result<Tensor> {
    let mut k = Tensor::on(t.target()).with_label(t.label());
    k.resize(t.dims())?;
    k.share_data(t)?;
    Ok(k)
}

/// A host view of a tensor's elements that keeps the buffer alive and its placement pinned.
pub struct HostView {
    keeper: Tensor,
    /// Keeps `ptr` the buffer's host memory: no spill, eviction or zero-copy re-sharing moves
    /// it while the view lives.
    _pin: Option<PlacementPin>,
    ptr: *mut u8,
    nbytes: usize,
    dims: Vec<usize>,
    dtype: DType,
    writable: bool,
}

// SAFETY: `ptr` is the host mirror of the buffer `keeper` keeps alive; it is only handed to
// NumPy or a DLPack consumer, which synchronise their own accesses. The rest is Send + Sync.
unsafe impl Send for HostView {}
// SAFETY: as above; `&HostView` gives no access to the bytes.
unsafe impl Sync for HostView {}

impl HostView {
    /// A view of the tensor in `blob` (named `what` in errors). Takes locks and may copy from
    /// the device: call it without the GIL.
    pub fn of_blob(blob: &BlobRef, what: &str, writable: bool) -> PyResult<HostView> {
        if writable {
            crate::reentry::check_writable_view(what)?;
        }
        let _gate = writable.then(|| GATE.write());
        let b = crate::reentry::read(blob, what)?;
        let t = b.get::<Tensor>().or_raise()?;
        Self::of_tensor(t, what, writable)
    }

    /// A read-only view of `t` (writable views are made by [`HostView::of_blob`], which holds
    /// the gate while it makes them).
    pub fn read_only(t: &Tensor, what: &str) -> PyResult<HostView> {
        Self::of_tensor(t, what, false)
    }

    fn of_tensor(t: &Tensor, what: &str, writable: bool) -> PyResult<HostView> {
        let dtype = t.dtype().ok_or_else(|| {
            InvalidStateError::new_err(format!("{what} has no element type yet (uninitialised)"))
        })?;
        if !dtype.is_pod() {
            return Err(TypeMismatchError::new_err(format!(
                "{what} holds str elements, which live in Python-less Rust strings: they have no \
                 host view (fetch_blob copies them)"
            )));
        }
        let keeper = share(t).or_raise()?;
        let nbytes = keeper.nbytes();
        // The pin first: the addresses it protects are the ones read after taking it.
        let pin = keeper.synced().map(SyncedMemory::pin_placement);
        let ptr = match keeper.synced() {
            Some(mem) if nbytes > 0 => {
                if writable {
                    let mut g = mem.host_mut().or_raise()?;
                    g.as_mut_ptr()
                } else {
                    let g = mem.host().or_raise()?;
                    g.as_ptr().cast_mut()
                }
            }
            _ => std::ptr::NonNull::dangling().as_ptr(),
        };
        if let Some(mem) = keeper.synced() {
            register(&keeper, mem, writable);
        }
        Ok(HostView {
            dims: keeper.dims().to_vec(),
            keeper,
            _pin: pin,
            ptr,
            nbytes,
            dtype,
            writable,
        })
    }

    /// Start of the elements.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The label of the buffer.
    pub fn label(&self) -> &str {
        self.keeper.label()
    }
}

impl Drop for HostView {
    fn drop(&mut self) {
        if let Some(mem) = self.keeper.synced() {
            unregister(key(mem), self.writable);
        }
    }
}

/// The owner of a NumPy view: the array's `base`. It keeps the buffer alive; when the last
/// array over it is gone, a writable view ends.
#[pyclass(module = "syncmem", name = "HostView", frozen)]
pub struct PyHostView {
    view: HostView,
}

#[pymethods]
impl PyHostView {
    /// True when the view is writable (device access raises while it lives).
    #[getter]
    fn writable(&self) -> bool {
        self.view.writable
    }

    /// Bytes of the elements.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.nbytes
    }

    /// The buffer's label (the blob name it was created for).
    #[getter]
    fn label(&self) -> &str {
        self.view.label()
    }

    fn __repr__(&self) -> String {
        format!(
            "<syncmem.HostView of {} ({} bytes, {})>",
            self.view.label(),
            self.view.nbytes,
            if self.view.writable {
                "writable"
            } else {
                "read-only"
            }
        )
    }
}

impl PyHostView {
    /// The Python object owning `view`: a NumPy array's `base`.
    pub fn wrap(py: Python<'_>, view: HostView) -> PyResult<Bound<'_, PyHostView>> {
        Bound::new(py, PyHostView { view })
    }

    /// The buffer's label.
    pub fn buffer_label(&self) -> &str {
        self.view.label()
    }
}

/// A NumPy array over `view`'s memory, owning the view through its `base`.
pub fn to_numpy(py: Python<'_>, view: HostView) -> PyResult<Bound<'_, PyAny>> {
    let what = format!("tensor {}", view.label());
    let descr = dtypes::numpy_descr(py, view.dtype, &what)?;
    let mut dims: Vec<npy_intp> = view
        .dims
        .iter()
        .map(|&d| npy_intp::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            to_py(syncmem::Error::SizeOverflow {
                what: format!("dims {:?} of {what} for NumPy", view.dims),
            })
        })?;
    let mut flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
    if view.writable {
        flags |= NPY_ARRAY_WRITEABLE;
    }
    let ptr = view.ptr;
    let owner = PyHostView::wrap(py, view)?;
    // SAFETY: `ptr` addresses the view's `nbytes` bytes, C-contiguous elements of `descr` with
    // `dims` (the host mirror, aligned for its type); the memory stays valid while `owner`
    // lives, and `owner` becomes the array's base below (or the array is dropped on error).
    // `PyArray_NewFromDescr` steals the reference to `descr`, `PyArray_SetBaseObject` the one
    // to `owner`.
    unsafe {
        let subtype = get_type_object(py, NpyTypes::PyArray_Type);
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            subtype,
            descr.into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            ptr.cast(),
            flags,
            std::ptr::null_mut(),
        );
        let arr = Bound::from_owned_ptr_or_err(py, raw)?;
        if PY_ARRAY_API.PyArray_SetBaseObject(py, raw.cast::<PyArrayObject>(), owner.into_ptr())
            != 0
        {
            return Err(PyErr::fetch(py));
        }
        Ok(arr)
    }
}
