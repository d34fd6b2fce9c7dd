//! `syncmem.Tensor`: a handle to the tensor in a blob.

use std::sync::Arc;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use syncmem::workspace::BlobRef;
use syncmem::{Blob, CopyStats, Tensor};

use crate::device::{remember, PyDevice};
use crate::errors::OrRaise;
use crate::{arrays, dlpack, dtypes, views};

/// A tensor held in a blob: a workspace's (from `Workspace.tensor(name)`), or its own (from
/// `syncmem.from_dlpack`). The handle follows the blob: after `feed_blob` replaces the blob's
/// tensor, it sees the new one.
///
/// `numpy()` and `__array__` give live NumPy views of the host memory without copying
/// (`numpy(copy=True)` a snapshot); `__dlpack__`
/// exports host tensors to any DLPack consumer (`numpy.from_dlpack`, `torch.from_dlpack`), and
/// device tensors as their device memory (OpenCL `cl_mem`, CUDA device pointer).
/// A view keeps the buffer alive after the tensor, its blob and its workspace are gone.
#[pyclass(module = "syncmem", name = "Tensor", frozen)]
pub struct PyTensor {
    pub blob: BlobRef,
    pub name: String,
}

impl PyTensor {
    /// A handle to a tensor of its own, in a fresh blob.
    pub fn standalone(t: Tensor) -> PyTensor {
        let name = t.label().to_string();
        let mut blob = Blob::new();
        blob.reset(t);
        PyTensor {
            blob: Arc::new(RwLock::new(blob)),
            name,
        }
    }

    /// How errors name it.
    pub fn what(&self) -> String {
        format!("tensor {:?}", self.name)
    }

    /// Runs `f` on the tensor under the blob's read lock, with the GIL released.
    pub fn read<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Tensor) -> PyResult<R> + Send,
    ) -> PyResult<R> {
        let blob = &self.blob;
        let what = self.what();
        py.detach(|| {
            let b = crate::reentry::read(blob, &what)?;
            f(b.get::<Tensor>().or_raise()?)
        })
    }
}

/// A copy-statistics dict: `{"host_to_device": {"count": n, "bytes": b}, ...}`.
pub fn copy_stats_dict(py: Python<'_>, c: &CopyStats) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    for (name, dir) in [
        ("host_to_device", c.host_to_device),
        ("device_to_host", c.device_to_host),
        ("device_to_device", c.device_to_device),
        ("mapped", c.mapped),
        ("spilled", c.spilled),
        ("refilled", c.refilled),
    ] {
        let e = PyDict::new(py);
        e.set_item("count", dir.count)?;
        e.set_item("bytes", dir.bytes)?;
        d.set_item(name, e)?;
    }
    Ok(d.into_any().unbind())
}

#[pymethods]
impl PyTensor {
    /// The blob name (or label) of the tensor.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The dims, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let dims = self.read(py, |t| Ok(t.dims().to_vec()))?;
        PyTuple::new(py, dims)
    }

    /// Number of dims.
    #[getter]
    fn ndim(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| Ok(t.ndim()))
    }

    /// Number of elements (0 for an uninitialised tensor).
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| Ok(t.numel().unwrap_or(0)))
    }

    /// Bytes of the elements.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |t| Ok(t.nbytes()))
    }

    /// The element type's name (NumPy's names, `bfloat16`, `str`), or `None` before one is set.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.read(py, |t| Ok(t.dtype().map(dtypes::name)))
    }

    /// The device the tensor is mirrored on, or `None` for a host-only tensor.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<Option<PyDevice>> {
        let dev = self.read(py, |t| Ok(t.target().cloned()))?;
        Ok(dev.map(|d| PyDevice { dev: remember(d) }))
    }

    /// Which mirror holds the newest data: `"uninitialized"`, `"host"`, `"device"` or
    /// `"synced"`; `None` without storage.
    #[getter]
    fn head(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.read(py, |t| Ok(t.head().map(|h| h.as_str())))
    }

    /// Copies between host and device made by this tensor's buffer, by direction.
    fn copy_stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let c = self.read(py, |t| Ok(t.copy_stats()))?;
        copy_stats_dict(py, &c)
    }

    /// A NumPy view of the tensor's host memory, without copying; it keeps the buffer alive
    /// and its memory where it is (no spill or eviction moves it while the view lives).
    ///
    /// A view is live, not a snapshot: it shows the buffer's host memory as it is now. Without
    /// zero copy that is the host mirror, which shows device writes once the host is read
    /// again (another `numpy()`, `fetch_blob`). With zero copy (the default on `cpu` and PoCL)
    /// it is the device memory itself, which kernels and nets write in place, so a read-only
    /// view changes as they write. `copy=True` returns a snapshot instead: a new array, the
    /// tensor's elements now (as `fetch_blob`).
    ///
    /// Read-only (the default): the host is made current once (one device-to-host copy when
    /// the device is newer).
    ///
    /// `writable=True`: the host becomes the head, and while the view (or any array made from
    /// it) lives, device access to this buffer raises `BusyError`, since it would race with
    /// writes through the view. Delete the array to end it. With `copy=True` the copy is a
    /// new writable array and `writable` changes nothing.
    #[pyo3(signature = (writable = false, copy = false))]
    fn numpy<'py>(
        &self,
        py: Python<'py>,
        writable: bool,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let what = self.what();
        if copy {
            return arrays::fetch(py, &self.blob, &what);
        }
        let view = py.detach(|| views::HostView::of_blob(&self.blob, &what, writable))?;
        views::to_numpy(py, view)
    }

    /// NumPy's conversion hook: `numpy.asarray(t)` is a read-only view (see `numpy()`);
    /// `copy=True` or another `dtype` give a copy.
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let arr = if copy == Some(true) {
            arrays::fetch(py, &self.blob, &self.what())?
        } else {
            self.numpy(py, false, false)?
        };
        match dtype {
            Some(d) if !d.is_none() => {
                let kwargs = PyDict::new(py);
                kwargs.set_item("copy", false)?;
                arr.call_method("astype", (d,), Some(&kwargs))
            }
            _ => Ok(arr),
        }
    }

    /// Makes the device mirror current (one host-to-device copy when the host is newer).
    /// Raises `BusyError` while a writable host view is alive, `DeviceError` for a host-only
    /// tensor.
    fn to_device(&self, py: Python<'_>) -> PyResult<()> {
        let what = self.what();
        let blob = &self.blob;
        // The gate first, then the blob's lock: the order every path here takes them in.
        py.detach(|| {
            views::device_section(
                || Ok(()),
                || {
                    let b = crate::reentry::read(blob, &what)?;
                    let t = b.get::<Tensor>().or_raise()?;
                    views::check_no_writable_view(t, &what)?;
                    match t.synced() {
                        Some(mem) if t.nbytes() > 0 => mem.device().map(drop).or_raise(),
                        None if t.target().is_none() => {
                            Err(crate::errors::to_py(syncmem::Error::NoDevice {
                                buffer: what.clone(),
                            }))
                        }
                        _ => Ok(()),
                    }
                },
            )
        })
    }

    /// DLPack export without copying: of the host mirror for a host-only or `cpu` tensor (see
    /// `syncmem.from_dlpack`), of the device memory for an OpenCL or CUDA tensor (`data` the
    /// `cl_mem` or the device pointer; the device copy is taken for writing, its work waited
    /// for unless `stream=-1`).
    ///
    /// The export is writable: until the consumer releases it, device access to the buffer
    /// raises `BusyError`, and the buffer stays where it is (never spilled). `copy=True`
    /// exports a copy instead, on the same device; with `dl_device=(1, 0)` (`kDLCPU`) a device
    /// tensor exports a host copy (one device-to-host copy), as
    /// `numpy.from_dlpack(t, device="cpu", copy=True)` asks. Any other `dl_device` than the
    /// tensor's raises `BufferError`.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        dlpack::export(py, self, stream, max_version, dl_device, copy)
    }

    /// `(device_type, device_id)` as DLPack names them: `(1, 0)` (`kDLCPU`) for host-only and
    /// `cpu` tensors, `(4, N)` (`kDLOpenCL`) and `(2, N)` (`kDLCUDA`) for device tensors.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let dev = self.read(py, |t| Ok(t.target().cloned()))?;
        Ok(dlpack::device_of(dev.as_ref()))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let dims = self.read(py, |t| Ok(t.dims().to_vec()))?;
        dims.first()
            .copied()
            .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        self.read(py, |t| Ok(format!("<syncmem.{}>", t.debug_string())))
    }
}
