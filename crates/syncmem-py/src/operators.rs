//! `syncmem.register_operator`: an operator type defined by a Python function over NumPy
//! views, for the `cpu` device, registered in the library's registry as any operator is (nets
//! and JSON nets use it by name, the planner plans it).
//!
//! At each run the function gets the inputs as read-only NumPy views of their host mirrors
//! (made current first: on `cpu` that is a copy from the `cpu` device's memory when it holds
//! newer data) and the outputs as fresh writable NumPy arrays of their shapes, which it fills;
//! they are then copied into the output tensors' host mirrors (one copy each), so the arrays
//! may outlive the call without touching any buffer. The function may call the package; what
//! would wait for the blobs the run holds raises `BusyError` instead (see `reentry`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use syncmem::ops::{self, Operator, OperatorDef};
use syncmem::{BackendKind, Context, DType, Device, Error, Result, Tensor, Workspace};

use crate::errors::OrRaise;
use crate::{dtypes, reentry, views};

/// An operator whose work is a Python function.
struct PyOperator {
    def: OperatorDef,
    func: Py<PyAny>,
    shapes: Option<Py<PyAny>>,
}

/// A Python failure inside an operator, as a library error naming it.
fn failed(def: &OperatorDef, e: PyErr) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: format!("operator {} (a Python function)", def.label()),
        reason: e.to_string(),
    }
}

impl PyOperator {
    /// The outputs' dims and types: from `shapes(input_shapes)` when given, else the first
    /// input's for every output.
    fn output_specs(
        &self,
        py: Python<'_>,
        ins: &[(Vec<usize>, DType)],
    ) -> PyResult<Vec<(Vec<usize>, DType)>> {
        let n = self.def.outputs.len();
        let first = ins.first().cloned();
        let Some(shapes) = &self.shapes else {
            let (dims, dtype) = first.ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(
                    "an operator without inputs needs shapes= to size its outputs",
                )
            })?;
            return Ok(vec![(dims, dtype); n]);
        };
        let given = PyList::new(py, ins.iter().map(|(d, _)| PyTuple::new(py, d).ok()))?;
        let dims: Vec<Vec<usize>> = shapes.call1(py, (given,))?.extract(py)?;
        if dims.len() != n {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "shapes returned {} shapes for {n} outputs",
                dims.len()
            )));
        }
        let dtype = first.map_or(DType::F32, |f| f.1);
        Ok(dims.into_iter().map(|d| (d, dtype)).collect())
    }
}

impl Operator for PyOperator {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        let def = &self.def;
        ops::with_io(ws, def, ctx.device(), &[], |io| {
            let mut inputs = Vec::with_capacity(def.inputs.len());
            let mut specs = Vec::with_capacity(def.inputs.len());
            for i in 0..def.inputs.len() {
                let t = io.input(i)?;
                let dtype = t.dtype().ok_or_else(|| Error::InvalidState {
                    op: "Operator::run",
                    buffer: format!("input {i} of operator {}", def.label()),
                    reason: "the tensor has no element type".into(),
                })?;
                specs.push((t.dims().to_vec(), dtype));
                let view = views::HostView::read_only(t, &format!("input {i} of {}", def.label()))
                    .map_err(|e| Python::attach(|_| failed(def, e)))?;
                inputs.push(view);
            }
            // The blobs this run holds, for the package's calls from the function (see
            // `reentry`): they raise `BusyError` rather than wait for them.
            let held = def
                .inputs
                .iter()
                .map(|n| (n, def.outputs.contains(n)))
                .chain(def.outputs.iter().map(|n| (n, true)))
                .filter_map(|(n, written)| ws.try_get_blob(n).map(|b| (b, n.clone(), written)));
            let _running = reentry::enter(def.label(), held);
            let results: Vec<(Vec<usize>, DType, Vec<u8>)> = Python::attach(|py| {
                let outs = self.output_specs(py, &specs)?;
                let arrays = inputs
                    .drain(..)
                    .map(|v| views::to_numpy(py, v))
                    .collect::<PyResult<Vec<_>>>()?;
                let np = py.import("numpy")?;
                let mut outputs = Vec::with_capacity(outs.len());
                for (dims, dtype) in &outs {
                    let descr = dtypes::numpy_descr(py, *dtype, &def.label())?;
                    outputs.push(np.call_method1("zeros", (PyTuple::new(py, dims)?, descr))?);
                }
                let out_list = PyList::new(py, &outputs)?;
                self.func.call1(py, (PyList::new(py, arrays)?, &out_list))?;
                let mut results = Vec::with_capacity(outs.len());
                for (j, (dims, dtype)) in outs.into_iter().enumerate() {
                    let descr = dtypes::numpy_descr(py, dtype, &def.label())?;
                    let a = np.call_method1("ascontiguousarray", (out_list.get_item(j)?, descr))?;
                    let got: Vec<usize> = a.getattr("shape")?.extract()?;
                    if got != dims {
                        return Err(pyo3::exceptions::PyValueError::new_err(format!(
                            "output {j} has shape {got:?}, the operator sized it {dims:?}"
                        )));
                    }
                    let bytes = a.call_method0("tobytes")?;
                    let bytes = bytes.cast::<PyBytes>()?.as_bytes().to_vec();
                    results.push((dims, dtype, bytes));
                }
                Ok(results)
            })
            .map_err(|e| failed(def, e))?;
            for (j, (dims, dtype, bytes)) in results.into_iter().enumerate() {
                let t: &mut Tensor = io.output(j)?;
                t.resize(&dims)?;
                t.set_dtype(dtype)?;
                if !bytes.is_empty() {
                    t.host_bytes_overwrite()?.copy_from_slice(&bytes);
                }
            }
            Ok(())
        })
    }
}

/// Registers operator type `op_type`, run by `func(inputs, outputs)` on the `cpu` device:
/// `inputs` is a list of read-only NumPy views of the input tensors, `outputs` a list of
/// zero-filled NumPy arrays to fill (each shaped and typed as the first input, or as
/// `shapes(input_shapes)` says). `gradient` names the type of its gradient operator, for nets
/// built with it (`Mlp` activations). Raises `AlreadyExistsError` for a type registered
/// before; building the operator for another device than `cpu` raises `DeviceError`. The
/// function may call the package: a call that would wait for a blob the running operator holds
/// (`feed_blob` of an input or output, reading an output, `run_net` of a net using one, `save`,
/// a writable view) raises `BusyError` naming the blob instead of waiting forever.
#[pyfunction]
#[pyo3(signature = (op_type, func, gradient = None, shapes = None))]
pub fn register_operator(
    op_type: &str,
    func: Py<PyAny>,
    gradient: Option<&str>,
    shapes: Option<Py<PyAny>>,
) -> PyResult<()> {
    let name = op_type.to_string();
    ops::register_operator(
        op_type,
        gradient,
        move |def: &OperatorDef, device: &Device| {
            if device.backend() != BackendKind::Cpu {
                return Err(Error::Unsupported {
                    device: device.label().to_string(),
                    what: format!(
                        "operator type {name:?} is a Python function: it runs on cpu only"
                    ),
                });
            }
            Python::attach(|py| {
                Ok(Box::new(PyOperator {
                    def: def.clone(),
                    func: func.clone_ref(py),
                    shapes: shapes.as_ref().map(|s| s.clone_ref(py)),
                }) as Box<dyn Operator>)
            })
        },
    )
    .or_raise()
}
