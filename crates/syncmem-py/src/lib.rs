//! The native module `syncmem._native` of the Python package `syncmem`: Caffe2's workspace
//! API over syncmem, NumPy views and DLPack exchange without copies, and PyTorch-style memory
//! statistics. The package's `__init__.py` re-exports it and adds the module-level default
//! workspace.
//!
//! | module | role |
//! |---|---|
//! | `errors` | one Python exception class per kind of library error |
//! | `device` | `Device`, `devices()`, `backends()` |
//! | `workspace` | `Workspace`: blobs, feed and fetch, nets, save and load |
//! | `tensor` | `Tensor`: a handle to a blob's tensor, NumPy and DLPack hooks |
//! | `arrays` | NumPy arrays into tensors and back (one copy, or none) |
//! | `views` | host views that keep the buffer alive; the writable-view guard |
//! | `dlpack` | DLPack export and import |
//! | `mem_pool` | `MemPool` and `use_mem_pool`: a private pool of one device, routed to inside a `with` block |
//! | `stats` | `memory_stats` (its keys in one table), `memory_allocated` and the other `torch.cuda` functions, `copy_stats` |
//! | `report` | `memory_summary`, `memory_snapshot`, `pool_snapshot` |
//! | `history` | `record_memory_history`, `memory_history`, `on_out_of_memory` and its `OomObserver` |
//! | `torch_snapshot` | the pools in PyTorch's snapshot format (`memory_snapshot(format="torch")`) |
//! | `raw_kernel` | `RawKernel`: kernels from OpenCL C or CUDA C source, called as CuPy's |
//! | `operators` | `register_operator`: operator types run by a Python function (`cpu`) |
//! | `reentry` | calls from inside an operator function: `BusyError` instead of waiting on the run's own locks |
//!
//! No Rust panic crosses into Python: PyO3 turns a panic inside a call into an exception, and
//! the library returns errors rather than panicking; the DLPack deleters, called from C, catch
//! unwinding themselves.

use pyo3::prelude::*;

mod arrays;
mod device;
mod dlpack;
mod dtypes;
mod errors;
mod history;
mod mem_pool;
mod operators;
mod raw_kernel;
mod reentry;
mod report;
mod stats;
mod tensor;
mod torch_snapshot;
mod views;
mod workspace;

/// The operator types a net can use (`"FC"`, `"Relu"`, `"ConstantFill"`, ...).
#[pyfunction]
fn operator_types() -> Vec<&'static str> {
    syncmem::ops::registered_types()
}

/// The native part of the `syncmem` package: workspaces, tensors, devices, DLPack and memory
/// statistics (import `syncmem`, which re-exports all of it).
#[pymodule]
#[pyo3(name = "_native")]
fn syncmem_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    syncmem_nn::register_operators().map_err(errors::to_py)?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<workspace::PyWorkspace>()?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<views::PyHostView>()?;
    m.add_class::<mem_pool::PyMemPool>()?;
    m.add_class::<mem_pool::PyMemPoolContext>()?;
    m.add_function(wrap_pyfunction!(mem_pool::use_mem_pool, m)?)?;
    m.add_function(wrap_pyfunction!(device::devices, m)?)?;
    m.add_function(wrap_pyfunction!(device::backends, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(stats::max_memory_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_reserved, m)?)?;
    m.add_function(wrap_pyfunction!(stats::max_memory_reserved, m)?)?;
    m.add_function(wrap_pyfunction!(report::memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(history::record_memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(history::memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(history::on_out_of_memory, m)?)?;
    m.add_class::<history::PyOomObserver>()?;
    m.add_function(wrap_pyfunction!(report::memory_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(report::pool_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(stats::copy_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_snapshot::torch_snapshot_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(stats::empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(stats::reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(operator_types, m)?)?;
    m.add_class::<raw_kernel::PyRawKernel>()?;
    m.add_function(wrap_pyfunction!(operators::register_operator, m)?)?;
    Ok(())
}
