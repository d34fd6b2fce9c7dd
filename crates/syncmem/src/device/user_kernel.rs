//! Kernels the user brings ([`UserKernel`], documented there): the checked launch API of the
//! device layer. The raw compile and launch are the backends' (`backend/*/user.rs`); a launch
//! is ordered and recorded by the same `Kernels::queue` as the crate's own kernels.

use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::{Device, DeviceBuffer, Stream};
use crate::backend::dispatch::{RawArg, RawUserKernel};
use crate::backend::user::{declared_params, ArgShape, Sources};
use crate::error::{BackendKind, Error, Result};

pub use crate::backend::cpu::user::{HostArgs, HostKernelFn};
pub use crate::backend::user::{Grid, KernelParam, ScalarArg, ScalarType};

/// A kernel of the user, by name: OpenCL C source, CUDA C source, a host closure for the `cpu`
/// device, any of them. Built once per device on first use and kept; `Send + Sync`, so one
/// kernel serves every thread (keep it in a `static` `LazyLock` or an `Arc`).
///
/// Kernels the user brings, compiled from OpenCL C or CUDA C source once per
/// device, or a Rust closure over host slices on the `cpu` device, launched on a [`Stream`]
/// with a [`Grid`] and [`KernelArg`]s (Caffe's layers launching their own kernels, CuPy's
/// `RawKernel`).
///
/// A launch is checked, ordered and recorded exactly as the crate's own kernels are
/// (`Kernels::queue`): the stream first waits, on the device, for the commands of other
/// streams that last wrote the buffers it reads (and that used the buffers it writes); the
/// kernel is queued and never waited for; its point on the stream is recorded on every buffer,
/// so that a later access on any stream is ordered after it, a host access waits for exactly
/// that point, and a pooled block freed while it runs goes back to its pool fenced.
///
/// ```
/// use syncmem::device::{Grid, KernelArg, UserKernel};
/// use syncmem::{Device, SyncedMemory};
///
/// # fn main() -> syncmem::Result<()> {
/// // y = a * x, as OpenCL C, CUDA C and a host closure: the launch picks the device's.
/// let axby = UserKernel::new("scale")
///     .with_opencl(
///         "__kernel void scale(const __global float* x, __global float* y, uint n, float a) {
///              size_t i = get_global_id(0); if (i < n) y[i] = a * x[i]; }",
///     )
///     .with_cuda(
///         "extern \"C\" __global__ void scale(const float* x, float* y, unsigned int n, float a) {
///              unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i]; }",
///     )
///     .with_host(|args| {
///         let (x, y) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
///         let (n, a) = (args.u32(2)? as usize, args.f32(3)?);
///         for (y, x) in y[..n].iter_mut().zip(&x[..n]) {
///             *y = a * x;
///         }
///         Ok(())
///     });
/// let dev = Device::cpu();
/// let x = SyncedMemory::new(16, &dev);
/// x.host_mut()?.as_mut_slice_of::<f32>()?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
/// let y = SyncedMemory::new(16, &dev);
/// {
///     let xd = x.device()?;                      // uploads x once
///     let mut yd = y.device_overwrite()?;        // no copy, no fill
///     let stream = yd.stream().clone();
///     let args = [KernelArg::from(&xd), KernelArg::from(&mut yd), 4u32.into(), 0.5f32.into()];
///     // SAFETY: `scale` touches elements 0..n of x and y, and both hold n = 4 floats.
///     unsafe { axby.launch(&stream, Grid::for_elements(4, 64), &args)? };
/// }
/// assert_eq!(y.host()?.as_slice_of::<f32>()?, [0.5, 1.0, 1.5, 2.0]);
/// # Ok(())
/// # }
/// ```
///
/// [`crate::kernels::launch`] takes [`crate::SyncedMemory`] buffers and tensors instead of
/// device buffers, through their guards.
///
/// # Arguments and checks
///
/// Buffers are passed read ([`KernelArg::read`], a [`crate::synced::DeviceRead`] guard) or
/// written ([`KernelArg::write`], a [`crate::synced::DeviceWrite`] guard: read and written);
/// scalars as `i32`, `u32`, `i64`, `u64`, `f32`, `f64`; a by-value parameter of another type
/// (`char`, `half`, `float4`, a struct) as its raw bytes ([`KernelArg::bytes`]). Before
/// anything is queued, a launch
/// is refused with [`Error::KernelArgument`] naming the kernel and the argument when a buffer
/// lives on another device than the stream, when a written buffer is passed twice, when the
/// grid has an extent of 0, more threads per block than the compiled kernel runs, more
/// work-items in all than the device's addresses count (2^64 on a 64-bit device: a grid the
/// device could not index, which would run for ever if at all), or more threads or blocks
/// along an axis than the device launches (OpenCL's `CL_DEVICE_MAX_WORK_ITEM_SIZES` and
/// `CL_DEVICE_MAX_WORK_GROUP_SIZE`; CUDA's block and grid dimensions), and, from
/// what the compiler reports of the kernel's parameters, when the count differs or an
/// argument is not of the parameter's kind: a buffer for a pointer, a scalar of the exact type
/// (OpenCL reports each parameter's type; CUDA's PTX tells only `float`, `double`, 32-bit
/// integer, and 64-bit word, which is a pointer or a 64-bit integer), and for a parameter of
/// any other type ([`KernelParam::Bytes`]) raw bytes or a scalar of exactly its size (OpenCL's
/// vector and small types by their names, CUDA's by the PTX; a parameter whose size neither
/// tells, an OpenCL struct, takes nothing: [`KernelParam::Other`]). A host closure has no
/// declared parameters: [`HostArgs`] checks each access instead.
///
/// A source is built once per device on first use (or by [`UserKernel::prepare`]) and kept:
/// OpenCL programs per device, by source and options; CUDA C by NVRTC once per process, its
/// module loaded once per device. A failed build is [`Error::KernelBuild`] with the compiler's
/// log, and is not kept (the next launch tries again); a name, source or OpenCL build options
/// holding a NUL byte (which the compilers' C strings cannot carry) is refused as
/// [`Error::KernelBuild`] too, on every backend, before any compiler sees it. CUDA kernels must
/// be `extern "C"`.
/// NVRTC compiles the CUDA sources in CI; the CUDA path has run on a GPU by hand (the user
/// kernel tests on `cuda:0`).
///
/// # The native escape hatch
///
/// `DeviceBuffer::as_opencl` / `DeviceBuffer::as_cuda` and `Stream::as_opencl` /
/// `Stream::as_cuda` (features `opencl`, `cuda`) hand out the native objects. Work queued
/// natively on a guard's own stream is ordered with that buffer's copies (the queue is in order, and a guard's stream
/// already follows the other streams' work on the buffer), and a pooled block whose handle was
/// handed out is fenced on that stream when freed; work queued on any other stream must be
/// announced ([`crate::synced::DeviceWrite::queued_on`]). Prefer the launch API whenever a
/// kernel touches buffers of other streams or several buffers at once, when it should run on
/// `cpu` too, or when mistakes in the arguments should be errors: it orders every argument on
/// the launch's stream and records the launch on each buffer, which native work cannot do.
/// Use the native objects for what the API does not cover (images, events of your own,
/// `__local` parameters, dynamic shared memory, library calls).
pub struct UserKernel {
    name: Arc<str>,
    sources: Sources,
    /// The kernel built for the first device it was built for, read without a lock (the
    /// device handle keeps the comparison by identity valid).
    first: OnceLock<(Device, RawUserKernel)>,
    /// The kernel built for each other device.
    others: Mutex<SmallVec<[(Device, RawUserKernel); 1]>>,
}

impl UserKernel {
    /// A kernel named `name` (the function's name in the sources) with nothing to run yet: add
    /// sources with [`UserKernel::with_opencl`], [`UserKernel::with_cuda`] and
    /// [`UserKernel::with_host`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into().into(),
            sources: Sources::default(),
            first: OnceLock::new(),
            others: Mutex::default(),
        }
    }

    /// Adds the OpenCL C source of the kernel (a `__kernel` function named as the kernel).
    pub fn with_opencl(mut self, source: impl Into<String>) -> Self {
        self.sources.opencl = Some(source.into().into());
        self
    }

    /// Sets the options of the OpenCL build (`-D WIDTH=4 -cl-fast-relaxed-math`, ...);
    /// `-cl-kernel-arg-info` is always added.
    pub fn with_opencl_options(mut self, options: impl Into<String>) -> Self {
        self.sources.opencl_options = options.into().into();
        self
    }

    /// Adds the CUDA C source of the kernel (an `extern "C" __global__` function named as the
    /// kernel; NVRTC has no standard headers).
    pub fn with_cuda(mut self, source: impl Into<String>) -> Self {
        self.sources.cuda = Some(source.into().into());
        self
    }

    /// Adds the host closure that runs the kernel on the `cpu` device: it gets the launch's
    /// buffers as slices and its scalars ([`HostArgs`]), once per launch, and has finished when
    /// the launch returns.
    pub fn with_host(
        mut self,
        f: impl Fn(&HostArgs<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.sources.host = Some(Arc::new(f));
        self
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when the kernel has something to run on `backend`.
    pub fn supports(&self, backend: BackendKind) -> bool {
        match backend {
            BackendKind::Cpu => self.sources.host.is_some(),
            BackendKind::OpenCl => self.sources.opencl.is_some(),
            BackendKind::Cuda => self.sources.cuda.is_some(),
        }
    }

    /// The parameter list as the source of `backend` declares it (`["const __global float*
    /// x", "uint n"]`), found by a plain reading of the text (`None` when not found, or for
    /// `cpu`). For messages and tools; the checks use what the compiler reports.
    pub fn declared_params(&self, backend: BackendKind) -> Option<Vec<String>> {
        let source = match backend {
            BackendKind::OpenCl => self.sources.opencl.as_ref()?,
            BackendKind::Cuda => self.sources.cuda.as_ref()?,
            BackendKind::Cpu => return None,
        };
        declared_params(source, &self.name)
    }

    /// Builds the kernel for `device` now (a launch builds it on first use otherwise).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the kernel has nothing for the device's backend;
    /// [`Error::KernelBuild`] with the compiler's log; [`Error::RuntimeUnavailable`] without
    /// NVRTC (CUDA); a backend error.
    pub fn prepare(&self, device: &Device) -> Result<()> {
        self.built_for(device).map(drop)
    }

    /// The kernel's parameters on `device` as the compiler reports them (`None` for a host
    /// closure, which declares none); builds the kernel first.
    ///
    /// # Errors
    /// As [`UserKernel::prepare`].
    pub fn params(&self, device: &Device) -> Result<Option<Vec<KernelParam>>> {
        Ok(self
            .built_for(device)?
            .params()
            .map(<[KernelParam]>::to_vec))
    }

    /// The kernel built for `device`, built now if it was not.
    fn built_for(&self, device: &Device) -> Result<RawUserKernel> {
        if let Some(k) = self.find(device) {
            return Ok(k);
        }
        // Built without a lock: a compile can take long. The backend's cache makes a race
        // build once; the first result is kept here.
        let k = device.shared.raw.build_user(&self.name, &self.sources)?;
        if self.first.set((device.clone(), k.clone())).is_ok() {
            return Ok(k);
        }
        let mut others = self.others.lock();
        if let Some(k) = self.find_locked(device, &others) {
            return Ok(k);
        }
        others.push((device.clone(), k.clone()));
        Ok(k)
    }

    fn find(&self, device: &Device) -> Option<RawUserKernel> {
        self.find_locked(device, &self.others.lock())
    }

    fn find_locked(
        &self,
        device: &Device,
        others: &[(Device, RawUserKernel)],
    ) -> Option<RawUserKernel> {
        match self.first.get() {
            Some((d, k)) if d.same(device) => Some(k.clone()),
            _ => others
                .iter()
                .find(|(d, _)| d.same(device))
                .map(|(_, k)| k.clone()),
        }
    }

    /// Queues the kernel on `stream` over `grid` with `args`, and returns at once (on `cpu`,
    /// once the host closure returned). See [`UserKernel`] for the checks and the ordering.
    ///
    /// # Safety
    /// The kernel runs code the crate cannot check. For these arguments and this grid it must
    /// read and write each buffer only within its length ([`DeviceBuffer::len`]) and write
    /// only the buffers passed as written. (A host closure, which is safe Rust, meets this by
    /// itself.)
    ///
    /// # Errors
    /// [`Error::KernelArgument`] naming the kernel and the argument (see [`UserKernel`]);
    /// the errors of [`UserKernel::prepare`]; a backend error queueing the kernel; on `cpu`,
    /// the closure's error.
    pub unsafe fn launch(&self, stream: &Stream, grid: Grid, args: &[KernelArg<'_>]) -> Result<()> {
        self.launch_checked(stream, grid, args)
    }

    /// [`UserKernel::launch`], for callers of the crate that forward its safety contract.
    pub(crate) fn launch_checked(
        &self,
        stream: &Stream,
        grid: Grid,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        let dev = stream.device();
        if let Some(reason) = grid.problem() {
            return Err(self.error(None, reason));
        }
        self.check_buffers(dev, args)?;
        // The first device's kernel without a lock or a reference count (the common case).
        let owned;
        let k = match self.first.get() {
            Some((d, k)) if d.same(dev) => k,
            _ => {
                owned = self.built_for(dev)?;
                &owned
            }
        };
        if let Some(params) = k.params() {
            self.check_params(dev.backend(), params, args)?;
        }
        if let Some(max) = k.max_threads() {
            let t = grid.threads_per_block();
            if t > max {
                return Err(self.error(
                    None,
                    format!(
                        "{t} threads per block; the kernel runs at most {max} on {}",
                        dev.label()
                    ),
                ));
            }
        }
        if let Some(reason) = grid.exceeds(&k.limits()) {
            return Err(self.error(None, format!("{reason} on {}", dev.label())));
        }
        let mut reads: SmallVec<[Option<&DeviceBuffer>; 8]> = SmallVec::new();
        let mut writes: SmallVec<[Option<&DeviceBuffer>; 8]> = SmallVec::new();
        let mut raw: SmallVec<[RawArg<'_>; 16]> = SmallVec::new();
        for a in args {
            raw.push(match a.kind {
                ArgKind::Buffer { buf, write } => {
                    if write { &mut writes } else { &mut reads }.push(Some(buf));
                    RawArg::Mem {
                        mem: buf.raw(),
                        len: buf.len(),
                        write,
                    }
                }
                ArgKind::Scalar(s) => RawArg::Scalar(s),
                ArgKind::Bytes(b) => RawArg::Bytes(b),
            });
        }
        stream.kernels().queue(&reads, &writes, |d, s| {
            d.launch_user(s, k, &self.name, &grid, &raw)
        })
    }

    fn error(&self, index: Option<usize>, reason: String) -> Error {
        Error::KernelArgument {
            kernel: self.name.to_string(),
            index,
            reason,
        }
    }

    /// Every buffer on the stream's device; a written buffer passed once.
    fn check_buffers(&self, dev: &Device, args: &[KernelArg<'_>]) -> Result<()> {
        for (i, a) in args.iter().enumerate() {
            let ArgKind::Buffer { buf, write } = a.kind else {
                continue;
            };
            if !buf.device().same(dev) {
                return Err(self.error(
                    Some(i),
                    format!(
                        "the buffer lives on {}, the launch's stream on {}",
                        buf.device().label(),
                        dev.label()
                    ),
                ));
            }
            if buf.is_empty() {
                continue; // no memory: it aliases nothing
            }
            let twice = args[..i]
                .iter()
                .enumerate()
                .find_map(|(j, b)| match b.kind {
                    ArgKind::Buffer {
                        buf: other,
                        write: w,
                    } if std::ptr::eq(other, buf) && (w || write) => Some(j),
                    _ => None,
                });
            if let Some(j) = twice {
                return Err(self.error(
                    Some(i),
                    format!(
                        "the buffer is also argument {j}, and the launch writes it: pass a \
                         buffer that is read and written once, as written"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The count and the kind of every argument against the compiled parameters.
    fn check_params(
        &self,
        backend: BackendKind,
        params: &[KernelParam],
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        if params.len() != args.len() {
            return Err(self.error(
                None,
                format!(
                    "the kernel takes {} arguments, the launch passes {}",
                    params.len(),
                    args.len()
                ),
            ));
        }
        for (i, (p, a)) in params.iter().zip(args).enumerate() {
            if let Some(mut reason) = p.accepts(a.shape()) {
                if let Some(decl) = self
                    .declared_params(backend)
                    .and_then(|d| d.get(i).cloned())
                {
                    reason.push_str(&format!(" (parameter `{decl}`)"));
                }
                return Err(self.error(Some(i), reason));
            }
        }
        Ok(())
    }
}

impl fmt::Debug for UserKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserKernel")
            .field("name", &self.name)
            .field("opencl", &self.sources.opencl.is_some())
            .field("cuda", &self.sources.cuda.is_some())
            .field("host", &self.sources.host.is_some())
            .finish()
    }
}

#[derive(Clone, Copy)]
enum ArgKind<'a> {
    Buffer { buf: &'a DeviceBuffer, write: bool },
    Scalar(ScalarArg),
    Bytes(&'a [u8]),
}

/// One argument of [`UserKernel::launch`]: a device buffer the kernel reads, one it writes
/// (and may read), a scalar, or the raw bytes of a by-value parameter of a type the crate has
/// no scalar for ([`KernelArg::bytes`]). Guards convert into it: `KernelArg::from(&read_guard)`,
/// `KernelArg::from(&mut write_guard)`; scalars with `.into()`.
#[derive(Clone, Copy)]
pub struct KernelArg<'a> {
    kind: ArgKind<'a>,
}

impl<'a> KernelArg<'a> {
    /// A buffer the kernel only reads.
    pub fn read(buf: &'a DeviceBuffer) -> Self {
        Self {
            kind: ArgKind::Buffer { buf, write: false },
        }
    }

    /// A buffer the kernel writes (and may read).
    pub fn write(buf: &'a mut DeviceBuffer) -> Self {
        Self::written(buf)
    }

    /// A buffer the kernel writes, held exclusively by the caller through a write guard.
    pub(crate) fn written(buf: &'a DeviceBuffer) -> Self {
        Self {
            kind: ArgKind::Buffer { buf, write: true },
        }
    }

    /// A scalar.
    pub fn scalar(value: impl Into<ScalarArg>) -> Self {
        Self {
            kind: ArgKind::Scalar(value.into()),
        }
    }

    /// The raw bytes of a by-value parameter whose type the crate has no scalar for: a `char`,
    /// a `half`, a `float4`, a struct (`bytemuck::bytes_of(&value)` of a `#[repr(C)]` twin).
    /// A launch takes them only for a parameter of exactly their size
    /// ([`KernelParam::Bytes`]); the layout inside is the caller's to get right.
    pub fn bytes(bytes: &'a [u8]) -> Self {
        Self {
            kind: ArgKind::Bytes(bytes),
        }
    }

    fn shape(&self) -> ArgShape {
        match self.kind {
            ArgKind::Buffer { .. } => ArgShape::Buffer,
            ArgKind::Scalar(s) => ArgShape::Scalar(s.scalar_type()),
            ArgKind::Bytes(b) => ArgShape::Bytes(b.len()),
        }
    }
}

impl fmt::Debug for KernelArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ArgKind::Buffer { buf, write } => f
                .debug_struct("KernelArg")
                .field("buffer", buf)
                .field("write", &write)
                .finish(),
            ArgKind::Scalar(s) => f.debug_tuple("KernelArg").field(&s).finish(),
            ArgKind::Bytes(b) => f.debug_struct("KernelArg").field("bytes", &b).finish(),
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<$t> for ScalarArg {
            fn from(v: $t) -> Self {
                ScalarArg::$variant(v)
            }
        }
        impl From<$t> for KernelArg<'_> {
            fn from(v: $t) -> Self {
                KernelArg::scalar(v)
            }
        }
    )*};
}

scalar_from!(i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

impl From<ScalarArg> for KernelArg<'_> {
    fn from(v: ScalarArg) -> Self {
        KernelArg::scalar(v)
    }
}
