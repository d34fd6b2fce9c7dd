//! Memory planning (Caffe2's "memonger"): intermediate blobs whose lifetimes do not overlap
//! share one buffer.
//!
//! The planner rewrites a [`NetDef`]: each intermediate blob name is replaced by the name of a
//! shared slot (`__shared_0`, `__shared_1`, ...). A blob is live from the first operator that
//! writes it to the last operator that reads or writes it; a slot whose occupant is dead is
//! reused by the next blob first written *after* that point, so an operator never reads and
//! writes the same slot unless the def itself runs it in place. Renaming is per name and
//! consistent through the whole net, so in-place operators (`Relu x -> x`, `SGD w, dw -> w`)
//! stay in place and gradient operators read exactly the blobs they read before.
//!
//! Never renamed ("protected"): the external inputs and outputs ([`NetDef::inputs`],
//! [`NetDef::outputs`]), the names in [`PlanOptions::keep`], and any blob read before the net
//! writes it (parameters, data). Parameters updated in place are external inputs, so they keep
//! their names.
//!
//! The slot tensor keeps its largest storage (Caffe2's keep-on-shrink), so the memory a slot
//! costs is the size of its largest occupant. With [`PlanOptions::sizes`] (bytes per blob, e.g.
//! measured by [`super::memory::blob_sizes`] after one unplanned run) the planner picks the
//! best-fitting free slot; without, the lowest-numbered free slot.
//!
//! The planner assumes, as memonger does, that operators overwrite their outputs instead of
//! accumulating into them.
//!
//! ```
//! use syncmem::net::{plan_memory, NetDef, PlanOptions};
//! use syncmem::ops::OperatorDef;
//!
//! # fn main() -> syncmem::Result<()> {
//! let def = NetDef::new("chain")
//!     .op(OperatorDef::new("Relu", &["x"], &["a"]))
//!     .op(OperatorDef::new("Relu", &["a"], &["b"]))
//!     .op(OperatorDef::new("Relu", &["b"], &["c"]))
//!     .op(OperatorDef::new("Relu", &["c"], &["y"]))
//!     .with_inputs(&["x"])
//!     .with_outputs(&["y"]);
//! let plan = plan_memory(&def, &PlanOptions::default())?;
//! assert_eq!(plan.slots, 2);                          // a and c share, b has its own
//! assert_eq!(plan.mapping["a"], plan.mapping["c"]);
//! assert_eq!(plan.def.ops[3].outputs, vec!["y".to_string()]);
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::NetDef;
use crate::error::Result;

/// Options of [`plan_memory`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct PlanOptions {
    /// Blob names never to share, in addition to the net's external inputs and outputs.
    pub keep: Vec<String>,
    /// Bytes of each blob, when known: the planner then picks the best-fitting free slot.
    pub sizes: BTreeMap<String, usize>,
}

impl PlanOptions {
    /// No blob kept apart, no sizes known (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// The same options with `keep` as the blobs never to share.
    #[must_use]
    pub fn with_keep(mut self, keep: Vec<String>) -> Self {
        self.keep = keep;
        self
    }

    /// The same options with the bytes of each blob.
    #[must_use]
    pub fn with_sizes(mut self, sizes: BTreeMap<String, usize>) -> Self {
        self.sizes = sizes;
        self
    }
}

/// A planned net: the rewritten def and how names were mapped.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MemoryPlan {
    /// The def with intermediate blob names replaced by slot names.
    pub def: NetDef,
    /// Original intermediate blob name -> slot name.
    pub mapping: BTreeMap<String, String>,
    /// Number of shared slots.
    pub slots: usize,
    /// Blobs kept under their own name (protected).
    pub protected: BTreeSet<String>,
    /// With size hints: bytes of the intermediates without planning, and with (the sum of each
    /// slot's largest occupant). Both 0 without hints.
    pub estimated_bytes: (usize, usize),
}

impl MemoryPlan {
    /// Per slot, the blobs this plan puts in it, in the order `def` (the net before planning)
    /// first uses them; slots in the order of their first blob's use.
    pub(crate) fn slots_in_order(&self, def: &NetDef) -> Vec<(String, Vec<String>)> {
        let first_use = |blob: &String| {
            def.ops
                .iter()
                .position(|o| o.outputs.contains(blob) || o.inputs.contains(blob))
                .unwrap_or(usize::MAX)
        };
        let mut uses: Vec<(usize, &String, &String)> = self
            .mapping
            .iter()
            .map(|(blob, slot)| (first_use(blob), blob, slot))
            .collect();
        uses.sort();
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for (_, blob, slot) in uses {
            match out.iter_mut().find(|(s, _)| s == slot) {
                Some((_, blobs)) => blobs.push(blob.clone()),
                None => out.push((slot.clone(), vec![blob.clone()])),
            }
        }
        out
    }

    /// Number of intermediate blobs mapped to slots.
    pub fn planned_blobs(&self) -> usize {
        self.mapping.len()
    }
}

/// Lifetime of one intermediate blob: first write, last use (op indices).
#[derive(Debug, Clone)]
struct Interval {
    name: String,
    first: usize,
    last: usize,
}

/// Plans memory for `def` (see the [module docs](self)).
///
/// # Errors
/// None today (every def can be planned; a blob the planner cannot reason about is kept);
/// the `Result` leaves room for validation.
pub fn plan_memory(def: &NetDef, opts: &PlanOptions) -> Result<MemoryPlan> {
    let protected = protected_names(def, opts);
    let intervals = lifetimes(def, &protected);
    let prefix = slot_prefix(def);

    // Slots: (capacity hint, occupant's last use or None when free).
    let mut slot_cap: Vec<usize> = Vec::new();
    let mut slot_busy_until: Vec<Option<usize>> = Vec::new();
    let mut mapping = BTreeMap::new();
    let mut unplanned_bytes = 0usize;
    for iv in &intervals {
        // Free every slot whose occupant died strictly before this blob is first written.
        for busy in slot_busy_until.iter_mut() {
            if busy.is_some_and(|last| last < iv.first) {
                *busy = None;
            }
        }
        let size = opts.sizes.get(&iv.name).copied().unwrap_or(0);
        unplanned_bytes = unplanned_bytes.saturating_add(size);
        let free: Vec<usize> = (0..slot_cap.len())
            .filter(|&s| slot_busy_until[s].is_none())
            .collect();
        let slot = pick_slot(&free, &slot_cap, size).unwrap_or_else(|| {
            slot_cap.push(0);
            slot_busy_until.push(None);
            slot_cap.len() - 1
        });
        slot_cap[slot] = slot_cap[slot].max(size);
        slot_busy_until[slot] = Some(iv.last);
        mapping.insert(iv.name.clone(), format!("{prefix}{slot}"));
    }

    let rename = |n: &String| mapping.get(n).cloned().unwrap_or_else(|| n.clone());
    let mut planned = def.clone();
    for op in &mut planned.ops {
        op.inputs = op.inputs.iter().map(rename).collect();
        op.outputs = op.outputs.iter().map(rename).collect();
    }
    // Make the protected names explicit, so that planning the planned def changes nothing.
    planned.external_inputs = Some(def.inputs());
    planned.external_outputs = Some(def.outputs());
    let planned_bytes = slot_cap.iter().fold(0usize, |a, &b| a.saturating_add(b));
    Ok(MemoryPlan {
        def: planned,
        mapping,
        slots: slot_cap.len(),
        protected,
        estimated_bytes: (unplanned_bytes, planned_bytes),
    })
}

/// Best fit among `free` slots for `size`: the smallest slot that holds it, else the largest
/// (which will grow); ties go to the lowest slot number. `None` when no slot is free.
fn pick_slot(free: &[usize], cap: &[usize], size: usize) -> Option<usize> {
    let fits = free
        .iter()
        .copied()
        .filter(|&s| cap[s] >= size)
        .min_by_key(|&s| (cap[s], s));
    fits.or_else(|| {
        free.iter()
            .copied()
            .max_by_key(|&s| (cap[s], std::cmp::Reverse(s)))
    })
}

/// The blobs of `def` whose values matter outside a run: external inputs and outputs, the
/// `keep` names, and anything read before the net writes it. The others are internal: planning
/// shares their buffers, and a run under a memory cap drops them once dead.
pub(super) fn protected_names(def: &NetDef, opts: &PlanOptions) -> BTreeSet<String> {
    let mut p: BTreeSet<String> = def.inputs().into_iter().collect();
    p.extend(def.outputs());
    p.extend(opts.keep.iter().cloned());
    // Anything read before the net writes it comes from outside, declared or not.
    let mut written = BTreeSet::new();
    for op in &def.ops {
        for i in &op.inputs {
            if !written.contains(i) {
                p.insert(i.clone());
            }
        }
        written.extend(op.outputs.iter().cloned());
    }
    p
}

/// Lifetimes of the unprotected blobs, ordered by first write (then name).
fn lifetimes(def: &NetDef, protected: &BTreeSet<String>) -> Vec<Interval> {
    let mut map: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (k, op) in def.ops.iter().enumerate() {
        for o in &op.outputs {
            if !protected.contains(o) {
                let e = map.entry(o.as_str()).or_insert((k, k));
                e.1 = k;
            }
        }
        for i in &op.inputs {
            if let Some(e) = map.get_mut(i.as_str()) {
                e.1 = k;
            }
        }
    }
    let mut v: Vec<Interval> = map
        .into_iter()
        .map(|(name, (first, last))| Interval {
            name: name.to_string(),
            first,
            last,
        })
        .collect();
    v.sort_by(|a, b| (a.first, &a.name).cmp(&(b.first, &b.name)));
    v
}

/// `__shared_`, with more underscores if the def already uses names of that form.
fn slot_prefix(def: &NetDef) -> String {
    let names = def.blob_names();
    let mut prefix = String::from("__shared_");
    while names.iter().any(|n| n.starts_with(&prefix)) {
        prefix.insert(0, '_');
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::OperatorDef;

    fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
        OperatorDef::new(t, i, o)
    }

    #[test]
    fn same_op_never_reads_and_writes_one_slot() {
        // b dies at op 1, c is born at op 1: they must not share.
        let def = NetDef::new("n")
            .op(op("A", &["x"], &["b"]))
            .op(op("A", &["b"], &["c"]))
            .op(op("A", &["c"], &["y"]))
            .with_outputs(&["y"]);
        let p = plan_memory(&def, &PlanOptions::default()).unwrap();
        assert_ne!(p.mapping["b"], p.mapping["c"]);
        assert_eq!(p.slots, 2);
    }

    #[test]
    fn in_place_keeps_one_name() {
        let def = NetDef::new("n")
            .op(op("A", &["x"], &["h"]))
            .op(op("Relu", &["h"], &["h"]))
            .op(op("A", &["h"], &["y"]))
            .with_outputs(&["y"]);
        let p = plan_memory(&def, &PlanOptions::default()).unwrap();
        assert_eq!(p.def.ops[1].inputs, p.def.ops[1].outputs);
        assert_eq!(p.def.ops[0].outputs, p.def.ops[2].inputs);
    }

    #[test]
    fn protected_names_and_undeclared_inputs_are_kept() {
        let def = NetDef::new("n")
            .op(op("A", &["w", "x"], &["t"]))
            .op(op("SGD", &["w", "t"], &["w"]))
            .op(op("A", &["w"], &["z"]))
            .with_inputs(&["x"])
            .with_outputs(&["z"]);
        let p = plan_memory(&def, &PlanOptions::default()).unwrap();
        assert!(p.protected.contains("w"));
        assert_eq!(p.mapping.keys().collect::<Vec<_>>(), vec!["t"]);
        let again = plan_memory(&p.def, &PlanOptions::default()).unwrap();
        assert!(again.mapping.len() <= 1);
    }

    #[test]
    fn best_fit_with_sizes() {
        let def = NetDef::new("n")
            .op(op("A", &["x"], &["big"]))
            .op(op("A", &["big"], &["small"]))
            .op(op("A", &["small"], &["big2"]))
            .op(op("A", &["big2"], &["small2"]))
            .op(op("A", &["small2"], &["y"]))
            .with_outputs(&["y"]);
        let sizes = [("big", 100), ("small", 10), ("big2", 100), ("small2", 10)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let p = plan_memory(
            &def,
            &PlanOptions {
                sizes,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        assert_eq!(p.mapping["big"], p.mapping["big2"]);
        assert_eq!(p.mapping["small"], p.mapping["small2"]);
        assert_eq!(p.estimated_bytes, (220, 110));
    }

    #[test]
    fn slot_names_do_not_collide() {
        let def = NetDef::new("n")
            .op(op("A", &["__shared_0"], &["t"]))
            .op(op("A", &["t"], &["y"]))
            .with_outputs(&["y"]);
        let p = plan_memory(&def, &PlanOptions::default()).unwrap();
        assert_eq!(p.mapping["t"], "___shared_0");
    }
}
