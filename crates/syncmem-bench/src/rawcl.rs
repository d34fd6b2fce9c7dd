//! The plain OpenCL cost of a trivial kernel, through `opencl3` directly: enqueued and waited
//! for one by one, and only enqueued (one `clFinish` after the batch).

use std::ptr;
use std::time::Instant;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{Device, CL_DEVICE_TYPE_ALL};
use opencl3::kernel::{ExecuteKernel, Kernel};
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE};
use opencl3::platform::get_platforms;
use opencl3::program::Program;

const SOURCE: &str = "__kernel void sm_bench_trivial(__global float* x) { x[0] *= 1.0f; }";

/// Nanoseconds per kernel on OpenCL device `ordinal` (numbered as the crate numbers them:
/// platforms in order, every device of each): (enqueue + wait each, only enqueued).
pub(crate) fn trivial_kernel_ns(
    ordinal: usize,
    calls: usize,
    runs: usize,
) -> Result<(f64, f64), String> {
    let err = |what: &str, e: opencl3::error_codes::ClError| format!("{what}: {e}");
    let mut ids = Vec::new();
    for p in get_platforms().map_err(|e| err("clGetPlatformIDs", e))? {
        ids.extend(p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default());
    }
    let id = *ids
        .get(ordinal)
        .ok_or_else(|| format!("no OpenCL device {ordinal}"))?;
    let context = Context::from_device(&Device::new(id)).map_err(|e| err("clCreateContext", e))?;
    #[allow(deprecated)] // clCreateCommandQueue: the OpenCL 1.2 call, present everywhere
    let queue =
        CommandQueue::create_default(&context, 0).map_err(|e| err("clCreateCommandQueue", e))?;
    let program = Program::create_and_build_from_source(&context, SOURCE, "")
        .map_err(|log| format!("building the trivial kernel: {log}"))?;
    let kernel =
        Kernel::create(&program, "sm_bench_trivial").map_err(|e| err("clCreateKernel", e))?;
    // SAFETY: a 1-float buffer of this context, no host pointer.
    let buf = unsafe { Buffer::<f32>::create(&context, CL_MEM_READ_WRITE, 1, ptr::null_mut()) }
        .map_err(|e| err("clCreateBuffer", e))?;
    let enqueue = || {
        // SAFETY: the kernel's one argument is a global float buffer, which `buf` is; one
        // work-item.
        unsafe {
            ExecuteKernel::new(&kernel)
                .set_arg(&buf)
                .set_global_work_size(1)
                .enqueue_nd_range(&queue)
        }
        .map_err(|e| err("clEnqueueNDRangeKernel", e))
    };
    let time = |wait_each: bool| -> Result<f64, String> {
        let mut best = Vec::new();
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            for _ in 0..calls {
                let event = enqueue()?;
                if wait_each {
                    event.wait().map_err(|e| err("clWaitForEvents", e))?;
                }
            }
            queue.finish().map_err(|e| err("clFinish", e))?;
            best.push(start.elapsed().as_nanos() as f64 / calls as f64);
        }
        best.sort_by(f64::total_cmp);
        Ok(best[best.len() / 2])
    };
    time(true)?; // warm-up: the runtime compiles the kernel for its work-group size here
    Ok((time(true)?, time(false)?))
}

/// The trivial kernel built in the context of `queue` (a syncmem stream's command queue), to
/// be enqueued there with plain OpenCL: the baseline of the user-kernel launch row.
pub(crate) fn trivial_kernel_on(queue: &CommandQueue) -> Result<Kernel, String> {
    use opencl3::program::{build_program, create_program_with_source, release_program};
    let err = |what: &str, c: i32| format!("{what}: {}", opencl3::error_codes::ClError(c));
    let context = queue
        .context()
        .map_err(|e| format!("clGetCommandQueueInfo: {e}"))?;
    let device = queue
        .device()
        .map_err(|e| format!("clGetCommandQueueInfo: {e}"))?;
    let program = create_program_with_source(context, &[SOURCE])
        .map_err(|c| err("clCreateProgramWithSource", c))?;
    let built = build_program(program, &[device], c"", None, ptr::null_mut())
        .map_err(|c| err("clBuildProgram", c))
        .and_then(|()| {
            opencl3::kernel::create_kernel(program, c"sm_bench_trivial")
                .map_err(|c| err("clCreateKernel", c))
        });
    // SAFETY: the one reference clCreateProgramWithSource gave; the kernel keeps its own.
    let _ = unsafe { release_program(program) };
    Ok(Kernel::new(built?))
}

/// Sets the kernel's one argument to `buf` and enqueues it (one work-item) on `queue`: the
/// plain OpenCL a launch costs, without waiting.
pub(crate) fn enqueue_trivial(
    queue: &CommandQueue,
    kernel: &Kernel,
    buf: &opencl3::memory::Buffer<u8>,
) -> Result<(), String> {
    // SAFETY: the kernel's one argument is a global float buffer of the queue's context, which
    // `buf` is (a syncmem buffer of that queue's device, kept alive by the caller until the
    // queue finishes); one work-item.
    unsafe {
        ExecuteKernel::new(kernel)
            .set_arg(buf)
            .set_global_work_size(1)
            .set_local_work_size(1)
            .enqueue_nd_range(queue)
    }
    .map(drop)
    .map_err(|e| format!("clEnqueueNDRangeKernel: {e}"))
}

/// A user event with a barrier waiting on it, queued on a command queue: commands queued after
/// it wait until [`Hold::release`], so that timing them measures the host's queuing cost only
/// (no worker thread runs a kernel meanwhile).
pub(crate) struct Hold {
    event: opencl3::types::cl_event,
    released: bool,
    _barrier: opencl3::event::Event,
}

impl Hold {
    /// Holds `queue`.
    pub(crate) fn new(queue: &CommandQueue) -> Result<Hold, String> {
        let context = queue
            .context()
            .map_err(|e| format!("clGetCommandQueueInfo: {e}"))?;
        let event = opencl3::event::create_user_event(context)
            .map_err(|e| format!("clCreateUserEvent: {e}"))?;
        // SAFETY: the wait list holds one live event, released only in Drop (after the
        // barrier has been let through).
        let barrier = unsafe { queue.enqueue_barrier_with_wait_list(&[event]) }
            .map_err(|e| format!("clEnqueueBarrierWithWaitList: {e}"))?;
        Ok(Hold {
            event,
            released: false,
            _barrier: barrier,
        })
    }

    /// Lets the queue run.
    pub(crate) fn release(&mut self) -> Result<(), String> {
        if !std::mem::replace(&mut self.released, true) {
            opencl3::event::set_user_event_status(self.event, opencl3::event::CL_COMPLETE)
                .map_err(|e| format!("clSetUserEventStatus: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Never leave the queue blocked.
        let _ = self.release();
        // SAFETY: the one reference clCreateUserEvent gave, released once.
        let _ = unsafe { opencl3::event::release_event(self.event) };
    }
}
