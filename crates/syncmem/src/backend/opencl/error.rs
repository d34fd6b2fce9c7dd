//! OpenCL status codes as typed errors.

use opencl3::types::cl_int;

use crate::error::{BackendKind, Error, OomReport};

const CL_MEM_OBJECT_ALLOCATION_FAILURE: cl_int = -4;
const CL_OUT_OF_RESOURCES: cl_int = -5;
const CL_OUT_OF_HOST_MEMORY: cl_int = -6;
const CL_INVALID_BUFFER_SIZE: cl_int = -61;
const CL_PLATFORM_NOT_FOUND_KHR: cl_int = -1001;
const DLOPEN_RUNTIME_LOAD_FAILED: cl_int = -2000;
const DLOPEN_FUNCTION_NOT_AVAILABLE: cl_int = -2001;

/// A readable message for an OpenCL status code: its name and, for the common ones, what it
/// means.
pub(crate) fn cl_error_message(code: cl_int) -> String {
    let (name, meaning) = match code {
        -1 => ("CL_DEVICE_NOT_FOUND", "no device of the requested type"),
        -2 => ("CL_DEVICE_NOT_AVAILABLE", "the device is not available"),
        -4 => (
            "CL_MEM_OBJECT_ALLOCATION_FAILURE",
            "could not allocate memory for a buffer",
        ),
        -5 => ("CL_OUT_OF_RESOURCES", "the device ran out of resources"),
        -6 => (
            "CL_OUT_OF_HOST_MEMORY",
            "the OpenCL runtime ran out of host memory",
        ),
        -8 => (
            "CL_MEM_COPY_OVERLAP",
            "source and destination regions overlap",
        ),
        -12 => (
            "CL_MAP_FAILURE",
            "the buffer could not be mapped into host memory",
        ),
        -14 => (
            "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
            "an earlier command this one waited for failed",
        ),
        -30 => ("CL_INVALID_VALUE", "an argument is invalid"),
        -32 => ("CL_INVALID_PLATFORM", "invalid platform"),
        -33 => ("CL_INVALID_DEVICE", "invalid device"),
        -34 => (
            "CL_INVALID_CONTEXT",
            "invalid context, or objects of different contexts",
        ),
        -35 => (
            "CL_INVALID_QUEUE_PROPERTIES",
            "unsupported command-queue properties",
        ),
        -36 => ("CL_INVALID_COMMAND_QUEUE", "invalid command queue"),
        -37 => ("CL_INVALID_HOST_PTR", "invalid host pointer"),
        -38 => ("CL_INVALID_MEM_OBJECT", "not a valid memory object"),
        -57 => ("CL_INVALID_EVENT_WAIT_LIST", "invalid event wait list"),
        -58 => ("CL_INVALID_EVENT", "invalid event"),
        -59 => ("CL_INVALID_OPERATION", "operation not valid here"),
        -61 => (
            "CL_INVALID_BUFFER_SIZE",
            "buffer size is 0 or above the device's limit",
        ),
        CL_PLATFORM_NOT_FOUND_KHR => ("CL_PLATFORM_NOT_FOUND_KHR", "no OpenCL platform found"),
        DLOPEN_RUNTIME_LOAD_FAILED => (
            "DLOPEN_RUNTIME_LOAD_FAILED",
            "libOpenCL could not be loaded",
        ),
        DLOPEN_FUNCTION_NOT_AVAILABLE => (
            "DLOPEN_FUNCTION_NOT_AVAILABLE",
            "the loaded libOpenCL lacks this function",
        ),
        _ => match opencl3::error_codes::error_text(code) {
            "UNKNOWN_ERROR" => return "OpenCL error".to_string(),
            name => return name.to_string(),
        },
    };
    format!("{name} ({meaning})")
}

/// True for the status codes that mean "not enough memory".
fn is_oom_code(code: cl_int) -> bool {
    matches!(
        code,
        CL_MEM_OBJECT_ALLOCATION_FAILURE
            | CL_OUT_OF_RESOURCES
            | CL_OUT_OF_HOST_MEMORY
            | CL_INVALID_BUFFER_SIZE
    )
}

/// A failed OpenCL call as an [`Error::Backend`].
pub(crate) fn backend_error(device: &str, op: &'static str, code: cl_int) -> Error {
    Error::Backend {
        backend: BackendKind::OpenCl,
        device: device.to_string(),
        op,
        code: i64::from(code),
        message: cl_error_message(code),
    }
}

/// An event whose command ended with a negative execution status: the command failed (or a
/// user event was set to an error). OpenCL reports the failure as the status itself, which is
/// an error code of the runtime's choosing (or the user's), not the result of a call.
pub(crate) fn failed_command_error(device: &str, status: cl_int) -> Error {
    Error::Backend {
        backend: BackendKind::OpenCl,
        device: device.to_string(),
        op: "event command",
        code: i64::from(status),
        message: format!(
            "the command ended with execution status {status} (failed; as an error code: {})",
            cl_error_message(status)
        ),
    }
}

/// A failed allocation call: [`Error::OutOfMemory`] for the memory codes, else
/// [`Error::Backend`].
pub(crate) fn alloc_error(device: &str, op: &'static str, code: cl_int, requested: usize) -> Error {
    if is_oom_code(code) {
        OomReport::new(
            device,
            requested,
            format!("{op}: {}", cl_error_message(code)),
        )
        .into()
    } else {
        backend_error(device, op, code)
    }
}

/// A failed enqueue. `CL_MEM_OBJECT_ALLOCATION_FAILURE` there means the runtime could not back
/// the buffer `mem_len` bytes long on first use (OpenCL may allocate lazily): an
/// [`Error::OutOfMemory`]. Anything else is an [`Error::Backend`].
pub(crate) fn enqueue_error(device: &str, op: &'static str, code: cl_int, mem_len: usize) -> Error {
    if code == CL_MEM_OBJECT_ALLOCATION_FAILURE {
        OomReport::new(
            device,
            mem_len,
            format!(
                "the buffer is allocated on first use; {op}: {}",
                cl_error_message(code)
            ),
        )
        .into()
    } else {
        backend_error(device, op, code)
    }
}

/// Why the OpenCL runtime cannot be used, for a failed `clGetPlatformIDs`.
pub(crate) fn unavailable(code: cl_int) -> Error {
    let reason = match code {
        DLOPEN_RUNTIME_LOAD_FAILED => {
            "libOpenCL could not be loaded (install an OpenCL ICD loader \
             such as ocl-icd-libopencl1, and a driver such as PoCL)"
                .to_string()
        }
        CL_PLATFORM_NOT_FOUND_KHR => "the OpenCL ICD loader found no platform (no driver is \
             registered in /etc/OpenCL/vendors; install one such as PoCL)"
            .to_string(),
        DLOPEN_FUNCTION_NOT_AVAILABLE => {
            "the loaded libOpenCL does not export clGetPlatformIDs".to_string()
        }
        c => format!(
            "clGetPlatformIDs failed: {} (code {c})",
            cl_error_message(c)
        ),
    };
    Error::RuntimeUnavailable {
        backend: BackendKind::OpenCl,
        reason,
    }
}
