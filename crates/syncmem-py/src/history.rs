//! The always-on history and out-of-memory observers: `record_memory_history(max_entries)`,
//! `memory_history()` and `on_out_of_memory(callable)`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syncmem::device::{on_out_of_memory as register, OomObserverHandle};
use syncmem::report::{current_history, record_history};
use syncmem::{Error, OomReport};

/// Keeps the newest `max_entries` events of every device (PyTorch's
/// `torch.cuda.memory._record_memory_history(max_entries=N)`); `None` or 0 stops.
#[pyfunction]
#[pyo3(signature = (max_entries = None))]
pub fn record_memory_history(max_entries: Option<usize>) {
    record_history(max_entries);
}

/// The events the history keeps now, as the JSON lines of a trace file (what `syncmem trace
/// view` and `syncmem trace export-torch` read), or `None` while no history records.
#[pyfunction]
pub fn memory_history(py: Python<'_>) -> PyResult<Option<String>> {
    let Some(h) = current_history() else {
        return Ok(None);
    };
    let mut out = Vec::new();
    py.detach(|| h.trace().save(&mut out))
        .map_err(crate::errors::to_py)?;
    Ok(Some(String::from_utf8_lossy(&out).into_owned()))
}

/// A callable registered by `on_out_of_memory`; `remove()` (or leaving its `with` block)
/// unregisters it.
#[pyclass(name = "OomObserver", module = "syncmem._native")]
pub struct PyOomObserver {
    handle: Mutex<Option<OomObserverHandle>>,
}

#[pymethods]
impl PyOomObserver {
    /// Unregisters the callable (again: nothing).
    fn remove(&self) {
        self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &self,
        _kind: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.remove();
        false
    }
}

/// The report as a dict: `device`, `requested`, `purpose`, `cause`, `cap`, `allocated`,
/// `reserved`, `holders` (a list of `(label, bytes)`) and `message` (the error's text).
fn report_dict<'py>(py: Python<'py>, r: &OomReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("device", &r.device)?;
    d.set_item("requested", r.requested)?;
    d.set_item("purpose", r.purpose.as_deref())?;
    d.set_item("cause", &r.cause)?;
    d.set_item("cap", r.cap)?;
    d.set_item("allocated", r.allocated)?;
    d.set_item("reserved", r.reserved)?;
    d.set_item("holders", r.holders.clone())?;
    d.set_item("message", Error::from(r.clone()).to_string())?;
    Ok(d)
}

/// Calls `callable(report)` each time a device allocation fails for lack of memory, before
/// the `OutOfMemoryError` is raised (`report`: a dict, see the package's docs). An exception
/// the callable raises is reported as unraisable and does not replace the error.
#[pyfunction]
pub fn on_out_of_memory(callable: Py<PyAny>) -> PyOomObserver {
    let handle = register(move |report| {
        Python::attach(|py| {
            let called = report_dict(py, report).and_then(|d| callable.call1(py, (d,)));
            if let Err(e) = called {
                e.write_unraisable(py, None);
            }
        });
    });
    PyOomObserver {
        handle: Mutex::new(Some(handle)),
    }
}
