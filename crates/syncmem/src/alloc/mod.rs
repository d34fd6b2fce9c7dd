//! Raw allocation, caching pools and statistics.
//!
//! - [`HostBlock`]: aligned, zeroed host memory (the host allocator).
//! - [`pool`]: caching pools (PyTorch-style best fit, CUB-style bins, or none) for host memory,
//!   pinned host memory and device memory, with statistics, a memory cap and the
//!   out-of-memory path; [`pool::summary`] prints a pool's statistics as
//!   `torch.cuda.memory_summary()` does, and [`pool::snapshot`] lists every segment and block
//!   with its owner ([`crate::memory_snapshot`]).
//! - Pinned host and device memory come from [`crate::Device::alloc_pinned`] and
//!   [`crate::Device::alloc`] (direct) or from the device's pools.
//! - [`trace`]: record allocations, frees, copies and evictions per device ([`Trace`],
//!   [`Trace::attach`]), save/load them as JSON lines, replay them against any pool
//!   configuration ([`trace::replay_with`]).
//! - [`stats`]: always-on counters, read with [`crate::stats`]; every reading derives
//!   `serde::Serialize` (`to_json()` for a string).

mod host;
pub mod pairs;
pub mod pool;
pub mod stats;
pub(crate) mod thread;
pub mod trace;

pub use host::{HostBlock, HOST_ALIGN};
pub use trace::{replay, ReplayReport, Trace, TraceEvent, TraceGuard};
