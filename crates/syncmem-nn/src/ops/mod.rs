//! The built-in operators (Caffe2's): fills, `FC`, `Relu`, `SoftmaxWithLoss`, `Accuracy`,
//! the updates `SGD`, `MomentumSGD` and `Adam`, and the gradients, each written on `syncmem`'s public API alone, as a user's
//! operator is: the builder checks its def with [`Args`](syncmem::ops::Args), `run` reaches
//! its tensors with [`with_io`](syncmem::ops::with_io) and launches the library's kernels
//! through [`syncmem::kernels`] (`gemm`, `relu`, `softmax_loss`, ...).
//!
//! [`register_operators`] adds them to syncmem's registry (once; later calls do nothing), so
//! that [`create_operator`](syncmem::ops::create_operator), nets and JSON nets find them by
//! name.
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
//! | `FC` | `X[N,K]`, `W[M,K]`, `b[M]` | `Y[N,M] = X·Wᵀ + b` | `axis` (1), `axis_w` (1), `relu` (0): 1 gives `Y = max(X·Wᵀ + b, 0)` in the GEMM's own pass (a fused FC + Relu, see [`crate::fuse`]); `activation` (a type declared with `syncmem::ops::register_epilogue`) and `activation_args` (an object): that operator's epilogue in the GEMM's pass (a fused FC + a user's element-wise operator) |
//! | `FCGradient` | `X[N,K]`, `W[M,K]`, `dY[N,M]`, optional `R[N,K]` | `dW[M,K]`, `db[M]`, optional `dX[N,K]` | `axis`, `axis_w`, `db_in_gemm` (0); with `R`: `dX` masked by `R > 0` (a fused ReluGradient), or with `activation` (the gradient's type) and `activation_args`, that gradient's epilogue from `R = Y` |
//! | `Relu` | `X` | `Y = max(X, 0)` (in place allowed) | |
//! | `ReluGradient` | `Y`, `dY` | `dX = dY · [Y > 0]` (in place on `dY` allowed) | |
//! | `SoftmaxWithLoss` | `logits[N,C]`, `labels[N]` (`i32`) | `prob[N,C]`, `loss[]` (mean cross-entropy) | `axis` (1) |
//! | `SoftmaxWithLossGradient` | `prob`, `labels` (, `dLoss[]`); or Caffe2's `X`, `labels`, `prob`, `dLoss` | `dLogits = (prob − onehot) · dLoss / N` | `axis` (1) |
//! | `Accuracy` | `X[N,C]` (probabilities or logits), `labels[N]` (`i32`) | `accuracy[]` | `top_k` (1) |
//! | `SGD` | `param`, `grad` | `param` (in place; may be omitted) | `lr` (required): `param -= lr · grad` |
//! | `MomentumSGD` | `param`, `grad`, `momentum` | `param`, `momentum` (in place; may be omitted) | `lr` (required, ≥ 0), `momentum` (0.9, in `[0, 1)`), `nesterov` (0): `m = momentum · m + lr · grad; param -= m` (Caffe2's `MomentumSGDUpdate`; Nesterov's form with `nesterov = 1`) |
//! | `Adam` | `param`, `grad`, `m`, `v` | `param`, `m`, `v` (in place; may be omitted) | `lr` (required, ≥ 0), `beta1` (0.9), `beta2` (0.999), each in `[0, 1)`, `epsilon` (1e-8, > 0): Caffe2's `Adam`, bias-corrected by the operator's own count of its runs |
//!
//! The three updates take several parameters each: `SGD` pairs `[p0, g0, p1, g1, ...]`,
//! `MomentumSGD` and `Adam` groups `[param, grad, state...]` per parameter (outputs: none, or
//! the parameter and states of every group). `MomentumSGD` and `Adam` keep their state in
//! blobs of the workspace (`<param>_momentum`; `<param>_m`, `<param>_v`), which the init net
//! creates zero-filled ([`crate::optimizer`]); each has one element-wise kernel, OpenCL C and
//! CUDA C in files next to the operator (`optim/`), and a host loop for `cpu`, launched once
//! per parameter as a user's kernel is.
//!
//! Fills draw their values from the context's seeded generator ([`Context::rng`](syncmem::Context::rng)) on the host
//! and upload them once, so equal seeds give identical tensors on every device.
//! `ConstantFill` of `float` runs a fill kernel on OpenCL and CUDA (nothing to upload).
//!
//! # Devices
//!
//! | backend | how operators run |
//! |---|---|
//! | `cpu` | loops and `matrixmultiply` over the `cpu` device's memory (the tensors' device mirror, so the same head transitions as on an accelerator) |
//! | `opencl:N` | OpenCL C kernels built once per device and cached; GEMM is tiled in local memory (see below) |
//! | `cuda:N` | CUDA C kernels compiled by NVRTC at first use (`libnvrtc` loaded at run time; absent: [`Error::RuntimeUnavailable`](syncmem::Error::RuntimeUnavailable) from [`Operator::run`]), loaded once per device and cached, launched on the context's stream; GEMM is tiled in shared memory (see below) |
//!
//! Every operator has queued its device work when `run` returns (later accesses wait for it).
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

mod access;
mod fc;
mod fill;
mod loss;
mod optim;
mod relu;
mod sgd;

pub(crate) use optim::update_group;

use std::sync::OnceLock;

use syncmem::ops::{register_operator, Operator, OperatorDef};
use syncmem::{Device, Result};

type Builder = fn(&OperatorDef, &Device) -> Result<Box<dyn Operator>>;

/// The built-in operator types, their gradients and builders.
const BUILT_IN: [(&str, Option<&str>, Builder); 15] = [
    ("ConstantFill", None, fill::build_constant),
    ("UniformFill", None, fill::build_uniform),
    ("GaussianFill", None, fill::build_gaussian),
    ("XavierFill", None, fill::build_xavier),
    ("MSRAFill", None, fill::build_msra),
    ("FC", Some("FCGradient"), fc::build_fc),
    ("FCGradient", None, fc::build_fc_gradient),
    ("Relu", Some("ReluGradient"), relu::build_relu),
    ("ReluGradient", None, relu::build_relu_gradient),
    (
        "SoftmaxWithLoss",
        Some("SoftmaxWithLossGradient"),
        loss::build_softmax_with_loss,
    ),
    (
        "SoftmaxWithLossGradient",
        None,
        loss::build_softmax_with_loss_gradient,
    ),
    ("Accuracy", None, loss::build_accuracy),
    ("SGD", None, sgd::build_sgd),
    ("MomentumSGD", None, optim::build_momentum_sgd),
    ("Adam", None, optim::build_adam),
];

/// The names of the built-in operator types, in the order they are registered.
pub fn built_in_types() -> impl Iterator<Item = &'static str> {
    BUILT_IN.iter().map(|b| b.0)
}

/// Registers the built-in operators in syncmem's registry, through the same call a user's
/// operator takes ([`register_operator`]). The first call registers them; later calls return
/// what the first returned.
///
/// # Errors
/// [`Error::AlreadyExists`](syncmem::Error::AlreadyExists) when a type of the same name was
/// registered before by someone else.
pub fn register_operators() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        for (name, gradient, build) in BUILT_IN {
            register_operator(name, gradient, build).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    r.clone().map_err(|reason| syncmem::Error::InvalidState {
        op: "register_operators",
        buffer: "the built-in operator types".into(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncmem::ops::{gradient_of, is_registered, registered_types};

    #[test]
    fn the_built_in_types_are_registered_through_the_public_path() {
        register_operators().unwrap();
        register_operators().unwrap();
        let names = registered_types();
        for name in built_in_types() {
            assert!(names.contains(&name), "{name}");
        }
        assert_eq!(gradient_of("Relu"), Some("ReluGradient"));
        assert_eq!(gradient_of("FC"), Some("FCGradient"));
        assert_eq!(gradient_of("SGD"), None);
        assert_eq!(gradient_of("NoSuchType"), None);
        // Every gradient named is itself registered.
        for (_, gradient, _) in BUILT_IN {
            if let Some(g) = gradient {
                assert!(is_registered(g), "{g}");
            }
        }
    }
}
