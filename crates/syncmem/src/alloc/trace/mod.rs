//! Recording and replaying memory traffic: allocations, frees, copies and evictions.
//!
//! A [`Trace`] records, per device:
//!
//! - every block allocation and free of a pool (bytes asked for, a block id of its own, the
//!   stream, the pool's label: `opencl:0`, `opencl:0 pinned`, `host`; the label of the buffer
//!   that owns the block; where the block lies: its segment, offset and rounded size);
//! - every segment a pool takes from and gives back to the backend (a segment id of its own,
//!   bytes, the stream of the allocation that made it);
//! - every copy between host and device memory made by a [`crate::Stream`] (direction, bytes,
//!   the stream and its device);
//! - every clean device mirror dropped to make room under memory pressure (the buffer's label,
//!   bytes, the device);
//! - every allocation a pool refused for good, out of memory (bytes asked for, the pool's
//!   label).
//!
//! Every event carries a [`Stamp`]: microseconds since the trace began (a monotonic clock) and
//! the step the program was in, when it marks steps ([`Trace::set_step`];
//! `crate::Device::mark_trace_step` marks them on every trace recording a device, as the
//! training loop does).
//!
//! Record a whole program with [`Trace::attach`] (one device, its pinned pool and the host
//! pool), [`Trace::attach_device_only`] or [`Trace::attach_all`] (every device): each returns a
//! [`TraceGuard`] that detaches on drop. While no trace is attached, the hook costs one relaxed
//! atomic load per copy or pool event (see [`hub`]). A [`Trace`] is also a [`PoolObserver`]
//! for any single pool ([`crate::alloc::pool::Pool::set_observer`]); [`EnvTrace`] records the
//! process into the file named by `SYNCMEM_TRACE`.
//!
//! Save a trace as JSON lines ([`Trace::save`], [`Trace::save_file`]), load it back
//! ([`Trace::load`], [`Trace::load_file`]; files written before copies, evictions, segments,
//! owners and times were recorded still load: what they lack is absent), turn it into a
//! timeline of memory over time ([`timeline::Timeline`]) or into a snapshot that PyTorch's
//! memory tools open ([`torch`]), and replay it ([`replay_with`]) with
//! one fresh pool per recorded device, of any [`crate::PoolConfig`], optionally under a memory cap, to
//! compare how much memory each pool kind would reserve for the same program, how often it
//! would call the backend, and where it would run out of memory. [`Trace::synthetic`] makes a
//! deterministic training-loop-like trace.
//!
//! ```
//! use std::sync::Arc;
//! use syncmem::alloc::trace::{replay_with, ReplayOptions, Trace};
//! use syncmem::{Device, PoolConfig, PoolKind, SyncedMemory};
//!
//! let dev = Device::cpu();
//! let trace = Arc::new(Trace::new());
//! {
//!     let _guard = trace.attach_device_only(&dev);
//!     // Two mirrors (no zero-copy), so that the device access copies.
//!     let m = SyncedMemory::new(4096, &dev).with_zero_copy(false);
//!     m.host_mut().unwrap().fill(7);
//!     drop(m.device().unwrap()); // one host-to-device copy
//! } // detached here
//! let s = trace.summary();
//! assert_eq!(s.copies.host_to_device.count, 1);
//! assert_eq!(s.copies.host_to_device.bytes, 4096);
//!
//! // Save, load, and replay on a binned pool with a 1 MiB cap per device.
//! let mut file = Vec::new();
//! trace.save(&mut file).unwrap();
//! let back = Trace::load(&file[..]).unwrap();
//! let opts = ReplayOptions::new().with_cap(Some(1 << 20));
//! let r = replay_with(&back, &PoolConfig::new(PoolKind::Binned), &opts).unwrap();
//! let cpu = r.device("cpu").unwrap();
//! assert_eq!(cpu.ooms, 0);
//! assert!(cpu.peak_reserved >= cpu.peak_allocated && cpu.peak_allocated >= 4096);
//! assert_eq!(r.total.copies.host_to_device.bytes, 4096);
//! ```

mod file;
pub mod hub;
mod pickle;
mod replay;
mod summary;
pub mod timeline;
pub mod torch;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::alloc::pool::{PoolEvent, PoolObserver, StreamId};
use crate::alloc::stats::Direction;
use crate::error::{Error, Result};

pub(crate) use hub::HOST_SOURCE;
pub use hub::{EnvTrace, TraceGuard, TRACE_ENV};
pub use replay::{
    replay, replay_with, DeviceReplay, ReplayOptions, ReplayReport, ReplaySummary, MAX_REPLAY_BYTES,
};
use summary::add_copy;
pub use summary::TraceSummary;

/// One recorded event: a line of a saved trace (`{"op":"alloc",...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
#[non_exhaustive]
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
        /// The label of the buffer it was handed to (a tensor's or blob's name), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
        /// Where the block lies (absent in traces written before placements were recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        place: Option<Place>,
    },
    /// A block was freed.
    Free {
        /// The id given in its [`TraceEvent::Alloc`].
        id: u64,
        /// The label of the pool (device) it came from.
        device: String,
    },
    /// A pool took a segment from the backend.
    #[serde(rename = "segment_alloc")]
    SegmentAlloc {
        /// The trace's id of the segment (unique within the trace).
        segment: u64,
        /// Its size in bytes.
        size: usize,
        /// The stream of the allocation that made it.
        stream: StreamId,
        /// The label of the pool (device).
        device: String,
    },
    /// A pool gave a segment back to the backend.
    #[serde(rename = "segment_free")]
    SegmentFree {
        /// The id given in its [`TraceEvent::SegmentAlloc`] (or in the [`Place`] of a block
        /// of a segment made before the trace began).
        segment: u64,
        /// Its size in bytes.
        size: usize,
        /// The label of the pool (device).
        device: String,
    },
    /// A copy between host and device memory (or within a device).
    Copy {
        /// Which way (`host_to_device`, `device_to_host`, `device_to_device`).
        direction: Direction,
        /// Bytes copied.
        bytes: usize,
        /// The device whose stream made the copy.
        device: String,
        /// The stream's id (absent in traces written before streams of copies were recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamId>,
        /// For a copy from another device with one device command: the device copied from
        /// (`device` is the one copied to). Absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
    },
    /// A clean device mirror was dropped to make room.
    Evict {
        /// The buffer's label.
        label: String,
        /// Bytes freed.
        bytes: usize,
        /// The device (its pool's label).
        device: String,
    },
    /// An allocation failed for good: out of memory after the pool's cache was released (and,
    /// on a device, clean mirrors were dropped).
    Oom {
        /// Bytes asked for.
        size: usize,
        /// The label of the pool (device) that refused.
        device: String,
    },
}

/// Where a block lies in its pool: the segment, the start in it, the bytes it occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// The trace's id of the segment.
    pub segment: u64,
    /// The block's start in the segment.
    pub offset: u64,
    /// The bytes the block occupies (the request rounded up by the pool).
    pub size: u64,
}

/// When an event happened: microseconds since the trace began, and the step the program had
/// marked (see [`Trace::set_step`]). Traces written before times were recorded load with
/// `t_us` 0 everywhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Microseconds since the trace began (monotonic).
    #[serde(default)]
    pub t_us: u64,
    /// The step marked when the event happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

impl TraceEvent {
    /// `alloc`, `free`, `segment_alloc`, `segment_free`, `copy`, `evict` or `oom`.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceEvent::Alloc { .. } => "alloc",
            TraceEvent::Free { .. } => "free",
            TraceEvent::SegmentAlloc { .. } => "segment_alloc",
            TraceEvent::SegmentFree { .. } => "segment_free",
            TraceEvent::Copy { .. } => "copy",
            TraceEvent::Evict { .. } => "evict",
            TraceEvent::Oom { .. } => "oom",
        }
    }

    /// The device (pool label) the event belongs to.
    pub fn device(&self) -> &str {
        match self {
            TraceEvent::Alloc { device, .. }
            | TraceEvent::Free { device, .. }
            | TraceEvent::SegmentAlloc { device, .. }
            | TraceEvent::SegmentFree { device, .. }
            | TraceEvent::Copy { device, .. }
            | TraceEvent::Evict { device, .. }
            | TraceEvent::Oom { device, .. } => device,
        }
    }

    /// The bytes the event is about: asked for (`alloc`, `oom`), of the segment, copied or
    /// evicted; `None` for a `free` (its bytes are those of its `alloc`).
    pub fn bytes(&self) -> Option<u64> {
        match self {
            TraceEvent::Alloc { size, .. }
            | TraceEvent::SegmentAlloc { size, .. }
            | TraceEvent::SegmentFree { size, .. }
            | TraceEvent::Oom { size, .. } => Some(*size as u64),
            TraceEvent::Copy { bytes, .. } | TraceEvent::Evict { bytes, .. } => Some(*bytes as u64),
            TraceEvent::Free { .. } => None,
        }
    }
}

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
        }
    }
}

impl Recorder {
    fn push(&mut self, event: TraceEvent) {
        let t_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.stamps.push(Stamp {
            t_us,
            step: self.step,
        });
        self.events.push(event);
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
        self.inner.lock().events.clone()
    }

    /// A copy of the stamps of the recorded events (one per event).
    pub fn stamps(&self) -> Vec<Stamp> {
        self.inner.lock().stamps.clone()
    }

    /// Runs `f` on the recorded events without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[TraceEvent]) -> R) -> R {
        f(&self.inner.lock().events)
    }

    /// Runs `f` on the recorded events and their stamps (as long as the events) without
    /// copying them.
    pub fn with_stamped<R>(&self, f: impl FnOnce(&[TraceEvent], &[Stamp]) -> R) -> R {
        let r = self.inner.lock();
        f(&r.events, &r.stamps)
    }

    /// Marks the step the program is in (`None`: none): the events recorded from now on
    /// carry it in their [`Stamp`]. `crate::Device::mark_trace_step` marks it on every trace
    /// attached to a device.
    pub fn set_step(&self, step: Option<u64>) {
        self.inner.lock().step = step;
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
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
        for (e, s) in r.events.iter().zip(&r.stamps) {
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
        crate::file::write_atomic(path, |out| {
            for (e, s) in r.events.iter().zip(&r.stamps) {
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
        let mut r = self.inner.lock();
        let device = || label.to_string();
        match event {
            PoolEvent::Alloc {
                requested,
                size,
                block,
                stream,
                segment,
                offset,
                owner,
                ..
            } => {
                let id = r.next_id;
                r.next_id += 1;
                r.live.insert((source, label.to_string(), *block), id);
                let segment = r.segment_id((source, label.to_string(), *segment));
                r.push(TraceEvent::Alloc {
                    id,
                    size: *requested,
                    stream: *stream,
                    device: device(),
                    owner: owner.as_deref().map(str::to_string),
                    place: Some(Place {
                        segment,
                        offset: *offset as u64,
                        size: *size as u64,
                    }),
                });
            }
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
        self.inner.lock().push(TraceEvent::Copy {
            direction,
            bytes,
            device: device.to_string(),
            stream: Some(stream),
            peer: peer.map(str::to_string),
        });
    }
}

/// Longest line a trace file may hold. An event is one short JSON object (its labels are
/// buffer and device names); the bound keeps an input without line breaks (`/dev/zero`) from
/// exhausting memory.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Largest byte count one event may carry (256 TiB): a larger size, copy or eviction is no
/// real program's, and sums of such sizes could overflow the statistics.
pub const MAX_EVENT_BYTES: u64 = 1 << 48;

/// Checks the byte count of `e` against [`MAX_EVENT_BYTES`].
pub(super) fn check_event_size(e: &TraceEvent) -> std::result::Result<(), String> {
    let (what, n) = match e {
        TraceEvent::Alloc { size, .. } => ("allocation size", *size),
        TraceEvent::Copy { bytes, .. } => ("copy size", *bytes),
        TraceEvent::Evict { bytes, .. } => ("eviction size", *bytes),
        TraceEvent::Oom { size, .. } => ("out-of-memory request", *size),
        TraceEvent::SegmentAlloc { size, .. } | TraceEvent::SegmentFree { size, .. } => {
            ("segment size", *size)
        }
        TraceEvent::Free { .. } => return Ok(()),
    };
    if n as u64 > MAX_EVENT_BYTES {
        return Err(format!(
            "{what} {n} bytes is above the {MAX_EVENT_BYTES}-byte (256 TiB) limit of an event"
        ));
    }
    Ok(())
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        what: "trace".to_string(),
        reason,
    }
}

impl PoolObserver for Trace {
    fn on_event(&self, pool: &str, event: &PoolEvent) {
        self.record_pool(None, pool, event);
    }
}

#[cfg(test)]
mod tests;
