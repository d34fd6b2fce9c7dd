//! [`History`]: the always-on record of the newest memory events of every device, in bounded
//! memory (PyTorch's `torch.cuda.memory._record_memory_history(max_entries=N)`), readable as a
//! [`Trace`] at any moment.
//!
//! One history records the process at a time: [`record_history`] starts it (or stops it) and
//! [`current_history`] returns it; `SYNCMEM_HISTORY=N` starts it from the environment
//! ([`history_from_env`], which the `syncmem` command calls). Each source of events (each
//! device with its pinned pool, and the host pool) keeps its own ring of the newest `N`
//! events, so a busy host pool does not push a device's events out.

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use super::event::Stamp;
use super::frames;
use super::trace::Origin;
use super::Trace;
use crate::alloc::event::{self, Attachment, Event, Scope, Sink};
use crate::alloc::pool::{PoolEvent, StreamId};
use crate::alloc::stats::Direction;
use crate::error::{Error, Result};

/// The environment variable that starts the history with its number of events per device
/// (`SYNCMEM_HISTORY=100000`; `0` or empty: off).
pub const HISTORY_ENV: &str = "SYNCMEM_HISTORY";

/// The newest events of every device, each in a ring of its own. Read it with
/// [`History::trace`].
///
/// A ring keeps the events as they came from the pools (no text is copied: labels are
/// numbered, owners and operators shared), so that recording costs little; reading turns
/// them into a [`Trace`].
#[derive(Debug)]
pub struct History {
    max_entries: usize,
    /// Times of every ring count from here, so that the rings merge in order.
    start: Instant,
    /// One ring per source of events.
    rings: RwLock<Vec<(u64, Arc<Mutex<Ring>>)>>,
    /// The step marked now (`u64::MAX`: none).
    step: AtomicU64,
}

/// The newest events of one source.
#[derive(Debug, Default)]
struct Ring {
    /// The pool and device labels its events name, by number.
    labels: Vec<Arc<str>>,
    records: VecDeque<Record>,
}

/// One event of a ring.
#[derive(Debug)]
struct Record {
    /// When it happened (turned into microseconds when read: cheaper than at each event).
    at: Instant,
    /// The step marked then (`u64::MAX`: none).
    step: u64,
    /// The label's number in the ring.
    label: u32,
    what: What,
}

#[derive(Debug)]
enum What {
    /// A pool event, with the operator and the stack of an allocation (resolved to names
    /// only when read).
    Pool(PoolEvent, Option<Arc<str>>, Option<Arc<Backtrace>>),
    Copy {
        stream: StreamId,
        direction: Direction,
        bytes: usize,
        peer: Option<Box<str>>,
    },
}

impl Ring {
    /// The number of `label`, given one at its first use.
    fn label(&mut self, label: &str) -> u32 {
        match self.labels.iter().position(|l| **l == *label) {
            Some(i) => i as u32,
            None => {
                self.labels.push(label.into());
                (self.labels.len() - 1) as u32
            }
        }
    }

    fn push(&mut self, max: usize, record: Record) {
        if self.records.len() >= max {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }
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
            step: AtomicU64::new(u64::MAX),
        }
    }

    /// The most events kept per device.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Makes the ring of `source` (at its first event) unless another thread just did.
    #[cold]
    fn new_ring(&self, source: u64) {
        let mut rings = self.rings.write();
        if !rings.iter().any(|(s, _)| *s == source) {
            rings.push((source, Arc::new(Mutex::new(Ring::default()))));
        }
    }

    /// The stamp of `record`.
    fn stamp(&self, record: &Record) -> Stamp {
        let t = record.at.saturating_duration_since(self.start);
        Stamp {
            t_us: u64::try_from(t.as_micros()).unwrap_or(u64::MAX),
            step: (record.step != u64::MAX).then_some(record.step),
        }
    }

    /// The events kept now, of every device, as one trace in order of time: ids are the
    /// trace's own, a free whose allocation was dropped from its ring is left out (so that
    /// every view and replay takes the trace), and a block in a segment made before the
    /// ring's oldest event keeps its placement.
    pub fn trace(&self) -> Trace {
        let rings: Vec<(u64, Arc<Mutex<Ring>>)> = self.rings.read().clone();
        let mut all = Vec::new();
        for (source, ring) in &rings {
            let r = ring.lock();
            for rec in &r.records {
                let label = r.labels[rec.label as usize].clone();
                let what = match &rec.what {
                    What::Pool(e, op, frames) => What::Pool(e.clone(), op.clone(), frames.clone()),
                    What::Copy {
                        stream,
                        direction,
                        bytes,
                        peer,
                    } => What::Copy {
                        stream: *stream,
                        direction: *direction,
                        bytes: *bytes,
                        peer: peer.clone(),
                    },
                };
                all.push((rec.at, self.stamp(rec), *source, label, what));
            }
        }
        // Stable: the events of one device keep their order.
        all.sort_by_key(|(at, ..)| *at);
        let trace = Trace::new();
        for (_, stamp, source, label, what) in all {
            match what {
                What::Pool(e, op, frames) => {
                    let origin = Origin {
                        stamp,
                        op,
                        frames: frames.map_or_else(Vec::new, |bt| frames::frames_of(&bt)),
                    };
                    trace.record_pool_from(Some(source), &label, &e, Some(origin));
                }
                What::Copy {
                    stream,
                    direction,
                    bytes,
                    peer,
                } => trace.record_copy_from(
                    &label,
                    stream,
                    direction,
                    bytes,
                    peer.as_deref(),
                    Some(stamp),
                ),
            }
        }
        trace
    }

    /// Number of events kept now, over every device.
    pub fn len(&self) -> usize {
        self.rings
            .read()
            .iter()
            .map(|(_, r)| r.lock().records.len())
            .sum()
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

impl Sink for History {
    fn on_event(&self, source: u64, e: &Event<'_>) {
        let (pool, what) = match *e {
            Event::Step(step) => {
                self.step.store(step.unwrap_or(u64::MAX), Relaxed);
                return;
            }
            Event::Pool { pool, event } => {
                let alloc = matches!(event, PoolEvent::Alloc { .. });
                let op = alloc.then(frames::current_op).flatten();
                let stack =
                    (alloc && frames::trace_stacks()).then(|| Arc::new(frames::capture_raw()));
                (pool, What::Pool(event.clone(), op, stack))
            }
            Event::Copy {
                device,
                stream,
                direction,
                bytes,
                peer,
            } => (
                device,
                What::Copy {
                    stream,
                    direction,
                    bytes,
                    peer: peer.map(Into::into),
                },
            ),
        };
        let (at, step) = (Instant::now(), self.step.load(Relaxed));
        let rings = self.rings.read();
        let ring = match rings.iter().find(|(s, _)| *s == source) {
            Some((_, r)) => r,
            None => {
                drop(rings);
                self.new_ring(source);
                return self.on_event(source, e);
            }
        };
        let mut r = ring.lock();
        let label = r.label(pool);
        r.push(
            self.max_entries,
            Record {
                at,
                step,
                label,
                what,
            },
        );
    }
}
