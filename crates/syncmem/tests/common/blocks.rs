//! A device's allocations and frees in a trace, and the check that each block's come in turn:
//! the rig of the history tests (history.rs, history_threads.rs).

// Each test file uses a part of this rig.
#![allow(dead_code)]

use std::collections::HashSet;

use syncmem::report::{Trace, TraceEvent};

/// The allocations and frees of the device labelled `label` in `trace`, as (kind, trace id of
/// the block) pairs, in the trace's order.
pub fn blocks_of(trace: &Trace, label: &str) -> Vec<(&'static str, u64)> {
    trace
        .events()
        .into_iter()
        .filter(|e| e.device() == label)
        .filter_map(|e| match e {
            TraceEvent::Alloc { id, .. } => Some(("alloc", id)),
            TraceEvent::Free { id, .. } => Some(("free", id)),
            _ => None,
        })
        .collect()
}

/// The number of blocks left live after `events` (of [`blocks_of`]), or the first event out of
/// turn: a block allocated while live, or freed while not live.
pub fn live_after(events: &[(&'static str, u64)]) -> Result<usize, String> {
    let mut live = HashSet::new();
    for (i, (kind, id)) in events.iter().enumerate() {
        let in_turn = match *kind {
            "alloc" => live.insert(*id),
            _ => live.remove(id),
        };
        if !in_turn {
            return Err(format!("block {id}: {kind} at event {i} out of turn"));
        }
    }
    Ok(live.len())
}
