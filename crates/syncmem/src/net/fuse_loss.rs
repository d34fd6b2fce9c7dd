//! Loss fusion: the `Accuracy` and the `SoftmaxWithLossGradient` that read the probabilities
//! of a `SoftmaxWithLoss` run inside it: one pass over the rows (one kernel launch on a device)
//! writes the probabilities, the loss, the accuracy and the gradient, bit for bit what the
//! three operators give.
//!
//! A `SoftmaxWithLoss` at position `i` (inputs `[X, labels]`, outputs `[P, loss]`, `axis`
//! absent or 1) takes in a later operator at `j > i` that reads `[P, labels]` — an `Accuracy`
//! (any `top_k`) writing `a`, or a `SoftmaxWithLossGradient` without `dLoss` and with the same
//! `axis` writing `d` — when:
//! - no operator between `i` and `j` writes `P` or `labels`, or reads or writes its output
//!   (which the fused operator writes at `i`);
//! - its output is not `X`, `labels`, `P`, the loss, or the output of the other operator taken
//!   in.
//!
//! The fused `SoftmaxWithLoss` gets `accuracy_top_k` and the accuracy as output 2, and
//! `gradient = 1` with the gradient as its last output. No blob is removed.

use crate::ops::OperatorDef;

fn touches(op: &OperatorDef, name: &str) -> bool {
    op.inputs.iter().chain(&op.outputs).any(|n| n == name)
}

fn axis_one(op: &OperatorDef) -> bool {
    op.args.get("axis").is_none_or(|v| v.as_i64() == Some(1))
}

/// The softmax at `i` (unfused yet), if it can take in operators.
fn is_softmax(op: &OperatorDef) -> bool {
    op.op_type == "SoftmaxWithLoss"
        && op.inputs.len() == 2
        && op.outputs.len() == 2
        && op.args.keys().all(|k| k == "axis")
        && axis_one(op)
}

/// Whether `op` is an `Accuracy` (true) or a `SoftmaxWithLossGradient` (false) that reads
/// exactly `[p, labels]`.
fn kind(op: &OperatorDef, p: &str, labels: &str) -> Option<bool> {
    if op.inputs.len() != 2 || op.outputs.len() != 1 || op.inputs[0] != p || op.inputs[1] != labels
    {
        return None;
    }
    match op.op_type.as_str() {
        "Accuracy" if op.args.keys().all(|k| k == "top_k") => Some(true),
        "SoftmaxWithLossGradient" if op.args.keys().all(|k| k == "axis") && axis_one(op) => {
            Some(false)
        }
        _ => None,
    }
}

/// Fuses the `Accuracy` and `SoftmaxWithLossGradient` of every `SoftmaxWithLoss` of `ops`
/// that the [module rules](self) allow, in place; returns how many operators were taken in.
pub(super) fn fuse_loss(ops: &mut Vec<OperatorDef>) -> usize {
    let mut taken = 0;
    for i in 0..ops.len() {
        if i >= ops.len() || !is_softmax(&ops[i]) {
            continue;
        }
        let (x, labels) = (ops[i].inputs[0].clone(), ops[i].inputs[1].clone());
        let (p, loss) = (ops[i].outputs[0].clone(), ops[i].outputs[1].clone());
        let (mut acc, mut grad) = (None, None);
        for j in i + 1..ops.len() {
            let op = &ops[j];
            let Some(is_acc) = kind(op, &p, &labels) else {
                continue;
            };
            if (is_acc && acc.is_some()) || (!is_acc && grad.is_some()) {
                continue;
            }
            let out = &op.outputs[0];
            let other = if is_acc { &grad } else { &acc };
            if [&x, &labels, &p, &loss].contains(&out)
                || other
                    .as_ref()
                    .is_some_and(|(_, o): &(usize, String)| o == out)
            {
                continue;
            }
            let between = &ops[i + 1..j];
            if between
                .iter()
                .any(|b| b.outputs.contains(&p) || b.outputs.contains(&labels) || touches(b, out))
            {
                continue;
            }
            let slot = Some((j, out.clone()));
            if is_acc {
                acc = slot;
            } else {
                grad = slot;
            }
        }
        let mut gone = Vec::new();
        if let Some((j, a)) = &acc {
            let top_k = ops[*j].args.get("top_k").cloned().unwrap_or(1.into());
            ops[i].args.insert("accuracy_top_k".into(), top_k);
            ops[i].outputs.push(a.clone());
            gone.push(*j);
        }
        if let Some((j, d)) = &grad {
            ops[i].args.insert("gradient".into(), 1.into());
            ops[i].outputs.push(d.clone());
            gone.push(*j);
        }
        gone.sort_unstable();
        for j in gone.into_iter().rev() {
            ops.remove(j);
            taken += 1;
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use crate::net::{fuse_net, NetDef};
    use crate::ops::OperatorDef;

    fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
        OperatorDef::new(t, i, o)
    }

    fn loss_net(mid: Option<OperatorDef>) -> NetDef {
        let mut d = NetDef::new("n").op(op("SoftmaxWithLoss", &["x", "l"], &["p", "loss"]));
        if let Some(m) = mid {
            d = d.op(m);
        }
        d.op(op("Accuracy", &["p", "l"], &["acc"]).arg("top_k", 2))
            .op(op("SoftmaxWithLossGradient", &["p", "l"], &["dx"]))
            .with_inputs(&["x", "l"])
            .with_outputs(&["loss", "acc", "dx"])
    }

    #[test]
    fn the_accuracy_and_the_gradient_run_inside_the_loss() {
        let f = fuse_net(&loss_net(None), &[]);
        assert_eq!(f.fused_losses, 2);
        assert_eq!(f.def.ops.len(), 1);
        let o = &f.def.ops[0];
        assert_eq!(o.outputs, ["p", "loss", "acc", "dx"]);
        assert_eq!(o.args["accuracy_top_k"], 2);
        assert_eq!(o.args["gradient"], 1);
        assert_eq!(
            fuse_net(&f.def, &[]).def,
            f.def,
            "fusing again changes nothing"
        );
        // An unrelated operator in between changes nothing.
        let f = fuse_net(&loss_net(Some(op("Relu", &["z"], &["y"]))), &[]);
        assert_eq!(f.fused_losses, 2);
    }

    #[test]
    fn a_changed_input_a_used_output_or_other_arguments_are_not_fused() {
        let n = |d: &NetDef| fuse_net(d, &[]).fused_losses;
        // P or the labels written in between: neither is taken in.
        assert_eq!(n(&loss_net(Some(op("Relu", &["z"], &["p"])))), 0);
        assert_eq!(n(&loss_net(Some(op("Relu", &["z"], &["l"])))), 0);
        // An output read in between: that one stays.
        assert_eq!(n(&loss_net(Some(op("Relu", &["acc"], &["y"])))), 1);
        assert_eq!(n(&loss_net(Some(op("Relu", &["z"], &["dx"])))), 1);
        // A gradient with dLoss, another axis, or an output that is an input.
        let d = NetDef::new("n")
            .op(op("SoftmaxWithLoss", &["x", "l"], &["p", "loss"]))
            .op(op("SoftmaxWithLossGradient", &["p", "l", "dl"], &["dx"]))
            .op(op("SoftmaxWithLossGradient", &["p", "l"], &["dx2"]).arg("axis", 0))
            .op(op("Accuracy", &["p", "l"], &["x"]));
        assert_eq!(n(&d), 0);
        // A softmax over another axis, or reading other probabilities.
        let d = NetDef::new("n")
            .op(op("SoftmaxWithLoss", &["x", "l"], &["p", "loss"]).arg("axis", 2))
            .op(op("Accuracy", &["p", "l"], &["a"]))
            .op(op("Accuracy", &["q", "l"], &["b"]));
        assert_eq!(n(&d), 0);
    }
}
