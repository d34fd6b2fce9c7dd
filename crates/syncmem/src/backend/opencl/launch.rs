//! The one launch helper of the OpenCL kernels: kernel slots (a kernel object behind its lock,
//! with its work-group size) and [`launch`]; the arguments and sizes a launch takes are in
//! [`super::grid`].
//!
//! `clSetKernelArg` is not thread-safe on one kernel object, so each kernel sits behind a mutex
//! held from its first argument to its enqueue (OpenCL captures the arguments at enqueue time).

use std::borrow::Cow;
use std::mem::ManuallyDrop;
use std::ptr;

use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::types::{cl_command_queue, cl_device_id, cl_event, cl_uint, cl_ulong};
use parking_lot::Mutex;

use super::error::backend_error;
pub(super) use super::grid::{Arg, Grid};
use super::handle::{OwnedKernel, OwnedProgram};
use crate::backend::args::KArg;
use crate::error::{Error, Result};

/// Largest one-dimensional work-group size used.
pub(super) const MAX_LOCAL: usize = 256;

/// One kernel behind its lock, with its name and one-dimensional work-group size.
pub(super) struct Slot {
    kernel: Mutex<OwnedKernel>,
    pub(super) name: Cow<'static, str>,
    /// A power of two, at most the kernel's `CL_KERNEL_WORK_GROUP_SIZE` and [`MAX_LOCAL`].
    pub(super) local: usize,
    /// The kernel's own `CL_KERNEL_WORK_GROUP_SIZE`.
    pub(super) max_work_group: usize,
}

impl Slot {
    /// Creates kernel `name` of `program`, built for `device`.
    pub(super) fn new(
        program: &OwnedProgram,
        device: cl_device_id,
        name: impl Into<Cow<'static, str>>,
        label: &str,
    ) -> Result<Self> {
        let name = name.into();
        if name.contains('\0') {
            // `Kernel::create` would panic on it (a C string ends at its first NUL).
            return Err(backend_error(
                label,
                "clCreateKernel",
                opencl3::error_codes::CL_INVALID_KERNEL_NAME,
            ));
        }
        let k = Kernel::create(&program.0, &name)
            .map_err(|ClError(c)| backend_error(label, "clCreateKernel", c))?;
        let k = OwnedKernel(ManuallyDrop::new(k));
        let max =
            k.0.get_work_group_size(device)
                .map_err(|ClError(c)| backend_error(label, "clGetKernelWorkGroupInfo", c))?;
        let capped = max.clamp(1, MAX_LOCAL);
        Ok(Slot {
            kernel: Mutex::new(k),
            name,
            // The largest power of two not above `capped`.
            local: 1usize << (usize::BITS - 1 - capped.leading_zeros()),
            max_work_group: max,
        })
    }
}

impl Slot {
    /// Runs `f` on the kernel object, under its lock (for queries such as its arguments).
    pub(super) fn with_kernel<R>(&self, f: impl FnOnce(&Kernel) -> R) -> R {
        f(&self.kernel.lock().0)
    }
}

/// Work-groups of `local` items for a grid-stride loop over `n` items, at most `max`.
pub(super) fn groups_for(n: usize, local: usize, max: usize) -> usize {
    n.div_ceil(local).clamp(1, max)
}

/// Sets `slot`'s arguments and enqueues it on `queue`. Returns the command's event (one
/// reference, owned by the caller).
///
/// The caller passes the arguments in the order and of the types of the kernel's parameters:
/// `uint`, `ulong`, `float`, `double`, `__global` pointers to live buffers of the queue's
/// context (kept alive until the command completes), then the `__local` scratch if any.
pub(super) fn launch(
    label: &str,
    slot: &Slot,
    queue: cl_command_queue,
    args: &[Arg],
    grid: &Grid<'_>,
) -> Result<cl_event> {
    let (global, local) = (grid.global, grid.local);
    debug_assert_eq!(global.len(), local.len());
    let k = slot.kernel.lock();
    let set_err = |i: cl_uint, ClError(c)| {
        let mut e = backend_error(label, "clSetKernelArg", c);
        if let Error::Backend { message, .. } = &mut e {
            message.push_str(&format!(" (kernel {}, argument {i})", slot.name));
        }
        e
    };
    if let Some(bytes) = grid.scratch {
        let i = args.len() as cl_uint;
        // SAFETY: the kernel's parameter after the others is a `__local` buffer (this
        // function's contract): a size, no value. The kernel is locked.
        unsafe { k.0.set_arg_local_buffer(i, bytes) }.map_err(|e| set_err(i, e))?;
    }
    for (i, arg) in args.iter().enumerate() {
        let i = i as cl_uint;
        // SAFETY: the arguments come in the order and of the types of the kernel's parameters
        // (this function's contract): `uint` (cl_uint), `ulong` (cl_ulong), `float` (f32),
        // `double` (f64), a `__global` pointer (a cl_mem of this context, or null for an
        // operand the kernel does not read), or the bytes of a by-value parameter of exactly
        // its size, valid for this call (the runtime copies them). The kernel is locked, so no
        // other thread sets its arguments until it is enqueued.
        unsafe {
            match arg {
                KArg::U32(v) => k.0.set_arg(i, v as &cl_uint),
                KArg::U64(v) => k.0.set_arg(i, v as &cl_ulong),
                KArg::F32(v) => k.0.set_arg(i, v),
                KArg::F64(v) => k.0.set_arg(i, v),
                KArg::Ptr(m) => k.0.set_arg(i, m),
                KArg::Bytes { ptr, len } => {
                    opencl3::kernel::set_kernel_arg(k.0.get(), i, *len, ptr.cast()).map_err(ClError)
                }
            }
        }
        .map_err(|e| set_err(i, e))?;
    }
    // SAFETY: every argument of the kernel was set above; `global` and `local` have the same
    // length (1 or 2), each global size a non-zero multiple of the local one, and the
    // work-group size is at most the kernel's (checked when the slot was made, or at build
    // time for the 2-D GEMM); the buffers stay alive until the command completes (contract).
    let event = unsafe {
        opencl3::command_queue::enqueue_nd_range_kernel(
            queue,
            k.0.get(),
            global.len() as cl_uint,
            ptr::null(),
            global.as_ptr(),
            local.as_ptr(),
            0,
            ptr::null(),
        )
    }
    .map_err(|c| {
        let mut e = backend_error(label, "clEnqueueNDRangeKernel", c);
        if let Error::Backend { message, .. } = &mut e {
            message.push_str(&format!(" (kernel {})", slot.name));
        }
        e
    })?;
    if let Err(e) = super::capture::record(label, &k.0, args, grid) {
        // SAFETY: the event returned above, released once (the launch itself stands).
        let _ = unsafe { opencl3::event::release_event(event) };
        return Err(e);
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_any_length() {
        assert_eq!(groups_for(1, 256, 256), 1);
        assert_eq!(groups_for(256, 256, 256), 1);
        assert_eq!(groups_for(257, 256, 256), 2);
        assert_eq!(groups_for(1 << 30, 256, 256), 256);
    }
}
