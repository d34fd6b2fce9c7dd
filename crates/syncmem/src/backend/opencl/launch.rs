//! The one launch helper of the OpenCL kernels: kernel slots (a kernel object behind its lock,
//! with its work-group size), the argument type, and [`launch`].
//!
//! `clSetKernelArg` is not thread-safe on one kernel object, so each kernel sits behind a mutex
//! held from its first argument to its enqueue (OpenCL captures the arguments at enqueue time).

use std::mem::ManuallyDrop;
use std::ptr;

use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::types::{cl_command_queue, cl_device_id, cl_event, cl_mem, cl_uint, cl_ulong};
use parking_lot::Mutex;

use super::error::backend_error;
use super::handle::{OwnedKernel, OwnedProgram};
use crate::error::{Error, Result};

/// Largest one-dimensional work-group size used.
pub(super) const MAX_LOCAL: usize = 256;

/// One kernel behind its lock, with its name and one-dimensional work-group size.
pub(super) struct Slot {
    kernel: Mutex<OwnedKernel>,
    pub(super) name: &'static str,
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
        name: &'static str,
        label: &str,
    ) -> Result<Self> {
        let k = Kernel::create(&program.0, name)
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

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    U32(cl_uint),
    U64(cl_ulong),
    F32(f32),
    F64(f64),
    /// A `__global` pointer: a live buffer of the device's context, or null for an operand the
    /// kernel does not read.
    Mem(cl_mem),
    /// A `__local` buffer of this many bytes.
    Local(usize),
}

/// A size as a kernel `uint`.
pub(super) fn u32_arg(v: usize, what: &'static str, label: &str) -> Result<Arg> {
    cl_uint::try_from(v)
        .map(Arg::U32)
        .map_err(|_| Error::Unsupported {
            device: label.to_string(),
            what: format!("{what} = {v} exceeds the 32-bit sizes of the OpenCL kernels"),
        })
}

/// Work-groups of `local` items for a grid-stride loop over `n` items, at most `max`.
pub(super) fn groups_for(n: usize, local: usize, max: usize) -> usize {
    n.div_ceil(local).clamp(1, max)
}

/// Sets `slot`'s arguments and enqueues it on `queue` with the given global and local sizes
/// (1 or 2 dimensions). Returns the command's event (one reference, owned by the caller).
///
/// The caller passes the arguments in the order and of the types of the kernel's parameters:
/// `uint`, `ulong`, `float`, `double`, `__global` pointers to live buffers of the queue's
/// context (kept alive until the command completes), or `__local` sizes.
pub(super) fn launch(
    label: &str,
    slot: &Slot,
    queue: cl_command_queue,
    args: &[Arg],
    global: &[usize],
    local: &[usize],
) -> Result<cl_event> {
    debug_assert_eq!(global.len(), local.len());
    let k = slot.kernel.lock();
    for (i, arg) in args.iter().enumerate() {
        let i = i as cl_uint;
        // SAFETY: the arguments come in the order and of the types of the kernel's parameters
        // (this function's contract): `uint` (cl_uint), `ulong` (cl_ulong), `float` (f32),
        // `double` (f64), a `__global` pointer (a cl_mem of this context, or null for an
        // operand the kernel does not read), or a `__local` buffer (a size, no value). The
        // kernel is locked, so no other thread sets its arguments until it is enqueued.
        unsafe {
            match arg {
                Arg::U32(v) => k.0.set_arg(i, v),
                Arg::U64(v) => k.0.set_arg(i, v),
                Arg::F32(v) => k.0.set_arg(i, v),
                Arg::F64(v) => k.0.set_arg(i, v),
                Arg::Mem(m) => k.0.set_arg(i, m),
                Arg::Local(bytes) => k.0.set_arg_local_buffer(i, *bytes),
            }
        }
        .map_err(|ClError(c)| {
            let mut e = backend_error(label, "clSetKernelArg", c);
            if let Error::Backend { message, .. } = &mut e {
                message.push_str(&format!(" (kernel {}, argument {i})", slot.name));
            }
            e
        })?;
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

    #[test]
    fn sizes_beyond_32_bits_are_refused() {
        assert!(matches!(u32_arg(7, "rows", "opencl:0"), Ok(Arg::U32(7))));
        let e = u32_arg(u32::MAX as usize + 1, "GEMM K", "opencl:0").unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { device, what }
                if device == "opencl:0" && what.contains("GEMM K = 4294967296")),
            "{e}"
        );
    }
}
