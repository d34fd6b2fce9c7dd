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
//! `gradient = 1` with the gradient as the output after it. No blob is removed.
//!
//! With the accuracy taken in, it also gets `scalars = 1` and a last output named by
//! [`loss_scalars_name`] (`"{loss}_and_{accuracy}"`, when no operator of the net and no
//! external name uses it): `[loss, accuracy]` side by side, written in the same launch, so that
//! a training loop brings both back with one read instead of two. [`super::fuse_net`] makes it
//! an external output of the net (memory planning keeps it apart).

use std::collections::BTreeSet;

use syncmem::ops::OperatorDef;

/// The name of the `[loss, accuracy]` output that loss fusion gives a `SoftmaxWithLoss` writing
/// `loss` that takes in an `Accuracy` writing `accuracy` (see the [module](self)).
pub fn loss_scalars_name(loss: &str, accuracy: &str) -> String {
    format!("{loss}_and_{accuracy}")
}

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
/// that the [module rules](self) allow, in place; returns how many operators were taken in,
/// and the `[loss, accuracy]` outputs added (none named in `protected`).
pub(super) fn fuse_loss(
    ops: &mut Vec<OperatorDef>,
    protected: &BTreeSet<String>,
) -> (usize, Vec<String>) {
    let mut in_use: BTreeSet<String> = ops
        .iter()
        .flat_map(|o| o.inputs.iter().chain(&o.outputs).cloned())
        .collect();
    in_use.extend(protected.iter().cloned());
    let mut added = Vec::new();
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
        if let Some((_, a)) = &acc {
            let both = loss_scalars_name(&loss, a);
            if in_use.insert(both.clone()) {
                ops[i].args.insert("scalars".into(), 1.into());
                ops[i].outputs.push(both.clone());
                added.push(both);
            }
        }
        gone.sort_unstable();
        for j in gone.into_iter().rev() {
            ops.remove(j);
            taken += 1;
        }
    }
    (taken, added)
}

#[cfg(test)]
mod tests {
    use crate::fuse::fuse_net;
    use syncmem::net::NetDef;
    use syncmem::ops::OperatorDef;

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
        assert_eq!(o.outputs, ["p", "loss", "acc", "dx", "loss_and_acc"]);
        assert_eq!(o.args["accuracy_top_k"], 2);
        assert_eq!(o.args["gradient"], 1);
        assert_eq!(o.args["scalars"], 1);
        // The pair is an output of the net: memory planning keeps it.
        assert!(f.def.outputs().contains(&"loss_and_acc".to_string()));
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
        // An output read in between: that one stays (and without the accuracy, no pair).
        assert_eq!(n(&loss_net(Some(op("Relu", &["acc"], &["y"])))), 1);
        let f = fuse_net(&loss_net(Some(op("Relu", &["acc"], &["y"]))), &[]);
        assert!(!f.def.ops[0].args.contains_key("scalars"));
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

    #[test]
    fn the_pair_is_not_added_under_a_name_in_use() {
        // A blob of the net, or a name kept, already called `loss_and_acc`.
        let taken = loss_net(Some(op("Relu", &["z"], &["loss_and_acc"])));
        let f = fuse_net(&taken, &[]);
        assert_eq!(f.fused_losses, 2);
        assert!(!f.def.ops[0].args.contains_key("scalars"));
        assert_eq!(f.def.ops[0].outputs, ["p", "loss", "acc", "dx"]);
        let f = fuse_net(&loss_net(None), &["loss_and_acc".to_string()]);
        assert!(!f.def.ops[0].args.contains_key("scalars"));
        assert_eq!(super::loss_scalars_name("l", "a"), "l_and_a");
        use crate::mlp::{ACCURACY, LOSS, LOSS_AND_ACCURACY};
        assert_eq!(super::loss_scalars_name(LOSS, ACCURACY), LOSS_AND_ACCURACY);
    }
}
