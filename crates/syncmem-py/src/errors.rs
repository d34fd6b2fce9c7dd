//! Python exceptions: one subclass of `SyncmemError` per kind of [`syncmem::Error`], each
//! carrying the Rust message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use syncmem::Error;

create_exception!(
    syncmem,
    SyncmemError,
    PyException,
    "Base class of every error syncmem raises. The message is the library's own: it names the \
     blob, the sizes and the device."
);
create_exception!(
    syncmem,
    OutOfMemoryError,
    SyncmemError,
    "An allocation failed for lack of memory, after cached blocks were freed and clean device \
     mirrors dropped. The message names the device, the size asked for and the biggest holders."
);
create_exception!(
    syncmem,
    DeviceError,
    SyncmemError,
    "A device problem: a bad device string, a backend not compiled in or whose runtime is \
     missing, no such device, a failed backend call, a device mismatch, or an operation the \
     device does not support."
);
create_exception!(
    syncmem,
    ShapeError,
    SyncmemError,
    "A shape, size or layout that does not fit: wrong dims, sizes that differ or overflow, a \
     range out of bounds, an array that is not C-contiguous where no copy is allowed."
);
create_exception!(
    syncmem,
    TypeMismatchError,
    SyncmemError,
    "An element type that differs from the one stored or asked for, or that syncmem (or NumPy) \
     has no equivalent for."
);
create_exception!(
    syncmem,
    NotFoundError,
    SyncmemError,
    "A blob, net, tensor in a file, or operator type that does not exist."
);
create_exception!(
    syncmem,
    AlreadyExistsError,
    SyncmemError,
    "A blob or net that already exists where a new one was to be made."
);
create_exception!(
    syncmem,
    BusyError,
    SyncmemError,
    "A buffer in use: device access while a writable host view (NumPy array or DLPack export) \
     of the buffer is alive, or a guard held elsewhere."
);
create_exception!(
    syncmem,
    InvalidStateError,
    SyncmemError,
    "An operation that is not valid in the object's current state: an uninitialised tensor, a \
     tensor with no data yet, a net definition that does not parse."
);
create_exception!(
    syncmem,
    ConfigError,
    SyncmemError,
    "An invalid memory pool configuration."
);
create_exception!(
    syncmem,
    FileError,
    SyncmemError,
    "Reading or writing a file failed (the message includes the operating system's reason)."
);
create_exception!(
    syncmem,
    FormatError,
    SyncmemError,
    "A file whose contents are not valid for its format (corrupt or truncated safetensors)."
);

/// The Python exception for a library error. An operator's failure inside a net is raised as
/// the class of the operator's own error, with the whole message (net, operator, cause).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    raise_as(&e, msg)
}

fn raise_as(e: &Error, msg: String) -> PyErr {
    match e {
        Error::OutOfMemory { .. } => OutOfMemoryError::new_err(msg),
        Error::InvalidDeviceSpec { .. }
        | Error::BackendNotCompiled { .. }
        | Error::RuntimeUnavailable { .. }
        | Error::NoSuchDevice { .. }
        | Error::Backend { .. }
        | Error::NoDevice { .. }
        | Error::DeviceMismatch { .. }
        | Error::Unsupported { .. } => DeviceError::new_err(msg),
        Error::SizeOverflow { .. }
        | Error::OutOfBounds { .. }
        | Error::SizeMismatch { .. }
        | Error::InvalidShape { .. } => ShapeError::new_err(msg),
        Error::TypeMismatch { .. } => TypeMismatchError::new_err(msg),
        Error::NotFound { .. } => NotFoundError::new_err(msg),
        Error::AlreadyExists { .. } => AlreadyExistsError::new_err(msg),
        Error::Busy { .. } => BusyError::new_err(msg),
        Error::InvalidState { .. } => InvalidStateError::new_err(msg),
        Error::InvalidConfig { .. } => ConfigError::new_err(msg),
        Error::Io { .. } => FileError::new_err(msg),
        Error::Format { .. } => FormatError::new_err(msg),
        Error::OperatorFailed { error, .. } => raise_as(error, msg),
        // `Error` is non-exhaustive: a kind added later is still a SyncmemError.
        _ => SyncmemError::new_err(msg),
    }
}

/// `?` on a library result inside a Python call.
pub trait OrRaise<T> {
    /// The value, or the error as its Python exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for syncmem::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SyncmemError", py.get_type::<SyncmemError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("TypeMismatchError", py.get_type::<TypeMismatchError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("AlreadyExistsError", py.get_type::<AlreadyExistsError>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("InvalidStateError", py.get_type::<InvalidStateError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("FileError", py.get_type::<FileError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    Ok(())
}
