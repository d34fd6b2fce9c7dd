//! Typed errors. Every failure names what failed: the buffer, the sizes, the device.

use std::fmt;

mod oom;

pub(crate) use oom::human as human_bytes;
pub use oom::{OomReport, OomRetry};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which compute API a device belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BackendKind {
    /// The host itself (always present).
    Cpu,
    /// OpenCL, loaded at run time (feature `opencl`).
    OpenCl,
    /// CUDA driver API, loaded at run time (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// The lower-case name used in device strings (`cpu`, `opencl`, `cuda`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::OpenCl => "opencl",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every error syncmem returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device string such as `"opencl:0"` could not be parsed.
    #[error("invalid device string {spec:?}: {reason}")]
    InvalidDeviceSpec {
        /// The string given.
        spec: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The backend was not compiled into this build (cargo feature off).
    #[error(
        "backend {backend} is not compiled into this build (enable the cargo feature `{backend}`)"
    )]
    BackendNotCompiled {
        /// The backend asked for.
        backend: BackendKind,
    },

    /// The backend's runtime library or driver could not be loaded or has no platform.
    #[error("{backend} runtime unavailable: {reason}")]
    RuntimeUnavailable {
        /// The backend whose runtime is missing.
        backend: BackendKind,
        /// What was found missing.
        reason: String,
    },

    /// A device index beyond what the backend reports.
    #[error("no device {backend}:{ordinal} ({available} {backend} device(s) present)")]
    NoSuchDevice {
        /// Backend asked for.
        backend: BackendKind,
        /// Index asked for.
        ordinal: usize,
        /// How many devices of that backend exist.
        available: usize,
    },

    /// An allocation failed for lack of memory: the request, the device, the cap, the usage
    /// and the largest holders, as data ([`OomReport`]; the message is its `Display`).
    #[error("{report}")]
    OutOfMemory {
        /// What was asked for and what the allocator found.
        report: Box<OomReport>,
    },

    /// A call into a backend API failed.
    #[error("{backend} call {op} failed on {device}: {message} (code {code})")]
    Backend {
        /// The backend.
        backend: BackendKind,
        /// Device label.
        device: String,
        /// The API operation, e.g. `clEnqueueWriteBuffer`.
        op: &'static str,
        /// The backend's status code.
        code: i64,
        /// Readable message for the code.
        message: String,
    },

    /// A size computation overflowed.
    #[error("size overflow: {what}")]
    SizeOverflow {
        /// What was being computed (with its operands).
        what: String,
    },

    /// A range that falls outside a buffer.
    #[error("out of bounds on {what}: offset {offset} + length {len} exceeds size {size}")]
    OutOfBounds {
        /// The buffer.
        what: String,
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },

    /// Two buffers or slices whose lengths must match do not.
    #[error("size mismatch on {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// What was being matched.
        what: String,
        /// Expected bytes.
        expected: usize,
        /// Actual bytes.
        actual: usize,
    },

    /// A device-side access on a buffer that has no device.
    #[error("buffer {buffer} has no device mirror (it was created host-only)")]
    NoDevice {
        /// The buffer label.
        buffer: String,
    },

    /// Two objects that must live on the same device do not.
    #[error("device mismatch in {op}: {expected} vs {actual}")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// Device expected.
        expected: String,
        /// Device found.
        actual: String,
    },

    /// A `try_*` access found the buffer held by a conflicting guard, or a blocking access
    /// found it held by a conflicting guard of the same thread (waiting would never end).
    #[error("buffer {buffer} is busy: {reason}")]
    Busy {
        /// The buffer label; for a guard of the same thread, with the guard it conflicts with
        /// (and, for tensors, both tensors' names).
        buffer: String,
        /// What holds it.
        reason: &'static str,
    },

    /// An operation that is not valid in the buffer's current state.
    #[error("invalid state for {op} on {buffer}: {reason}")]
    InvalidState {
        /// The operation.
        op: &'static str,
        /// The buffer label.
        buffer: String,
        /// Why.
        reason: String,
    },

    /// A read of a buffer whose contents were dropped as no longer needed (head
    /// [`crate::Head::Dropped`]): a net's dead value under a memory cap (a blob internal to the
    /// net, read after the run), or [`crate::SyncedMemory::drop_contents`]. Writing the buffer
    /// whole (`host_overwrite`, `device_overwrite`) makes it readable again.
    #[error(
        "{op} of {buffer}: its contents were dropped as no longer needed (a value internal to a \
         net run under a memory cap, or drop_contents); write it whole before reading it"
    )]
    ContentsDropped {
        /// The access.
        op: &'static str,
        /// The buffer label.
        buffer: String,
    },

    /// A typed access whose type differs from the stored one.
    #[error("type mismatch on {what}: it holds {stored}, the caller asked for {requested}")]
    TypeMismatch {
        /// The blob or tensor.
        what: String,
        /// Type stored.
        stored: String,
        /// Type requested.
        requested: String,
    },

    /// A shape, axis or index that is not valid for the object.
    #[error("invalid shape on {what} (shape {shape}): {reason}")]
    InvalidShape {
        /// The blob or tensor.
        what: String,
        /// Its current shape, formatted.
        shape: String,
        /// Why the request was rejected.
        reason: String,
    },

    /// A named object (blob, net, tensor in a file) that does not exist.
    #[error("{kind} {name:?} not found{detail}")]
    NotFound {
        /// What was looked for (`blob`, `net`, ...).
        kind: &'static str,
        /// Its name.
        name: String,
        /// Extra context (already formatted, may be empty).
        detail: String,
    },

    /// A named object that already exists where a new one was to be made.
    #[error("{kind} {name:?} already exists{detail}")]
    AlreadyExists {
        /// What (`blob`, `net`, ...).
        kind: &'static str,
        /// Its name.
        name: String,
        /// Extra context (already formatted, may be empty).
        detail: String,
    },

    /// A pool configuration (from code or from an environment variable) that is not valid.
    #[error("invalid memory pool configuration {what}: {reason}")]
    InvalidConfig {
        /// The option or variable.
        what: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A private memory pool ([`crate::device::MemPool`]) could not be made as asked: `error`
    /// says why (an [`Error::InvalidConfig`] naming the option, an [`Error::OutOfMemory`] of
    /// its preallocation).
    #[error("memory pool {pool} of {device}: {error}")]
    MemPool {
        /// The device string.
        device: String,
        /// The pool's label.
        pool: String,
        /// What went wrong.
        error: Box<Error>,
    },

    /// An operator of a net failed to build or to run. The message includes the operator's own
    /// error; `error` keeps it for matching (it is not also returned as the error's source, so
    /// that chained reports do not print it twice).
    #[error("net {net:?}: {stage} of operator #{index} {op} failed: {error}")]
    OperatorFailed {
        /// The net's name.
        net: String,
        /// `"build"` or `"run"`.
        stage: &'static str,
        /// Position of the operator in the net (0-based).
        index: usize,
        /// The operator's type and name, formatted (`Relu "relu1"`).
        op: String,
        /// The operator's error.
        error: Box<Error>,
    },

    /// Reading or writing a file failed. The message includes the operating system's reason;
    /// `error` is kept for matching on its kind (it is not also returned as the error's source,
    /// so that chained reports do not print it twice).
    #[error("cannot {op} {}: {error}", path.display())]
    Io {
        /// What was being done: `read`, `write`, `open`, ...
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's error.
        error: std::io::Error,
    },

    /// A file whose contents are not valid for its format (corrupt, truncated, inconsistent).
    #[error("invalid {format} file {}: {reason}", path.display())]
    Format {
        /// The format, e.g. `safetensors`.
        format: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A kernel of the user ([`crate::device::UserKernel`]) cannot take the launch as asked:
    /// a wrong number of arguments, a buffer where the kernel takes a scalar (or the reverse),
    /// a scalar of another type, a buffer of another device, a buffer written and passed
    /// twice, a grid the kernel cannot run. `index` is the argument (`None`: the whole list or
    /// the grid).
    #[error("kernel {kernel:?}{}: {reason}", argument_text(*index))]
    KernelArgument {
        /// The kernel's name.
        kernel: String,
        /// The argument, from 0.
        index: Option<usize>,
        /// What is wrong.
        reason: String,
    },

    /// The source of a kernel of the user failed to compile for a device.
    #[error("kernel {kernel:?} failed to build for {device}: {reason}; build log:\n{log}")]
    KernelBuild {
        /// The kernel's name.
        kernel: String,
        /// The device label.
        device: String,
        /// The failing call and its status.
        reason: String,
        /// The compiler's log (may be empty).
        log: String,
    },

    /// An operation this backend or device does not support.
    #[error("unsupported on {device}: {what}")]
    Unsupported {
        /// Device label.
        device: String,
        /// The operation.
        what: String,
    },
}

impl Error {
    /// True for [`Error::OutOfMemory`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }

    /// The report of an [`Error::OutOfMemory`] (also inside an [`Error::OperatorFailed`]).
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            Error::OutOfMemory { report } => Some(report),
            Error::OperatorFailed { error, .. } | Error::MemPool { error, .. } => {
                error.oom_report()
            }
            _ => None,
        }
    }
}

impl From<OomReport> for Error {
    fn from(report: OomReport) -> Self {
        Error::OutOfMemory {
            report: Box::new(report),
        }
    }
}

/// `", argument 2"` for [`Error::KernelArgument`], nothing without an argument.
fn argument_text(index: Option<usize>) -> String {
    index.map_or_else(String::new, |i| format!(", argument {i}"))
}

/// `a * b` for sizes, as an error that says what overflowed.
pub(crate) fn checked_mul(a: usize, b: usize, what: impl std::fmt::Display) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::SizeOverflow {
        what: format!("{what}: {a} * {b}"),
    })
}

/// Checks that `offset..offset+len` lies within `size`, naming the buffer with `what` only when
/// the check fails.
pub(crate) fn check_range_with(
    what: impl FnOnce() -> String,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfBounds {
            what: what(),
            offset,
            len,
            size,
        }),
    }
}
