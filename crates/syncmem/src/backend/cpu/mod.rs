//! The `cpu` backend: "device memory" is separate host memory, copies are `memcpy`, the host
//! runs the math over it, and every operation has finished when it returns (events are always
//! complete). It gives the whole device-side code path (allocation, copies, head transitions,
//! events, kernels) a backend that runs everywhere.

mod device;
#[cfg(target_arch = "x86_64")]
mod gemm;
pub(crate) mod host;
pub(crate) mod kernels;
pub mod math;
mod par;
mod team;
pub(crate) mod user;
mod wide;

pub(crate) use device::{total_memory, CpuDevice, CpuEvent, CpuMem, CpuPinned, CpuStream};
