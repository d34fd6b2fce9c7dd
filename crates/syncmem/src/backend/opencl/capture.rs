//! Captured launches, replayed with raw OpenCL calls: the floor a benchmark compares the crate's
//! own cost with (the same kernels, arguments and sizes, without the crate's checks,
//! bookkeeping and ordering).
//!
//! While a capture is open on a thread, every kernel the crate launches on an OpenCL device
//! from that thread is recorded besides being launched: a kernel object of its own (created
//! from the same program), the argument values (the buffers retained, so that they outlive
//! the capture), the global and local sizes.

use std::cell::RefCell;
use std::ffi::CString;
use std::ptr;

use opencl3::command_queue::CommandQueue;
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::types::{cl_mem, cl_uint, cl_ulong};

use super::error::backend_error;
use super::grid::{Arg, Grid};
use crate::backend::args::KArg;
use crate::error::Result;

/// One recorded launch.
struct Launch {
    kernel: Kernel,
    args: Vec<Arg>,
    /// The bytes of the by-value arguments (`KArg::Bytes` in `args` point into them).
    _bytes: Vec<Box<[u8]>>,
    scratch: Option<usize>,
    global: Vec<usize>,
    local: Vec<usize>,
}

impl Drop for Launch {
    fn drop(&mut self) {
        for a in &self.args {
            if let KArg::Ptr(m) = a {
                if !m.is_null() {
                    // SAFETY: retained once when the launch was recorded, released once here.
                    let _ = unsafe { opencl3::memory::release_mem_object(*m) };
                }
            }
        }
    }
}

thread_local! {
    static OPEN: RefCell<Option<Vec<Launch>>> = const { RefCell::new(None) };
}

/// The OpenCL kernels launched by the calling thread while a capture was open, to replay with
/// raw calls: the floor a benchmark compares the crate's own cost with (the same kernels,
/// arguments and sizes, without the crate's checks, bookkeeping and ordering). Each captured
/// launch keeps a kernel object of its own (created from the same program), the argument values
/// (its buffers retained until the capture is dropped) and its sizes. [`LaunchCapture::replay`]
/// sets each kernel's arguments and enqueues it on a queue, nothing more. Replayed kernels write
/// their buffers again (an SGD update runs again), and nothing orders them with the crate's
/// own work on those buffers: hold the buffers' guards, or wait, around a replay.
pub struct LaunchCapture {
    launches: Vec<Launch>,
}

impl std::fmt::Debug for LaunchCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchCapture")
            .field("launches", &self.launches.len())
            .finish()
    }
}

impl LaunchCapture {
    /// Runs `f`, capturing the OpenCL kernels the crate launches from this thread meanwhile
    /// (captures do not nest: an inner one takes the launches of its own `f`).
    ///
    /// # Errors
    /// The error of `f`, or of recording a launch (creating its kernel object).
    pub fn record<R>(f: impl FnOnce() -> Result<R>) -> Result<(R, LaunchCapture)> {
        let outer = OPEN.with(|o| o.borrow_mut().replace(Vec::new()));
        let r = f();
        let launches = OPEN.with(|o| std::mem::replace(&mut *o.borrow_mut(), outer));
        let launches = launches.unwrap_or_default();
        Ok((r?, LaunchCapture { launches }))
    }

    /// Number of kernels captured.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    /// True when no kernel was captured.
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// Sets the arguments of each captured kernel and enqueues it on `queue` (of the devices'
    /// context), in the captured order; returns without waiting.
    ///
    /// # Errors
    /// The error of `clSetKernelArg` or `clEnqueueNDRangeKernel`.
    pub fn replay(&mut self, queue: &CommandQueue) -> Result<()> {
        for l in &self.launches {
            let k = &l.kernel;
            if let Some(bytes) = l.scratch {
                // SAFETY: the parameter after the others is the `__local` scratch, as when the
                // launch was recorded.
                unsafe { k.set_arg_local_buffer(l.args.len() as cl_uint, bytes) }
                    .map_err(|ClError(c)| backend_error("replay", "clSetKernelArg", c))?;
            }
            for (i, arg) in l.args.iter().enumerate() {
                let i = i as cl_uint;
                // SAFETY: the values the crate set when it launched this kernel, of the types
                // of its parameters; the buffers are retained by the capture, the by-value bytes
                // are the capture's own copies; the kernel object is the capture's own
                // (`&mut self`: no other thread sets its arguments).
                unsafe {
                    match arg {
                        KArg::U32(v) => k.set_arg(i, v as &cl_uint),
                        KArg::U64(v) => k.set_arg(i, v as &cl_ulong),
                        KArg::F32(v) => k.set_arg(i, v),
                        KArg::F64(v) => k.set_arg(i, v),
                        KArg::Ptr(m) => k.set_arg(i, m),
                        KArg::Bytes { ptr, len } => {
                            opencl3::kernel::set_kernel_arg(k.get(), i, *len, ptr.cast())
                                .map_err(ClError)
                        }
                    }
                }
                .map_err(|ClError(c)| backend_error("replay", "clSetKernelArg", c))?;
            }
            // SAFETY: every argument was set above; the sizes are those the crate launched
            // with; the buffers are retained until the capture is dropped, after the caller
            // waited for the queue.
            let event = unsafe {
                opencl3::command_queue::enqueue_nd_range_kernel(
                    queue.get(),
                    k.get(),
                    l.global.len() as cl_uint,
                    ptr::null(),
                    l.global.as_ptr(),
                    l.local.as_ptr(),
                    0,
                    ptr::null(),
                )
            }
            .map_err(|c| backend_error("replay", "clEnqueueNDRangeKernel", c))?;
            // SAFETY: the event returned above, released once (nothing waits on it).
            let _ = unsafe { opencl3::event::release_event(event) };
        }
        Ok(())
    }
}

/// Records a launch of `kernel` (just enqueued by the crate) when a capture is open.
pub(super) fn record(label: &str, kernel: &Kernel, args: &[Arg], grid: &Grid<'_>) -> Result<()> {
    if !OPEN.with(|o| o.borrow().is_some()) {
        return Ok(());
    }
    let err = |op: &'static str| move |ClError(c)| backend_error(label, op, c);
    let name = kernel.function_name().map_err(err("clGetKernelInfo"))?;
    let program = kernel.program().map_err(err("clGetKernelInfo"))?;
    let name = CString::new(name).unwrap_or_default();
    let raw = opencl3::kernel::create_kernel(program, &name)
        .map_err(|c| backend_error(label, "clCreateKernel", c))?;
    let kernel = Kernel::new(raw);
    for a in args {
        if let KArg::Ptr(m) = a {
            if !m.is_null() {
                // SAFETY: a live buffer the crate just passed to a kernel; released in Drop.
                unsafe { opencl3::memory::retain_mem_object(*m as cl_mem) }
                    .map_err(|c| backend_error(label, "clRetainMemObject", c))?;
            }
        }
    }
    // The by-value bytes outlive the launch's borrow: the capture keeps a copy of each.
    let mut bytes = Vec::new();
    let args = args
        .iter()
        .map(|a| match *a {
            KArg::Bytes { ptr, len } => {
                // SAFETY: `len` bytes at `ptr`, valid for this launch (the argument's contract).
                let copy: Box<[u8]> = unsafe { std::slice::from_raw_parts(ptr, len) }.into();
                let arg = KArg::Bytes {
                    ptr: copy.as_ptr(),
                    len,
                };
                bytes.push(copy);
                arg
            }
            other => other,
        })
        .collect();
    let launch = Launch {
        kernel,
        args,
        _bytes: bytes,
        scratch: grid.scratch,
        global: grid.global.to_vec(),
        local: grid.local.to_vec(),
    };
    OPEN.with(|o| {
        if let Some(v) = o.borrow_mut().as_mut() {
            v.push(launch);
        }
    });
    Ok(())
}
