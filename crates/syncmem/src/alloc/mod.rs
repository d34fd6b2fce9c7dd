//! Raw allocation and statistics.
//!
//! - [`HostBlock`]: aligned, zeroed host memory (the host allocator).
//! - Pinned host and device memory come from [`crate::Device::alloc_pinned`] and
//!   [`crate::Device::alloc`]; each buffer is freed by the backend that made it.
//! - [`stats`]: always-on counters, read with [`crate::stats`].

mod host;
pub mod stats;

pub use host::{HostBlock, HOST_ALIGN};
