//! The `cpu` backend: the host runs the math over the `cpu` device's memory (separate host
//! memory), and every operation has finished when it returns.

pub(crate) mod kernels;
pub mod math;
