//! `syncmem.Device` and `syncmem.devices()`.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyString;
use syncmem::{BackendKind, Device, ZeroCopy};

use crate::errors::{DeviceError, OrRaise};

/// Devices opened from Python, for the statistics and snapshots that list them.
static OPENED: Mutex<Vec<Device>> = Mutex::new(Vec::new());

/// Remembers `dev` as opened (once per device) and returns it.
pub fn remember(dev: Device) -> Device {
    let mut list = OPENED.lock();
    if !list.iter().any(|d| d.same(&dev)) {
        list.push(dev.clone());
    }
    dev
}

/// Every device opened from Python so far, `cpu` first.
pub fn opened() -> Vec<Device> {
    let mut list = OPENED.lock().clone();
    list.sort_by_key(|d| (d.backend() != BackendKind::Cpu, d.label().to_string()));
    list
}

/// Opens a device from its string (`cpu`, `opencl:0`, `cuda:0`).
pub fn open(spec: &str) -> PyResult<Device> {
    Device::open(spec).or_raise().map(remember)
}

/// A device given as a `Device`, a string, or `None` (then `default`).
pub fn device_arg(arg: Option<&Bound<'_, PyAny>>, default: Option<&Device>) -> PyResult<Device> {
    match arg {
        None => Ok(default.cloned().unwrap_or_else(|| remember(Device::cpu()))),
        Some(a) if a.is_none() => Ok(default.cloned().unwrap_or_else(|| remember(Device::cpu()))),
        Some(a) => {
            if let Ok(d) = a.cast::<PyDevice>() {
                return Ok(d.get().dev.clone());
            }
            if let Ok(s) = a.cast::<PyString>() {
                return open(&s.to_cow()?);
            }
            Err(DeviceError::new_err(format!(
                "a device is a syncmem.Device or a string such as 'cpu' or 'opencl:0', not {}",
                a.get_type().name()?
            )))
        }
    }
}

/// A compute device: `cpu`, `opencl:N` or `cuda:N`.
///
/// `Device("opencl:0")` opens the device (discovering the backend's devices once per
/// process); a malformed string, a backend whose runtime is missing or an index too large
/// raises `DeviceError`. Two `Device` objects of the same string are equal and share the same
/// memory pools and counters.
#[pyclass(module = "syncmem", name = "Device", frozen)]
pub struct PyDevice {
    pub dev: Device,
}

#[pymethods]
impl PyDevice {
    #[new]
    fn py_new(spec: &str) -> PyResult<Self> {
        Ok(Self { dev: open(spec)? })
    }

    /// The backend: `"cpu"`, `"opencl"` or `"cuda"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.dev.backend().as_str()
    }

    /// Index among the devices of the backend (0 for `cpu`).
    #[getter]
    fn index(&self) -> usize {
        self.dev.info().ordinal
    }

    /// Device name as the runtime reports it.
    #[getter]
    fn name(&self) -> String {
        self.dev.info().name.clone()
    }

    /// Vendor or platform name.
    #[getter]
    fn vendor(&self) -> String {
        self.dev.info().vendor.clone()
    }

    /// Total device memory in bytes.
    #[getter]
    fn total_memory(&self) -> u64 {
        self.dev.info().total_memory
    }

    /// Largest single allocation the device accepts, in bytes.
    #[getter]
    fn max_alloc(&self) -> u64 {
        self.dev.info().max_alloc
    }

    /// True when device memory is host memory (CPU OpenCL drivers, integrated GPUs).
    #[getter]
    fn host_unified(&self) -> bool {
        self.dev.info().host_unified
    }

    /// The memory cap of the device's pool in bytes, or `None`.
    #[getter]
    fn memory_cap(&self) -> Option<u64> {
        self.dev.memory_cap()
    }

    /// The zero-copy setting: `"auto"` (the default, or `SYNCMEM_ZERO_COPY`'s value), `"off"`
    /// or `"map"`. Where the device's memory is host memory (`cpu`, PoCL, integrated GPUs) a
    /// tensor then keeps one allocation for both sides and nothing is copied between them.
    /// Setting it (`dev.zero_copy = "off"`) applies to the tensors whose memory is allocated
    /// from then on. The values are exactly `auto`, `off` and `map`, in any case, as for
    /// `SYNCMEM_ZERO_COPY`: any other (blanks, `on`, `1`, `0`, `""`) raises `ConfigError`.
    #[getter]
    fn zero_copy(&self) -> &'static str {
        self.dev.zero_copy().as_str()
    }

    #[setter]
    fn set_zero_copy(&self, setting: &str) -> PyResult<()> {
        let z: ZeroCopy = setting.parse().or_raise()?;
        self.dev.set_zero_copy(z);
        Ok(())
    }

    /// How host and device share a tensor's memory under the current setting: `"in-place"`
    /// (the host uses the device memory directly), `"map"` (the host maps and unmaps it), or
    /// `None` (two copies, as on a discrete GPU or with zero-copy off).
    #[getter]
    fn zero_copy_protocol(&self) -> Option<&'static str> {
        self.dev.zero_copy_protocol().map(|p| p.as_str())
    }

    /// Waits until every command queued on the device's default stream is done (the GIL is
    /// released meanwhile).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let dev = self.dev.clone();
        py.detach(move || dev.synchronize()).or_raise()
    }

    /// Gives the cached free blocks of the device's pools back to the backend; returns the
    /// bytes released.
    fn empty_cache(&self, py: Python<'_>) -> u64 {
        let dev = self.dev.clone();
        py.detach(move || dev.empty_cache())
    }

    fn __str__(&self) -> String {
        self.dev.label().to_string()
    }

    fn __repr__(&self) -> String {
        format!("syncmem.Device('{}')", self.dev.label())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyDevice>() {
            Ok(o) => o.get().dev.same(&self.dev),
            Err(_) => other
                .extract::<String>()
                .is_ok_and(|s| s.trim().eq_ignore_ascii_case(self.dev.label())),
        }
    }

    /// The hash of the device string, so that a `Device` and its string are the same key.
    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        PyString::new(py, self.dev.label()).hash()
    }
}

/// Every device that can be opened: `cpu`, then each OpenCL and CUDA device found. A backend
/// whose runtime is missing contributes no device (see `syncmem.backends()` for why).
#[pyfunction]
pub fn devices(py: Python<'_>) -> PyResult<Vec<PyDevice>> {
    let found: Vec<Device> = py.detach(|| {
        let mut v = vec![Device::cpu()];
        for b in [BackendKind::OpenCl, BackendKind::Cuda] {
            v.extend(Device::all(b).unwrap_or_default());
        }
        v
    });
    Ok(found
        .into_iter()
        .map(|d| PyDevice { dev: remember(d) })
        .collect())
}

/// Each backend: whether it is compiled in, and its devices or why there are none. A list of
/// dicts with keys `backend`, `compiled`, `devices` (a list of device strings) and `error`
/// (`None`, or the reason no device could be listed).
#[pyfunction]
pub fn backends(py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
    let reports = py.detach(syncmem::device::probe);
    reports
        .into_iter()
        .map(|r| {
            let d = pyo3::types::PyDict::new(py);
            d.set_item("backend", r.backend.as_str())?;
            d.set_item("compiled", r.compiled)?;
            match r.devices {
                Ok(list) => {
                    let labels: Vec<String> = list.iter().map(|i| i.label()).collect();
                    d.set_item("devices", labels)?;
                    d.set_item("error", py.None())?;
                }
                Err(e) => {
                    d.set_item("devices", Vec::<String>::new())?;
                    d.set_item("error", e)?;
                }
            }
            Ok(d.into_any().unbind())
        })
        .collect()
}
