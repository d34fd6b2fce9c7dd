//! The CUDA kernels: CUDA C compiled at run time by NVRTC (cudarc feature `nvrtc`, `libnvrtc`
//! loaded at run time like `libcuda`), loaded once per device and cached for the life of the
//! process.
//!
//! **Status: compile-checked only.** This path was written against the source of cudarc
//! 0.19.10; it builds and passes clippy on a machine without a GPU, and CI compiles its CUDA C
//! source to PTX with NVRTC (the test `source_compiles_with_nvrtc`, no GPU needed), but the
//! kernels have **never run**. The device tests skip (with a `SKIPPED` line) when no CUDA
//! device is present.
//!
//! # Design
//!
//! - One CUDA C source ([`SOURCE`]) holds the kernels for `float` and `double`
//!   (`sm_axpy_f32`, `sm_axpy_f64`, ...). It is compiled to PTX **once per process**
//!   (`cudarc::nvrtc::compile_ptx`, no options: NVRTC's default virtual architecture, which the
//!   driver JIT-compiles for the actual device), and the PTX is loaded **once per device**
//!   (`CudaContext::load_module`, then `CudaModule::load_function` for each kernel). A failure
//!   (no NVRTC, a compile error, a module the driver rejects) is not cached: the next call tries
//!   again.
//! - The PTX carries the ISA version of the NVRTC that made it (NVRTC 12.9 writes
//!   `.version 8.8`, target `sm_52`). A driver older than that NVRTC cannot JIT it and rejects
//!   the module with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: an [`Error::Backend`] naming
//!   `cuModuleLoadData`, not a panic. Use an NVRTC no newer than the driver.
//! - `libnvrtc` is probed first (`cudarc::nvrtc::sys::is_culib_present`): cudarc's dynamic
//!   loader panics when the library is absent, so absence becomes [`Error::RuntimeUnavailable`]
//!   before any NVRTC call. Compilation and module loading also run under `catch_unwind` as a
//!   second line of defence (cudarc `unwrap`s inside its compile-error path, and panics on a
//!   missing symbol of an old library).
//! - Launches use cudarc's launch builder (`CudaStream::launch_builder`, `PushKernelArg::arg`,
//!   `LaunchArgs::launch`). These kernels take guards, not a context, so each device's cache
//!   entry owns one kernel stream (`CudaContext::new_stream`) instead of using the guard's
//!   stream. Ordering: the guards' streams are synchronized first (so the mirror made current by the
//!   guard is complete), the kernel is launched on the kernel stream, and that stream is
//!   synchronized before returning, so every call is complete when it returns, as the module
//!   contract asks. cudarc's event tracking is disabled on syncmem's contexts, so the builder
//!   adds no event waits or records for the `CudaSlice` arguments.
//! - Reductions write one partial sum per block (at most [`MAX_BLOCKS_REDUCE`]) into a scratch
//!   buffer of the device; the partial sums are read back with the guard's stream
//!   ([`Stream::read`](crate::Stream::read), so the copy shows in the process-wide counters)
//!   and added on the host in `f64`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{self, Ptx};
use parking_lot::Mutex;

use super::{Float, Op, ScalarKind};
use crate::device::{Device, DeviceBuffer};
use crate::error::{BackendKind, Error, Result};
use crate::kernels::cache::BuildCache;
use crate::synced::{DeviceRead, DeviceWrite};

/// CUDA C source: every kernel once for `float` (`_f32`) and once for `double` (`_f64`).
/// Grid-stride loops, so any `n` works with any grid size.
const SOURCE: &str = r#"
#define SM_BLOCK 256

#define SM_KERNELS(T, SUF)                                                                   \
extern "C" __global__ void sm_axpy_##SUF(unsigned long long n, T a, const T* x, T* y) {      \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        y[i] += a * x[i];                                                                    \
    }                                                                                        \
}                                                                                            \
extern "C" __global__ void sm_scale_##SUF(unsigned long long n, T a, T* x) {                 \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        x[i] *= a;                                                                           \
    }                                                                                        \
}                                                                                            \
SM_REDUCE(T, sm_asum_##SUF, fabs(v))                                                         \
SM_REDUCE(T, sm_sumsq_##SUF, v * v)

/* One partial sum per block; blockDim.x == SM_BLOCK (a power of two). */
#define SM_REDUCE(T, NAME, EXPR)                                                             \
extern "C" __global__ void NAME(unsigned long long n, const T* x, T* partial) {              \
    __shared__ T scratch[SM_BLOCK];                                                          \
    const unsigned int lid = threadIdx.x;                                                    \
    T acc = (T)0;                                                                            \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + lid;           \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        const T v = x[i];                                                                    \
        acc += EXPR;                                                                         \
    }                                                                                        \
    scratch[lid] = acc;                                                                      \
    __syncthreads();                                                                         \
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {                                  \
        if (lid < s) {                                                                       \
            scratch[lid] += scratch[lid + s];                                                \
        }                                                                                    \
        __syncthreads();                                                                     \
    }                                                                                        \
    if (lid == 0) {                                                                          \
        partial[blockIdx.x] = scratch[0];                                                    \
    }                                                                                        \
}

SM_KERNELS(float, f32)
SM_KERNELS(double, f64)
"#;

/// Threads per block (must match `SM_BLOCK` in [`SOURCE`]).
const BLOCK: u32 = 256;
/// Most blocks launched for an element-wise kernel (a grid-stride loop covers the rest).
const MAX_BLOCKS_ELEMENTWISE: usize = 1024;
/// Most blocks (partial sums) launched for a reduction.
const MAX_BLOCKS_REDUCE: usize = 256;

/// The reason given when `libnvrtc` cannot be loaded.
const NO_NVRTC: &str = "CUDA kernels need the NVRTC library (libnvrtc), which was not found";

/// The four kernels of one element type.
struct TypedKernels {
    axpy: CudaFunction,
    scale: CudaFunction,
    asum: CudaFunction,
    sumsq: CudaFunction,
}

/// The kernels of one device (the functions keep their module alive).
struct Kernels {
    label: String,
    /// The stream every kernel of this device is launched on.
    stream: Arc<CudaStream>,
    f32: TypedKernels,
    f64: TypedKernels,
}

impl Kernels {
    fn typed(&self, kind: ScalarKind) -> &TypedKernels {
        match kind {
            ScalarKind::F64 => &self.f64,
            _ => &self.f32,
        }
    }
}

/// Process-wide cache: device label -> kernels.
static CACHE: BuildCache<String, Kernels> = BuildCache::new();

/// The PTX of [`SOURCE`], compiled once per process (device-independent).
static PTX: Mutex<Option<Ptx>> = Mutex::new(None);

/// The text of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Maps a failed driver call `op` (the CUDA API name) on device `label` to [`Error::Backend`].
pub(crate) fn driver_error(label: &str, op: &'static str, e: DriverError) -> Error {
    Error::Backend {
        backend: BackendKind::Cuda,
        device: label.to_string(),
        op,
        code: e.0 as i64,
        message: format!("{:?}", e.0),
    }
}

/// The PTX of [`SOURCE`], compiled on first use.
fn ptx() -> Result<Ptx> {
    compile_cached(SOURCE, &PTX)
}

/// The PTX of `source`, compiled by NVRTC (default options) on the first call and kept in
/// `cache` for the life of the process. A failure is not cached. `libnvrtc` is probed first
/// and the compilation runs under `catch_unwind`, so a missing or broken NVRTC is an
/// [`Error::RuntimeUnavailable`], never a panic; a compile error is an [`Error::Backend`] with
/// the compile log.
pub(crate) fn compile_cached(source: &str, cache: &Mutex<Option<Ptx>>) -> Result<Ptx> {
    let mut cached = cache.lock();
    if let Some(p) = cached.as_ref() {
        return Ok(p.clone());
    }
    // SAFETY: `is_culib_present` only tries to open the shared library with `libloading` (and
    // closes it again); it calls no NVRTC function and has no preconditions.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: NO_NVRTC.to_string(),
        });
    }
    let compiled = catch_unwind(|| nvrtc::compile_ptx(source)).map_err(|payload| {
        Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: format!(
                "NVRTC could not be used (cudarc panicked: {})",
                panic_text(payload.as_ref())
            ),
        }
    })?;
    let p = compiled.map_err(|e| Error::Backend {
        backend: BackendKind::Cuda,
        device: "cuda".to_string(),
        op: "nvrtcCompileProgram",
        code: 0,
        message: match e {
            nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                format!("{nvrtc:?}; compile log: {}", log.to_string_lossy().trim())
            }
            other => format!("{other:?}"),
        },
    })?;
    *cached = Some(p.clone());
    Ok(p)
}

/// Loads `ptx` into `ctx` and runs `get` on the module (to look up its functions), under
/// `catch_unwind`: a cudarc panic (an old driver without a symbol) becomes
/// [`Error::RuntimeUnavailable`] naming `what` and the device `label`.
pub(crate) fn load_module<T>(
    label: &str,
    what: &str,
    ctx: &Arc<CudaContext>,
    ptx: Ptx,
    get: impl FnOnce(&Arc<CudaModule>) -> Result<T>,
) -> Result<T> {
    let load = || -> Result<T> {
        let module = ctx
            .load_module(ptx)
            .map_err(|e| driver_error(label, "cuModuleLoadData", e))?;
        get(&module)
    };
    catch_unwind(AssertUnwindSafe(load)).unwrap_or_else(|payload| {
        Err(Error::RuntimeUnavailable {
            backend: BackendKind::Cuda,
            reason: format!(
                "loading the {what} on {label} failed (cudarc panicked: {})",
                panic_text(payload.as_ref())
            ),
        })
    })
}

/// The CUDA context of `buf`'s memory.
fn context_of(buf: &DeviceBuffer, op: Op) -> Result<Arc<CudaContext>> {
    slice_of(buf, op).map(|s| s.context().clone())
}

fn slice_of(buf: &DeviceBuffer, op: Op) -> Result<&CudaSlice<u8>> {
    buf.as_cuda().ok_or_else(|| Error::InvalidState {
        op: "CUDA kernel",
        buffer: format!("{buf:?}"),
        reason: format!(
            "kernel {} on {}: the buffer has no CUDA memory (empty or another backend)",
            op.name(),
            buf.device().label()
        ),
    })
}

/// The kernels of `dev` (whose context is `ctx`), built on first use.
fn kernels(dev: &Device, ctx: &Arc<CudaContext>) -> Result<Arc<Kernels>> {
    CACHE.get_or_build(dev.label().to_string(), || build(dev.label(), ctx))
}

fn build(label: &str, ctx: &Arc<CudaContext>) -> Result<Kernels> {
    let ptx = ptx()?;
    load_module(label, "CUDA kernels", ctx, ptx, |module| {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_error(label, "cuModuleGetFunction", e))
        };
        let typed = |suf: &str| -> Result<TypedKernels> {
            Ok(TypedKernels {
                axpy: f(&format!("sm_axpy_{suf}"))?,
                scale: f(&format!("sm_scale_{suf}"))?,
                asum: f(&format!("sm_asum_{suf}"))?,
                sumsq: f(&format!("sm_sumsq_{suf}"))?,
            })
        };
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error(label, "cuStreamCreate", e))?;
        Ok(Kernels {
            label: label.to_string(),
            stream,
            f32: typed("f32")?,
            f64: typed("f64")?,
        })
    })
}

pub(super) fn prepare<F: Float>(dev: &Device) -> Result<()> {
    // The device handle exposes no CUDA context: take it from a small scratch buffer.
    let probe = dev.alloc(std::mem::size_of::<F>())?;
    let ctx = context_of(&probe, Op::Axpy)?;
    kernels(dev, &ctx).map(drop)
}

/// A scalar argument of the element type.
#[derive(Clone, Copy)]
enum Value {
    F32(f32),
    F64(f64),
}

fn value<F: Float>(a: F) -> Value {
    match F::KIND {
        ScalarKind::F64 => Value::F64(a.to_f64()),
        // Exact: `a` is an f32.
        _ => Value::F32(a.to_f64() as f32),
    }
}

fn blocks_for(n: usize, max: usize) -> usize {
    n.div_ceil(BLOCK as usize).clamp(1, max)
}

fn config(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launch_error(ks: &Kernels, op: Op, kind: ScalarKind, e: DriverError) -> Error {
    let mut err = driver_error(&ks.label, "cuLaunchKernel", e);
    if let Error::Backend { message, .. } = &mut err {
        message.push_str(&format!(" (kernel {}<{kind}>)", op.name()));
    }
    err
}

fn sync(ks: &Kernels) -> Result<()> {
    ks.stream
        .synchronize()
        .map_err(|e| driver_error(&ks.label, "cuStreamSynchronize", e))
}

pub(super) fn axpy<F: Float>(
    n: usize,
    a: F,
    x: &DeviceRead<'_>,
    y: &mut DeviceWrite<'_>,
) -> Result<()> {
    let ctx = context_of(y.buffer(), Op::Axpy)?;
    let ks = kernels(y.buffer().device(), &ctx)?;
    x.stream().synchronize()?;
    y.stream().synchronize()?;
    let xs = slice_of(x.buffer(), Op::Axpy)?;
    let ys = slice_of(y.buffer(), Op::Axpy)?;
    let func = &ks.typed(F::KIND).axpy;
    let len = n as u64;
    let cfg = config(blocks_for(n, MAX_BLOCKS_ELEMENTWISE));
    let a = value(a);
    let mut b = ks.stream.launch_builder(func);
    b.arg(&len);
    match &a {
        Value::F32(v) => b.arg(v),
        Value::F64(v) => b.arg(v),
    };
    b.arg(xs).arg(ys);
    // SAFETY: the arguments match `sm_axpy_{f32,f64}(unsigned long long n, T a, const T* x,
    // T* y)` in SOURCE, for the `T` of `F::KIND`: a u64, a scalar of that type, and two device
    // pointers of this context. Both buffers hold at least `n` elements (checked by the
    // caller) and stay alive (borrowed through the guards) until the stream is synchronized
    // below. The guards' streams were synchronized above, so no copy is in flight on them.
    unsafe { b.launch(cfg) }.map_err(|e| launch_error(&ks, Op::Axpy, F::KIND, e))?;
    sync(&ks)
}

pub(super) fn scale<F: Float>(n: usize, a: F, x: &mut DeviceWrite<'_>) -> Result<()> {
    let ctx = context_of(x.buffer(), Op::Scale)?;
    let ks = kernels(x.buffer().device(), &ctx)?;
    x.stream().synchronize()?;
    let xs = slice_of(x.buffer(), Op::Scale)?;
    let func = &ks.typed(F::KIND).scale;
    let len = n as u64;
    let cfg = config(blocks_for(n, MAX_BLOCKS_ELEMENTWISE));
    let a = value(a);
    let mut b = ks.stream.launch_builder(func);
    b.arg(&len);
    match &a {
        Value::F32(v) => b.arg(v),
        Value::F64(v) => b.arg(v),
    };
    b.arg(xs);
    // SAFETY: the arguments match `sm_scale_{f32,f64}(unsigned long long n, T a, T* x)` in
    // SOURCE for the `T` of `F::KIND`; the buffer holds at least `n` elements (checked by the
    // caller) and stays alive (borrowed through the guard) until the stream is synchronized
    // below, after the guard's stream.
    unsafe { b.launch(cfg) }.map_err(|e| launch_error(&ks, Op::Scale, F::KIND, e))?;
    sync(&ks)
}

pub(super) fn reduce<F: Float>(op: Op, n: usize, x: &DeviceRead<'_>) -> Result<F> {
    let dev = x.buffer().device();
    let ctx = context_of(x.buffer(), op)?;
    let ks = kernels(dev, &ctx)?;
    let typed = ks.typed(F::KIND);
    let func = match op {
        Op::Asum => &typed.asum,
        _ => &typed.sumsq,
    };
    let blocks = blocks_for(n, MAX_BLOCKS_REDUCE);
    let partial_buf = dev.alloc(blocks * std::mem::size_of::<F>())?;
    let stream = x.stream();
    stream.synchronize()?;
    let xs = slice_of(x.buffer(), op)?;
    let ps = slice_of(&partial_buf, op)?;
    let len = n as u64;
    let mut b = ks.stream.launch_builder(func);
    b.arg(&len).arg(xs).arg(ps);
    // SAFETY: the arguments match `sm_{asum,sumsq}_{f32,f64}(unsigned long long n, const T* x,
    // T* partial)` in SOURCE for the `T` of `F::KIND`; `x` holds at least `n` elements (checked
    // by the caller) and `partial` one element per block. Both stay alive (the guard and the
    // local buffer) until the stream is synchronized below. The block size is BLOCK, the size
    // of the kernel's static shared array.
    unsafe { b.launch(config(blocks)) }.map_err(|e| launch_error(&ks, op, F::KIND, e))?;
    sync(&ks)?;
    let mut partial = vec![F::ZERO; blocks];
    stream.read(&partial_buf, 0, bytemuck::cast_slice_mut(&mut partial))?;
    Ok(F::from_f64(partial.iter().map(|p| p.to_f64()).sum()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cuda_or_skip;

    #[test]
    fn blocks_cover_any_length() {
        assert_eq!(blocks_for(1, 256), 1);
        assert_eq!(blocks_for(256, 256), 1);
        assert_eq!(blocks_for(257, 256), 2);
        assert_eq!(blocks_for(1 << 30, 256), 256);
    }

    #[test]
    fn source_names_every_kernel() {
        for op in ["axpy", "scale", "asum", "sumsq"] {
            assert!(SOURCE.contains(&format!("sm_{op}_##SUF")), "{op}");
        }
        assert!(SOURCE.contains(&format!("#define SM_BLOCK {BLOCK}")));
    }

    #[test]
    fn source_compiles_with_nvrtc() {
        if !crate::testing::nvrtc_or_skip("kernels::cuda::source_compiles_with_nvrtc") {
            return;
        }
        let ptx = ptx().unwrap_or_else(|e| panic!("{e}")).to_src();
        for op in ["axpy", "scale", "asum", "sumsq"] {
            for suf in ["f32", "f64"] {
                let entry = format!(".entry sm_{op}_{suf}(");
                assert!(ptx.contains(&entry), "{entry} missing from the PTX");
            }
        }
    }

    #[test]
    fn missing_nvrtc_is_an_error_not_a_panic() {
        // SAFETY: only tries to open the shared library; see `ptx`.
        if unsafe { nvrtc::sys::is_culib_present() } {
            eprintln!(
                "SKIPPED kernels::cuda::missing_nvrtc_is_an_error_not_a_panic: libnvrtc is present"
            );
            return;
        }
        for _ in 0..2 {
            match ptx() {
                Err(Error::RuntimeUnavailable {
                    backend: BackendKind::Cuda,
                    reason,
                }) => assert_eq!(reason, NO_NVRTC),
                other => panic!("expected RuntimeUnavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn cuda_kernels_are_built_once_per_device() {
        let Some(dev) = cuda_or_skip("kernels::cuda_kernels_are_built_once_per_device") else {
            return;
        };
        let probe = dev.alloc(8).unwrap();
        let ctx = context_of(&probe, Op::Axpy).unwrap();
        let a = kernels(&dev, &ctx).unwrap();
        let b = kernels(&dev, &ctx).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "cached");
        assert!(CACHE.contains(&dev.label().to_string()));
    }
}
