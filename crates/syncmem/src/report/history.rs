//! [`History`]: the always-on record of the newest memory events of every device, in bounded
//! memory (PyTorch's `torch.cuda.memory._record_memory_history(max_entries=N)`), readable as a
//! [`Trace`] at any moment.
//!
//! One history records the process at a time: [`record_history`] starts it (or stops it) and
//! [`current_history`] returns it; `SYNCMEM_HISTORY=N` starts it from the environment
//! ([`history_from_env`], which the `syncmem` command calls). Each source of events (each
//! device with its pinned pool, and the host pool) keeps its own ring of the newest `N`
//! events, so a busy host pool does not push a device's events out.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use super::event::{Stamp, TraceEvent};
use super::Trace;
use crate::alloc::event::{self, Attachment, Event, Scope, Sink};
use crate::error::{Error, Result};

/// The environment variable that starts the history with its number of events per device
/// (`SYNCMEM_HISTORY=100000`; `0` or empty: off).
pub const HISTORY_ENV: &str = "SYNCMEM_HISTORY";

/// The newest events of every device, each in a ring of its own (a bounded [`Trace`] per
/// source of events). Read it with [`History::trace`].
#[derive(Debug)]
pub struct History {
    max_entries: usize,
    /// Times of every ring count from here, so that the rings merge in order.
    start: Instant,
    /// One ring per source of events.
    rings: RwLock<Vec<(u64, Arc<Trace>)>>,
    /// The step marked now (given to rings made later).
    step: Mutex<Option<u64>>,
}

/// The history recording now, and its attachment to the event hook.
static CURRENT: Mutex<Option<(Arc<History>, Attachment)>> = Mutex::new(None);

/// Starts recording the history of every device, keeping the newest `max_entries` events of
/// each (`Some(n)`, replacing a history recording already), or stops it (`None`). Returns the
/// history recording now. While it records, each pool event and copy takes a lock of its
/// device's ring and is stored there; see `docs/performance.md` for the cost.
pub fn record_history(max_entries: Option<usize>) -> Option<Arc<History>> {
    let mut current = CURRENT.lock();
    // Detach the old one first: its attachment is dropped here.
    *current = None;
    let n = max_entries.filter(|&n| n > 0)?;
    let h = Arc::new(History::new(n));
    let attachment = event::attach(h.clone(), Scope::All);
    *current = Some((h.clone(), attachment));
    Some(h)
}

/// The history recording now, if any.
pub fn current_history() -> Option<Arc<History>> {
    CURRENT.lock().as_ref().map(|(h, _)| h.clone())
}

/// Starts the history when [`HISTORY_ENV`] holds a number of events per device above 0.
///
/// # Errors
/// [`Error::InvalidConfig`] when the variable is set to something other than a number.
pub fn history_from_env() -> Result<Option<Arc<History>>> {
    let Some(v) = std::env::var_os(HISTORY_ENV) else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let n: usize = v.parse().map_err(|_| Error::InvalidConfig {
        what: HISTORY_ENV.to_string(),
        reason: format!("{v:?} is not a number of events (SYNCMEM_HISTORY=100000)"),
    })?;
    Ok(record_history(Some(n)))
}

impl History {
    /// A history keeping `max_entries` events per source (at least 1), not attached: it
    /// records only what is given to it. [`record_history`] makes and attaches one.
    fn new(max_entries: usize) -> Self {
        Self {
            max_entries: max_entries.max(1),
            start: Instant::now(),
            rings: RwLock::new(Vec::new()),
            step: Mutex::new(None),
        }
    }

    /// The most events kept per device.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The ring of `source`, made at its first event.
    fn ring(&self, source: u64) -> Arc<Trace> {
        if let Some((_, t)) = self.rings.read().iter().find(|(s, _)| *s == source) {
            return t.clone();
        }
        let mut rings = self.rings.write();
        if let Some((_, t)) = rings.iter().find(|(s, _)| *s == source) {
            return t.clone();
        }
        let t = Arc::new(Trace::bounded_from(self.max_entries, self.start));
        t.set_step(*self.step.lock());
        rings.push((source, t.clone()));
        t
    }

    /// The events kept now, of every device, as one trace in order of time. Ids are made
    /// unique across devices; a free whose allocation was dropped from its ring is left out
    /// (so that every view and replay takes the trace), while a block whose segment was made
    /// before the ring's oldest event keeps its placement.
    pub fn trace(&self) -> Trace {
        let rings: Vec<Arc<Trace>> = self.rings.read().iter().map(|(_, t)| t.clone()).collect();
        let mut all: Vec<(TraceEvent, Stamp)> = Vec::new();
        let (mut id_base, mut seg_base) = (0u64, 0u64);
        for ring in rings {
            let (ids, segs) = ring.with_stamped(|events, stamps| {
                let mut max = (0u64, 0u64);
                for (e, s) in events.iter().zip(stamps) {
                    let (e, m) = renumbered(e, id_base, seg_base);
                    max = (max.0.max(m.0), max.1.max(m.1));
                    all.push((e, *s));
                }
                max
            });
            id_base = id_base.max(ids);
            seg_base = seg_base.max(segs);
        }
        // Stable: the events of one device keep their order.
        all.sort_by_key(|(_, s)| s.t_us);
        let mut allocated = std::collections::HashSet::new();
        all.retain(|(e, _)| match e {
            TraceEvent::Alloc { id, .. } => {
                allocated.insert(*id);
                true
            }
            TraceEvent::Free { id, .. } => allocated.remove(id),
            _ => true,
        });
        let (events, stamps) = all.into_iter().unzip();
        Trace::from_stamped(events, stamps)
    }

    /// Number of events kept now, over every device.
    pub fn len(&self) -> usize {
        self.rings.read().iter().map(|(_, t)| t.len()).sum()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes [`History::trace`] into the file `path` (JSON lines, as [`Trace::save_file`]).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn save_file(&self, path: &Path) -> Result<()> {
        self.trace().save_file(path)
    }
}

/// `e` with its block and segment ids moved up by `ids` and `segs`, and one past the largest
/// id and segment it names after the move.
fn renumbered(e: &TraceEvent, ids: u64, segs: u64) -> (TraceEvent, (u64, u64)) {
    let mut e = e.clone();
    let mut max = (ids, segs);
    match &mut e {
        TraceEvent::Alloc { id, place, .. } => {
            *id += ids;
            max.0 = *id + 1;
            if let Some(p) = place {
                p.segment += segs;
                max.1 = p.segment + 1;
            }
        }
        TraceEvent::Free { id, .. } => {
            *id += ids;
            max.0 = *id + 1;
        }
        TraceEvent::SegmentAlloc { segment, .. } | TraceEvent::SegmentFree { segment, .. } => {
            *segment += segs;
            max.1 = *segment + 1;
        }
        _ => {}
    }
    (e, max)
}

impl Sink for History {
    fn on_event(&self, source: u64, e: &Event<'_>) {
        match *e {
            Event::Step(step) => {
                *self.step.lock() = step;
                for (_, t) in self.rings.read().iter() {
                    t.set_step(step);
                }
            }
            _ => self.ring(source).on_event(source, e),
        }
    }
}
