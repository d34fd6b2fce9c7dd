//! The phases of a recorded run, derived from what the trace holds: the steps its events are
//! stamped with, and the moments when every block was given back.
//!
//! - before the first step: the **planning measurement** (the runs `syncmem train` makes to
//!   measure memory planning, which free everything they allocated) when the allocated bytes
//!   of every pool fell back to zero before the first step, then the **set-up** (parameters,
//!   data, the planned nets' first allocations);
//! - **training**: from the first event of the first step to the last event stamped with a
//!   step;
//! - **after training**: evaluation, saving, and the frees of the run's buffers.
//!
//! A trace without steps is one phase, the whole trace.

use serde::Serialize;
use syncmem::report::TraceEvent;

/// One phase: its name, what it is, and its span of `x` (inclusive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Phase {
    /// Short name (the button's label).
    pub name: &'static str,
    /// What it is (the button's tooltip).
    pub note: &'static str,
    /// First `x` of the phase.
    pub from: u64,
    /// Last `x` of the phase.
    pub to: u64,
    /// Index of its first event.
    #[serde(skip)]
    pub first: usize,
    /// Index of its last event.
    #[serde(skip)]
    pub last: usize,
    /// True for the phase the page shows first (training, when there is one).
    pub main: bool,
}

const MEASURE: &str = "runs that measure memory planning (syncmem train compares the net with \
                       and without it); everything they allocate is freed before set-up";
const SETUP: &str = "parameters, data and the nets' buffers allocated before the first step";
const TRAIN: &str = "from the first event of the first step to the last event of a step";
const AFTER: &str = "evaluation, saving, and the frees of the run's buffers";
const WHOLE: &str = "the trace has no steps: one phase";

/// The phases of `events` (with their step stamps `steps` and axis values `xs`, both as long
/// as the events).
pub fn phases(events: &[TraceEvent], steps: &[Option<u64>], xs: &[u64]) -> Vec<Phase> {
    let n = events.len();
    if n == 0 {
        return Vec::new();
    }
    let phase = |name, note, first: usize, last: usize, main| Phase {
        name,
        note,
        from: xs[first],
        to: xs[last],
        first,
        last,
        main,
    };
    let (Some(first_step), Some(last_step)) = (
        steps.iter().position(Option::is_some),
        steps.iter().rposition(Option::is_some),
    ) else {
        return vec![phase("the run", WHOLE, 0, n - 1, true)];
    };
    let mut out = Vec::new();
    if first_step > 0 {
        match last_zero(&events[..first_step]) {
            Some(z) if z + 1 < first_step => {
                out.push(phase("planning measurement", MEASURE, 0, z, false));
                out.push(phase("set-up", SETUP, z + 1, first_step - 1, false));
            }
            Some(z) => out.push(phase("planning measurement", MEASURE, 0, z, false)),
            None => out.push(phase("set-up", SETUP, 0, first_step - 1, false)),
        }
    }
    out.push(phase("training", TRAIN, first_step, last_step, true));
    if last_step + 1 < n {
        out.push(phase("after training", AFTER, last_step + 1, n - 1, false));
    }
    out
}

/// The index of the last event after which no block of any pool was allocated any more,
/// when blocks had been allocated before it.
fn last_zero(events: &[TraceEvent]) -> Option<usize> {
    let mut live = std::collections::HashSet::new();
    let mut found = None;
    for (i, e) in events.iter().enumerate() {
        match e {
            TraceEvent::Alloc { id, .. } => {
                live.insert(*id);
            }
            TraceEvent::Free { id, .. } if live.remove(id) && live.is_empty() => found = Some(i),
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64) -> TraceEvent {
        serde_json::from_str(&format!(
            r#"{{"op":"alloc","id":{id},"size":8,"stream":0,"device":"cpu"}}"#
        ))
        .unwrap()
    }

    fn free(id: u64) -> TraceEvent {
        serde_json::from_str(&format!(r#"{{"op":"free","id":{id},"device":"cpu"}}"#)).unwrap()
    }

    #[test]
    fn a_run_is_cut_at_its_steps_and_its_last_empty_moment() {
        // measure: 0..=3, set-up: 4, training: 5..=6, after: 7.
        let events = vec![
            alloc(0),
            alloc(1),
            free(0),
            free(1),
            alloc(2),
            alloc(3),
            free(3),
            free(2),
        ];
        let steps = [None, None, None, None, None, Some(1), Some(2), None];
        let xs: Vec<u64> = (0..8).map(|i| i * 10).collect();
        let p = phases(&events, &steps, &xs);
        let names: Vec<_> = p.iter().map(|p| (p.name, p.first, p.last)).collect();
        assert_eq!(
            names,
            [
                ("planning measurement", 0, 3),
                ("set-up", 4, 4),
                ("training", 5, 6),
                ("after training", 7, 7)
            ]
        );
        assert!(p[2].main && !p[0].main);
        assert_eq!((p[2].from, p[2].to), (50, 60));
    }

    #[test]
    fn without_steps_the_trace_is_one_phase() {
        let events = vec![alloc(0), free(0)];
        let p = phases(&events, &[None, None], &[0, 5]);
        assert_eq!(p.len(), 1);
        assert!(p[0].main);
        assert_eq!((p[0].from, p[0].to), (0, 5));
        assert!(phases(&[], &[], &[]).is_empty());
    }
}
