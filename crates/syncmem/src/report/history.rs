//! [`History`]: the always-on record of the newest memory events of every device, in bounded
//! memory (PyTorch's `torch.cuda.memory._record_memory_history(max_entries=N)`), readable as a
//! [`Trace`] at any moment.
//!
//! One history records the process at a time: [`record_history`] starts it (or stops it) and
//! [`current_history`] returns it; `SYNCMEM_HISTORY=N` starts it from the environment
//! ([`history_from_env`], which the `syncmem` command calls). Each thread keeps, per source of
//! events (each device with its pinned pool, and the host pool), a ring of its newest `N`
//! events, written with no lock (`alloc/ring/`); reading keeps the newest `N` of each source,
//! so a busy host pool does not push a device's events out. Plans of nets (`plan` lines of a
//! recorded trace) are not kept.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::event::Stamp;
use super::frames;
use super::trace::Origin;
use super::Trace;
use crate::alloc::ring::{self, RawWhat, Rings};
use crate::error::{Error, Result};

/// The environment variable that starts the history with its number of events per device
/// (`SYNCMEM_HISTORY=100000`; `0` or empty: off).
pub const HISTORY_ENV: &str = "SYNCMEM_HISTORY";

/// The newest events of every device. Read it with [`History::trace`].
///
/// Each thread writes the events it makes into rings of its own, one per device (and one for
/// the host pool), with no lock (see `docs/performance.md` for the cost); reading merges them
/// into one order: the events of one thread in their order, each block's events in their
/// order (an allocation before its free, whichever threads made them), the rest by time. The
/// time of an event is the time its thread read last: the clock is read every 256 events of a
/// device on a thread and whenever the operator running on it changes, a step is marked, a
/// segment is made or given back, or a copy is made, and an event of a block that another
/// thread touched last reads it too. Each
/// thread holds at most `max_entries` events per device; reading keeps the newest
/// `max_entries` of each device over all threads.
#[derive(Debug)]
pub struct History {
    rings: Arc<Rings>,
}

/// The history recording now.
static CURRENT: Mutex<Option<Arc<History>>> = Mutex::new(None);

/// Starts recording the history of every device, keeping the newest `max_entries` events of
/// each (`Some(n)`, replacing a history recording already), or stops it (`None`). Returns the
/// history recording now. While it records, each pool event and copy is written into its
/// thread's ring of its device, with no lock; see `docs/performance.md` for the cost.
pub fn record_history(max_entries: Option<usize>) -> Option<Arc<History>> {
    let mut current = CURRENT.lock();
    *current = None;
    let Some(n) = max_entries.filter(|&n| n > 0) else {
        ring::stop();
        return None;
    };
    let h = Arc::new(History {
        rings: ring::start(n),
    });
    *current = Some(h.clone());
    Some(h)
}

/// The history recording now, if any.
pub fn current_history() -> Option<Arc<History>> {
    CURRENT.lock().clone()
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
    /// The most events kept per device.
    pub fn max_entries(&self) -> usize {
        self.rings.max_entries()
    }

    /// The events kept now, of every device, as one trace in order: ids are the trace's own,
    /// a free whose allocation was dropped from its ring is left out, and so is an allocation
    /// whose free was (a thread's ring may keep a block's allocation while the free, in the
    /// ring of another thread, went: seen when another allocation lands on its bytes or its
    /// segment goes), so that every view and replay takes the trace; a block in a segment
    /// made before the ring's oldest event keeps its placement.
    pub fn trace(&self) -> Trace {
        let trace = Trace::new();
        let events = self.rings.collect();
        let lost = super::lost::lost_frees(&events);
        for (_, e) in events
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !lost.contains(i))
        {
            let stamp = Stamp {
                t_us: e.t_ns / 1000,
                step: e.step,
            };
            match e.what {
                RawWhat::Pool(event, op, stack) => {
                    let origin = Origin {
                        stamp,
                        op,
                        frames: stack.map_or_else(Vec::new, |bt| frames::frames_of(&bt)),
                    };
                    trace.record_pool_from(Some(e.source), &e.label, &event, Some(origin));
                }
                RawWhat::Copy {
                    stream,
                    direction,
                    bytes,
                    peer,
                } => trace.record_copy_from(
                    &e.label,
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
        self.rings.len()
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
