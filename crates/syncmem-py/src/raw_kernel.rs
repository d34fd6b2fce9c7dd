//! `syncmem.RawKernel`: a kernel from OpenCL C or CUDA C source, called as CuPy's `RawKernel`
//! is, `kernel(grid, block, args)`, on tensors and NumPy scalars.
//!
//! The kernel is compiled once per device ([`syncmem::device::UserKernel`]). A call takes the
//! device of its tensor arguments and launches on that device's default stream, through
//! [`syncmem::kernels::launch`]: each tensor is taken through its guard (a tensor whose newest
//! data is on the host is uploaded once), the launch is checked (count and kinds against the
//! compiled kernel's parameters, typed errors naming the argument), queued and never waited for;
//! reading a result (`fetch_blob`, `numpy()`) waits for exactly the work on that buffer.
//!
//! A tensor is read only when its parameter is read-only (`const` or `__constant`, as OpenCL
//! reports it, or `const` in the CUDA source's declaration); otherwise it is read and written.
//! A scalar is a NumPy scalar of the parameter's exact type (`numpy.float32(0.5)`), or a Python
//! `int` / `float` converted to the parameter's type (a value the type cannot hold is an
//! error, not an infinity). A parameter of a type without a scalar (`char`, `float4`, a CUDA
//! struct) takes `bytes` of its size, or a NumPy scalar of its size (`numpy.int8(3)`). A
//! tensor passed for a pointer whose element type the source declares (`const float* x`) must
//! be of that dtype.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PySequence};
use syncmem::device::{Grid, KernelParam, ScalarArg, ScalarType, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::workspace::BlobRef;
use syncmem::{BackendKind, Blob, DType, Device, Error, Tensor};

use crate::device::remember;
use crate::errors::{to_py, DeviceError, OrRaise};
use crate::tensor::PyTensor;
use crate::views;

/// A kernel compiled from source, called with `kernel(grid, block, args)`.
///
/// `RawKernel(source, name, backend=None, options="")`: `source` is OpenCL C (a `__kernel`
/// function) or CUDA C (an `extern "C" __global__` function) named `name`; `backend` is
/// `"opencl"` or `"cuda"` (default: CUDA when the source declares `__global__`, else
/// OpenCL); `options` are the OpenCL build options. The kernel is built on each device at its
/// first call (`compile(device)` builds it now); a build failure raises with the compiler's
/// log. CUDA is compile-checked only: it has never run on a GPU.
///
/// The crate checks the arguments' count, kinds, sizes and the tensors' dtypes against the
/// kernel, but not its indexing: a kernel that reads or writes past the end of a tensor (a
/// grid larger than the tensor with no bounds check in the kernel, a wrong `n`) corrupts
/// memory, as a CuPy kernel would.
#[pyclass(module = "syncmem", name = "RawKernel", frozen)]
pub struct PyRawKernel {
    kernel: Arc<UserKernel>,
    backend: BackendKind,
}

/// One argument as Python gave it.
enum Given {
    /// A tensor: its blob and name.
    Tensor(BlobRef, String),
    Scalar(ScalarArg),
    /// A Python `int` or `float`, typed by the kernel's parameter.
    Int(i128),
    Float(f64),
    /// Raw bytes (`bytes`, or a NumPy scalar of a dtype without a kernel scalar type).
    Bytes(Vec<u8>),
}

fn dims3(what: &str, v: &Bound<'_, PyAny>) -> PyResult<[u32; 3]> {
    if let Ok(n) = v.extract::<u32>() {
        return Ok([n, 1, 1]);
    }
    let seq = v
        .cast::<PySequence>()
        .map_err(|_| PyTypeError::new_err(format!("{what} is an int or a tuple of 1 to 3 ints")))?;
    let items: Vec<u32> = seq.extract()?;
    if items.is_empty() || items.len() > 3 {
        return Err(PyTypeError::new_err(format!(
            "{what} has 1 to 3 dimensions, not {}",
            items.len()
        )));
    }
    let mut out = [1u32; 3];
    out[..items.len()].copy_from_slice(&items);
    Ok(out)
}

/// A NumPy scalar's value, by its dtype.
fn numpy_scalar(v: &Bound<'_, PyAny>) -> PyResult<Option<ScalarArg>> {
    let np = v.py().import("numpy")?;
    if !v.is_instance(&np.getattr("generic")?)? {
        return Ok(None);
    }
    let name: String = v.getattr("dtype")?.getattr("name")?.extract()?;
    let item = v.call_method0("item")?;
    Ok(Some(match name.as_str() {
        "int32" => ScalarArg::I32(item.extract()?),
        "uint32" => ScalarArg::U32(item.extract()?),
        "int64" => ScalarArg::I64(item.extract()?),
        "uint64" => ScalarArg::U64(item.extract()?),
        "float32" => ScalarArg::F32(item.extract::<f64>()? as f32),
        "float64" => ScalarArg::F64(item.extract()?),
        _ => return Ok(None),
    }))
}

/// The bytes of a NumPy scalar of another dtype (`int8`, `float16`, a structured scalar).
fn numpy_bytes(v: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    let np = v.py().import("numpy")?;
    if !v.is_instance(&np.getattr("generic")?)? {
        return Ok(None);
    }
    Ok(Some(v.call_method0("tobytes")?.extract()?))
}

/// The element type of a pointer parameter as the source declares it (`const __global float*
/// x` → `float`), as a dtype; `None` for anything else.
fn pointee(decl: &str) -> Option<DType> {
    let star = decl.find('*')?;
    let words: Vec<&str> = decl[..star]
        .split_whitespace()
        .filter(|w| {
            !matches!(
                *w,
                "const"
                    | "volatile"
                    | "restrict"
                    | "__restrict__"
                    | "__global"
                    | "global"
                    | "__constant"
                    | "constant"
            )
        })
        .collect();
    Some(match words.join(" ").as_str() {
        "float" => DType::F32,
        "double" => DType::F64,
        "half" | "__half" => DType::F16,
        "int" | "signed int" | "int32_t" => DType::I32,
        "uint" | "unsigned int" | "unsigned" | "uint32_t" => DType::U32,
        "long" | "long long" | "int64_t" => DType::I64,
        "ulong" | "unsigned long" | "unsigned long long" | "uint64_t" => DType::U64,
        "short" | "int16_t" => DType::I16,
        "ushort" | "unsigned short" | "uint16_t" => DType::U16,
        "char" | "signed char" | "int8_t" => DType::I8,
        "uchar" | "unsigned char" | "uint8_t" => DType::U8,
        "bool" => DType::Bool,
        _ => return None,
    })
}

fn given(i: usize, v: &Bound<'_, PyAny>) -> PyResult<Given> {
    if let Ok(t) = v.cast::<PyTensor>() {
        let t = t.get();
        return Ok(Given::Tensor(t.blob.clone(), t.name.clone()));
    }
    if v.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "argument {i}: a bool has no kernel type (pass numpy.int32(0) or (1))"
        )));
    }
    if let Some(s) = numpy_scalar(v)? {
        return Ok(Given::Scalar(s));
    }
    if let Some(b) = numpy_bytes(v)? {
        return Ok(Given::Bytes(b));
    }
    if let Ok(b) = v.cast::<pyo3::types::PyBytes>() {
        return Ok(Given::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = v.cast::<pyo3::types::PyByteArray>() {
        return Ok(Given::Bytes(b.to_vec()));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(Given::Int(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Given::Float(v.extract()?));
    }
    Err(PyTypeError::new_err(format!(
        "argument {i}: a kernel argument is a syncmem.Tensor, a scalar or bytes, not {}",
        v.get_type().name()?
    )))
}

/// A Python number as the scalar type the kernel's parameter `p` takes.
fn typed(name: &str, i: usize, p: Option<&KernelParam>, g: &Given) -> syncmem::Result<ScalarArg> {
    let bad = |reason: String| Error::KernelArgument {
        kernel: name.to_string(),
        index: Some(i),
        reason,
    };
    let want = match p {
        Some(KernelParam::Scalar(t)) => Some(*t),
        Some(KernelParam::Int32) => Some(ScalarType::I32),
        Some(KernelParam::Word64) => Some(ScalarType::I64),
        _ => None,
    };
    // A finite value past a float's range would silently become an infinity.
    let as_f32 = |v: f64, what: &dyn std::fmt::Display| {
        let f = v as f32;
        if v.is_finite() && f.is_infinite() {
            Err(bad(format!("{what} does not fit a float parameter")))
        } else {
            Ok(ScalarArg::F32(f))
        }
    };
    match (g, want) {
        (Given::Float(v), Some(ScalarType::F32)) => as_f32(*v, v),
        (Given::Float(v), Some(ScalarType::F64) | None) => Ok(ScalarArg::F64(*v)),
        (Given::Int(v), t) => {
            let fits = |r: Option<ScalarArg>| {
                r.ok_or_else(|| bad(format!("{v} does not fit the parameter's type")))
            };
            match t {
                Some(ScalarType::I32) if *v > i128::from(i32::MAX) => {
                    fits(u32::try_from(*v).ok().map(ScalarArg::U32))
                }
                Some(ScalarType::I32) => fits(i32::try_from(*v).ok().map(ScalarArg::I32)),
                Some(ScalarType::U32) => fits(u32::try_from(*v).ok().map(ScalarArg::U32)),
                Some(ScalarType::U64) => fits(u64::try_from(*v).ok().map(ScalarArg::U64)),
                Some(ScalarType::F32) => as_f32(*v as f64, v),
                Some(ScalarType::F64) => Ok(ScalarArg::F64(*v as f64)),
                _ => fits(i64::try_from(*v).ok().map(ScalarArg::I64)),
            }
        }
        (Given::Float(_), Some(t)) => Err(bad(format!(
            "a Python float for a {t} parameter (pass an int or a NumPy scalar)"
        ))),
        (Given::Scalar(s), _) => Ok(*s),
        (Given::Tensor(..) | Given::Bytes(_), _) => {
            Err(bad("a tensor or bytes where a scalar was expected".into()))
        }
    }
}

/// The blob locks of one call.
enum Lock<'a> {
    Read(parking_lot::RwLockReadGuard<'a, Blob>),
    Write(parking_lot::RwLockWriteGuard<'a, Blob>),
}

/// A tensor taken from its lock.
enum Taken<'a> {
    Read(&'a Tensor),
    Write(Option<&'a mut Tensor>),
}

impl PyRawKernel {
    /// Each tensor argument has the element type its pointer parameter declares (where the
    /// source declares one) and no writable view.
    fn check_tensors(&self, name: &str, given: &[Given]) -> PyResult<()> {
        let declared = self.kernel.declared_params(self.backend);
        for (i, g) in given.iter().enumerate() {
            let Given::Tensor(b, tensor) = g else {
                continue;
            };
            let b = b.read_recursive();
            let t = b.get::<Tensor>().or_raise()?;
            let want = declared.as_ref().and_then(|d| pointee(d.get(i)?));
            if let (Some(want), Some(have)) = (want, t.dtype()) {
                if want != have {
                    return Err(to_py(Error::KernelArgument {
                        kernel: name.to_string(),
                        index: Some(i),
                        reason: format!(
                            "tensor {tensor:?} is {}, the kernel's pointer points to {}",
                            have.name(),
                            want.name()
                        ),
                    }));
                }
            }
            views::check_no_writable_view(t, &format!("tensor {tensor:?}"))?;
        }
        Ok(())
    }

    /// True when parameter `i` only reads its buffer.
    fn reads_only(&self, params: Option<&[KernelParam]>, i: usize) -> bool {
        match params.and_then(|p| p.get(i)) {
            Some(KernelParam::Buffer { read_only }) => *read_only,
            Some(KernelParam::Word64) => self
                .kernel
                .declared_params(self.backend)
                .and_then(|d| d.get(i).cloned())
                .is_some_and(|d| d.contains("const") && d.contains('*')),
            _ => false,
        }
    }

    /// Locks the tensors' blobs (in address order; a blob passed twice is locked once), then
    /// launches with `args` (the tensors' positions in `given` taken from the locks).
    fn launch(
        &self,
        dev: &Device,
        grid: Grid,
        given: &[Given],
        scalars: &[Option<ScalarArg>],
        reads: &[bool],
    ) -> syncmem::Result<()> {
        let name = self.kernel.name();
        // The distinct blobs, and whether any argument writes them.
        let mut blobs: Vec<(BlobRef, bool)> = Vec::new();
        let mut slot_of = vec![usize::MAX; given.len()];
        for (i, g) in given.iter().enumerate() {
            if let Given::Tensor(b, tensor) = g {
                match blobs.iter().position(|(x, _)| Arc::ptr_eq(x, b)) {
                    Some(s) if !reads[i] || blobs[s].1 => {
                        return Err(Error::KernelArgument {
                            kernel: name.to_string(),
                            index: Some(i),
                            reason: format!(
                                "tensor {tensor:?} is passed twice and written: a kernel \
                                 parameter that writes it must be its only one"
                            ),
                        })
                    }
                    Some(s) => slot_of[i] = s,
                    None => {
                        slot_of[i] = blobs.len();
                        blobs.push((b.clone(), !reads[i]));
                    }
                }
            }
        }
        let mut order: Vec<usize> = (0..blobs.len()).collect();
        order.sort_by_key(|&s| Arc::as_ptr(&blobs[s].0) as usize);
        let mut locks: Vec<Option<Lock<'_>>> = (0..blobs.len()).map(|_| None).collect();
        for s in order {
            let (b, write) = &blobs[s];
            locks[s] = Some(if *write {
                Lock::Write(b.write())
            } else {
                // Recursive: an operator function running on this thread may hold it for
                // reading (its input), checked above.
                Lock::Read(b.read_recursive())
            });
        }
        let mut taken: Vec<Taken<'_>> = Vec::with_capacity(locks.len());
        for l in locks.iter_mut() {
            taken.push(match l {
                Some(Lock::Read(g)) => Taken::Read(g.get::<Tensor>()?),
                Some(Lock::Write(g)) => Taken::Write(Some(g.get_mut::<Tensor>()?)),
                None => unreachable_lock()?,
            });
        }
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(given.len());
        for (i, g) in given.iter().enumerate() {
            args.push(match g {
                Given::Tensor(..) => match &mut taken[slot_of[i]] {
                    Taken::Read(t) => Arg::read(*t),
                    Taken::Write(t) => match t.take() {
                        Some(t) => Arg::write(t),
                        None => unreachable_lock()?,
                    },
                },
                Given::Bytes(b) => Arg::bytes(b),
                _ => match scalars[i] {
                    Some(s) => Arg::scalar(s),
                    None => unreachable_lock()?,
                },
            });
        }
        let stream = dev.default_stream()?;
        // SAFETY: as CuPy's RawKernel, the caller vouches for the kernel: for these arguments
        // and this grid it touches each buffer within its length and writes only the tensors
        // passed to parameters that are not read-only.
        unsafe { kernels::launch(&self.kernel, &stream, grid, &args) }
    }
}

/// Every lock and argument was prepared above; an error rather than a panic all the same.
fn unreachable_lock<T>() -> syncmem::Result<T> {
    Err(Error::InvalidState {
        op: "RawKernel",
        buffer: "a kernel argument".into(),
        reason: "it was not prepared".into(),
    })
}

/// The device a launch runs on: the first tensor argument's.
fn launch_device(name: &str, given: &[Given]) -> PyResult<Device> {
    given
        .iter()
        .find_map(|g| match g {
            Given::Tensor(b, _) => Some(
                b.read_recursive()
                    .get::<Tensor>()
                    .map(|t| t.target().cloned()),
            ),
            _ => None,
        })
        .transpose()
        .or_raise()?
        .flatten()
        .ok_or_else(|| {
            DeviceError::new_err(format!(
                "kernel {name:?}: no argument is a tensor on a device to launch on"
            ))
        })
}

#[pymethods]
impl PyRawKernel {
    #[new]
    #[pyo3(signature = (source, name, backend = None, options = ""))]
    fn py_new(source: &str, name: &str, backend: Option<&str>, options: &str) -> PyResult<Self> {
        let backend = match backend {
            Some("opencl") => BackendKind::OpenCl,
            Some("cuda") => BackendKind::Cuda,
            None if source.contains("__global__") => BackendKind::Cuda,
            None => BackendKind::OpenCl,
            Some(other) => {
                return Err(DeviceError::new_err(format!(
                    "a RawKernel's backend is 'opencl' or 'cuda', not {other:?}"
                )))
            }
        };
        let k = UserKernel::new(name);
        let k = match backend {
            BackendKind::Cuda => k.with_cuda(source),
            _ => k.with_opencl(source).with_opencl_options(options),
        };
        Ok(Self {
            kernel: Arc::new(k),
            backend,
        })
    }

    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.kernel.name()
    }

    /// `"opencl"` or `"cuda"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.as_str()
    }

    /// Builds the kernel for `device` now (a call builds it otherwise); raises with the
    /// compiler's log on failure.
    fn compile(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<()> {
        let dev = crate::device::device_arg(Some(device), None)?;
        py.detach(|| self.kernel.prepare(&dev)).or_raise()
    }

    /// Launches the kernel: `grid` blocks of `block` threads (ints or tuples of up to 3),
    /// with `args`, a sequence of tensors and scalars. Queued on the tensors' device, not
    /// waited for.
    #[pyo3(signature = (grid, block, args))]
    fn __call__(
        &self,
        py: Python<'_>,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let grid = Grid::new(dims3("grid", grid)?, dims3("block", block)?);
        let items = args
            .cast::<PySequence>()
            .map_err(|_| PyTypeError::new_err("args is a tuple or list"))?;
        let given: Vec<Given> = (0..items.len()?)
            .map(|i| given(i, &items.get_item(i)?))
            .collect::<PyResult<_>>()?;
        let name = self.kernel.name().to_string();
        let what = |tensor: &str| format!("kernel {name:?}: tensor {tensor:?}");
        py.detach(|| {
            // A tensor whose blob an operator running on this thread holds for writing: its
            // lock would never come (BusyError). One it holds for reading is read recursively.
            for g in &given {
                if let Given::Tensor(b, tensor) = g {
                    crate::reentry::check(b, false, &what(tensor))?;
                }
            }
            let dev = remember(launch_device(&name, &given)?);
            let params = self.kernel.params(&dev).or_raise()?;
            let params = params.as_deref();
            let mut scalars = Vec::with_capacity(given.len());
            let mut reads = Vec::with_capacity(given.len());
            for (i, g) in given.iter().enumerate() {
                reads.push(self.reads_only(params, i));
                scalars.push(match g {
                    Given::Tensor(..) | Given::Bytes(_) => None,
                    g => Some(typed(&name, i, params.and_then(|p| p.get(i)), g).map_err(to_py)?),
                });
                if let (Given::Tensor(b, tensor), false) = (g, reads[i]) {
                    // Written: a blob the running operator holds at all is busy.
                    crate::reentry::check(b, true, &what(tensor))?;
                }
            }
            views::device_section(
                || self.check_tensors(&name, &given),
                || self.launch(&dev, grid, &given, &scalars, &reads).or_raise(),
            )
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<syncmem.RawKernel {:?} ({})>",
            self.kernel.name(),
            self.backend.as_str()
        )
    }
}
