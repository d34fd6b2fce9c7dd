//! Operator fusion: an `FC` whose output is read only by a following `Relu` becomes one `FC`
//! with `relu = 1` that writes the Relu's output, and the `Relu` goes. A user's element-wise
//! operator declared with its GEMM epilogue ([`syncmem::ops::register_epilogue`], an
//! [`Epilogue`](syncmem::kernels::Epilogue) with code for every backend) fuses the same way:
//! the `FC` gets `activation` (the type) and `activation_args` (its arguments) and applies the
//! epilogue as it stores each result; its gradient fuses into the `FCGradient` as
//! `ReluGradient` does (see [`grad`]). An operator without a declared epilogue is never fused.
//!
//! The fused GEMM applies `max(·, 0)` as it stores each result, so the net makes one pass over
//! the activations instead of three (GEMM store, ReLU load and store), launches one kernel
//! instead of two, and never holds the pre-activation blob. The results are bit for bit those of
//! `FC` then `Relu` on every backend (the same select: NaN and `-0` become `0`). The backward
//! pass is untouched: `ReluGradient` needs only the ReLU's output `Y`, which the fused `FC`
//! writes under the Relu's name, and `FCGradient` reads the layer's input and `dY`, never the
//! pre-activation.
//!
//! An `FC` at position `i` writing `y` and a `Relu` (or a declared user's element-wise operator,
//! one input and one output) at `j > i` reading `y` and writing `r` fuse when:
//! - the `FC` has no `relu` or `activation` argument yet and does not read `y` or `r`;
//! - `y` is written by that `FC` only and read by that `Relu` only (when the Relu runs in place,
//!   `r == y`: no operator between them reads or writes `y`), and `y` is not protected (an
//!   external input or output of the net, or a name in `keep`);
//! - no operator between `i` and `j` reads or writes `r` (the fused `FC` writes `r` at `i`).
//!
//! [`Fuse`], given to [`NetOptions::rewrite`](syncmem::net::NetOptions::rewrite), applies the
//! rewrites of [`fuse_net`] when a net is built (this one, then the backward fusion of
//! [`grad`], the update fusion of [`sgd`], the loss fusion of [`loss`] and the bias gradients
//! in the `dW` GEMMs; before memory planning); the training loop uses it unless
//! [`TrainConfig::fuse`](crate::train::TrainConfig::fuse) is off (`syncmem train --no-fuse`).
//!
//! ```
//! use syncmem::net::NetDef;
//! use syncmem::ops::{self, OperatorDef};
//! use syncmem_nn::fuse::fuse_fc_relu;
//!
//! let def = NetDef::new("mlp")
//!     .op(OperatorDef::new("FC", &["x", "w1", "b1"], &["fc1"]))
//!     .op(OperatorDef::new("Relu", &["fc1"], &["relu1"]))
//!     .op(OperatorDef::new("FC", &["relu1", "w2", "b2"], &["y"]))
//!     .with_outputs(&["y"]);
//! let f = fuse_fc_relu(&def, &[]);
//! assert_eq!(f.def.ops.len(), 2);
//! assert_eq!(f.def.ops[0].outputs, vec!["relu1".to_string()]);
//! assert_eq!(f.fused, vec![("fc1".to_string(), "relu1".to_string())]);
//! ```

pub mod grad;
pub mod loss;
pub mod sgd;

use std::collections::BTreeSet;
use std::sync::Arc;

use syncmem::net::{NetDef, NetRewrite};
use syncmem::ops::{self, OperatorDef};

/// Every fusion of [`fuse_net`] as a rewrite of nets at build time
/// ([`NetOptions::rewrite`](syncmem::net::NetOptions::rewrite)).
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Fuse;

impl Fuse {
    /// The rewrite, shared, as [`NetOptions::rewrite`](syncmem::net::NetOptions::rewrite)
    /// takes it; `None` when `on` is false.
    pub fn when(on: bool) -> Option<Arc<dyn NetRewrite>> {
        on.then(|| Arc::new(Fuse) as Arc<dyn NetRewrite>)
    }
}

impl NetRewrite for Fuse {
    fn rewrite(&self, def: &NetDef, keep: &[String]) -> syncmem::Result<NetDef> {
        Ok(fuse_net(def, keep).def)
    }
}

/// A net after [`fuse_fc_relu`] or [`fuse_net`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Fusion {
    /// The rewritten def (external inputs and outputs as in the original, and the
    /// `[loss, accuracy]` pairs that loss fusion adds as outputs).
    pub def: NetDef,
    /// The pairs fused, as (pre-activation blob removed, ReLU output now written by the `FC`).
    pub fused: Vec<(String, String)>,
    /// The `FCGradient` + `ReluGradient` pairs fused (see [`grad`]), as (input
    /// gradient blob removed, `ReluGradient` output now written by the `FCGradient`).
    pub fused_grads: Vec<(String, String)>,
    /// How many update operators (`SGD`, `MomentumSGD`, `Adam`) merged into multi-parameter
    /// ones (see [`sgd`]).
    pub fused_updates: usize,
    /// How many `Accuracy` and `SoftmaxWithLossGradient` operators run inside a
    /// `SoftmaxWithLoss` (see [`loss`]).
    pub fused_losses: usize,
    /// How many `FCGradient`s write their bias gradient in their `dW` GEMM's launch
    /// (`db_in_gemm = 1`, see [`fuse_net`]).
    pub fused_bias_grads: usize,
}

/// Every fusion of a net: [`fuse_fc_relu`], then each `FCGradient` + `ReluGradient` pair
/// (see [`grad`]), then the runs of updates (`SGD`s, `MomentumSGD`s, `Adam`s: see [`sgd`]),
/// then the
/// `Accuracy` and the gradient of each `SoftmaxWithLoss` (see [`loss`]: with the
/// accuracy, its `[loss, accuracy]` pair becomes an output of the net), and every
/// `FCGradient` computes its bias gradient in its `dW` GEMM's launch (`db_in_gemm = 1`: the
/// column sums of `dY`, bit for bit those of a separate launch). Names in `keep` are never
/// removed.
pub fn fuse_net(def: &NetDef, keep: &[String]) -> Fusion {
    let mut f = fuse_fc_relu(def, keep);
    let protected = protected(def, keep);
    f.fused_grads = grad::fuse_relu_grad(&mut f.def.ops, &protected);
    f.fused_updates = sgd::fuse_sgd(&mut f.def.ops);
    let (losses, pairs) = loss::fuse_loss(&mut f.def.ops, &protected);
    f.fused_losses = losses;
    if !pairs.is_empty() {
        let mut outputs = f.def.outputs();
        outputs.extend(pairs);
        f.def.external_outputs = Some(outputs);
    }
    for op in &mut f.def.ops {
        if op.op_type == "FCGradient" && !op.args.contains_key("db_in_gemm") {
            op.args.insert("db_in_gemm".into(), 1.into());
            f.fused_bias_grads += 1;
        }
    }
    f
}

/// The names a rewrite never removes: external inputs and outputs, and `keep`.
fn protected(def: &NetDef, keep: &[String]) -> BTreeSet<String> {
    let mut protected: BTreeSet<String> = def.inputs().into_iter().collect();
    protected.extend(def.outputs());
    protected.extend(keep.iter().cloned());
    protected
}

fn is_fc(op: &OperatorDef) -> bool {
    op.op_type == "FC"
        && op.outputs.len() == 1
        && !op.args.contains_key("relu")
        && !op.args.contains_key("activation")
}

/// True for a `Relu`, or a user's element-wise operator whose declared epilogue
/// ([`syncmem::ops::register_epilogue`]) has code for every backend; one input, one output.
fn is_activation(op: &OperatorDef) -> bool {
    if op.inputs.len() != 1 || op.outputs.len() != 1 {
        return false;
    }
    op.op_type == "Relu" || matches!(ops::epilogue_of(op), Ok(Some(e)) if e.fuses())
}

/// Makes `fc` apply the activation `act` in its GEMM: `relu = 1` for a `Relu`, else
/// `activation` (the type) and `activation_args` (its arguments).
fn attach(fc: &mut OperatorDef, act: &OperatorDef, relu: &str) {
    if act.op_type == relu {
        fc.args.insert("relu".into(), 1.into());
        return;
    }
    fc.args
        .insert("activation".into(), act.op_type.clone().into());
    fc.args.insert(
        "activation_args".into(),
        serde_json::Value::Object(act.args.clone()),
    );
}

fn touches(op: &OperatorDef, name: &str) -> bool {
    op.inputs.iter().chain(&op.outputs).any(|n| n == name)
}

/// Fuses every `FC` + `Relu` pair of `def` that the [module rules](self) allow; names in `keep`
/// are never removed.
pub fn fuse_fc_relu(def: &NetDef, keep: &[String]) -> Fusion {
    let protected = protected(def, keep);
    let mut ops = def.ops.clone();
    let mut fused = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        if let Some(j) = partner(&ops, i, &protected) {
            let r = ops[j].outputs[0].clone();
            let y = std::mem::replace(&mut ops[i].outputs[0], r.clone());
            let act = ops.remove(j);
            attach(&mut ops[i], &act, "Relu");
            fused.push((y, r));
        }
        i += 1;
    }
    let mut out = def.clone();
    out.ops = ops;
    // The protected names stay what they were, whatever the rewrite removed.
    out.external_inputs = Some(def.inputs());
    out.external_outputs = Some(def.outputs());
    Fusion {
        def: out,
        fused,
        fused_grads: Vec::new(),
        fused_updates: 0,
        fused_losses: 0,
        fused_bias_grads: 0,
    }
}

/// The index of the `Relu` (or user's element-wise operator) that the `FC` at `i` fuses with,
/// if any.
fn partner(ops: &[OperatorDef], i: usize, protected: &BTreeSet<String>) -> Option<usize> {
    let fc = &ops[i];
    if !is_fc(fc) {
        return None;
    }
    let y = &fc.outputs[0];
    if protected.contains(y) || fc.inputs.contains(y) {
        return None;
    }
    // The first operator after the FC that touches y must be a Relu reading it.
    let j = (i + 1..ops.len()).find(|&j| touches(&ops[j], y))?;
    let relu = &ops[j];
    if !is_activation(relu) || relu.inputs[0] != *y {
        return None;
    }
    let r = &relu.outputs[0];
    if fc.inputs.contains(r) || ops[i + 1..j].iter().any(|op| touches(op, r)) {
        return None;
    }
    let writers = ops.iter().filter(|op| op.outputs.contains(y)).count();
    let readers = ops.iter().filter(|op| op.inputs.contains(y)).count();
    if r == y {
        // In place: y lives on as the ReLU's output; the FC and the Relu are its only users
        // up to the Relu (checked above), so nothing sees the difference.
        return Some(j);
    }
    (writers == 1 && readers == 1).then_some(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
        OperatorDef::new(t, i, o)
    }

    fn mlp() -> NetDef {
        NetDef::new("n")
            .op(op("FC", &["x", "w1", "b1"], &["fc1"]))
            .op(op("Relu", &["fc1"], &["relu1"]))
            .op(op("FC", &["relu1", "w2", "b2"], &["fc2"]))
            .op(op("Relu", &["fc2"], &["relu2"]))
            .op(op("FC", &["relu2", "w3", "b3"], &["fc3"]))
            .op(op("ReluGradient", &["relu2", "d"], &["dfc2"]))
            .with_inputs(&["x", "w1", "b1", "w2", "b2", "w3", "b3", "d"])
            .with_outputs(&["fc3", "dfc2"])
    }

    #[test]
    fn every_fc_feeding_only_a_relu_is_fused() {
        let f = fuse_fc_relu(&mlp(), &[]);
        let types: Vec<&str> = f.def.ops.iter().map(|o| o.op_type.as_str()).collect();
        assert_eq!(types, ["FC", "FC", "FC", "ReluGradient"]);
        assert_eq!(f.def.ops[0].outputs, ["relu1"]);
        assert_eq!(f.def.ops[1].inputs[0], "relu1");
        assert_eq!(f.def.ops[1].outputs, ["relu2"]);
        assert!(f.def.ops[0].args.contains_key("relu"));
        assert!(!f.def.ops[2].args.contains_key("relu"), "fc3 feeds no Relu");
        assert_eq!(f.fused.len(), 2);
        assert_eq!(f.def.inputs(), mlp().inputs());
        assert_eq!(f.def.outputs(), mlp().outputs());
        // Fusing again changes nothing.
        assert_eq!(fuse_fc_relu(&f.def, &[]).def, f.def);
    }

    #[test]
    fn a_pre_activation_read_elsewhere_or_kept_is_not_fused() {
        // fc1 read by another operator.
        let d = mlp().op(op("Relu", &["fc1"], &["other"]));
        assert_eq!(fuse_fc_relu(&d, &[]).fused.len(), 1);
        // fc2 kept by name, or declared as an output.
        assert_eq!(fuse_fc_relu(&mlp(), &["fc2".into()]).fused.len(), 1);
        let d = mlp().with_outputs(&["fc3", "fc1"]);
        assert_eq!(fuse_fc_relu(&d, &[]).fused.len(), 1);
        // The Relu's output is used between the two.
        let d = NetDef::new("n")
            .op(op("FC", &["x", "w", "b"], &["y"]))
            .op(op("Relu", &["r"], &["z"]))
            .op(op("Relu", &["y"], &["r"]))
            .with_outputs(&["r", "z"]);
        assert!(fuse_fc_relu(&d, &[]).fused.is_empty());
        // Something else comes first after the FC: y read by a non-Relu.
        let d = NetDef::new("n")
            .op(op("FC", &["x", "w", "b"], &["y"]))
            .op(op("Sum", &["y"], &["s"]))
            .op(op("Relu", &["y"], &["r"]))
            .with_outputs(&["r", "s"]);
        assert!(fuse_fc_relu(&d, &[]).fused.is_empty());
        // An FC that already applies its ReLU.
        let d = NetDef::new("n")
            .op(op("FC", &["x", "w", "b"], &["y"]).arg("relu", 1))
            .op(op("Relu", &["y"], &["r"]))
            .with_outputs(&["r"]);
        assert!(fuse_fc_relu(&d, &[]).fused.is_empty());
    }

    #[test]
    fn an_in_place_relu_fuses_and_keeps_its_name() {
        let d = NetDef::new("n")
            .op(op("FC", &["x", "w", "b"], &["h"]))
            .op(op("Relu", &["h"], &["h"]))
            .op(op("FC", &["h", "w2", "b2"], &["y"]))
            .with_inputs(&["x", "w", "b", "w2", "b2"])
            .with_outputs(&["y"]);
        let f = fuse_fc_relu(&d, &[]);
        assert_eq!(f.fused, [("h".to_string(), "h".to_string())]);
        assert_eq!(f.def.ops.len(), 2);
        assert_eq!(f.def.ops[0].outputs, ["h"]);
    }
}
