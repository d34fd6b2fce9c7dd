//! Recording and replaying the allocation traffic of pools.
//!
//! A [`Trace`] is a [`PoolObserver`]: attach it to one or more pools
//! ([`crate::alloc::pool::Pool::set_observer`]) and it records every block allocation and free
//! (bytes asked for, a block id of its own, the stream, the pool's label). Save it as JSON lines
//! ([`Trace::save`]), load it back ([`Trace::load`]), and [`replay`] it against a fresh pool of
//! any [`PoolConfig`] to compare how much memory each pool kind would reserve for the same
//! program. [`Trace::synthetic`] makes a deterministic training-loop-like trace.
//!
//! ```
//! use syncmem::alloc::trace::{replay, Trace};
//! use syncmem::{PoolConfig, PoolKind};
//!
//! let trace = Trace::synthetic(4);
//! let r = replay(&trace, &PoolConfig::new(PoolKind::Caching)).unwrap();
//! assert!(r.peak_reserved >= r.peak_allocated);
//! ```

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::alloc::pool::{Budget, Lease, Pool, PoolConfig, PoolEvent, PoolObserver, StreamId};
use crate::error::{Error, Result};

/// One recorded event: a line of a saved trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum TraceEvent {
    /// A block was allocated.
    Alloc {
        /// The trace's id of the block (unique within the trace).
        id: u64,
        /// Bytes asked for.
        size: usize,
        /// The stream it was allocated for.
        stream: StreamId,
        /// The label of the pool (device) it came from.
        device: String,
    },
    /// A block was freed.
    Free {
        /// The id given in its [`TraceEvent::Alloc`].
        id: u64,
        /// The label of the pool (device) it came from.
        device: String,
    },
}

#[derive(Default)]
struct Recorder {
    events: Vec<TraceEvent>,
    /// (pool label, pool block id) -> trace id, for live blocks.
    live: HashMap<(String, u64), u64>,
    next_id: u64,
}

/// A recorded sequence of allocations and frees; a [`PoolObserver`] that records into itself.
#[derive(Default)]
pub struct Trace {
    inner: Mutex<Recorder>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("events", &self.len())
            .finish()
    }
}

impl Trace {
    /// An empty trace, ready to record (share it in an `Arc` to attach it to pools).
    pub fn new() -> Self {
        Self::default()
    }

    /// A trace of these events.
    pub fn from_events(events: Vec<TraceEvent>) -> Self {
        let next_id = events
            .iter()
            .map(|e| match e {
                TraceEvent::Alloc { id, .. } | TraceEvent::Free { id, .. } => id + 1,
            })
            .max()
            .unwrap_or(0);
        Self {
            inner: Mutex::new(Recorder {
                events,
                live: HashMap::new(),
                next_id,
            }),
        }
    }

    /// A copy of the recorded events.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.inner.lock().events.clone()
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the events as JSON lines (one object per line).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] carrying the writer's error.
    pub fn save(&self, mut out: impl Write) -> Result<()> {
        for e in &self.inner.lock().events {
            let line = serde_json::to_string(e).map_err(|e| invalid(e.to_string()))?;
            writeln!(out, "{line}").map_err(|e| invalid(format!("writing a trace: {e}")))?;
        }
        Ok(())
    }

    /// Reads a trace written by [`Trace::save`] (blank lines are skipped).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the line that does not parse, or a read error.
    pub fn load(input: impl BufRead) -> Result<Self> {
        let mut events = Vec::new();
        for (n, line) in input.lines().enumerate() {
            let line = line.map_err(|e| invalid(format!("reading a trace: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let e = serde_json::from_str(&line)
                .map_err(|e| invalid(format!("trace line {}: {e}", n + 1)))?;
            events.push(e);
        }
        Ok(Self::from_events(events))
    }

    /// A deterministic training-loop-like trace on pool `"synthetic"`, stream 1: each of
    /// `iterations` iterations allocates activations of a few layer sizes forward (scaled by a
    /// batch size that cycles through 32, 48, 64, 40), a gradient per layer backward, and frees
    /// them in reverse order; a few parameter buffers live for the whole trace.
    pub fn synthetic(iterations: usize) -> Self {
        const LAYERS: [usize; 5] = [3 * 1024, 4096, 4096, 1024, 10];
        const BATCHES: [usize; 4] = [32, 48, 64, 40];
        let dev = "synthetic".to_string();
        let mut events = Vec::new();
        let mut next = 0u64;
        let mut alloc = |events: &mut Vec<TraceEvent>, size: usize| {
            let id = next;
            next += 1;
            events.push(TraceEvent::Alloc {
                id,
                size,
                stream: 1,
                device: dev.clone(),
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
            .map(|w| alloc(&mut events, w[0] * w[1] * 4))
            .collect();
        for it in 0..iterations {
            let batch = BATCHES[it % BATCHES.len()];
            // Forward: one activation per layer.
            let acts: Vec<u64> = LAYERS
                .iter()
                .map(|&n| alloc(&mut events, n * batch * 4))
                .collect();
            // Backward: a gradient per layer, freed with the activation it pairs with.
            for (i, &n) in LAYERS.iter().enumerate().rev() {
                let g = alloc(&mut events, n * batch * 4);
                // A temporary workspace of odd size.
                let ws = alloc(&mut events, (n * batch * 4) / 3 + 100);
                free(&mut events, ws);
                free(&mut events, g);
                free(&mut events, acts[i]);
            }
        }
        for id in params {
            free(&mut events, id);
        }
        Self::from_events(events)
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        what: "trace".to_string(),
        reason,
    }
}

impl PoolObserver for Trace {
    fn on_event(&self, pool: &str, event: &PoolEvent) {
        let mut r = self.inner.lock();
        match event {
            PoolEvent::Alloc {
                requested,
                block,
                stream,
                ..
            } => {
                let id = r.next_id;
                r.next_id += 1;
                r.live.insert((pool.to_string(), *block), id);
                r.events.push(TraceEvent::Alloc {
                    id,
                    size: *requested,
                    stream: *stream,
                    device: pool.to_string(),
                });
            }
            PoolEvent::Free { block, .. } => {
                if let Some(id) = r.live.remove(&(pool.to_string(), *block)) {
                    r.events.push(TraceEvent::Free {
                        id,
                        device: pool.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
}

/// What a [`replay`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// Highest bytes of segments held from the backend.
    pub peak_reserved: u64,
    /// Highest bytes of blocks handed out (rounded block sizes).
    pub peak_allocated: u64,
    /// Segment allocations and frees asked of the backend (including the final release).
    pub backend_calls: u64,
    /// Allocations served from cached memory.
    pub cache_hits: u64,
}

impl ReplayReport {
    /// `peak_reserved / peak_allocated` (1.0 for an empty trace).
    pub fn overhead(&self) -> f64 {
        if self.peak_allocated == 0 {
            1.0
        } else {
            self.peak_reserved as f64 / self.peak_allocated as f64
        }
    }
}

/// A segment that is only a size: replays need no memory behind the blocks.
#[derive(Debug)]
struct SizeOnly(#[allow(dead_code)] usize);

/// Replays `trace` against a fresh pool of configuration `config` whose segments are sizes only
/// (no memory is touched; the memory cap is ignored). Every pool of the trace is replayed into
/// the one pool, on the streams recorded. Blocks still live at the end are freed, then the
/// cache is emptied.
///
/// # Errors
/// [`Error::InvalidConfig`] for an invalid configuration or a trace that frees an unknown id or
/// allocates an id twice; [`Error::SizeOverflow`] for a size that cannot be rounded.
pub fn replay(trace: &Trace, config: &PoolConfig) -> Result<ReplayReport> {
    let pool: Arc<Pool<SizeOnly>> = Pool::new(
        "replay",
        config.clone(),
        Arc::new(Budget::new(None)),
        isize::MAX as usize,
    )?;
    let source = |b: usize| -> Result<SizeOnly> { Ok(SizeOnly(b)) };
    let mut live: HashMap<u64, Lease<SizeOnly>> = HashMap::new();
    for e in trace.inner.lock().events.iter() {
        match e {
            TraceEvent::Alloc {
                id, size, stream, ..
            } => {
                let lease = pool.alloc(*size, *stream, &source)?;
                if live.insert(*id, lease).is_some() {
                    return Err(invalid(format!("trace allocates block {id} twice")));
                }
            }
            TraceEvent::Free { id, .. } => {
                if live.remove(id).is_none() {
                    return Err(invalid(format!("trace frees unknown block {id}")));
                }
            }
        }
    }
    drop(live);
    pool.empty_cache();
    let s = pool.stats();
    Ok(ReplayReport {
        peak_reserved: s.reserved.peak,
        peak_allocated: s.allocated.peak,
        backend_calls: s.backend_allocs + s.backend_frees,
        cache_hits: s.cache_hits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::pool::{HostPool, PoolKind};

    #[test]
    fn record_save_load_round_trip() {
        let pool = HostPool::new("traced", PoolConfig::new(PoolKind::Caching)).unwrap();
        let trace = Arc::new(Trace::new());
        pool.pool().set_observer(Some(trace.clone()));
        let a = pool.alloc(1000).unwrap();
        let b = pool.alloc(5000).unwrap();
        drop(a);
        let c = pool.alloc(1000).unwrap();
        drop(b);
        drop(c);
        pool.pool().set_observer(None);
        let ev = trace.events();
        assert_eq!(ev.len(), 6, "{ev:?}");
        assert!(
            matches!(&ev[0], TraceEvent::Alloc { id: 0, size: 1000, device, .. } if device == "traced")
        );
        assert!(matches!(&ev[2], TraceEvent::Free { id: 0, .. }));
        assert!(matches!(&ev[5], TraceEvent::Free { id: 2, .. }));

        let mut bytes = Vec::new();
        trace.save(&mut bytes).unwrap();
        assert_eq!(String::from_utf8_lossy(&bytes).lines().count(), 6);
        let back = Trace::load(&bytes[..]).unwrap();
        assert_eq!(back.events(), ev);
        let r = replay(&back, &PoolConfig::default()).unwrap();
        assert!(r.cache_hits >= 1, "{r:?}");
    }

    #[test]
    fn load_rejects_bad_lines() {
        let err = Trace::load(&b"{\"op\":\"alloc\"}\n"[..]).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let t = Trace::from_events(vec![TraceEvent::Free {
            id: 3,
            device: "x".into(),
        }]);
        assert!(replay(&t, &PoolConfig::default()).is_err());
    }

    #[test]
    fn replay_by_kind() {
        let trace = Trace::synthetic(8);
        assert!(trace.len() > 100);
        // Deterministic.
        assert_eq!(trace.events(), Trace::synthetic(8).events());
        let mut reports = Vec::new();
        for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
            let r = replay(&trace, &PoolConfig::new(kind)).unwrap();
            assert!(r.peak_reserved >= r.peak_allocated, "{kind}: {r:?}");
            assert!(r.peak_allocated > 0);
            reports.push(r);
        }
        let none = reports[2];
        assert_eq!(none.peak_reserved, none.peak_allocated);
        assert_eq!(none.cache_hits, 0);
        // Caching pools reuse memory: far fewer backend calls than direct allocation.
        assert!(reports[0].cache_hits > 0 && reports[1].cache_hits > 0);
        assert!(reports[0].backend_calls < none.backend_calls);
    }
}
