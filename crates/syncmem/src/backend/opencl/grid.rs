//! What a launch takes besides its kernel: the arguments ([`Arg`]) and the sizes ([`Grid`]).
//! Shared by the launch helper ([`super::launch`]) and the launches it records
//! ([`super::capture`]).

use std::ptr;

use opencl3::types::cl_mem;

use crate::backend::args::{DevicePtr, KArg};

/// One kernel argument: a device pointer is a `cl_mem`.
pub(super) type Arg = KArg<cl_mem>;

impl DevicePtr for cl_mem {
    const NULL: Self = ptr::null_mut();
}

/// A launch: the global and local sizes (1 or 2 dimensions), and the bytes of a `__local`
/// scratch buffer passed after the other arguments, if the kernel takes one.
pub(super) struct Grid<'a> {
    pub(super) global: &'a [usize],
    pub(super) local: &'a [usize],
    pub(super) scratch: Option<usize>,
}
