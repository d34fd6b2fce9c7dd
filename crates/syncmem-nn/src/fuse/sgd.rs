//! Update fusion: consecutive update operators of one type (`SGD`, `MomentumSGD` or `Adam`)
//! with the same arguments become one operator over all their parameters. One `SGD` updates
//! its (parameter, gradient) pairs in one kernel launch (a multi-tensor update, bit for bit the
//! separate ones); `MomentumSGD` and `Adam` still launch once per parameter, in one operator.
//!
//! A run of update operators at positions `i..j` (nothing else between them) merges, in groups
//! of at most 8 parameters (5 for `MomentumSGD`, 4 for `Adam`: a merged operator has at most
//! 16 inputs, which a run of it holds without a heap allocation), when:
//! - each has the same type and arguments (`lr`, ...) and one parameter or more (inputs
//!   `[param, grad, state...]` per parameter);
//! - no blob the group writes (a parameter, a state) appears twice in it, and no gradient of
//!   the group is one of those (each update reads values no other update of the group
//!   writes, so running them together is running them one after the other).
//!
//! The merged operator lists every written blob as an output (`[param, state...]` per
//! parameter) and keeps the names of the operators it replaces, joined by `+`. No blob is
//! removed, so nothing is protected.

use std::collections::BTreeSet;

use syncmem::ops::OperatorDef;

/// The most parameters of one merged update (one launch on a device, for `SGD`).
const MAX_PAIRS: usize = syncmem::kernels::AXPY_MULTI;

/// The most inputs of one merged update: the blobs of an operator's run live on the stack up
/// to 16 (`syncmem::ops::with_io`); more would allocate on every run.
const MAX_INPUTS: usize = 16;

/// The inputs per parameter of an update operator that can merge.
fn group_size(op: &OperatorDef) -> Option<usize> {
    let size = crate::ops::update_group(&op.op_type)?;
    (!op.inputs.is_empty() && op.inputs.len().is_multiple_of(size)).then_some(size)
}

/// True when `op` (groups of `size` inputs) can join a group holding `params` parameters
/// that writes `written` and reads `grads` (then adds its names).
fn joins(
    op: &OperatorDef,
    size: usize,
    params: &mut usize,
    written: &mut BTreeSet<String>,
    grads: &mut BTreeSet<String>,
) -> bool {
    let groups = op.inputs.len() / size;
    if *params + groups > MAX_PAIRS.min(MAX_INPUTS / size) {
        return false;
    }
    let (mut w, mut g) = (written.clone(), grads.clone());
    for group in op.inputs.chunks(size) {
        let writes = std::iter::once(&group[0]).chain(&group[2..]);
        for name in writes {
            if !w.insert(name.clone()) {
                return false;
            }
        }
        g.insert(group[1].clone());
    }
    if w.iter().any(|n| g.contains(n)) {
        return false;
    }
    (*params, *written, *grads) = (*params + groups, w, g);
    true
}

/// The blobs an update of groups of `size` inputs writes, in order: `[param, state...]` per
/// parameter.
fn written(inputs: &[String], size: usize) -> Vec<String> {
    inputs
        .chunks(size)
        .flat_map(|g| std::iter::once(&g[0]).chain(&g[2..]).cloned())
        .collect()
}

/// Merges the runs of consecutive update operators of `ops` that the [module rules](self)
/// allow, in place; returns the number of operators that merged groups replaced.
pub(super) fn fuse_sgd(ops: &mut Vec<OperatorDef>) -> usize {
    let mut merged = 0;
    let mut i = 0;
    while i < ops.len() {
        let Some(size) = group_size(&ops[i]) else {
            i += 1;
            continue;
        };
        let mut params = 0;
        let (mut w, mut grads) = (BTreeSet::new(), BTreeSet::new());
        let mut j = i;
        while j < ops.len()
            && ops[j].op_type == ops[i].op_type
            && group_size(&ops[j]) == Some(size)
            && ops[j].args == ops[i].args
            && joins(&ops[j], size, &mut params, &mut w, &mut grads)
        {
            j += 1;
        }
        if j == i {
            // An update that cannot even form a group of its own (a repeated parameter).
            i += 1;
            continue;
        }
        if j - i > 1 {
            let group: Vec<OperatorDef> = ops.drain(i..j).collect();
            let mut op = group[0].clone();
            op.inputs = group.iter().flat_map(|o| o.inputs.clone()).collect();
            op.outputs = written(&op.inputs, size);
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

    #[test]
    fn momentum_and_adam_updates_merge_with_their_state() {
        let adam = |p: &str| {
            let (g, m, v) = (format!("{p}_grad"), format!("{p}_m"), format!("{p}_v"));
            OperatorDef::new("Adam", &[p, &g, &m, &v], &[p, &m, &v])
                .arg("lr", 0.01)
                .named(&format!("adam_{p}"))
        };
        let f = fuse_net(&net(vec![adam("w"), adam("b")]), &[]);
        assert_eq!(f.fused_updates, 2);
        // At most 16 inputs: four Adam parameters, five MomentumSGD ones.
        let many: Vec<OperatorDef> = (0..6).map(|i| adam(&format!("p{i}"))).collect();
        let groups: Vec<usize> = fuse_net(&net(many), &[])
            .def
            .ops
            .iter()
            .map(|o| o.inputs.len() / 4)
            .collect();
        assert_eq!(groups, [4, 2]);
        let op = &f.def.ops[0];
        assert_eq!(op.op_type, "Adam");
        assert_eq!(
            op.inputs,
            ["w", "w_grad", "w_m", "w_v", "b", "b_grad", "b_m", "b_v"]
        );
        assert_eq!(op.outputs, ["w", "w_m", "w_v", "b", "b_m", "b_v"]);
        assert_eq!(op.name.as_deref(), Some("adam_w+adam_b"));
        let momentum = |p: &str, g: &str, m: &str| {
            OperatorDef::new("MomentumSGD", &[p, g, m], &[p, m]).arg("lr", 0.1)
        };
        let n = |ops: Vec<OperatorDef>| fuse_net(&net(ops), &[]).fused_updates;
        assert_eq!(
            n(vec![momentum("a", "ga", "ma"), momentum("b", "gb", "mb")]),
            2
        );
        let many: Vec<OperatorDef> = (0..6)
            .map(|i| momentum(&format!("p{i}"), &format!("g{i}"), &format!("m{i}")))
            .collect();
        assert_eq!(fuse_net(&net(many), &[]).def.ops.len(), 2);
        // A state shared by two parameters, or a state that is another's gradient.
        assert_eq!(
            n(vec![momentum("a", "ga", "m"), momentum("b", "gb", "m")]),
            0
        );
        assert_eq!(
            n(vec![momentum("a", "ga", "ma"), momentum("b", "ma", "mb")]),
            0
        );
        // Updates of different types do not merge.
        assert_eq!(n(vec![momentum("a", "ga", "ma"), sgd("b", "gb", 0.1)]), 0);
    }
}
