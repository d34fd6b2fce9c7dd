//! The OpenCL kernels: one program per (device, element type), built on first use from the
//! OpenCL C source below and cached for the life of the process.
//!
//! The cache is a process-wide map keyed by the device label and the element type. Each entry
//! has its own lock, so a slow build for one device does not hold up the others, and two
//! threads asking for the same entry build it once. `clSetKernelArg` is not thread-safe on one
//! kernel object, so each kernel sits behind a mutex held from the first argument to the
//! enqueue (OpenCL captures the arguments at enqueue time).
//!
//! `opencl3`'s handle types panic in `Drop` when a release fails; as in the device backend, the
//! handles here are kept in [`ManuallyDrop`] and released quietly.

use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use opencl3::command_queue::{enqueue_nd_range_kernel, CommandQueue};
use opencl3::device::Device as ClDeviceHandle;
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::memory::ClMem as _;
use opencl3::program::Program;
use opencl3::types::{cl_event, cl_mem, cl_ulong};
use parking_lot::Mutex;

use super::{Float, Op};
use crate::device::opencl::{backend_error, ClDevice};
use crate::device::{Device, DeviceBuffer, RawDevice};
use crate::error::{Error, Result};
use crate::kernels::cache::BuildCache;
use crate::synced::{DeviceRead, DeviceWrite};
use crate::Stream;

/// OpenCL C source; `T` is defined as `float` or `double` in front of it.
const SOURCE: &str = r#"
__kernel void sm_axpy(const ulong n, const T a, __global const T* x, __global T* y) {
    for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {
        y[i] += a * x[i];
    }
}

__kernel void sm_scale(const ulong n, const T a, __global T* x) {
    for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {
        x[i] *= a;
    }
}

/* One partial sum per work-group. The local size is a power of two. */
#define SM_REDUCE(NAME, EXPR)                                                             \
__kernel void NAME(const ulong n, __global const T* x, __global T* partial,             \
                   __local T* scratch) {                                                 \
    const size_t lid = get_local_id(0);                                                  \
    T acc = (T)0;                                                                        \
    for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {                   \
        const T v = x[i];                                                                \
        acc += EXPR;                                                                     \
    }                                                                                    \
    scratch[lid] = acc;                                                                  \
    barrier(CLK_LOCAL_MEM_FENCE);                                                        \
    for (size_t s = get_local_size(0) / 2; s > 0; s >>= 1) {                             \
        if (lid < s) {                                                                   \
            scratch[lid] += scratch[lid + s];                                            \
        }                                                                                \
        barrier(CLK_LOCAL_MEM_FENCE);                                                    \
    }                                                                                    \
    if (lid == 0) {                                                                      \
        partial[get_group_id(0)] = scratch[0];                                           \
    }                                                                                    \
}

SM_REDUCE(sm_asum, fabs(v))
SM_REDUCE(sm_sumsq, v * v)
"#;

/// Largest work-group size used.
const MAX_LOCAL: usize = 256;
/// Most work-groups launched for an element-wise kernel (a grid-stride loop covers the rest).
const MAX_GROUPS_ELEMENTWISE: usize = 1024;
/// Most work-groups (partial sums) launched for a reduction.
const MAX_GROUPS_REDUCE: usize = 256;

/// A program released quietly on drop (opencl3's own drop panics if the release fails).
/// Shared with the operators' OpenCL code.
pub(crate) struct OwnedProgram(pub(crate) ManuallyDrop<Program>);

impl Drop for OwnedProgram {
    fn drop(&mut self) {
        // SAFETY: the `Program` is never dropped by opencl3 (ManuallyDrop), so its one
        // reference is released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::program::release_program(self.0.get()) };
    }
}

/// A kernel released quietly on drop. Shared with the operators' OpenCL code.
pub(crate) struct OwnedKernel(pub(crate) ManuallyDrop<Kernel>);

impl Drop for OwnedKernel {
    fn drop(&mut self) {
        // SAFETY: the `Kernel` is never dropped by opencl3 (ManuallyDrop), so its one
        // reference is released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::kernel::release_kernel(self.0.get()) };
    }
}

/// One kernel behind its lock, with the work-group size chosen for it.
struct KernelSlot {
    kernel: Mutex<OwnedKernel>,
    /// A power of two, at most the kernel's `CL_KERNEL_WORK_GROUP_SIZE` and [`MAX_LOCAL`].
    local: usize,
}

/// An event returned by an enqueue, released quietly on drop.
struct OwnedEvent(cl_event);

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the event came from a successful enqueue, which handed us its one
            // reference; it is released exactly once, here.
            let _ = unsafe { opencl3::event::release_event(self.0) };
        }
    }
}

/// The kernels of one (device, element type).
struct Kernels {
    label: String,
    axpy: KernelSlot,
    scale: KernelSlot,
    asum: KernelSlot,
    sumsq: KernelSlot,
    // Declared last: dropped after the kernels that reference it.
    _program: OwnedProgram,
}

/// Process-wide cache: (device label, OpenCL type name) -> kernels.
static CACHE: BuildCache<(String, &'static str), Kernels> = BuildCache::new();

fn cl_device(dev: &Device) -> Result<&ClDevice> {
    match &dev.shared.raw {
        RawDevice::OpenCl(d) => Ok(d),
        #[allow(unreachable_patterns)]
        _ => Err(Error::Unsupported {
            device: dev.label().to_string(),
            what: "OpenCL kernels on a device of another backend".into(),
        }),
    }
}

/// The kernels for `F` on `dev`, built on first use.
fn kernels<F: Float>(dev: &Device) -> Result<Arc<Kernels>> {
    CACHE.get_or_build((dev.label().to_string(), F::CL_NAME), || build::<F>(dev))
}

pub(super) fn prepare<F: Float>(dev: &Device) -> Result<()> {
    kernels::<F>(dev).map(drop)
}

fn build<F: Float>(dev: &Device) -> Result<Kernels> {
    let label = dev.label();
    let cl = cl_device(dev)?;
    let id = cl.device_id();
    let mut header = format!("#define T {}\n", F::CL_NAME);
    if F::CL_NAME == "double" {
        let handle = ClDeviceHandle::new(id);
        let exts = handle
            .extensions()
            .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(EXTENSIONS)", c))?;
        if !exts.split_whitespace().any(|e| e == "cl_khr_fp64") {
            return Err(Error::Unsupported {
                device: label.to_string(),
                what: format!(
                    "f64 kernels: the device does not report cl_khr_fp64 (extensions: {exts})"
                ),
            });
        }
        header.push_str("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n");
    }
    let source = header + SOURCE;
    let program = Program::create_from_source(cl.context(), &source)
        .map_err(|ClError(c)| backend_error(label, "clCreateProgramWithSource", c))?;
    let mut program = OwnedProgram(ManuallyDrop::new(program));
    if let Err(ClError(code)) = program.0.build(&[id], "") {
        let log = program.0.get_build_log(id).unwrap_or_default();
        let base = backend_error(label, "clBuildProgram", code);
        return Err(match base {
            Error::Backend {
                backend,
                device,
                op,
                code,
                message,
            } => Error::Backend {
                backend,
                device,
                op,
                code,
                message: format!("{message}; {} kernels, build log: {}", F::KIND, log.trim()),
            },
            e => e,
        });
    }
    let kernel = |name: &str| -> Result<KernelSlot> {
        let k = Kernel::create(&program.0, name)
            .map_err(|ClError(c)| backend_error(label, "clCreateKernel", c))?;
        let k = OwnedKernel(ManuallyDrop::new(k));
        let max =
            k.0.get_work_group_size(id)
                .map_err(|ClError(c)| backend_error(label, "clGetKernelWorkGroupInfo", c))?
                .clamp(1, MAX_LOCAL);
        Ok(KernelSlot {
            kernel: Mutex::new(k),
            // The largest power of two not above `max`.
            local: 1usize << (usize::BITS - 1 - max.leading_zeros()),
        })
    };
    Ok(Kernels {
        label: label.to_string(),
        axpy: kernel("sm_axpy")?,
        scale: kernel("sm_scale")?,
        asum: kernel("sm_asum")?,
        sumsq: kernel("sm_sumsq")?,
        _program: program,
    })
}

/// One kernel argument.
enum Arg<F> {
    Len(cl_ulong),
    Value(F),
    Mem(cl_mem),
    Local(usize),
}

/// Sets the arguments of `slot`'s kernel and enqueues it on `queue` with `groups` work-groups
/// of the kernel's local size. Returns the enqueue's event.
fn launch<F: Float>(
    ks: &Kernels,
    slot: &KernelSlot,
    queue: &CommandQueue,
    op: Op,
    args: &[Arg<F>],
    groups: usize,
) -> Result<OwnedEvent> {
    let k = slot.kernel.lock();
    let set_err = |ClError(c)| backend_error(&ks.label, "clSetKernelArg", c);
    for (i, arg) in args.iter().enumerate() {
        let i = i as u32;
        match arg {
            // SAFETY (all four arms): `launch` is called with the arguments in the order and of
            // the types of the kernel's parameters in SOURCE: `ulong n` (cl_ulong), `T a` (F,
            // which is `float` or `double` as T is defined for this program), a `__global`
            // pointer (the cl_mem handle of a live buffer of this device's context), or a
            // `__local` buffer (a size, no value). The kernel is locked, so no other thread sets
            // its arguments until it is enqueued.
            Arg::Len(v) => unsafe { k.0.set_arg(i, v) },
            Arg::Value(v) => unsafe { k.0.set_arg(i, v) },
            Arg::Mem(m) => unsafe { k.0.set_arg(i, m) },
            Arg::Local(bytes) => unsafe { k.0.set_arg_local_buffer(i, *bytes) },
        }
        .map_err(set_err)?;
    }
    let local = slot.local;
    let global = groups * local;
    // SAFETY: every argument of the kernel was set above; `global` is a non-zero multiple of
    // `local`, which the device accepts for this kernel (it is at most the kernel's work-group
    // size); the buffers passed stay alive until the command completes, because every caller
    // waits for it (the event, or a blocking read on the same in-order queue) while it still
    // holds the guards that own them.
    let event = unsafe {
        enqueue_nd_range_kernel(
            queue.get(),
            k.0.get(),
            1,
            ptr::null(),
            &global,
            &local,
            0,
            ptr::null(),
        )
    }
    .map_err(|c| {
        let mut e = backend_error(&ks.label, "clEnqueueNDRangeKernel", c);
        if let Error::Backend { message, .. } = &mut e {
            message.push_str(&format!(" (kernel {}<{}>)", op.name(), F::KIND));
        }
        e
    })?;
    Ok(OwnedEvent(event))
}

fn mem_of(buf: &DeviceBuffer, label: &str, op: Op) -> Result<cl_mem> {
    buf.as_opencl()
        .map(|b| b.get())
        .ok_or_else(|| Error::InvalidState {
            op: "OpenCL kernel",
            buffer: format!("{buf:?}"),
            reason: format!(
                "kernel {} on {label}: the buffer has no OpenCL memory (empty or another backend)",
                op.name()
            ),
        })
}

fn queue_of(stream: &Stream, op: Op) -> Result<&CommandQueue> {
    stream.as_opencl().ok_or_else(|| Error::DeviceMismatch {
        op: "OpenCL kernel stream",
        expected: format!("an OpenCL stream for kernel {}", op.name()),
        actual: stream.device().label().to_string(),
    })
}

fn wait(ev: &OwnedEvent, label: &str) -> Result<()> {
    opencl3::event::wait_for_events(&[ev.0]).map_err(|c| backend_error(label, "clWaitForEvents", c))
}

fn groups_for(n: usize, local: usize, max: usize) -> usize {
    n.div_ceil(local).clamp(1, max)
}

pub(super) fn axpy<F: Float>(
    n: usize,
    a: F,
    x: &DeviceRead<'_>,
    y: &mut DeviceWrite<'_>,
) -> Result<()> {
    let dev = y.buffer().device();
    let ks = kernels::<F>(dev)?;
    let args = [
        Arg::Len(n as cl_ulong),
        Arg::Value(a),
        Arg::Mem(mem_of(x.buffer(), &ks.label, Op::Axpy)?),
        Arg::Mem(mem_of(y.buffer(), &ks.label, Op::Axpy)?),
    ];
    let groups = groups_for(n, ks.axpy.local, MAX_GROUPS_ELEMENTWISE);
    let queue = queue_of(y.stream(), Op::Axpy)?;
    let ev = launch(&ks, &ks.axpy, queue, Op::Axpy, &args, groups)?;
    wait(&ev, &ks.label)
}

pub(super) fn scale<F: Float>(n: usize, a: F, x: &mut DeviceWrite<'_>) -> Result<()> {
    let dev = x.buffer().device();
    let ks = kernels::<F>(dev)?;
    let args = [
        Arg::Len(n as cl_ulong),
        Arg::Value(a),
        Arg::Mem(mem_of(x.buffer(), &ks.label, Op::Scale)?),
    ];
    let groups = groups_for(n, ks.scale.local, MAX_GROUPS_ELEMENTWISE);
    let queue = queue_of(x.stream(), Op::Scale)?;
    let ev = launch(&ks, &ks.scale, queue, Op::Scale, &args, groups)?;
    wait(&ev, &ks.label)
}

pub(super) fn reduce<F: Float>(op: Op, n: usize, x: &DeviceRead<'_>) -> Result<F> {
    let dev = x.buffer().device();
    let ks = kernels::<F>(dev)?;
    let slot = match op {
        Op::Asum => &ks.asum,
        _ => &ks.sumsq,
    };
    let local = slot.local;
    let groups = groups_for(n, local, MAX_GROUPS_REDUCE);
    let size = std::mem::size_of::<F>();
    let partial_buf = dev.alloc(groups * size)?;
    let args = [
        Arg::<F>::Len(n as cl_ulong),
        Arg::Mem(mem_of(x.buffer(), &ks.label, op)?),
        Arg::Mem(mem_of(&partial_buf, &ks.label, op)?),
        Arg::Local(local * size),
    ];
    let stream = x.stream();
    let queue = queue_of(stream, op)?;
    let _ev = launch(&ks, slot, queue, op, &args, groups)?;
    let mut partial = vec![F::ZERO; groups];
    // Blocking read on the same in-order queue: it runs after the kernel.
    stream.read(&partial_buf, 0, bytemuck::cast_slice_mut(&mut partial))?;
    Ok(F::from_f64(partial.iter().map(|p| p.to_f64()).sum()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::opencl_or_skip;

    #[test]
    fn opencl_kernels_are_built_once_per_device_and_type() {
        let Some(dev) =
            opencl_or_skip("kernels::opencl_kernels_are_built_once_per_device_and_type")
        else {
            return;
        };
        let a = kernels::<f32>(&dev).unwrap();
        let b = kernels::<f32>(&dev).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "cached");
        let c = kernels::<f64>(&dev).unwrap();
        assert!(!Arc::ptr_eq(&a, &c), "one program per element type");
        for slot in [&a.axpy, &a.scale, &a.asum, &a.sumsq] {
            assert!(slot.local.is_power_of_two() && slot.local <= MAX_LOCAL);
        }
        let key = (dev.label().to_string(), "float");
        assert!(CACHE.contains(&key));
    }

    #[test]
    fn groups_cover_any_length() {
        assert_eq!(groups_for(1, 256, 256), 1);
        assert_eq!(groups_for(256, 256, 256), 1);
        assert_eq!(groups_for(257, 256, 256), 2);
        assert_eq!(groups_for(1 << 30, 256, 256), 256);
    }
}
