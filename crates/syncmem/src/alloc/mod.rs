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
//! - What pools report: a [`pool::PoolEvent`] for each allocation, free, segment, eviction and
//!   out-of-memory failure, seen by the [`pool::PoolObserver`] of one pool; the process's own
//!   pools and streams also publish them, with their copies, to the sinks a higher layer
//!   attaches (traces that record, save and replay them).
//! - [`stats`]: always-on counters, read with [`crate::stats`] (one [`Snapshot`] of them all
//!   and of every pool); every reading derives `serde::Serialize` (`to_json()` for a string).

pub(crate) mod event;
mod host;
pub mod pairs;
pub mod pool;
mod reading;
pub(crate) mod ring;
pub mod stats;
pub(crate) mod thread;

pub use host::{HostBlock, HOST_ALIGN};
pub use reading::Snapshot;
