//! The operators' OpenCL kernels: one program per device, built from
//! [`opencl_src::SOURCE`](super::opencl_src) on first use and cached for the life of the
//! process (as [`crate::kernels`] does for its own kernels).
//!
//! # GEMM
//!
//! `sm_gemm` computes `C[M,N] = op(A)·op(B) (+ bias)`, with either operand transposed, so FC
//! (`X·Wᵀ`) and FCGradient (`dYᵀ·X`, `dY·W`) use the same kernel.
//!
//! - **Tiles in local memory.** A work-group owns a `TSM × TSN` tile of C (64 × 64 by default).
//!   It walks K in steps of `TSK`: at each step it copies a `TSM × TSK` tile of op(A) and a
//!   `TSK × TSN` tile of op(B) into local memory (k-major, zeros outside the matrices, so no size
//!   needs to be a multiple of a tile; consecutive work-items read consecutive addresses in either
//!   layout), waits at a barrier, accumulates, and waits again.
//! - **Register blocking.** Each work-item computes a 4 × 8 block of C in four `float8`
//!   accumulators: per k it reads one `float4` of the A tile and one `float8` of the B tile and
//!   issues four vector FMAs. A work-group is therefore `(TSN/8) × (TSM/4)` = 8 × 16 work-items.
//!   The first version (16 × 16 tiles, one element per work-item) ran at 0.4 GFLOP/s on PoCL;
//!   this one at 2–6 GFLOP/s on the same two loaded cores: PoCL runs a work-group as loops over
//!   its work-items and only vectorises what the kernel makes explicit.
//! - **Sizes per device**, fixed at build time (`-D TSM/TSN/TSK`, `reqd_work_group_size`): 64 × 64
//!   when work-groups of 128 fit, else 32 × 32 or 16 × 16; `TSK` is the largest of 64, 32, 16
//!   whose two tiles take at most half the local memory (PoCL: 64; a 48 KiB GPU: 32). When the
//!   compiled kernel cannot run that work-group size, the next smaller tiling is built.

//! # Launches
//!
//! Each kernel object sits behind a mutex held from its first `clSetKernelArg` to its enqueue
//! (`clSetKernelArg` is not thread-safe on one kernel). Every launch waits for its event before
//! returning: the operator still holds the guards of every buffer the kernel uses, and the
//! tensors' later accesses (on any stream) see the results.
//!
//! `opencl3`'s handle types panic in `Drop` when a release fails; the handles here are kept in
//! [`ManuallyDrop`] and released quietly, as in the device backend.

use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use opencl3::command_queue::{enqueue_nd_range_kernel, CommandQueue};
use opencl3::device::Device as ClDeviceHandle;
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::program::Program;
use opencl3::types::{cl_event, cl_mem, cl_uint, cl_ulong};
use parking_lot::Mutex;

use super::opencl_src::SOURCE;
use crate::context::Context;
use crate::device::opencl::backend_error;
use crate::device::{Device, RawDevice};
use crate::error::{Error, Result};
use crate::kernels::cache::BuildCache;
use crate::kernels::opencl::{OwnedKernel, OwnedProgram};

/// Largest work-group size used by the one-dimensional kernels.
const MAX_LOCAL: usize = 256;
/// Most work-groups launched for an element-wise kernel (a grid-stride loop covers the rest).
const MAX_GROUPS: usize = 1024;

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

/// One kernel behind its lock, with its name and one-dimensional work-group size.
struct Slot {
    kernel: Mutex<OwnedKernel>,
    name: &'static str,
    /// A power of two, at most the kernel's `CL_KERNEL_WORK_GROUP_SIZE` and [`MAX_LOCAL`].
    local: usize,
}

/// The compiled operator kernels of one OpenCL device.
pub(crate) struct Kernels {
    label: String,
    /// The GEMM tiling the program was built with.
    tiles: Tiles,
    gemm: Slot,
    col_sum: Slot,
    relu: Slot,
    relu_grad: Slot,
    fill: Slot,
    softmax_loss: Slot,
    softmax_loss_grad: Slot,
    accuracy: Slot,
    // Declared last: dropped after the kernels that reference it.
    _program: OwnedProgram,
}

/// Process-wide cache: device label -> kernels.
static CACHE: BuildCache<String, Kernels> = BuildCache::new();

/// The kernels of `dev`, built on first use. A failed build is not cached.
pub(crate) fn kernels(dev: &Device) -> Result<Arc<Kernels>> {
    CACHE.get_or_build(dev.label().to_string(), || build(dev))
}

/// GEMM tiling: `tsm x tsn` elements of C per work-group, `tsk` along K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiles {
    tsm: usize,
    tsn: usize,
    tsk: usize,
}

impl Tiles {
    /// Work-items per work-group: each computes 4 x 8 elements of C.
    fn work_group(self) -> usize {
        (self.tsm / 4) * (self.tsn / 8)
    }

    /// The local work size `[columns, rows]` of a launch.
    fn local(self) -> [usize; 2] {
        [self.tsn / 8, self.tsm / 4]
    }
}

/// Tile candidates for a device, best first: 64 x 64 when work-groups of 128 fit, else smaller;
/// the K step is the largest of 64, 32, 16 whose two tiles take at most half the local memory.
fn tile_candidates(max_wg: usize, local_mem: u64) -> Vec<Tiles> {
    [64usize, 32, 16]
        .into_iter()
        .filter_map(|t| {
            let tsk = [64usize, 32, 16]
                .into_iter()
                .find(|k| ((2 * t * k * 4) as u64) <= local_mem / 2)?;
            let tiles = Tiles {
                tsm: t,
                tsn: t,
                tsk,
            };
            (tiles.work_group() <= max_wg).then_some(tiles)
        })
        .collect()
}

fn build(dev: &Device) -> Result<Kernels> {
    let label = dev.label();
    let RawDevice::OpenCl(cl) = &dev.shared.raw else {
        return Err(Error::Unsupported {
            device: label.to_string(),
            what: "OpenCL operator kernels on a device of another backend".into(),
        });
    };
    let id = cl.device_id();
    let info = ClDeviceHandle::new(id);
    let max_wg = info
        .max_work_group_size()
        .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(MAX_WORK_GROUP_SIZE)", c))?;
    let local_mem = info
        .local_mem_size()
        .map_err(|ClError(c)| backend_error(label, "clGetDeviceInfo(LOCAL_MEM_SIZE)", c))?;
    let candidates = tile_candidates(max_wg, local_mem);
    let mut last = None;
    for tiles in &candidates {
        match build_with(dev, cl, *tiles)? {
            Some(k) => return Ok(k),
            None => last = Some(*tiles),
        }
    }
    Err(Error::Unsupported {
        device: label.to_string(),
        what: format!(
            "the GEMM kernel does not fit the device (max work-group {max_wg}, local memory \
             {local_mem} bytes; last tiles tried: {last:?})"
        ),
    })
}

/// Builds the program with `tiles`; `None` when the GEMM kernel cannot run work-groups of that
/// size on the device (register pressure), so that smaller tiles are tried.
fn build_with(
    dev: &Device,
    cl: &crate::device::opencl::ClDevice,
    tiles: Tiles,
) -> Result<Option<Kernels>> {
    let label = dev.label();
    let id = cl.device_id();
    let program = Program::create_from_source(cl.context(), SOURCE)
        .map_err(|ClError(c)| backend_error(label, "clCreateProgramWithSource", c))?;
    let mut program = OwnedProgram(ManuallyDrop::new(program));
    let options = format!(
        "-D TSM={} -D TSN={} -D TSK={}",
        tiles.tsm, tiles.tsn, tiles.tsk
    );
    if let Err(ClError(code)) = program.0.build(&[id], &options) {
        let log = program.0.get_build_log(id).unwrap_or_default();
        let mut e = backend_error(label, "clBuildProgram", code);
        if let Error::Backend { message, .. } = &mut e {
            message.push_str(&format!(
                "; operator kernels ({options}), build log: {}",
                log.trim()
            ));
        }
        return Err(e);
    }
    let kernel = |name: &'static str| -> Result<(Slot, usize)> {
        let k = Kernel::create(&program.0, name)
            .map_err(|ClError(c)| backend_error(label, "clCreateKernel", c))?;
        let k = OwnedKernel(ManuallyDrop::new(k));
        let max =
            k.0.get_work_group_size(id)
                .map_err(|ClError(c)| backend_error(label, "clGetKernelWorkGroupInfo", c))?;
        let capped = max.clamp(1, MAX_LOCAL);
        let slot = Slot {
            kernel: Mutex::new(k),
            name,
            // The largest power of two not above `capped`.
            local: 1usize << (usize::BITS - 1 - capped.leading_zeros()),
        };
        Ok((slot, max))
    };
    let (gemm, gemm_max) = kernel("sm_gemm")?;
    if gemm_max < tiles.work_group() {
        return Ok(None);
    }
    let one = |name| kernel(name).map(|(s, _)| s);
    Ok(Some(Kernels {
        label: label.to_string(),
        tiles,
        gemm,
        col_sum: one("sm_col_sum")?,
        relu: one("sm_relu")?,
        relu_grad: one("sm_relu_grad")?,
        fill: one("sm_fill")?,
        softmax_loss: one("sm_softmax_loss")?,
        softmax_loss_grad: one("sm_softmax_loss_grad")?,
        accuracy: one("sm_accuracy")?,
        _program: program,
    }))
}

/// One kernel argument.
enum Arg {
    U32(cl_uint),
    U64(cl_ulong),
    F32(f32),
    Mem(cl_mem),
    Local(usize),
}

/// The OpenCL queue of `ctx`'s stream.
pub(crate) fn queue(ctx: &Context) -> Result<&CommandQueue> {
    ctx.stream()
        .as_opencl()
        .ok_or_else(|| Error::DeviceMismatch {
            op: "OpenCL operator",
            expected: "an OpenCL stream".into(),
            actual: ctx.device().label().to_string(),
        })
}

/// A size as a kernel `uint`.
fn u32_arg(v: usize, what: &str, label: &str) -> Result<Arg> {
    cl_uint::try_from(v)
        .map(Arg::U32)
        .map_err(|_| Error::Unsupported {
            device: label.to_string(),
            what: format!("{what} = {v} exceeds the 32-bit sizes of the OpenCL operator kernels"),
        })
}

impl Kernels {
    /// Sets `slot`'s arguments, enqueues it with the given global and local sizes (1 or 2
    /// dimensions) and waits for it.
    fn launch(
        &self,
        slot: &Slot,
        queue: &CommandQueue,
        args: &[Arg],
        global: &[usize],
        local: &[usize],
    ) -> Result<()> {
        let k = slot.kernel.lock();
        for (i, arg) in args.iter().enumerate() {
            let i = i as cl_uint;
            match arg {
                // SAFETY (all five arms): every caller passes the arguments in the order and of
                // the types of the kernel's parameters in SOURCE: `uint` (cl_uint), `ulong`
                // (cl_ulong), `float` (f32), a `__global` pointer (the cl_mem of a live buffer
                // of this device's context, held by the caller's guard, or null for a pointer the
                // kernel does not read), or a `__local` buffer (a size, no value). The kernel is
                // locked, so no other thread sets its arguments until it is enqueued.
                Arg::U32(v) => unsafe { k.0.set_arg(i, v) },
                Arg::U64(v) => unsafe { k.0.set_arg(i, v) },
                Arg::F32(v) => unsafe { k.0.set_arg(i, v) },
                Arg::Mem(m) => unsafe { k.0.set_arg(i, m) },
                Arg::Local(bytes) => unsafe { k.0.set_arg_local_buffer(i, *bytes) },
            }
            .map_err(|ClError(c)| {
                let mut e = backend_error(&self.label, "clSetKernelArg", c);
                if let Error::Backend { message, .. } = &mut e {
                    message.push_str(&format!(" (kernel {}, argument {i})", slot.name));
                }
                e
            })?;
        }
        debug_assert_eq!(global.len(), local.len());
        // SAFETY: every argument of the kernel was set above; `global` and `local` have
        // `global.len()` (1 or 2) entries, each global size a non-zero multiple of the local one,
        // and the work-group size is at most the kernel's (checked at build time for sm_gemm,
        // `slot.local` for the others); the buffers stay alive until the command completes,
        // because we wait for its event below while the caller holds their guards.
        let event = unsafe {
            enqueue_nd_range_kernel(
                queue.get(),
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
            let mut e = backend_error(&self.label, "clEnqueueNDRangeKernel", c);
            if let Error::Backend { message, .. } = &mut e {
                message.push_str(&format!(" (kernel {})", slot.name));
            }
            e
        })?;
        drop(k);
        let event = OwnedEvent(event);
        opencl3::event::wait_for_events(&[event.0])
            .map_err(|c| backend_error(&self.label, "clWaitForEvents", c))
    }

    /// A one-dimensional element-wise launch over `n` items (grid-stride loop).
    fn launch_elementwise(
        &self,
        slot: &Slot,
        queue: &CommandQueue,
        n: usize,
        args: &[Arg],
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let groups = n.div_ceil(slot.local).clamp(1, MAX_GROUPS);
        self.launch(slot, queue, args, &[groups * slot.local], &[slot.local])
    }

    /// `C[m,n] = op(A)·op(B) (+ bias[col])`; see the module docs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        queue: &CommandQueue,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        a: cl_mem,
        b: cl_mem,
        c: cl_mem,
        bias: Option<cl_mem>,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let l = &self.label;
        let args = [
            u32_arg(m, "GEMM M", l)?,
            u32_arg(n, "GEMM N", l)?,
            u32_arg(k, "GEMM K", l)?,
            Arg::U32(ta.into()),
            Arg::U32(tb.into()),
            Arg::Mem(a),
            Arg::Mem(b),
            Arg::Mem(c),
            Arg::Mem(bias.unwrap_or(ptr::null_mut())),
            Arg::U32(bias.is_some().into()),
        ];
        let t = self.tiles;
        let local = t.local();
        let global = [n.div_ceil(t.tsn) * local[0], m.div_ceil(t.tsm) * local[1]];
        self.launch(&self.gemm, queue, &args, &global, &local)
    }

    /// `out[j] = sum_i x[i*cols + j]`.
    pub(crate) fn col_sum(
        &self,
        queue: &CommandQueue,
        rows: usize,
        cols: usize,
        x: cl_mem,
        out: cl_mem,
    ) -> Result<()> {
        if cols == 0 {
            return Ok(());
        }
        let l = &self.label;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "columns", l)?,
            Arg::Mem(x),
            Arg::Mem(out),
        ];
        let local = self.col_sum.local;
        let global = cols.div_ceil(local) * local;
        self.launch(&self.col_sum, queue, &args, &[global], &[local])
    }

    /// `y = max(x, 0)` (`x` may be `y`).
    pub(crate) fn relu(&self, queue: &CommandQueue, n: usize, x: cl_mem, y: cl_mem) -> Result<()> {
        let args = [Arg::U64(n as cl_ulong), Arg::Mem(x), Arg::Mem(y)];
        self.launch_elementwise(&self.relu, queue, n, &args)
    }

    /// `dx = y > 0 ? dy : 0` (`dy` may be `dx`).
    pub(crate) fn relu_grad(
        &self,
        queue: &CommandQueue,
        n: usize,
        y: cl_mem,
        dy: cl_mem,
        dx: cl_mem,
    ) -> Result<()> {
        let args = [
            Arg::U64(n as cl_ulong),
            Arg::Mem(y),
            Arg::Mem(dy),
            Arg::Mem(dx),
        ];
        self.launch_elementwise(&self.relu_grad, queue, n, &args)
    }

    /// `y = value`.
    pub(crate) fn fill(&self, queue: &CommandQueue, n: usize, value: f32, y: cl_mem) -> Result<()> {
        let args = [Arg::U64(n as cl_ulong), Arg::F32(value), Arg::Mem(y)];
        self.launch_elementwise(&self.fill, queue, n, &args)
    }

    /// Softmax of each of `rows` rows of `cols` into `p`, mean cross-entropy into `loss[0]`.
    /// One work-group.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss(
        &self,
        queue: &CommandQueue,
        rows: usize,
        cols: usize,
        x: cl_mem,
        labels: cl_mem,
        p: cl_mem,
        loss: cl_mem,
    ) -> Result<()> {
        let l = &self.label;
        let local = self.softmax_loss.local;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            Arg::Mem(x),
            Arg::Mem(labels),
            Arg::Mem(p),
            Arg::Mem(loss),
            Arg::Local(local * std::mem::size_of::<f32>()),
        ];
        self.launch(&self.softmax_loss, queue, &args, &[local], &[local])
    }

    /// `dx = (p - onehot) * dloss / rows`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_loss_grad(
        &self,
        queue: &CommandQueue,
        rows: usize,
        cols: usize,
        p: cl_mem,
        labels: cl_mem,
        dloss: Option<cl_mem>,
        dx: cl_mem,
    ) -> Result<()> {
        let l = &self.label;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            Arg::Mem(p),
            Arg::Mem(labels),
            Arg::Mem(dloss.unwrap_or(ptr::null_mut())),
            Arg::U32(dloss.is_some().into()),
            Arg::Mem(dx),
        ];
        let n = rows.saturating_mul(cols);
        self.launch_elementwise(&self.softmax_loss_grad, queue, n, &args)
    }

    /// Fraction of rows whose label is in the top `top_k` into `out[0]`. One work-group.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accuracy(
        &self,
        queue: &CommandQueue,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: cl_mem,
        labels: cl_mem,
        out: cl_mem,
    ) -> Result<()> {
        let l = &self.label;
        let local = self.accuracy.local;
        let args = [
            u32_arg(rows, "rows", l)?,
            u32_arg(cols, "classes", l)?,
            u32_arg(top_k, "top_k", l)?,
            Arg::Mem(x),
            Arg::Mem(labels),
            Arg::Mem(out),
            Arg::Local(local * std::mem::size_of::<f32>()),
        ];
        self.launch(&self.accuracy, queue, &args, &[local], &[local])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::opencl_or_skip;

    #[test]
    fn tiles_follow_the_device_limits() {
        let t = |tsm, tsk| Tiles { tsm, tsn: tsm, tsk };
        // PoCL: work-groups of 4096, 2 MiB of local memory.
        assert_eq!(tile_candidates(4096, 2 << 20)[0], t(64, 64));
        // A GPU with 48 KiB of local memory: K step 32 (16 KiB of tiles).
        assert_eq!(tile_candidates(1024, 48 << 10)[0], t(64, 32));
        // Small work-groups: smaller tiles.
        assert_eq!(tile_candidates(64, 32 << 10), vec![t(32, 64), t(16, 64)]);
        assert!(tile_candidates(4, 1 << 20).is_empty());
    }

    #[test]
    fn operator_kernels_are_built_once_per_device() {
        let Some(dev) = opencl_or_skip("ops::opencl::operator_kernels_are_built_once_per_device")
        else {
            return;
        };
        let a = kernels(&dev).unwrap();
        let b = kernels(&dev).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(
            a.tiles.local()[0] * a.tiles.local()[1],
            a.tiles.work_group()
        );
        for s in [&a.relu, &a.softmax_loss, &a.accuracy, &a.col_sum] {
            assert!(s.local.is_power_of_two() && s.local <= MAX_LOCAL);
        }
    }
}
