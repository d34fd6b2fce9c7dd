//! `memory_snapshot(format="torch")`: the pools of the process in PyTorch's snapshot format.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syncmem::report::torch::TorchSnapshot;

/// Every segment and block of every pool now, as the pickle (protocol 3) of the dict that
/// `torch.cuda.memory._snapshot()` returns: `segments` (each with `device`, `address`,
/// `total_size`, `stream`, `segment_type`, `blocks` of `size`, `requested_size`, `state`,
/// `frames` naming the owner), `device_traces` (one empty list per pool: no history is
/// recorded here) and `device_labels` (the pool of each device ordinal). `syncmem`'s
/// `memory_snapshot(format="torch")` unpickles it.
#[pyfunction]
pub fn torch_snapshot_pickle(py: Python<'_>) -> Bound<'_, PyBytes> {
    let bytes = py.detach(|| TorchSnapshot::from_snapshot(&syncmem::memory_snapshot()).to_pickle());
    PyBytes::new(py, &bytes)
}
