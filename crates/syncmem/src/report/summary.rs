//! Counting a trace's events ([`TraceSummary`]) and the synthetic training-loop trace.

use std::collections::BTreeSet;

use serde::Serialize;

use super::event::{Stamp, TraceEvent};
use super::trace::Trace;
use crate::alloc::stats::{CopyDir, CopyStats, Direction};

/// Counts of a trace's events (see [`Trace::summary`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TraceSummary {
    /// Number of events.
    pub events: usize,
    /// Block allocations.
    pub allocs: u64,
    /// Bytes asked for by the allocations.
    pub alloc_bytes: u64,
    /// Block frees.
    pub frees: u64,
    /// Segments taken from the backend.
    pub segment_allocs: u64,
    /// Segments given back to the backend.
    pub segment_frees: u64,
    /// Copies (count and bytes) by direction.
    pub copies: CopyStats,
    /// Dropped device mirrors.
    pub evictions: u64,
    /// Bytes of the dropped mirrors.
    pub evicted_bytes: u64,
    /// Allocations refused for good (out of memory).
    pub ooms: u64,
    /// The devices (pool labels) seen, sorted.
    pub devices: Vec<String>,
}

fn summarize<'a>(events: impl Iterator<Item = &'a TraceEvent>) -> TraceSummary {
    let mut s = TraceSummary::default();
    let mut devices = BTreeSet::new();
    for e in events {
        s.events += 1;
        if !devices.contains(e.device()) {
            devices.insert(e.device().to_string());
        }
        match e {
            TraceEvent::Alloc { size, .. } => {
                s.allocs += 1;
                s.alloc_bytes = s.alloc_bytes.saturating_add(*size as u64);
            }
            TraceEvent::Free { .. } => s.frees += 1,
            TraceEvent::SegmentAlloc { .. } => s.segment_allocs += 1,
            TraceEvent::SegmentFree { .. } => s.segment_frees += 1,
            TraceEvent::Copy {
                direction, bytes, ..
            } => add_copy(&mut s.copies, *direction, *bytes),
            TraceEvent::Evict { bytes, .. } => {
                s.evictions += 1;
                s.evicted_bytes = s.evicted_bytes.saturating_add(*bytes as u64);
            }
            TraceEvent::Oom { .. } => s.ooms += 1,
            TraceEvent::Plan { .. } => {}
        }
    }
    s.devices = devices.into_iter().collect();
    s
}

/// Adds one copy (or zero-copy sync, spill, refill) to `c`, saturating: statistics never wrap.
pub(super) fn add_copy(c: &mut CopyStats, d: Direction, bytes: usize) {
    let slot: &mut CopyDir = c.get_mut(d);
    slot.count = slot.count.saturating_add(1);
    slot.bytes = slot.bytes.saturating_add(bytes as u64);
}

impl Trace {
    /// Counts the events by kind, bytes copied by direction, and the devices seen.
    pub fn summary(&self) -> TraceSummary {
        self.with_events(|events| summarize(events.iter()))
    }

    /// [`Trace::summary`] of each device (pool label), in order of first appearance.
    pub fn summaries_by_device(&self) -> Vec<(String, TraceSummary)> {
        self.with_events(|events| {
            let mut labels: Vec<&str> = Vec::new();
            for e in events {
                if !labels.contains(&e.device()) {
                    labels.push(e.device());
                }
            }
            labels
                .into_iter()
                .map(|l| {
                    let s = summarize(events.iter().filter(|e| e.device() == l));
                    (l.to_string(), s)
                })
                .collect()
        })
    }

    /// A deterministic training-loop-like trace on pool `"synthetic"`, stream 1: each of
    /// `iterations` iterations allocates activations of a few layer sizes forward (scaled by a
    /// batch size that cycles through 32, 48, 64, 40), a gradient per layer backward, and frees
    /// them in reverse order; a few parameter buffers live for the whole trace. Blocks are
    /// named (`w0`, `act1`, `grad1`, `workspace1`, ...); event `k` happens at `k` µs, in step
    /// `iteration + 1`. Placements and segments are not made up: replays make their own.
    pub fn synthetic(iterations: usize) -> Self {
        const LAYERS: [usize; 5] = [3 * 1024, 4096, 4096, 1024, 10];
        const BATCHES: [usize; 4] = [32, 48, 64, 40];
        let dev = "synthetic".to_string();
        let mut events = Vec::new();
        let mut steps = Vec::new();
        let mut next = 0u64;
        let mut alloc = |events: &mut Vec<TraceEvent>, size: usize, owner: String| {
            let id = next;
            next += 1;
            events.push(TraceEvent::Alloc {
                id,
                size,
                stream: 1,
                device: dev.clone(),
                owner: Some(owner),
                place: None,
                operator: None,
                frames: Vec::new(),
            });
            id
        };
        let free = |events: &mut Vec<TraceEvent>, id: u64| {
            events.push(TraceEvent::Free {
                id,
                device: "synthetic".to_string(),
            });
        };
        // Parameters (f32 weights between layers), alive throughout.
        let params: Vec<u64> = LAYERS
            .windows(2)
            .enumerate()
            .map(|(i, w)| alloc(&mut events, w[0] * w[1] * 4, format!("w{i}")))
            .collect();
        steps.resize(events.len(), None);
        for it in 0..iterations {
            let batch = BATCHES[it % BATCHES.len()];
            // Forward: one activation per layer.
            let acts: Vec<u64> = LAYERS
                .iter()
                .enumerate()
                .map(|(i, &n)| alloc(&mut events, n * batch * 4, format!("act{i}")))
                .collect();
            // Backward: a gradient per layer, freed with the activation it pairs with.
            for (i, &n) in LAYERS.iter().enumerate().rev() {
                let g = alloc(&mut events, n * batch * 4, format!("grad{i}"));
                // A temporary workspace of odd size.
                let ws = alloc(
                    &mut events,
                    (n * batch * 4) / 3 + 100,
                    format!("workspace{i}"),
                );
                free(&mut events, ws);
                free(&mut events, g);
                free(&mut events, acts[i]);
            }
            steps.resize(events.len(), Some(it as u64 + 1));
        }
        for id in params {
            free(&mut events, id);
        }
        steps.resize(events.len(), None);
        let stamps = steps
            .into_iter()
            .enumerate()
            .map(|(k, step)| Stamp {
                t_us: k as u64,
                step,
            })
            .collect();
        Self::from_stamped(events, stamps)
    }
}
