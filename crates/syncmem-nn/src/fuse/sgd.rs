//! Update fusion: consecutive `SGD` operators with the same arguments become one `SGD` over
//! all their (parameter, gradient) pairs, which updates them in one kernel launch (a
//! multi-tensor update, bit for bit the separate ones).
//!
//! A run of `SGD` operators at positions `i..j` (nothing else between them) merges, in groups
//! of at most 8 pairs, when:
//! - each has the same arguments (`lr`) and one pair or more;
//! - no parameter appears twice in the group, and no gradient of the group is one of its
//!   parameters (each update reads values no other update of the group writes, so running
//!   them together is running them one after the other).
//!
//! The merged operator lists every parameter as an output and keeps the names of the operators
//! it replaces, joined by `+`. No blob is removed, so nothing is protected.

use std::collections::BTreeSet;

use syncmem::ops::OperatorDef;

/// The most pairs of one merged `SGD` (one launch on a device).
const MAX_PAIRS: usize = syncmem::kernels::AXPY_MULTI;

fn is_sgd(op: &OperatorDef) -> bool {
    op.op_type == "SGD" && !op.inputs.is_empty() && op.inputs.len().is_multiple_of(2)
}

/// True when `op` can join a group holding `params` and `grads` (then adds its names).
fn joins(op: &OperatorDef, params: &mut BTreeSet<String>, grads: &mut BTreeSet<String>) -> bool {
    let pairs = op.inputs.len() / 2;
    if params.len() + pairs > MAX_PAIRS {
        return false;
    }
    let (mut p, mut g) = (params.clone(), grads.clone());
    for pair in op.inputs.chunks(2) {
        if !p.insert(pair[0].clone()) {
            return false;
        }
        g.insert(pair[1].clone());
    }
    if p.iter().any(|n| g.contains(n)) {
        return false;
    }
    (*params, *grads) = (p, g);
    true
}

/// Merges the runs of consecutive `SGD`s of `ops` that the [module rules](self) allow, in
/// place; returns the number of `SGD` operators that merged groups replaced.
pub(super) fn fuse_sgd(ops: &mut Vec<OperatorDef>) -> usize {
    let mut merged = 0;
    let mut i = 0;
    while i < ops.len() {
        if !is_sgd(&ops[i]) {
            i += 1;
            continue;
        }
        let (mut params, mut grads) = (BTreeSet::new(), BTreeSet::new());
        let mut j = i;
        while j < ops.len()
            && is_sgd(&ops[j])
            && ops[j].args == ops[i].args
            && joins(&ops[j], &mut params, &mut grads)
        {
            j += 1;
        }
        if j == i {
            // An SGD that cannot even form a group of its own (a repeated parameter).
            i += 1;
            continue;
        }
        if j - i > 1 {
            let group: Vec<OperatorDef> = ops.drain(i..j).collect();
            let mut op = group[0].clone();
            op.inputs = group.iter().flat_map(|o| o.inputs.clone()).collect();
            op.outputs = op.inputs.iter().step_by(2).cloned().collect();
            let names: Vec<&str> = group.iter().filter_map(|o| o.name.as_deref()).collect();
            op.name = (names.len() == group.len()).then(|| names.join("+"));
            merged += group.len();
            ops.insert(i, op);
        }
        i += 1;
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::fuse_net;
    use syncmem::net::NetDef;

    fn sgd(p: &str, g: &str, lr: f64) -> OperatorDef {
        OperatorDef::new("SGD", &[p, g], &[p]).arg("lr", lr)
    }

    fn net(ops: Vec<OperatorDef>) -> NetDef {
        let mut d = NetDef::new("n");
        d.ops = ops;
        d
    }

    #[test]
    fn consecutive_updates_merge_into_one() {
        let d = net(vec![
            OperatorDef::new("FCGradient", &["x", "w", "dy"], &["dw", "db"]),
            sgd("w", "dw", 0.5).named("sgd_w"),
            sgd("b", "db", 0.5).named("sgd_b"),
        ]);
        let f = fuse_net(&d, &[]);
        assert_eq!(f.fused_updates, 2);
        assert_eq!(f.def.ops.len(), 2);
        let op = &f.def.ops[1];
        assert_eq!(op.inputs, ["w", "dw", "b", "db"]);
        assert_eq!(op.outputs, ["w", "b"]);
        assert_eq!(op.name.as_deref(), Some("sgd_w+sgd_b"));
        assert_eq!(op.args, sgd("w", "dw", 0.5).args);
        // Merging again changes nothing.
        assert_eq!(fuse_net(&f.def, &[]).def, f.def);
    }

    #[test]
    fn updates_that_differ_interleave_or_depend_do_not_merge() {
        let n = |ops: Vec<OperatorDef>| fuse_net(&net(ops), &[]).fused_updates;
        // Another learning rate.
        assert_eq!(n(vec![sgd("a", "da", 0.5), sgd("b", "db", 0.25)]), 0);
        // Something in between.
        let mid = OperatorDef::new("Relu", &["x"], &["y"]);
        assert_eq!(n(vec![sgd("a", "da", 0.5), mid, sgd("b", "db", 0.5)]), 0);
        // One update's gradient is another's parameter, either way round.
        assert_eq!(n(vec![sgd("a", "b", 0.5), sgd("b", "db", 0.5)]), 0);
        assert_eq!(n(vec![sgd("b", "db", 0.5), sgd("a", "b", 0.5)]), 0);
        // The same parameter twice.
        assert_eq!(n(vec![sgd("a", "da", 0.5), sgd("a", "db", 0.5)]), 0);
        // A shared gradient is fine.
        assert_eq!(n(vec![sgd("a", "g", 0.5), sgd("b", "g", 0.5)]), 2);
    }

    #[test]
    fn groups_hold_at_most_the_pairs_of_one_launch() {
        let names: Vec<(String, String)> = (0..11)
            .map(|i| (format!("p{i}"), format!("g{i}")))
            .collect();
        let ops = names.iter().map(|(p, g)| sgd(p, g, 0.5)).collect();
        let f = fuse_net(&net(ops), &[]);
        assert_eq!(f.def.ops.len(), 2);
        assert_eq!(f.def.ops[0].inputs.len(), 2 * MAX_PAIRS);
        assert_eq!(f.def.ops[1].inputs.len(), 2 * (11 - MAX_PAIRS));
        assert_eq!(f.fused_updates, 11);
    }
}
