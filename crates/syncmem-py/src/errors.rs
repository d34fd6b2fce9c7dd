//! Python exceptions: one class per kind of [`syncmem::Error`], each carrying the Rust message
//! and deriving from both `SyncmemError` and the matching builtin (`NotFoundError` is a
//! `KeyError`, `FileError` an `OSError`, ...), so that `except SyncmemError` and
//! `except KeyError` both catch it.
//!
//! A class with two bases cannot be made by `create_exception!`, so the subclasses are made at
//! import with Python's `type(name, (SyncmemError, builtin), ...)`. An error is raised lazily
//! (it may be made without the interpreter attached, inside `py.detach`): as a `SyncmemError`
//! whose argument is the instance of the subclass, which Python then raises as it is.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBaseException, PyException, PyKeyError, PyMemoryError, PyOSError, PyRuntimeError,
    PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::PyErrArguments;
use syncmem::Error;

create_exception!(
    syncmem,
    SyncmemError,
    PyException,
    "Base class of every error syncmem raises. The message is the library's own: it names the \
     blob, the sizes and the device. Each subclass also derives from the matching builtin \
     exception (KeyError, ValueError, OSError, ...)."
);

/// The subclasses of `SyncmemError`: name, builtin base, docstring. `Kind` indexes it.
const CLASSES: [(&str, Builtin, &str); 11] = [
    (
        "OutOfMemoryError",
        Builtin::Memory,
        "An allocation failed for lack of memory, after cached blocks were freed and clean \
         device mirrors dropped. The message names the device, the size asked for and the \
         biggest holders. Also a MemoryError.",
    ),
    (
        "DeviceError",
        Builtin::Runtime,
        "A device problem: a bad device string, a backend not compiled in or whose runtime is \
         missing, no such device, a failed backend call, a device mismatch, or an operation the \
         device does not support. Also a RuntimeError.",
    ),
    (
        "ShapeError",
        Builtin::Value,
        "A shape, size or layout that does not fit: wrong dims, sizes that differ or overflow, \
         a range out of bounds, an array that is not C-contiguous where no copy is allowed. \
         Also a ValueError.",
    ),
    (
        "TypeMismatchError",
        Builtin::Type,
        "An element type that differs from the one stored or asked for, or that syncmem (or \
         NumPy) has no equivalent for. Also a TypeError.",
    ),
    (
        "NotFoundError",
        Builtin::Key,
        "A blob, net, workspace, tensor in a file, or operator type that does not exist. Also a \
         KeyError (whose message is shown as it is, without quotes).",
    ),
    (
        "AlreadyExistsError",
        Builtin::Value,
        "A blob or net that already exists where a new one was to be made. Also a ValueError.",
    ),
    (
        "BusyError",
        Builtin::Runtime,
        "A buffer in use: device access while a writable host view (NumPy array or DLPack \
         export) of the buffer is alive, or a guard held elsewhere. Also a RuntimeError.",
    ),
    (
        "InvalidStateError",
        Builtin::Value,
        "A value that is not valid where it is used: an uninitialised tensor, a tensor with no \
         data yet, a net definition that does not parse, an array that feed_blob(copy=False) \
         cannot adopt. Also a ValueError.",
    ),
    (
        "ConfigError",
        Builtin::Value,
        "An invalid memory pool configuration. Also a ValueError.",
    ),
    (
        "FileError",
        Builtin::Os,
        "Reading or writing a file failed (the message includes the operating system's \
         reason, `errno` its number when there is one). Also an OSError.",
    ),
    (
        "FormatError",
        Builtin::Value,
        "A file whose contents are not valid for its format (corrupt or truncated \
         safetensors). Also a ValueError.",
    ),
];

/// The builtin exception a subclass also derives from.
#[derive(Clone, Copy)]
enum Builtin {
    Memory,
    Runtime,
    Value,
    Type,
    Key,
    Os,
}

impl Builtin {
    fn get(self, py: Python<'_>) -> Bound<'_, PyType> {
        match self {
            Builtin::Memory => py.get_type::<PyMemoryError>(),
            Builtin::Runtime => py.get_type::<PyRuntimeError>(),
            Builtin::Value => py.get_type::<PyValueError>(),
            Builtin::Type => py.get_type::<PyTypeError>(),
            Builtin::Key => py.get_type::<PyKeyError>(),
            Builtin::Os => py.get_type::<PyOSError>(),
        }
    }
}

/// A kind of error: the index of its class in [`CLASSES`].
#[derive(Clone, Copy)]
enum Kind {
    OutOfMemory,
    Device,
    Shape,
    TypeMismatch,
    NotFound,
    AlreadyExists,
    Busy,
    InvalidState,
    Config,
    File,
    Format,
}

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// The subclasses, made on first use.
fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let base = py.get_type::<SyncmemError>();
        let make = py.get_type::<PyType>();
        CLASSES
            .iter()
            .map(|(name, builtin, doc)| {
                let builtin = builtin.get(py);
                let dict = PyDict::new(py);
                dict.set_item("__module__", "syncmem")?;
                dict.set_item("__doc__", *doc)?;
                if builtin.is(py.get_type::<PyKeyError>()) {
                    // KeyError shows its message quoted, as a key: show it as it is.
                    let plain = py.get_type::<PyBaseException>().getattr("__str__")?;
                    dict.set_item("__str__", plain)?;
                }
                let bases = PyTuple::new(py, [base.clone(), builtin])?;
                Ok(make
                    .call1((*name, bases, dict))?
                    .cast_into::<PyType>()?
                    .unbind())
            })
            .collect()
    })
}

/// What a lazily raised error becomes: an instance of its subclass.
struct Raise {
    kind: Kind,
    msg: String,
    errno: Option<i32>,
}

impl Raise {
    fn instance(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let ty = types(py)?[self.kind as usize].bind(py);
        let e = ty.call1((self.msg.as_str(),))?;
        if let Some(n) = self.errno {
            e.setattr("errno", n)?;
        }
        Ok(e.unbind())
    }
}

impl PyErrArguments for Raise {
    fn arguments(self, py: Python<'_>) -> Py<PyAny> {
        // Raised as a SyncmemError with an instance of a subclass as its value: Python raises
        // the instance itself. Should the instance fail to be made, a plain SyncmemError
        // carries the message.
        self.instance(py).unwrap_or_else(|_| {
            pyo3::types::PyString::new(py, &self.msg)
                .into_any()
                .unbind()
        })
    }
}

fn raise(kind: Kind, msg: String, errno: Option<i32>) -> PyErr {
    PyErr::new::<SyncmemError, _>(Raise { kind, msg, errno })
}

macro_rules! exception {
    ($name:ident, $kind:ident) => {
        #[doc = concat!("The Python class `syncmem.", stringify!($name), "`.")]
        pub struct $name;

        impl $name {
            /// The error, with `msg` as its message.
            pub fn new_err(msg: impl Into<String>) -> PyErr {
                raise(Kind::$kind, msg.into(), None)
            }
        }
    };
}

// The classes raised from this crate's own checks (the others come from library errors).
exception!(DeviceError, Device);
exception!(ShapeError, Shape);
exception!(TypeMismatchError, TypeMismatch);
exception!(BusyError, Busy);
exception!(InvalidStateError, InvalidState);

/// The Python exception for a library error. An operator's failure inside a net is raised as
/// the class of the operator's own error, with the whole message (net, operator, cause); so is
/// a MemPool's (device, pool, cause).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    raise_as(&e, msg)
}

fn raise_as(e: &Error, msg: String) -> PyErr {
    let kind = match e {
        Error::OutOfMemory { .. } => Kind::OutOfMemory,
        Error::InvalidDeviceSpec { .. }
        | Error::BackendNotCompiled { .. }
        | Error::RuntimeUnavailable { .. }
        | Error::NoSuchDevice { .. }
        | Error::Backend { .. }
        | Error::NoDevice { .. }
        | Error::DeviceMismatch { .. }
        | Error::Unsupported { .. } => Kind::Device,
        Error::SizeOverflow { .. }
        | Error::OutOfBounds { .. }
        | Error::SizeMismatch { .. }
        | Error::InvalidShape { .. } => Kind::Shape,
        Error::TypeMismatch { .. } => Kind::TypeMismatch,
        Error::NotFound { .. } => Kind::NotFound,
        Error::AlreadyExists { .. } => Kind::AlreadyExists,
        Error::Busy { .. } => Kind::Busy,
        Error::InvalidState { .. } | Error::ContentsDropped { .. } => Kind::InvalidState,
        Error::InvalidConfig { .. } => Kind::Config,
        Error::Io { error, .. } => return raise(Kind::File, msg, error.raw_os_error()),
        Error::Format { .. } => Kind::Format,
        Error::OperatorFailed { error, .. } | Error::MemPool { error, .. } => {
            return raise_as(error, msg)
        }
        // `Error` is non-exhaustive: a kind added later is still a SyncmemError.
        _ => return SyncmemError::new_err(msg),
    };
    raise(kind, msg, None)
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
    for ((name, _, _), ty) in CLASSES.iter().zip(types(py)?) {
        m.add(*name, ty.bind(py))?;
    }
    Ok(())
}
