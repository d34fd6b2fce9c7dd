//! `syncmem.Workspace`: Caffe2's workspace API with Python names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use syncmem::net::{NetDef, NetOptions};
use syncmem::{Device, Tensor, Workspace};

use crate::device::{device_arg, remember, PyDevice};
use crate::errors::{to_py, OrRaise};
use crate::tensor::PyTensor;
use crate::{arrays, reentry, views};

/// Most ancestors a workspace made from Python may have. Python frees a chain of parents one
/// C stack frame per workspace (50,000 nested `Workspace(parent)` crashed at exit); the library
/// itself walks and drops chains of any depth in loops.
const MAX_DEPTH: usize = 1000;

/// Workspaces made from Python, for the memory snapshot.
static LIVE: Mutex<Vec<(String, Weak<Workspace>)>> = Mutex::new(Vec::new());
/// Numbers the workspaces made without a name.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Every live workspace made from Python, with its name.
pub fn live() -> Vec<(String, Arc<Workspace>)> {
    let mut list = LIVE.lock();
    list.retain(|(_, w)| w.strong_count() > 0);
    list.iter()
        .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?)))
        .collect()
}

/// A workspace: named blobs (tensors), nets that run on them, and an optional parent whose
/// blobs it sees (Caffe2's `Workspace`).
///
/// `device` is where fed and loaded tensors are mirrored and nets run unless a call names
/// another (default `cpu`). A child made with `parent=` sees every blob of its parent it does
/// not define itself; with `blob_mapping={"local": "parent_name"}` it sees only those, under
/// local names. Long calls (`run_net`, `save`, `load`, feeding and fetching) release the GIL.
/// A workspace has at most 1000 ancestors (`ValueError` beyond).
#[pyclass(module = "syncmem", name = "Workspace", frozen)]
pub struct PyWorkspace {
    pub ws: Arc<Workspace>,
    name: String,
    device: Device,
    parent: Option<Py<PyWorkspace>>,
    /// Ancestors: 0 without a parent.
    depth: usize,
}

impl PyWorkspace {
    fn tensor_handle(&self, name: &str) -> PyResult<PyTensor> {
        // `Workspace::tensor` read-locks the blob to check its type: not one that a running
        // operator holds for writing (see `reentry`).
        if let Some(b) = self.ws.try_get_blob(name) {
            reentry::check(&b, false, &format!("blob {name:?}"))?;
        }
        let t = self.ws.tensor(name).or_raise()?;
        Ok(PyTensor {
            blob: t.blob().clone(),
            name: name.to_string(),
        })
    }

    /// `BusyError` when a tensor visible here has a writable host view alive. Takes each blob's
    /// read lock in turn: call it inside a device section, without the GIL.
    fn check_views(&self) -> PyResult<()> {
        // `blobs()`, not `tensor_blobs()`, which waits for every blob's lock.
        for name in self.ws.blobs() {
            if let Some(blob) = self.ws.try_get_blob(&name) {
                // A blob an operator running on this thread holds for writing is not one the
                // net uses (`run_net` checked): skip it rather than wait.
                let Ok(b) = crate::reentry::read(&blob, "") else {
                    continue;
                };
                if let Ok(t) = b.get::<Tensor>() {
                    views::check_no_writable_view(t, &format!("blob {name:?}"))?;
                }
            }
        }
        Ok(())
    }
}

fn net_def(py: Python<'_>, net: &Bound<'_, PyAny>) -> PyResult<NetDef> {
    let text: String = if let Ok(s) = net.cast::<PyString>() {
        s.to_cow()?.into_owned()
    } else if net.cast::<PyDict>().is_ok() {
        py.import("json")?
            .call_method1("dumps", (net,))?
            .extract()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "a net is a JSON string or a dict, not {}",
            net.get_type().name()?
        )));
    };
    NetDef::from_json(&text).or_raise()
}

#[pymethods]
impl PyWorkspace {
    #[new]
    #[pyo3(signature = (parent = None, *, device = None, blob_mapping = None, name = None))]
    fn py_new(
        parent: Option<Py<PyWorkspace>>,
        device: Option<&Bound<'_, PyAny>>,
        blob_mapping: Option<std::collections::BTreeMap<String, String>>,
        name: Option<String>,
    ) -> PyResult<Self> {
        let depth = parent.as_ref().map_or(0, |p| p.get().depth + 1);
        if depth > MAX_DEPTH {
            return Err(PyValueError::new_err(format!(
                "a workspace may have at most {MAX_DEPTH} ancestors; this one would have {depth}"
            )));
        }
        let parent_ws = parent.as_ref().map(|p| p.get().ws.clone());
        let default_dev = parent.as_ref().map(|p| p.get().device.clone());
        let device = device_arg(device, default_dev.as_ref())?;
        let ws = match (parent_ws, blob_mapping) {
            (Some(p), Some(map)) => {
                Workspace::with_forwarded(p, map.iter().map(|(l, t)| (l.as_str(), t.as_str())))
                    .or_raise()?
            }
            (Some(p), None) => Workspace::with_parent(p),
            (None, Some(_)) => {
                return Err(PyTypeError::new_err(
                    "blob_mapping needs a parent workspace",
                ))
            }
            (None, None) => Workspace::new(),
        };
        let name =
            name.unwrap_or_else(|| format!("workspace#{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let ws = Arc::new(ws);
        {
            let mut live = LIVE.lock();
            live.retain(|(_, w)| w.strong_count() > 0);
            live.push((name.clone(), Arc::downgrade(&ws)));
        }
        Ok(Self {
            ws,
            name,
            device,
            parent,
            depth,
        })
    }

    /// The workspace's name (in snapshots and reprs).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The default device of feeds, loads and nets.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice {
            dev: remember(self.device.clone()),
        }
    }

    /// The parent workspace, or `None`.
    #[getter]
    fn parent(&self, py: Python<'_>) -> Option<Py<PyWorkspace>> {
        self.parent.as_ref().map(|p| p.clone_ref(py))
    }

    /// Puts `value` in blob `name` as a tensor on `device` (the workspace's by default),
    /// replacing what the blob held (Caffe2's `FeedBlob`).
    ///
    /// `value` is a NumPy array, anything `numpy.asarray` accepts, or a `syncmem.Tensor`
    /// (whose buffer is then shared, not copied, when it is on the same device). With `copy`
    /// (the default) the elements are copied once into the host mirror.
    ///
    /// `copy=False` takes the array's memory over as the host mirror, without a copy: syncmem
    /// owns it from then on and frees it when the tensor and every array over it are gone.
    /// The array (and its base, when it is a view of all of it, such as `a.reshape(...)`)
    /// becomes a read-only view of the host mirror, like `tensor(name).numpy()`, and NumPy
    /// refuses to make it writable again (`setflags(write=True)` and resizing raise
    /// `ValueError`); write through `tensor(name).numpy(writable=True)` instead. It takes a
    /// C-contiguous, aligned, native-order array (`ShapeError` otherwise) that is writable and
    /// owns its memory, or views all of an array that does; it refuses (`InvalidStateError`)
    /// a view of part of an array (the rest of the base could still write it), memory NumPy
    /// does not own (`frombuffer`, `memmap`, DLPack imports), and memory that already belongs
    /// to a tensor (an array adopted before, `numpy()` views): feed those with `copy=True`, or
    /// share a tensor with `feed_blob(name, ws.tensor(other))`. Views of the array taken
    /// before the call (`v = a[1:]`) keep their own writable flag: NumPy does not track them,
    /// so do not write through them. Unsupported dtypes raise `TypeMismatchError`.
    #[pyo3(signature = (name, value, device = None, copy = true))]
    fn feed_blob(
        &self,
        py: Python<'_>,
        name: &str,
        value: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        copy: bool,
    ) -> PyResult<()> {
        let explicit = device.is_some_and(|d| !d.is_none());
        let dev = device_arg(device, Some(&self.device))?;
        let tensor = if let Ok(src) = value.cast::<PyTensor>() {
            let src = src.get();
            let dev = explicit.then_some(dev);
            src.read(py, |s| {
                let same = match (&dev, s.target()) {
                    (None, _) => true,
                    (Some(d), Some(t)) => d.same(t),
                    (Some(_), None) => false,
                };
                if same {
                    let mut t = views::share(s).or_raise()?;
                    t = t.with_label(name);
                    Ok(t)
                } else {
                    let mut t = Tensor::on(dev.as_ref()).with_label(name);
                    t.copy_from(s).or_raise()?;
                    Ok(t)
                }
            })?
        } else {
            arrays::tensor_from_value(py, value, name, &dev, copy)?
        };
        let ws = &self.ws;
        if let Some(b) = ws.try_get_blob(name) {
            reentry::check(&b, true, &format!("feed_blob({name:?})"))?;
        }
        py.detach(|| ws.feed(name, tensor)).or_raise()
    }

    /// A new NumPy array with the elements of blob `name` (Caffe2's `FetchBlob`), copied from
    /// whichever side is newest: straight from device memory when only the device is current.
    /// `bfloat16` comes back as `float32`, `str` tensors as object arrays. `copy=False` returns
    /// a read-only view of the host mirror instead (see `Tensor.numpy`).
    #[pyo3(signature = (name, copy = true))]
    fn fetch_blob<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        copy: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.tensor_handle(name)?;
        if copy {
            arrays::fetch(py, &t.blob, &format!("blob {name:?}"))
        } else {
            let what = format!("blob {name:?}");
            let view = py.detach(|| views::HostView::of_blob(&t.blob, &what, false))?;
            views::to_numpy(py, view)
        }
    }

    /// A handle to the tensor in blob `name` (`NotFoundError`, or `TypeMismatchError` when the
    /// blob holds no tensor).
    fn tensor(&self, name: &str) -> PyResult<PyTensor> {
        self.tensor_handle(name)
    }

    /// Every visible blob name, sorted: local, forwarded and the parent's.
    fn blobs(&self) -> Vec<String> {
        self.ws.blobs()
    }

    /// The names of this workspace's own blobs, sorted.
    fn local_blobs(&self) -> Vec<String> {
        self.ws.local_blobs()
    }

    /// True when a blob `name` is visible (here, forwarded, or in the parent).
    fn has_blob(&self, name: &str) -> bool {
        self.ws.has_blob(name)
    }

    fn __contains__(&self, name: &str) -> bool {
        self.ws.has_blob(name)
    }

    /// Creates an empty local blob `name` unless one is visible (Caffe2's `CreateBlob`).
    fn create_blob(&self, name: &str) -> PyResult<()> {
        self.ws.create_blob(name).map(drop).or_raise()
    }

    /// Removes the local blob `name`; returns whether there was one. Views and tensor
    /// handles of its tensor stay valid.
    fn remove_blob(&self, name: &str) -> bool {
        self.ws.remove_blob(name)
    }

    /// Renames the local blob `old` to `new` (`NotFoundError`, `AlreadyExistsError`).
    fn rename_blob(&self, old: &str, new: &str) -> PyResult<()> {
        self.ws.rename_blob(old, new).map(drop).or_raise()
    }

    /// Builds a net from a JSON string or a dict (`{"name": ..., "ops": [{"type": "Relu",
    /// "inputs": ["x"], "outputs": ["y"]}], ...}`) for `device` (the workspace's by default),
    /// registers it under its name and returns the name (Caffe2's `CreateNet`). Every operator
    /// is built before anything changes. `plan_memory` lets intermediate blobs share buffers.
    #[pyo3(signature = (net, device = None, overwrite = false, plan_memory = false, seed = None))]
    fn create_net(
        &self,
        py: Python<'_>,
        net: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        overwrite: bool,
        plan_memory: bool,
        seed: Option<u64>,
    ) -> PyResult<String> {
        let def = net_def(py, net)?;
        let dev = device_arg(device, Some(&self.device))?;
        let mut opts = NetOptions::new()
            .overwrite(overwrite)
            .plan_memory(plan_memory);
        if let Some(s) = seed {
            opts = opts.seed(s);
        }
        let ws = &self.ws;
        py.detach(|| ws.create_net(&def, &dev, &opts))
            .map(|n| n.name().to_string())
            .or_raise()
    }

    /// Runs the net `name` `num_iter` times (Caffe2's `RunNet`), with the GIL released.
    /// Raises `BusyError` (and runs nothing) while a tensor of the workspace has a writable
    /// host view alive; an operator's failure raises the class of its error, naming the net
    /// and the operator.
    #[pyo3(signature = (name, num_iter = 1))]
    fn run_net(&self, py: Python<'_>, name: &str, num_iter: usize) -> PyResult<()> {
        let net = self.ws.get_net(name).or_raise()?;
        let ws = &self.ws;
        reentry::check_names(
            &net.def().blob_names(),
            |n| ws.try_get_blob(n),
            &format!("run_net({name:?})"),
        )?;
        py.detach(|| {
            views::device_section(
                || self.check_views(),
                || {
                    for _ in 0..num_iter {
                        net.run(ws).map_err(to_py)?;
                    }
                    Ok(())
                },
            )
        })
    }

    /// Builds `net` for `device`, runs it once and discards it (Caffe2's `RunNetOnce`).
    #[pyo3(signature = (net, device = None))]
    fn run_net_once(
        &self,
        py: Python<'_>,
        net: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let def = net_def(py, net)?;
        let dev = device_arg(device, Some(&self.device))?;
        let ws = &self.ws;
        reentry::check_names(&def.blob_names(), |n| ws.try_get_blob(n), "run_net_once")?;
        py.detach(|| {
            views::device_section(
                || self.check_views(),
                || ws.run_net_once(&def, &dev, &NetOptions::new()).or_raise(),
            )
        })
    }

    /// Names of the registered nets, sorted.
    fn nets(&self) -> Vec<String> {
        self.ws.nets()
    }

    /// True when a net `name` is registered.
    fn has_net(&self, name: &str) -> bool {
        self.ws.has_net(name)
    }

    /// Unregisters the net `name`; returns whether there was one.
    fn delete_net(&self, name: &str) -> bool {
        self.ws.delete_net(name)
    }

    /// Writes the tensors `names` (all tensor blobs by default) to the safetensors file
    /// `path`; returns the names saved. The GIL is released meanwhile.
    #[pyo3(signature = (path, names = None))]
    fn save(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        names: Option<Vec<String>>,
    ) -> PyResult<Vec<String>> {
        let ws = &self.ws;
        let all = names.is_none().then(|| ws.blobs());
        let used = names.as_ref().or(all.as_ref()).into_iter().flatten();
        reentry::check_names(used, |n| ws.try_get_blob(n), "save")?;
        py.detach(|| {
            // Saving reads the host side (a device-to-host copy at most): the gate keeps a
            // writable view from being made in the middle.
            views::device_section(
                || Ok(()),
                || {
                    let refs: Option<Vec<&str>> = names
                        .as_ref()
                        .map(|v| v.iter().map(String::as_str).collect());
                    ws.save(&path, refs.as_deref()).or_raise()
                },
            )
        })
    }

    /// Reads the tensors `names` (all by default) of the safetensors file `path` onto
    /// `device` (the workspace's by default), replacing the blobs of those names; returns the
    /// names loaded. The whole file is checked before the workspace changes.
    #[pyo3(signature = (path, names = None, device = None))]
    fn load(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        names: Option<Vec<String>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<String>> {
        let dev = device_arg(device, Some(&self.device))?;
        let ws = &self.ws;
        // Without names the file's are unknown here: any blob may be replaced.
        let all = names.is_none().then(|| ws.blobs());
        let replaced = names.as_ref().or(all.as_ref()).into_iter().flatten();
        reentry::check_names(replaced, |n| ws.try_get_blob(n), "load")?;
        py.detach(|| {
            let refs: Option<Vec<&str>> = names
                .as_ref()
                .map(|v| v.iter().map(String::as_str).collect());
            ws.load(&path, Some(&dev), refs.as_deref())
        })
        .or_raise()
    }

    /// Removes every local blob and every net (Caffe2's `ResetWorkspace` on this workspace).
    fn clear(&self) {
        for n in self.ws.nets() {
            self.ws.delete_net(&n);
        }
        for b in self.ws.local_blobs() {
            self.ws.remove_blob(&b);
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<syncmem.Workspace {:?} on {}: {} blob(s), {} net(s){}>",
            self.name,
            self.device.label(),
            self.ws.blobs().len(),
            self.ws.nets().len(),
            if self.parent.is_some() {
                ", with a parent"
            } else {
                ""
            }
        )
    }
}
