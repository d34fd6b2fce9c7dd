//! The backends: everything that names a compute API (OpenCL through `opencl3`, CUDA through
//! `cudarc`) or runs the math on the host, one folder per backend (`cpu/`, `opencl/`,
//! `cuda/`), behind crate-private traits.
//!
//! [`BackendKernels`] is the math every backend implements once: GEMM with an optional bias,
//! ReLU and its gradient, the softmax loss and its gradient, accuracy, fills, and the BLAS-1
//! operations of parameter blobs (axpy, scale, asum, sumsq). The device layer
//! ([`crate::device`]) checks the arguments (devices, lengths) and dispatches to the right
//! backend with one `match`; operators and parameter math never see a backend type.

#[cfg(any(feature = "opencl", feature = "cuda"))]
pub(crate) mod args;
pub(crate) mod barrier;
#[cfg(any(feature = "opencl", feature = "cuda"))]
pub(crate) mod cache;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod dispatch;
pub(crate) mod epilogue;
pub(crate) mod grid;
#[cfg(feature = "opencl")]
pub(crate) mod opencl;
#[cfg(any(feature = "opencl", feature = "cuda"))]
pub(crate) mod timeline;
pub(crate) mod user;

use std::any::Any;
use std::sync::Arc;

use crate::dtype::{Float, ScalarKind};
use crate::error::{BackendKind, Result};

/// Facts about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The backend.
    pub backend: BackendKind,
    /// Index among the devices of that backend.
    pub ordinal: usize,
    /// Device name as the runtime reports it.
    pub name: String,
    /// Vendor or platform name.
    pub vendor: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Largest single allocation the device accepts, in bytes.
    pub max_alloc: u64,
    /// True when device memory is host memory (integrated GPUs, CPU OpenCL drivers).
    pub host_unified: bool,
    /// True when the host may read and write device memory made over host memory directly,
    /// once the device work on it is done, with no map call in between: the `cpu` device, CPU
    /// OpenCL devices, integrated CUDA devices (mapped pinned memory). Other host-unified
    /// devices (integrated GPUs under OpenCL) need a buffer mapped for host access and
    /// unmapped for device access.
    pub host_coherent: bool,
}

impl DeviceInfo {
    /// The device string: `cpu`, `opencl:0`, `cuda:1`.
    pub fn label(&self) -> String {
        match self.backend {
            BackendKind::Cpu => "cpu".to_string(),
            b => format!("{b}:{}", self.ordinal),
        }
    }
}

/// What the host may do with a mapping of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapAccess {
    /// Read only: the device may still read the memory while it is mapped.
    Read,
    /// Read and write.
    ReadWrite,
    /// Write every byte: the previous contents need not be kept.
    Overwrite,
}

/// Raw memory a pool carves its blocks from: the backend allocation behind a caching pool
/// ([`crate::alloc::pool::Pool`]). A segment is freed, with the API that made it, when it is
/// dropped; a view is a range of a segment usable as memory of its own (an OpenCL sub-buffer,
/// an offset device pointer), which keeps the segment alive.
pub trait RawStorage {
    /// A segment of raw memory.
    type Segment: Send + Sync + 'static;
    /// A view of a range of a segment.
    type View;

    /// Allocates a segment of `bytes` bytes.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] when the backend refuses, or another error of the backend.
    fn alloc(&self, bytes: usize) -> Result<Self::Segment>;

    /// A view of `len >= 1` bytes at `offset` of `segment` (`offset + len` within it, `offset`
    /// aligned as the backend needs), keeping the segment alive.
    ///
    /// # Errors
    /// An error of the backend.
    fn view(&self, segment: &Arc<Self::Segment>, offset: usize, len: usize) -> Result<Self::View>;

    /// Under a memory cap, whether a small request that finds no room but a wholly free segment
    /// kept for larger requests may split that segment now, rather than be refused (the pool
    /// keeps such segments whole while it can grow instead). `true` by default; a device's
    /// storage says `false` until its out-of-memory path has dropped and evicted what it can.
    fn may_split_whole(&self) -> bool {
        true
    }
}

/// Any function from a size to a segment is a storage without views (tests, trace replay).
impl<T: Send + Sync + 'static, F: Fn(usize) -> Result<T>> RawStorage for F {
    type Segment = T;
    type View = ();

    fn alloc(&self, bytes: usize) -> Result<T> {
        self(bytes)
    }

    fn view(&self, _: &Arc<T>, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

/// Keeps a pool segment alive for as long as a view into it exists.
pub(crate) type KeepAlive = Arc<dyn Any + Send + Sync>;

// The device traits: the contract every backend implements (CPU, OpenCL, CUDA). Rules every
// implementation follows:
// - `alloc(bytes)` is called with `bytes >= 1` only; memory contents are unspecified.
// - A `Mem` / `Pinned` frees itself on `Drop` with the API that made it, and never panics there
//   (errors on free are ignored: the runtime may already be shutting down).
// - Stream operations are ordered on the stream. `copy` and `fill` are asynchronous.
// - Offsets and lengths passed in have already been checked against the buffer sizes by the
//   caller, and `len >= 1`.

/// One physical device of a backend, created once at discovery.
pub(crate) trait BackendDevice: Send + Sync + 'static {
    /// Device memory.
    type Mem: BackendMem;
    /// Page-locked host memory that the device can copy from/to quickly.
    type Pinned: BackendPinned;
    /// A queue of device work.
    type Stream: BackendStream<Mem = Self::Mem, Event = Self::Event>;
    /// A marker in a stream.
    type Event: BackendEvent;

    /// Facts about the device.
    fn info(&self) -> &DeviceInfo;
    /// Allocates `bytes` of device memory (no zero fill).
    fn alloc(&self, bytes: usize) -> Result<Self::Mem>;
    /// Allocates `bytes` of pinned host memory, zero-filled.
    fn alloc_pinned(&self, bytes: usize) -> Result<Self::Pinned>;
    /// Creates a new stream (in-order queue) on this device.
    fn new_stream(&self) -> Result<Self::Stream>;
    /// Alignment in bytes that the offset of a sub-buffer ([`BackendDevice::sub_mem`]) must
    /// respect (a power of two).
    fn sub_align(&self) -> usize;
    /// A view of `len >= 1` bytes of `parent` from `offset` (a multiple of
    /// [`BackendDevice::sub_align`], `offset + len <= parent.len()`), usable wherever a `Mem`
    /// is. Dropping the view never frees the parent's memory; `keep` (which owns the parent)
    /// lives as long as the view.
    fn sub_mem(
        &self,
        parent: &Self::Mem,
        offset: usize,
        len: usize,
        keep: KeepAlive,
    ) -> Result<Self::Mem>;
}

/// Device memory owned by this value.
pub(crate) trait BackendMem: Send + Sync + 'static {
    /// Size in bytes.
    fn len(&self) -> usize;
}

/// Pinned host memory owned by this value.
pub(crate) trait BackendPinned: Send + Sync + 'static {
    /// Start of the host-visible mapping. Valid for `len()` bytes until drop.
    fn as_ptr(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;
}

/// An in-order queue of device work.
pub(crate) trait BackendStream: Send + Sync + 'static {
    /// Device memory of this backend.
    type Mem;
    /// Events of this backend.
    type Event;

    /// Copies `len` bytes from host `src` into `dst` at `dst_off`. Returns the command's
    /// sequence number on the stream's [timeline](timeline) (0 for a backend whose commands
    /// finish before returning).
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes. When `blocking` is false, `src` must stay
    /// valid and unmodified until the command has completed.
    unsafe fn write(
        &self,
        dst: &Self::Mem,
        dst_off: usize,
        src: *const u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64>;

    /// Copies `len` bytes from `src` at `src_off` into host `dst`. Returns the command's
    /// sequence number.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not accessed by anything else until the
    /// copy is complete (on return when `blocking`, else when the command has completed).
    unsafe fn read(
        &self,
        src: &Self::Mem,
        src_off: usize,
        dst: *mut u8,
        len: usize,
        blocking: bool,
    ) -> Result<u64>;

    /// Device-to-device copy, queued. `src` and `dst` may be on different devices of the same
    /// backend when the backend supports it. Returns the command's sequence number.
    fn copy(
        &self,
        src: &Self::Mem,
        src_off: usize,
        dst: &Self::Mem,
        dst_off: usize,
        len: usize,
    ) -> Result<u64>;

    /// Sets `len` bytes of `dst` from `off` to `value`, queued. Returns the command's sequence
    /// number.
    fn fill(&self, dst: &Self::Mem, off: usize, len: usize, value: u8) -> Result<u64>;

    /// Records an event after all work queued so far (including work queued on the stream's
    /// native queue by someone else).
    fn record(&self) -> Result<Self::Event>;

    /// Makes later work on this stream wait for `event`.
    fn wait_for(&self, event: &Self::Event) -> Result<()>;

    /// Blocks until all queued work is complete.
    fn synchronize(&self) -> Result<()>;

    /// The sequence number of the newest command (0 when none, or for a backend whose commands
    /// finish before returning).
    fn last_seq(&self) -> u64;

    /// True once command `seq` has completed. Never blocks.
    ///
    /// # Errors
    /// The error of a command that failed.
    fn is_done(&self, seq: u64) -> Result<bool>;

    /// Blocks until command `seq` has completed; returns whether it had to wait.
    ///
    /// # Errors
    /// The error of a command that failed.
    fn wait_done(&self, seq: u64) -> Result<bool>;

    /// Makes work queued later on this stream wait, on the device, for command `seq` of
    /// `other` (a stream of the same backend). Nothing is queued when it is known complete.
    ///
    /// # Errors
    /// A backend error.
    fn wait_on(&self, other: &Self, seq: u64) -> Result<()>;
}

/// A marker in a stream.
pub(crate) trait BackendEvent: Send + Sync + Clone + 'static {
    /// Blocks until the event has completed.
    fn wait(&self) -> Result<()>;
    /// True once the event has completed.
    fn is_complete(&self) -> Result<bool>;
}

/// A memory argument of a kernel: `None` for an empty buffer, which a kernel never reads or
/// writes (the backends pass a null pointer).
pub(crate) type Buf<'a, M> = Option<&'a M>;

/// A label that is not a class index: (row, label). Only the `cpu` backend reports it (a device
/// kernel cannot return it without a read-back; it writes NaN instead).
pub(crate) type BadLabel = (usize, i32);

/// A GEMM: `C[m,n] = op(A)·op(B) (+ bias[col])`, then `max(C, 0)` with `relu`, row-major, with
/// `op(A)[i,l] = ta ? A[l*m + i] : A[i*k + l]` and `op(B)[l,j] = tb ? B[j*k + l] : B[l*n + j]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm<'e> {
    /// `A` is stored transposed.
    pub(crate) ta: bool,
    /// `B` is stored transposed.
    pub(crate) tb: bool,
    /// Rows of `C`.
    pub(crate) m: usize,
    /// Columns of `C`.
    pub(crate) n: usize,
    /// The inner dimension.
    pub(crate) k: usize,
    /// Apply `max(·, 0)` to every result, after the bias (a fused FC + Relu).
    pub(crate) relu: bool,
    /// A user's activation after the bias (and the ReLU), or its gradient in place of the
    /// ReLU's mask (the mask operand is then the activation's output).
    pub(crate) user: Option<epilogue::UserAct<'e>>,
}

/// What [`BackendKernels::softmax_loss`] also computes in its pass over the rows (a fused
/// SoftmaxWithLoss + Accuracy + SoftmaxWithLossGradient), from the probabilities it writes.
#[derive(Debug)]
pub(crate) struct SoftmaxExtra<'a, M> {
    /// `(top_k >= 1, out)`: the accuracy of the probabilities into `out[0]`, as
    /// [`BackendKernels::accuracy`] computes it.
    pub(crate) accuracy: Option<(usize, &'a M)>,
    /// `dx = (p - onehot(labels)) / rows`, as [`BackendKernels::softmax_loss_grad`] without
    /// `dloss` computes it (`rows x cols` elements).
    pub(crate) grad: Option<&'a M>,
    /// The loss and the accuracy again, side by side in `out[0..2]` (given only with
    /// `accuracy`), so that one read brings both back.
    pub(crate) scalars: Option<&'a M>,
}

impl<M> Clone for SoftmaxExtra<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for SoftmaxExtra<'_, M> {}

/// The most `(n, x, y)` pairs of one [`BackendKernels::axpy_multi`] call (one launch).
pub(crate) const AXPY_MULTI: usize = 8;

/// The reductions of [`BackendKernels::reduce_partials`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// `sum |x[i]|`.
    Asum,
    /// `sum x[i]^2`.
    Sumsq,
}

impl Reduce {
    /// `asum` or `sumsq`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reduce::Asum => "asum",
            Reduce::Sumsq => "sumsq",
        }
    }
}

/// The kernels of one backend, implemented once per backend on its device type.
///
/// Contract, checked by the caller (the device layer) before any call:
/// - every buffer belongs to this device and holds at least the elements the call reads or
///   writes (`f32` unless stated, labels `i32`); `None` is passed only for an empty operand;
/// - the buffers written are held exclusively by the caller (write guards) for the duration of
///   the call, and no other buffer aliases them unless the method says so (in-place forms);
/// - sizes are at least 1 where the method says so; 32-bit limits are the backend's to check.
///
/// Work is queued on `stream`, ordered after everything queued there before.
pub(crate) trait BackendKernels {
    /// The backend's stream.
    type Stream;
    /// The backend's device memory.
    type Mem;

    /// Builds (or finds) the math kernels of element type `kind` (`f32` or `f64`).
    fn prepare_math(&self, kind: ScalarKind) -> Result<()>;

    /// `C = op(A)·op(B) (+ bias)`, then `max(C, 0)` when [`Gemm::relu`], then, with `mask`
    /// (`[m, n]`, aliasing nothing written), `C[i,j] = mask[i*n + j] > 0 ? C[i,j] : 0` (a fused
    /// ReLU gradient, the select of [`BackendKernels::relu_grad`]); `m, n >= 1` (`a` and `b`
    /// are empty only when `k == 0`). With `sum` (`[m]`, only when [`Gemm::ta`], aliasing no
    /// other operand), the same launch also writes `sum[i] = Σ_l A[l*m + i]`, the column sums
    /// of `A` as stored (the bias gradient of an `FCGradient`, whose `dW = dYᵀ·X`), bit for
    /// bit what [`BackendKernels::col_sum`] writes for `(k, m, A)`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        s: &Self::Stream,
        g: &Gemm,
        a: Buf<'_, Self::Mem>,
        b: Buf<'_, Self::Mem>,
        c: &Self::Mem,
        bias: Buf<'_, Self::Mem>,
        mask: Buf<'_, Self::Mem>,
        sum: Buf<'_, Self::Mem>,
    ) -> Result<()>;

    /// `out[j] = sum_i x[i*cols + j]`; `cols >= 1` (`x` empty only when `rows == 0`).
    fn col_sum(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        x: Buf<'_, Self::Mem>,
        out: &Self::Mem,
    ) -> Result<()>;

    /// `y = max(x, 0)`, `n >= 1`; `x` may be `y`.
    fn relu(&self, s: &Self::Stream, n: usize, x: &Self::Mem, y: &Self::Mem) -> Result<()>;

    /// `dx = y > 0 ? dy : 0`, `n >= 1`; `dy` may be `dx`.
    fn relu_grad(
        &self,
        s: &Self::Stream,
        n: usize,
        y: &Self::Mem,
        dy: &Self::Mem,
        dx: &Self::Mem,
    ) -> Result<()>;

    /// `y[..n] = value` (`f32`), `n >= 1`.
    fn fill_f32(&self, s: &Self::Stream, n: usize, value: f32, y: &Self::Mem) -> Result<()>;

    /// Row-wise softmax of `x[rows, cols]` into `p` and the mean cross-entropy against
    /// `labels` into `loss[0]` (0 for no rows), then what `extra` asks for, bit for bit what
    /// the separate kernels give; `cols >= 1`, `p` given whenever `extra.grad` is (`rows >= 1`).
    #[allow(clippy::too_many_arguments)]
    fn softmax_loss(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        x: Buf<'_, Self::Mem>,
        labels: Buf<'_, Self::Mem>,
        p: Buf<'_, Self::Mem>,
        loss: &Self::Mem,
        extra: SoftmaxExtra<'_, Self::Mem>,
    ) -> Result<Option<BadLabel>>;

    /// `dx = (p - onehot(labels)) * dloss / rows` (`dloss = dloss[0]`, or 1 without it);
    /// `rows, cols >= 1`.
    #[allow(clippy::too_many_arguments)]
    fn softmax_loss_grad(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        p: &Self::Mem,
        labels: &Self::Mem,
        dloss: Buf<'_, Self::Mem>,
        dx: &Self::Mem,
    ) -> Result<Option<BadLabel>>;

    /// The fraction of rows whose label is among the `top_k` best scores (ties count) into
    /// `out[0]` (0 for no rows); `cols, top_k >= 1`.
    #[allow(clippy::too_many_arguments)]
    fn accuracy(
        &self,
        s: &Self::Stream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: Buf<'_, Self::Mem>,
        labels: Buf<'_, Self::Mem>,
        out: &Self::Mem,
    ) -> Result<Option<BadLabel>>;

    /// `y[..n] += a * x[..n]`, `n >= 1`.
    fn axpy<F: Float>(
        &self,
        s: &Self::Stream,
        n: usize,
        a: F,
        x: &Self::Mem,
        y: &Self::Mem,
    ) -> Result<()>;

    /// `y[..n] += a * x[..n]` for each `(n, x, y)` of `pairs` (1 to [`AXPY_MULTI`] of them, each
    /// `n >= 1`, no `y` aliasing another operand), in one launch on a device: bit for bit one
    /// [`BackendKernels::axpy`] per pair.
    fn axpy_multi<F: Float>(
        &self,
        s: &Self::Stream,
        a: F,
        pairs: &[(usize, &Self::Mem, &Self::Mem)],
    ) -> Result<()>;

    /// `x[..n] *= a`, `n >= 1`.
    fn scale<F: Float>(&self, s: &Self::Stream, n: usize, a: F, x: &Self::Mem) -> Result<()>;

    /// How many partial results [`BackendKernels::reduce_partials`] writes for `n` elements.
    fn reduce_groups(&self, n: usize) -> usize;

    /// Writes `reduce_groups(n)` partial results of `op` over `x[..n]` (`n >= 1`) into
    /// `partial` (elements of `F`); their sum (in `f64`) is the result.
    fn reduce_partials<F: Float>(
        &self,
        s: &Self::Stream,
        op: Reduce,
        n: usize,
        x: &Self::Mem,
        partial: &Self::Mem,
    ) -> Result<()>;
}
