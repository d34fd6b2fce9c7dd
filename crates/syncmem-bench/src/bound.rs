//! A lower bound of the bytes a training step must move between host and device under a
//! memory cap, from the net's schedule alone: at each operator, the values that must survive it
//! (every external input, read again by the next step: data, labels, parameters, state; and
//! each value written earlier in the step and read later) plus the operator's own operands. What
//! exceeds the cap at the tightest operator cannot stay on the device then, and must come back
//! before it is read: at least once its bytes. The exact optimum with values of different sizes
//! is a packing problem; this bound ignores fragmentation and counts a byte moved once (a dirty
//! value also has to be written out first).

use std::collections::{BTreeMap, BTreeSet};

use syncmem::net::NetDef;

/// The lower bound (see the [module docs](self)) for `def` with blob sizes `sizes` under `cap`.
pub fn step_bytes_lower_bound(def: &NetDef, sizes: &BTreeMap<String, usize>, cap: u64) -> u64 {
    let size = |n: &str| sizes.get(n).copied().unwrap_or(0) as u64;
    let external: BTreeSet<String> = def.inputs().into_iter().collect();
    let always: u64 = external.iter().map(|n| size(n)).sum();
    // Each other value: the operator that writes it first and the last that reads it.
    let mut span: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (i, op) in def.ops.iter().enumerate() {
        for o in &op.outputs {
            if !external.contains(o) {
                span.entry(o.as_str()).or_insert((i, i));
            }
        }
        for x in &op.inputs {
            if let Some(s) = span.get_mut(x.as_str()) {
                s.1 = i;
            }
        }
    }
    let mut worst = 0u64;
    for (i, op) in def.ops.iter().enumerate() {
        let mut live: BTreeSet<&str> = span
            .iter()
            .filter(|(_, &(w, r))| w < i && i < r)
            .map(|(n, _)| *n)
            .collect();
        live.extend(
            op.inputs
                .iter()
                .chain(&op.outputs)
                .map(String::as_str)
                .filter(|n| !external.contains(*n)),
        );
        let need = always + live.iter().map(|n| size(n)).sum::<u64>();
        worst = worst.max(need.saturating_sub(cap));
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncmem::ops::OperatorDef;

    #[test]
    fn the_tightest_operator_sets_the_bound() {
        // x (external, 10) -> a (100) -> b (100) -> y (1); a is read by the last operator too.
        let def = NetDef::new("n")
            .op(OperatorDef::new("F", &["x"], &["a"]))
            .op(OperatorDef::new("F", &["a"], &["b"]))
            .op(OperatorDef::new("F", &["a", "b"], &["y"]));
        let sizes: BTreeMap<String, usize> = [("x", 10), ("a", 100), ("b", 100), ("y", 1)]
            .into_iter()
            .map(|(n, s)| (n.to_string(), s))
            .collect();
        // Op 2 needs x, a, b and y: 211 bytes.
        assert_eq!(step_bytes_lower_bound(&def, &sizes, 211), 0);
        assert_eq!(step_bytes_lower_bound(&def, &sizes, 200), 11);
        assert_eq!(step_bytes_lower_bound(&def, &sizes, 1000), 0);
    }
}
