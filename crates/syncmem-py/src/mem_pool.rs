//! `syncmem.MemPool` and `syncmem.use_mem_pool(pool)`: a private pool of one device, and the
//! context manager that routes the calling thread's allocations on that device to it (as
//! `torch.cuda.MemPool` and `torch.cuda.use_mem_pool`).

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use syncmem::{MemPool, MemPoolScope, PoolConfig, PoolKind};

use crate::device::{device_arg, PyDevice};
use crate::errors::{InvalidStateError, OrRaise};

/// A private memory pool of one device: while a `with syncmem.use_mem_pool(pool):` block runs,
/// the device memory the calling thread allocates on `pool.device` (tensors' device mirrors)
/// comes from it, and nothing else does (other threads, other devices, code outside the
/// block).
///
/// `MemPool(device=None, conf=None, kind=None)`: `device` a `Device` or a string (`"cpu"` by
/// default); `conf` a `key=value` list as `SYNCMEM_POOL_CONF` takes (`"memory_cap=64MiB,
/// preallocate=50%,gc_threshold=0.8"`: a cap of the pool's own below the device's, memory
/// reserved at once, idle segments given back above a fraction of the cap); `kind`
/// `"caching"` (the default), `"binned"` or `"none"`. A bad setting raises `ConfigError`.
///
/// A block goes back to the pool it came from whenever it is freed. `stats()` gives the pool's
/// own statistics; `release()` (or the object's end) gives its cached memory back to the
/// device at once, while memory still in use stays until its tensors free it.
#[pyclass(module = "syncmem", name = "MemPool", frozen)]
pub struct PyMemPool {
    /// `None` once released.
    pool: Mutex<Option<MemPool>>,
    label: String,
    device: syncmem::Device,
}

impl PyMemPool {
    /// Runs `f` on the pool, or raises `InvalidStateError` once it was released.
    fn with<T>(&self, f: impl FnOnce(&MemPool) -> T) -> PyResult<T> {
        match &*self.pool.lock() {
            Some(p) => Ok(f(p)),
            None => Err(InvalidStateError::new_err(format!(
                "memory pool {} of {} was released",
                self.label,
                self.device.label()
            ))),
        }
    }
}

#[pymethods]
impl PyMemPool {
    #[new]
    #[pyo3(signature = (device = None, conf = None, kind = None))]
    fn py_new(
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        conf: Option<&str>,
        kind: Option<&str>,
    ) -> PyResult<Self> {
        let dev = device_arg(device, None)?;
        let kind: PoolKind = kind.unwrap_or("caching").parse().or_raise()?;
        let config = PoolConfig::new(kind).apply(conf.unwrap_or("")).or_raise()?;
        let d = dev.clone();
        let pool = py.detach(move || MemPool::new(&d, config)).or_raise()?;
        Ok(Self {
            label: pool.label().to_string(),
            pool: Mutex::new(Some(pool)),
            device: dev,
        })
    }

    /// The pool's label, `"DEVICE mempool N"`.
    #[getter]
    fn label(&self) -> &str {
        &self.label
    }

    /// The device whose memory the pool holds.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice {
            dev: self.device.clone(),
        }
    }

    /// The pool's statistics as a dict: `allocated`, `requested`, `reserved` (each with
    /// `current`, `peak`, `allocated`, `freed`), `allocations`, `frees`, `cache_hits`,
    /// `backend_allocs`, `backend_frees`, `ooms`, `preallocated_bytes`, `gc_releases`,
    /// `gc_released_bytes`, `cap`, `fragmentation`, ... (the library's `PoolStats`).
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let json = self.with(|p| p.stats().to_json())?;
        Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
    }

    /// Every segment of the pool and every block in it, as `pool_snapshot()` lists a pool:
    /// `{"label", "kind", "stats", "segments": [...]}`.
    fn snapshot(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let json = self.with(|p| syncmem::MemorySnapshot::new(vec![p.snapshot()]).to_json())?;
        let all = py.import("json")?.call_method1("loads", (json,))?;
        Ok(all.get_item("pools")?.get_item(0)?.unbind())
    }

    /// Gives the pool's cached free memory back to the device (waiting for work queued on
    /// it); returns the bytes released. The pool stays usable.
    fn empty_cache(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.with(MemPool::empty_cache))
    }

    /// Lets the pool go: its cached memory goes back to the device now (returns the bytes),
    /// memory still in use when its tensors free it. Using the pool afterwards raises
    /// `InvalidStateError`; a `use_mem_pool` block still open keeps it until it ends.
    fn release(&self, py: Python<'_>) -> u64 {
        let pool = self.pool.lock().take();
        py.detach(move || pool.map_or(0, MemPool::release))
    }

    fn __repr__(&self) -> String {
        format!("syncmem.MemPool('{}')", self.label)
    }
}

/// The context manager of `use_mem_pool(pool)`: the scope it opens belongs to the thread that
/// entered it.
#[pyclass(module = "syncmem", name = "MemPoolContext", unsendable)]
pub struct PyMemPoolContext {
    pool: Py<PyMemPool>,
    scopes: Vec<MemPoolScope>,
}

#[pymethods]
impl PyMemPoolContext {
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let scope = slf.borrow().pool.get().with(MemPool::scope)?;
        slf.borrow_mut().scopes.push(scope);
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        match self.scopes.pop() {
            Some(scope) => {
                drop(scope);
                Ok(false)
            }
            None => Err(PyRuntimeError::new_err(
                "use_mem_pool: __exit__ without a matching __enter__",
            )),
        }
    }

    /// The pool the block routes to.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyMemPool> {
        self.pool.clone_ref(py)
    }
}

/// `with syncmem.use_mem_pool(pool):` routes the device memory the calling thread allocates on
/// `pool.device` inside the block to `pool` (blocks nest; the innermost wins). Other threads
/// are not affected. Returns the context manager; `as` gives it, with the pool in `.pool`.
#[pyfunction]
pub fn use_mem_pool(pool: Bound<'_, PyMemPool>) -> PyMemPoolContext {
    PyMemPoolContext {
        pool: pool.unbind(),
        scopes: Vec::new(),
    }
}
