//! [`Trace`]: the recorder, and saving and loading it as JSON lines.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::event::{invalid, Place, Stamp, TraceEvent};
use super::file;
use super::frames::{self, Frame};
use crate::alloc::pool::{PoolEvent, PoolObserver, StreamId};
use crate::alloc::stats::Direction;
use crate::error::{Error, Result};

#[cfg(doc)]
use super::event::{MAX_EVENT_BYTES, MAX_LINE_BYTES};

/// Which pool a live block belongs to: the trace source (`None` for a pool observed directly),
/// the pool's label, the pool's block id.
type LiveKey = (Option<u64>, String, u64);

struct Recorder {
    events: Vec<TraceEvent>,
    /// One per event.
    stamps: Vec<Stamp>,
    /// Live blocks -> trace id.
    live: HashMap<LiveKey, u64>,
    /// Live segments (keyed as blocks, by the pool's segment id) -> trace id.
    segments: HashMap<LiveKey, u64>,
    next_id: u64,
    next_segment: u64,
    /// When the trace began (made or cleared).
    start: Instant,
    /// The step marked now.
    step: Option<u64>,
    /// The most events kept (0: every one); older ones are dropped (see [`Trace::bounded`]).
    max: usize,
    /// Where the event being recorded comes from, when it is replayed from another record
    /// (the history's rings) rather than happening now.
    origin: Option<Origin>,
}

/// What an event recorded elsewhere carries into a trace: its stamp, and for an allocation
/// the operator and the stack recorded with it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    pub(crate) stamp: Stamp,
    pub(crate) op: Option<Arc<str>>,
    pub(crate) frames: Vec<Frame>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            events: Vec::new(),
            stamps: Vec::new(),
            live: HashMap::new(),
            segments: HashMap::new(),
            next_id: 0,
            next_segment: 0,
            start: Instant::now(),
            step: None,
            max: 0,
            origin: None,
        }
    }
}

impl Recorder {
    fn push(&mut self, event: TraceEvent) {
        let stamp = match &self.origin {
            Some(o) => o.stamp,
            None => Stamp {
                t_us: u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX),
                step: self.step,
            },
        };
        // A bounded trace keeps up to twice its bound and drops the older half at once: one
        // move per `max` events instead of one per event.
        if self.max > 0 && self.events.len() >= 2 * self.max {
            let drop = self.events.len() - self.max + 1;
            self.events.drain(..drop);
            self.stamps.drain(..drop);
        }
        self.stamps.push(stamp);
        self.events.push(event);
    }

    /// The events kept (the newest `max` of a bounded trace) and their stamps.
    fn window(&self) -> (&[TraceEvent], &[Stamp]) {
        let from = match self.max {
            0 => 0,
            max => self.events.len().saturating_sub(max),
        };
        (&self.events[from..], &self.stamps[from..])
    }

    /// Records `event`, a [`PoolEvent::Alloc`] of pool `label` of trace source `source`: the
    /// block gets an id of its own, its segment the trace's id.
    fn alloc(&mut self, source: Option<u64>, label: &str, event: &PoolEvent) {
        let PoolEvent::Alloc {
            requested,
            size,
            block,
            stream,
            segment,
            offset,
            owner,
            ..
        } = event
        else {
            return;
        };
        let (operator, frames) = match &mut self.origin {
            Some(o) => (
                o.op.as_deref().map(str::to_string),
                std::mem::take(&mut o.frames),
            ),
            None => (
                frames::current_op().map(|o| o.to_string()),
                if frames::trace_stacks() {
                    frames::capture()
                } else {
                    Vec::new()
                },
            ),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert((source, label.to_string(), *block), id);
        let segment = self.segment_id((source, label.to_string(), *segment));
        self.push(TraceEvent::Alloc {
            id,
            size: *requested,
            stream: *stream,
            device: label.to_string(),
            owner: owner.as_deref().map(str::to_string),
            place: Some(Place {
                segment,
                offset: *offset as u64,
                size: *size as u64,
            }),
            operator,
            frames,
        });
    }

    /// The trace's id of the pool segment `key`; a segment made before the trace began gets
    /// one at its first use.
    fn segment_id(&mut self, key: LiveKey) -> u64 {
        let next = &mut self.next_segment;
        *self.segments.entry(key).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }
}

/// A recorded sequence of memory events; a [`PoolObserver`] that records into itself.
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
    /// An empty trace, ready to record (share it in an `Arc` to attach it).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty trace that keeps only the newest `max_entries` events (at least 1): the
    /// older ones are dropped as new ones come, so that recording can stay on for a whole
    /// program in bounded memory (what [`super::History`] keeps per device). The events kept
    /// may free blocks, or lie in segments, whose allocation was dropped.
    pub fn bounded(max_entries: usize) -> Self {
        Self::bounded_from(max_entries, Instant::now())
    }

    /// As [`Trace::bounded`], with times counted from `start`.
    pub(crate) fn bounded_from(max_entries: usize, start: Instant) -> Self {
        Self {
            inner: Mutex::new(Recorder {
                max: max_entries.max(1),
                start,
                ..Recorder::default()
            }),
        }
    }

    /// The most events this trace keeps (`None`: unbounded).
    pub fn max_entries(&self) -> Option<usize> {
        match self.inner.lock().max {
            0 => None,
            m => Some(m),
        }
    }

    /// A trace of these events, without times (every [`Stamp`] is the default).
    pub fn from_events(events: Vec<TraceEvent>) -> Self {
        Self::from_stamped(events, Vec::new())
    }

    /// A trace of these events with these stamps (one per event, in the same order: missing
    /// ones are the default, extra ones are dropped).
    pub fn from_stamped(events: Vec<TraceEvent>, mut stamps: Vec<Stamp>) -> Self {
        stamps.resize(events.len(), Stamp::default());
        let (mut next_id, mut next_segment) = (0, 0);
        for e in &events {
            match e {
                TraceEvent::Alloc { id, place, .. } => {
                    next_id = next_id.max(id.saturating_add(1));
                    if let Some(p) = place {
                        next_segment = next_segment.max(p.segment.saturating_add(1));
                    }
                }
                TraceEvent::Free { id, .. } => next_id = next_id.max(id.saturating_add(1)),
                TraceEvent::SegmentAlloc { segment, .. }
                | TraceEvent::SegmentFree { segment, .. } => {
                    next_segment = next_segment.max(segment.saturating_add(1));
                }
                _ => {}
            }
        }
        Self {
            inner: Mutex::new(Recorder {
                events,
                stamps,
                next_id,
                next_segment,
                ..Recorder::default()
            }),
        }
    }

    /// A copy of the recorded events.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.inner.lock().window().0.to_vec()
    }

    /// A copy of the stamps of the recorded events (one per event).
    pub fn stamps(&self) -> Vec<Stamp> {
        self.inner.lock().window().1.to_vec()
    }

    /// Runs `f` on the recorded events without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[TraceEvent]) -> R) -> R {
        f(self.inner.lock().window().0)
    }

    /// Runs `f` on the recorded events and their stamps (as long as the events) without
    /// copying them.
    pub fn with_stamped<R>(&self, f: impl FnOnce(&[TraceEvent], &[Stamp]) -> R) -> R {
        let r = self.inner.lock();
        let (events, stamps) = r.window();
        f(events, stamps)
    }

    /// Marks the step the program is in (`None`: none): the events recorded from now on
    /// carry it in their [`Stamp`]. `crate::Device::mark_trace_step` marks it on every trace
    /// attached to a device.
    pub fn set_step(&self, step: Option<u64>) {
        self.inner.lock().step = step;
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.inner.lock().window().0.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the events recorded so far, and the blocks they allocated: as for blocks
    /// allocated before a trace is attached, their frees are not recorded. Times start again
    /// from 0.
    pub fn clear(&self) {
        let mut r = self.inner.lock();
        r.events.clear();
        r.stamps.clear();
        r.live.clear();
        r.start = Instant::now();
    }

    /// Writes the events as JSON lines (one object per line, with its stamp's `t_us` and
    /// `step`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] carrying the writer's error.
    pub fn save(&self, mut out: impl Write) -> Result<()> {
        let r = self.inner.lock();
        let (events, stamps) = r.window();
        for (e, s) in events.iter().zip(stamps) {
            file::write_line(&mut out, e, s)
                .map_err(|e| invalid(format!("writing a trace: {e}")))?;
        }
        Ok(())
    }

    /// Writes the events as JSON lines into the file `path`, replacing it atomically through
    /// a temporary file ([`crate::file::write_atomic`]: a symbolic link is followed; a
    /// directory, a device node, a FIFO or a socket is refused).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn save_file(&self, path: &Path) -> Result<()> {
        let r = self.inner.lock();
        let (events, stamps) = r.window();
        crate::file::write_atomic(path, |out| {
            for (e, s) in events.iter().zip(stamps) {
                file::write_line(&mut *out, e, s)?;
            }
            Ok(())
        })
    }

    /// Reads a trace written by [`Trace::save`] (blank lines are skipped).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the line that does not parse, is longer than
    /// [`MAX_LINE_BYTES`] or carries more than [`MAX_EVENT_BYTES`]; or a read error.
    pub fn load(input: impl BufRead) -> Result<Self> {
        file::read_events(input)
            .map(|(events, stamps)| Self::from_stamped(events, stamps))
            .map_err(|(line, reason)| match line {
                Some(n) => invalid(format!("trace line {n}: {reason}")),
                None => invalid(format!("reading a trace: {reason}")),
            })
    }

    /// Reads the trace file `path` (JSON lines, as written by [`Trace::save_file`]).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read, [`Error::Format`] naming the first line that
    /// is not a trace event (as [`Trace::load`]: unparsable, too long, an absurd size), or an
    /// empty file.
    pub fn load_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|error| Error::Io {
            op: "open",
            path: path.to_path_buf(),
            error,
        })?;
        let (events, stamps) = file::read_events(std::io::BufReader::new(file)).map_err(
            |(line, reason)| match line {
                Some(n) => Error::Format {
                    format: "trace",
                    path: path.to_path_buf(),
                    reason: format!("line {n}: {reason}"),
                },
                None => Error::Format {
                    format: "trace",
                    path: path.to_path_buf(),
                    reason,
                },
            },
        )?;
        if events.is_empty() {
            return Err(Error::Format {
                format: "trace",
                path: path.to_path_buf(),
                reason: "no events (an empty file)".to_string(),
            });
        }
        Ok(Self::from_stamped(events, stamps))
    }

    /// Records an event of pool `label` (of trace source `source`, `None` for an observed pool).
    pub(crate) fn record_pool(&self, source: Option<u64>, label: &str, event: &PoolEvent) {
        self.record_pool_from(source, label, event, None);
    }

    /// As [`Trace::record_pool`], for an event recorded elsewhere (`origin`; `None`: now).
    pub(crate) fn record_pool_from(
        &self,
        source: Option<u64>,
        label: &str,
        event: &PoolEvent,
        origin: Option<Origin>,
    ) {
        let mut r = self.inner.lock();
        r.origin = origin;
        Self::record_locked(&mut r, source, label, event);
        r.origin = None;
    }

    fn record_locked(r: &mut Recorder, source: Option<u64>, label: &str, event: &PoolEvent) {
        let device = || label.to_string();
        match event {
            PoolEvent::Alloc { .. } => r.alloc(source, label, event),
            PoolEvent::Free { block, .. } => {
                // A block allocated before the trace was attached has no id: skipped.
                if let Some(id) = r.live.remove(&(source, label.to_string(), *block)) {
                    r.push(TraceEvent::Free {
                        id,
                        device: device(),
                    });
                }
            }
            PoolEvent::SegmentAlloc {
                bytes,
                segment,
                stream,
            } => {
                let key = (source, label.to_string(), *segment);
                // A stale entry (a segment freed while the trace was cleared) is replaced.
                r.segments.remove(&key);
                let segment = r.segment_id(key);
                r.push(TraceEvent::SegmentAlloc {
                    segment,
                    size: *bytes,
                    stream: *stream,
                    device: device(),
                });
            }
            PoolEvent::SegmentFree { bytes, segment } => {
                // A segment made before the trace began and never used since: skipped.
                if let Some(segment) = r.segments.remove(&(source, label.to_string(), *segment)) {
                    r.push(TraceEvent::SegmentFree {
                        segment,
                        size: *bytes,
                        device: device(),
                    });
                }
            }
            PoolEvent::Evict {
                label: buffer,
                bytes,
            } => r.push(TraceEvent::Evict {
                label: buffer.clone(),
                bytes: *bytes,
                device: device(),
            }),
            PoolEvent::OutOfMemory { requested } => r.push(TraceEvent::Oom {
                size: *requested,
                device: device(),
            }),
        }
    }

    /// Records a copy made by stream `stream` of device `device`.
    pub(crate) fn record_copy(
        &self,
        device: &str,
        stream: StreamId,
        direction: Direction,
        bytes: usize,
        peer: Option<&str>,
    ) {
        self.record_copy_from(device, stream, direction, bytes, peer, None);
    }

    /// As [`Trace::record_copy`], for a copy recorded elsewhere at `stamp` (`None`: now).
    pub(crate) fn record_copy_from(
        &self,
        device: &str,
        stream: StreamId,
        direction: Direction,
        bytes: usize,
        peer: Option<&str>,
        stamp: Option<Stamp>,
    ) {
        let mut r = self.inner.lock();
        r.origin = stamp.map(|stamp| Origin {
            stamp,
            ..Origin::default()
        });
        r.push(TraceEvent::Copy {
            direction,
            bytes,
            device: device.to_string(),
            stream: Some(stream),
            peer: peer.map(str::to_string),
        });
        r.origin = None;
    }
}

impl Trace {
    /// Records the memory plan of net `net` built for `device` (see [`TraceEvent::Plan`]).
    pub(crate) fn record_plan(&self, device: &str, net: &str, slots: &[(String, Vec<String>)]) {
        self.inner.lock().push(TraceEvent::Plan {
            net: net.to_string(),
            device: device.to_string(),
            slots: slots.iter().cloned().collect(),
        });
    }
}

impl PoolObserver for Trace {
    fn on_event(&self, pool: &str, event: &PoolEvent) {
        self.record_pool(None, pool, event);
    }
}
