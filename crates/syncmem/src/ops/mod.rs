//! Operators: units of work that read and write workspace tensors by name (Caffe2's
//! `OperatorBase`), each running on its context's device; the registry of operator types.
//!
//! An operator is described by an [`OperatorDef`] (loadable from JSON with serde) and built for a
//! device by [`create_operator`] from the builder registered for its type
//! ([`register_operator`]). It reaches tensor memory only through the tensors' guards
//! ([`with_io`]), so the copies made are exactly the ones SyncedMemory's head state requires,
//! and launches its kernels through [`crate::kernels`].
//!
//! The registry starts empty. The built-in operators (`FC`, `Relu`, `SoftmaxWithLoss`, `SGD`,
//! the fills, their gradients) live in the `syncmem-nn` crate, written on this module's public
//! API alone, and are registered by `syncmem_nn::register_operators()`.
//!
//! # Operators of your own
//!
//! [`register_operator`] adds an operator type (and the name of its gradient's type) to the
//! registry that [`create_operator`] reads, from any crate (Caffe2's `REGISTER_CPU_OPERATOR`,
//! `REGISTER_GRADIENT`). A registered type is built, run and planned like any other: nets (and
//! JSON nets) use it by name. Its builder checks the def with [`Args`]; its [`Operator::run`]
//! checks its context ([`check_context`]), reaches its tensors with [`with_io`] (the lookups,
//! locks and checks every operator needs) and launches the library's kernels
//! ([`crate::kernels::gemm`], [`crate::kernels::relu`], ...) or kernels of its own
//! ([`crate::kernels::launch`]); errors name the operator and the blob ([`Operand`]). The
//! `custom_operator` example defines `LeakyRelu` this way, and so are the built-in operators.
//!
//! An element-wise type of your own may also be declared with a GEMM epilogue
//! ([`register_epilogue`], a [`crate::kernels::Epilogue`]): a fusion pass (`syncmem-nn`'s) then
//! applies it in the store of the GEMM that computes its input, and its gradient in the store
//! of the GEMM that computes the input gradient, as it does for the built-in `Relu`
//! ([`epilogue_of`], [`gradient_epilogue_of`] find the declaration).
//!
//! # Blobs, locks, in-place
//!
//! Inputs are looked up with [`Workspace::get_blob`] and must hold a
//! [`Tensor`](crate::tensor::Tensor) on the context's device (the error names the operator and
//! the blob). Outputs are created with [`Workspace::create_blob`]; an output blob that holds
//! something else than a tensor, or a tensor of another device, gets a fresh tensor of the
//! context's device (Caffe2's `GetMutable`). Outputs are resized and written with the
//! overwrite accessors when every element is written: no copy from the other mirror, no zero
//! fill.
//!
//! During [`Operator::run`] every blob is locked once: read locks for inputs, write locks for
//! outputs, one write lock for a blob that is both. Locks are taken in the order of the blobs'
//! addresses, so operators running on different threads cannot deadlock on each other. An
//! operator whose output is one of its inputs is an error unless its `in_place` pairs (given
//! to [`with_io`]) allow it.

mod args;
pub(crate) mod cache;
mod io;
mod operand;
mod registry;

pub use args::{invalid_def, Args};
pub use io::{with_io, OperatorIo};
pub use operand::{check_context, Operand};
pub use registry::{
    create_operator, epilogue_of, gradient_epilogue_of, gradient_of, is_registered,
    register_epilogue, register_operator, registered_types, EpilogueBuilder, OperatorBuilder,
};

use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::Result;
use crate::workspace::Workspace;

/// The description of one operator: its type, the blobs it reads and writes, and arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OperatorDef {
    /// The operator type, e.g. `"FC"`, `"Relu"`.
    #[serde(rename = "type")]
    pub op_type: String,
    /// Optional name, used in errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Names of the blobs read.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Names of the blobs written.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Named arguments (numbers, strings, lists).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub args: serde_json::Map<String, serde_json::Value>,
}

impl OperatorDef {
    /// A def with a type, inputs and outputs, and no arguments.
    pub fn new(op_type: &str, inputs: &[&str], outputs: &[&str]) -> Self {
        Self {
            op_type: op_type.to_string(),
            name: None,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            args: serde_json::Map::new(),
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.args.insert(key.to_string(), value.into());
        self
    }

    /// Sets the name used in errors.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The name used in errors: the given name, else the type.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.op_type)
    }

    /// The type and, when set, the name: `FC` or `FC "fc1"`. Every operator error contains it.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{} {n:?}", self.op_type),
            None => self.op_type.clone(),
        }
    }
}

/// A built operator.
pub trait Operator: Send + Sync {
    /// The def it was built from.
    fn def(&self) -> &OperatorDef;

    /// Runs the operator on `ctx`'s device, reading and writing blobs of `ws`. The device work
    /// is queued on `ctx`'s stream when it returns, not waited for: every later access of the
    /// blobs is ordered after it (on the device for device work on any stream; a host access
    /// waits for exactly the commands of the buffer it reads).
    ///
    /// # Errors
    /// Missing or mistyped blobs, shape mismatches, device errors; a context on another device
    /// than the one the operator was built for ([`Error::DeviceMismatch`](crate::Error::DeviceMismatch)).
    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()>;

    /// Whether every run writes each output that is not also an input whole, without reading
    /// it first (`device_overwrite`, `host_overwrite`, or an in-place update listed as an
    /// input too). When true, a net running on a device with a memory cap may drop such an
    /// output's old contents before the operator runs, with no write-back, when nothing reads
    /// them (a blob internal to the net): see [`crate::SyncedMemory::drop_contents`]. `false`
    /// by default; the built-in operators say `true`.
    fn overwrites_outputs(&self) -> bool {
        false
    }
}
