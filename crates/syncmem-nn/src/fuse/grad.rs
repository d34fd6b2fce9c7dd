//! Backward fusion: an `FCGradient` whose input gradient `dX` is read only by a following
//! `ReluGradient` takes the ReLU's output `R` as a fourth input and writes the
//! `ReluGradient`'s output itself; the `ReluGradient` goes.
//!
//! The fused `FCGradient`'s `dX` GEMM applies the mask `R > 0` as it stores each result (the
//! select of `ReluGradient`: `dX` where `R > 0`, else 0), so the results are bit for bit those
//! of the two operators, with one launch and one pass over the gradient fewer, and without the
//! `dX` blob. The gradient of a user's element-wise operator whose declared epilogue has a
//! gradient ([`syncmem::ops::register_epilogue`]; inputs `[R, g]`, output `d`, as
//! `ReluGradient`) fuses the same way: the `FCGradient` also gets `activation` (the gradient's
//! type) and `activation_args`, and its `dX` GEMM applies `act_grad(·, R)` as it stores.
//!
//! An `FCGradient` at position `i` (inputs `[X, W, dY]`, outputs `[dW, db, g]`) and a
//! `ReluGradient` at `j > i` (inputs `[R, g]`, output `d`) fuse when:
//! - the `FCGradient` has three inputs (no mask yet) and three outputs, and none of its inputs
//!   or outputs other than `g` is `d`; `R` is not one of its outputs, not `g` and not `d`;
//! - the first operator after `i` that reads or writes `g` is that `ReluGradient`, reading it
//!   as its gradient input;
//! - `g` is written by that `FCGradient` only and read by that `ReluGradient` only, and is not
//!   protected (an external input or output of the net, or a name in `keep`) — or the
//!   `ReluGradient` runs in place (`d == g`), when `g` lives on under its name;
//! - no operator between `i` and `j` reads or writes `d`, or writes `R` (the mask must be the
//!   value the `ReluGradient` would have read).

use std::collections::BTreeSet;

use syncmem::ops::{self, OperatorDef};

fn is_fc_grad(op: &OperatorDef) -> bool {
    op.op_type == "FCGradient" && op.inputs.len() == 3 && op.outputs.len() == 3
}

/// True for a `ReluGradient`, or the gradient of a user's element-wise operator whose declared
/// epilogue has a gradient with code for every backend; inputs `[Y, dY]`, output `dX`.
fn is_relu_grad(op: &OperatorDef) -> bool {
    if op.inputs.len() != 2 || op.outputs.len() != 1 {
        return false;
    }
    op.op_type == "ReluGradient"
        || matches!(ops::gradient_epilogue_of(op), Ok(Some(e)) if e.fuses_gradient())
}

fn touches(op: &OperatorDef, name: &str) -> bool {
    op.inputs.iter().chain(&op.outputs).any(|n| n == name)
}

/// Fuses every `FCGradient` + `ReluGradient` pair of `ops` that the [module rules](self)
/// allow, in place; returns the pairs fused as (`dX` blob removed, `ReluGradient` output now
/// written by the `FCGradient`).
pub(super) fn fuse_relu_grad(
    ops: &mut Vec<OperatorDef>,
    protected: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut fused = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        if let Some(j) = partner(ops, i, protected) {
            let (r, d) = (ops[j].inputs[0].clone(), ops[j].outputs[0].clone());
            let g = std::mem::replace(&mut ops[i].outputs[2], d.clone());
            ops[i].inputs.push(r);
            let act = ops.remove(j);
            if act.op_type != "ReluGradient" {
                // A user's gradient: the FCGradient applies its epilogue to dX with R = Y.
                super::attach(&mut ops[i], &act, "ReluGradient");
            }
            fused.push((g, d));
        }
        i += 1;
    }
    fused
}

/// The index of the `ReluGradient` that the `FCGradient` at `i` fuses with, if any.
fn partner(ops: &[OperatorDef], i: usize, protected: &BTreeSet<String>) -> Option<usize> {
    let fg = &ops[i];
    if !is_fc_grad(fg) {
        return None;
    }
    let g = &fg.outputs[2];
    if fg.inputs.contains(g) || fg.outputs[..2].contains(g) {
        return None;
    }
    let j = (i + 1..ops.len()).find(|&j| touches(&ops[j], g))?;
    let rg = &ops[j];
    if !is_relu_grad(rg) || rg.inputs[1] != *g || rg.inputs[0] == *g {
        return None;
    }
    let (r, d) = (&rg.inputs[0], &rg.outputs[0]);
    if d == r || fg.outputs.contains(r) || fg.inputs.contains(d) || fg.outputs[..2].contains(d) {
        return None;
    }
    let between = &ops[i + 1..j];
    if between
        .iter()
        .any(|op| touches(op, d) || op.outputs.contains(r))
    {
        return None;
    }
    if d == g {
        // In place: g lives on as the ReluGradient's output; nothing between reads it.
        return Some(j);
    }
    if protected.contains(g) {
        return None;
    }
    let writers = ops.iter().filter(|op| op.outputs.contains(g)).count();
    let readers = ops.iter().filter(|op| op.inputs.contains(g)).count();
    (writers == 1 && readers == 1).then_some(j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::fuse_net as fuse_fc_relu;
    use syncmem::net::NetDef;

    fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
        OperatorDef::new(t, i, o)
    }

    /// The backward part of a 3-layer MLP.
    fn backward() -> NetDef {
        NetDef::new("n")
            .op(op(
                "FCGradient",
                &["r2", "w3", "d3"],
                &["dw3", "db3", "dr2"],
            ))
            .op(op("ReluGradient", &["r2", "dr2"], &["d2"]))
            .op(op(
                "FCGradient",
                &["r1", "w2", "d2"],
                &["dw2", "db2", "dr1"],
            ))
            .op(op("ReluGradient", &["r1", "dr1"], &["d1"]))
            .op(op("FCGradient", &["x", "w1", "d1"], &["dw1", "db1"]))
            .with_inputs(&["x", "r1", "r2", "w1", "w2", "w3", "d3"])
            .with_outputs(&["dw1", "db1", "dw2", "db2", "dw3", "db3"])
    }

    fn types(d: &NetDef) -> Vec<&str> {
        d.ops.iter().map(|o| o.op_type.as_str()).collect()
    }

    #[test]
    fn every_input_gradient_read_only_by_a_relu_gradient_is_fused() {
        let f = fuse_fc_relu(&backward(), &[]);
        assert_eq!(types(&f.def), ["FCGradient"; 3]);
        assert_eq!(f.def.ops[0].inputs, ["r2", "w3", "d3", "r2"]);
        assert_eq!(f.def.ops[0].outputs, ["dw3", "db3", "d2"]);
        assert_eq!(f.def.ops[1].inputs, ["r1", "w2", "d2", "r1"]);
        assert_eq!(f.def.ops[1].outputs, ["dw2", "db2", "d1"]);
        assert_eq!(
            f.def.ops[2].inputs.len(),
            3,
            "no input gradient: nothing to fuse"
        );
        assert_eq!(
            f.fused_grads,
            [
                ("dr2".to_string(), "d2".to_string()),
                ("dr1".into(), "d1".into())
            ]
        );
        assert_eq!(f.def.inputs(), backward().inputs());
        assert_eq!(f.def.outputs(), backward().outputs());
        // Fusing again changes nothing.
        assert_eq!(fuse_fc_relu(&f.def, &[]).def, f.def);
    }

    #[test]
    fn an_input_gradient_read_elsewhere_kept_or_a_changed_mask_is_not_fused() {
        let n = |d: &NetDef, keep: &[String]| fuse_fc_relu(d, keep).fused_grads.len();
        // dr2 read by another operator, kept by name, or declared as an output.
        let d = backward().op(op("Relu", &["dr2"], &["other"]));
        assert_eq!(n(&d, &[]), 1);
        assert_eq!(n(&backward(), &["dr1".into()]), 1);
        assert_eq!(n(&backward().with_outputs(&["dw1", "dr2"]), &[]), 1);
        // The mask is written between the two.
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("Relu", &["z"], &["r"]))
            .op(op("ReluGradient", &["r", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d"]);
        assert_eq!(n(&d, &[]), 0);
        // The output is used between the two.
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("Relu", &["d"], &["z"]))
            .op(op("ReluGradient", &["r", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d", "z"]);
        assert_eq!(n(&d, &[]), 0);
        // Something else reads g first, or g is the mask, or the mask is an output of the
        // FCGradient, or the output is one of its inputs.
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("Sum", &["g"], &["s"]))
            .op(op("ReluGradient", &["r", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d", "s"]);
        assert_eq!(n(&d, &[]), 0);
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["g", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d"]);
        assert_eq!(n(&d, &[]), 0);
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["dw", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d"]);
        assert_eq!(n(&d, &[]), 0);
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["r", "g"], &["dy"]))
            .with_outputs(&["dw", "db", "dy"]);
        assert_eq!(n(&d, &[]), 0);
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["r", "g"], &["r"]))
            .with_outputs(&["dw", "db", "r"]);
        assert_eq!(n(&d, &[]), 0);
        // An FCGradient that already applies a mask, or computes no dX.
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy", "m"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["r", "g"], &["d"]))
            .with_outputs(&["dw", "db", "d"]);
        assert_eq!(n(&d, &[]), 0);
    }

    #[test]
    fn an_in_place_relu_gradient_fuses_and_keeps_its_name() {
        let d = NetDef::new("n")
            .op(op("FCGradient", &["x", "w", "dy"], &["dw", "db", "g"]))
            .op(op("ReluGradient", &["r", "g"], &["g"]))
            .op(op("FCGradient", &["x0", "w0", "g"], &["dw0", "db0"]))
            .with_inputs(&["x", "w", "dy", "r", "x0", "w0"])
            .with_outputs(&["dw", "db", "dw0", "db0"]);
        let f = fuse_fc_relu(&d, &[]);
        assert_eq!(f.fused_grads, [("g".to_string(), "g".to_string())]);
        assert_eq!(f.def.ops.len(), 2);
        assert_eq!(f.def.ops[0].inputs, ["x", "w", "dy", "r"]);
        assert_eq!(f.def.ops[0].outputs, ["dw", "db", "g"]);
    }
}
