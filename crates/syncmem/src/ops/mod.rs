//! Operators: units of work that read and write workspace tensors by name (Caffe2's
//! `OperatorBase`), each running on its context's device.
//!
//! An operator is described by an [`OperatorDef`] (loadable from JSON with serde) and built for a
//! device by [`create_operator`]. It reaches tensor memory only through the tensors' guards, so
//! the copies made are exactly the ones SyncedMemory's head state requires.
//!
//! ```
//! use syncmem::ops::{create_operator, OperatorDef};
//! use syncmem::{tensor::Tensor, Context, Device, Workspace};
//!
//! # fn main() -> syncmem::Result<()> {
//! let dev = Device::cpu();
//! let ctx = Context::with_seed(&dev, 7)?;
//! let ws = Workspace::new();
//! let fill = OperatorDef::new("UniformFill", &[], &["x"])
//!     .arg("shape", vec![2, 3])
//!     .arg("min", -1.0)
//!     .arg("max", 1.0);
//! create_operator(&fill, &dev)?.run(&ws, &ctx)?;
//! create_operator(&OperatorDef::new("Relu", &["x"], &["y"]), &dev)?.run(&ws, &ctx)?;
//! let y = ws.get_blob("y")?;
//! let y = y.read();
//! let y = y.get::<Tensor>()?;
//! assert_eq!(y.dims(), &[2, 3]);
//! assert!(y.host::<f32>()?.iter().all(|&v| v >= 0.0));
//! # Ok(())
//! # }
//! ```
//!
//! # Operators
//!
//! All math is `f32`; labels are `i32`. Shapes use Caffe2's names: `X[N,K]` is a tensor of `N`
//! rows of `K` elements (with `axis`, the dims before `axis` are flattened into `N`, the rest
//! into `K`).
//!
//! | type | inputs | outputs | arguments |
//! |---|---|---|---|
//! | `ConstantFill` | none, or `like` (shape source) | `Y` | `shape` (list; required without input), `value` (0), `dtype` (`"float"` or `"int32"`) |
//! | `UniformFill` | none, or `like` | `Y` | `shape`, `min` (0), `max` (1): uniform in `[min, max]` |
//! | `GaussianFill` | none, or `like` | `Y` | `shape`, `mean` (0), `std` (1) |
//! | `XavierFill` | none, or `like` | `Y` | `shape`: uniform in `±sqrt(3 / fan_in)`, `fan_in = numel / dims[0]` |
//! | `MSRAFill` | none, or `like` | `Y` | `shape`: gaussian, `std = sqrt(2 / fan_out)`, `fan_out = numel / dims[1]` (as Caffe2) |
//! | `FC` | `X[N,K]`, `W[M,K]`, `b[M]` | `Y[N,M] = X·Wᵀ + b` | `axis` (1), `axis_w` (1), `relu` (0): 1 gives `Y = max(X·Wᵀ + b, 0)` in the GEMM's own pass (a fused FC + Relu, see [`crate::net::fuse`]) |
//! | `FCGradient` | `X[N,K]`, `W[M,K]`, `dY[N,M]` | `dW[M,K]`, `db[M]`, optional `dX[N,K]` | `axis`, `axis_w` |
//! | `Relu` | `X` | `Y = max(X, 0)` (in place allowed) | |
//! | `ReluGradient` | `Y`, `dY` | `dX = dY · [Y > 0]` (in place on `dY` allowed) | |
//! | `SoftmaxWithLoss` | `logits[N,C]`, `labels[N]` (`i32`) | `prob[N,C]`, `loss[]` (mean cross-entropy) | `axis` (1) |
//! | `SoftmaxWithLossGradient` | `prob`, `labels` (, `dLoss[]`); or Caffe2's `X`, `labels`, `prob`, `dLoss` | `dLogits = (prob − onehot) · dLoss / N` | `axis` (1) |
//! | `Accuracy` | `X[N,C]` (probabilities or logits), `labels[N]` (`i32`) | `accuracy[]` | `top_k` (1) |
//! | `SGD` | `param`, `grad` | `param` (in place; may be omitted) | `lr` (required): `param -= lr · grad` |
//!
//! Fills draw their values from the context's seeded generator ([`Context::rng`]) on the host
//! and upload them once, so equal seeds give identical tensors on every device.
//! `ConstantFill` of `float` runs a fill kernel on OpenCL and CUDA (nothing to upload).
//!
//! # Devices
//!
//! | backend | how operators run |
//! |---|---|
//! | `cpu` | loops and `matrixmultiply` over the `cpu` device's memory (the tensors' device mirror, so the same head transitions as on an accelerator) |
//! | `opencl:N` | OpenCL C kernels built once per device and cached; GEMM is tiled in local memory (see below) |
//! | `cuda:N` | CUDA C kernels compiled by NVRTC at first use (`libnvrtc` loaded at run time; absent: [`Error::RuntimeUnavailable`](crate::Error::RuntimeUnavailable) from [`Operator::run`]), loaded once per device and cached, launched on the context's stream; GEMM is tiled in shared memory (see below). **Untested on hardware**: they have never run on a GPU (this project's CI has none), only been built |
//!
//! Every operator has finished its device work when [`Operator::run`] returns.
//!
//! # OpenCL GEMM
//!
//! `FC` and `FCGradient` share one GEMM kernel with optional transposes (`X·Wᵀ`, `dYᵀ·X`,
//! `dY·W`). A work-group owns a 64 × 64 tile of the result and walks K in steps of `TSK` (64 on
//! PoCL): both operand tiles are staged in local memory (zero-padded, so any size works), and
//! each of its 8 × 16 work-items accumulates a 4 × 8 block in `float8` registers. Tile sizes
//! shrink on devices with small work-groups or little local memory. The bias is added in the
//! same kernel; `db` is a column-sum kernel.
//!
//! # CUDA GEMM
//!
//! The same kernel in CUDA C: a block of 16 × 16 threads owns a 64 × 64 tile of the result and
//! walks K in steps of 16, both operand tiles staged in shared memory (zero-padded), each thread
//! accumulating a 4 × 4 block in registers. The grid has one block per column tile and up to
//! 65535 blocks along the rows, each looping over further row tiles, so any size works.
//!
//! # Operators of your own
//!
//! [`register_operator`] adds an operator type (and the name of its gradient's type) to the
//! registry that [`create_operator`] reads, from any crate (Caffe2's `REGISTER_CPU_OPERATOR`,
//! `REGISTER_GRADIENT`); the types above are registered through the same call. A registered
//! type is built, run, planned and fused like a built-in one: nets (and JSON nets) use it by
//! name, and [`crate::net::mlp::Mlp::with_activation`] trains with it. Its builder checks the
//! def with [`Args`]; its [`Operator::run`] reaches its tensors with [`with_io`] (the lookups,
//! locks and checks of the built-in operators) and launches kernels of its own with
//! [`crate::kernels::launch`]. The `custom_operator` example defines `LeakyRelu` this way.
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
//! operator whose output is one of its inputs is an error unless the table above allows it.

mod access;
mod args;
mod fc;
mod fill;
mod io;
mod loss;
mod registry;
mod relu;
mod sgd;

pub use args::Args;
pub use io::{with_io, OperatorIo};
pub use registry::{
    create_operator, gradient_of, is_registered, register_operator, registered_types,
    OperatorBuilder,
};

use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::Result;
use crate::workspace::Workspace;

/// The description of one operator: its type, the blobs it reads and writes, and arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}
