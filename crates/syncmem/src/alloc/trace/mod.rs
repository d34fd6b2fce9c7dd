//! Recording and replaying memory traffic: allocations, frees, copies and evictions.
//!
//! A [`Trace`] records, per device:
//!
//! - every block allocation and free of a pool (bytes asked for, a block id of its own, the
//!   stream, the pool's label: `opencl:0`, `opencl:0 pinned`, `host`);
//! - every copy between host and device memory made by a [`crate::Stream`] (direction, bytes,
//!   the stream's device);
//! - every clean device mirror dropped to make room under memory pressure (the buffer's label,
//!   bytes, the device);
//! - every allocation a pool refused for good, out of memory (bytes asked for, the pool's
//!   label).
//!
//! Record a whole program with [`Trace::attach`] (one device, its pinned pool and the host
//! pool), [`Trace::attach_device_only`] or [`Trace::attach_all`] (every device): each returns a
//! [`TraceGuard`] that detaches on drop. While no trace is attached, the hook costs one relaxed
//! atomic load per copy or pool event (see [`hub`]). A [`Trace`] is also a [`PoolObserver`]
//! for any single pool ([`crate::alloc::pool::Pool::set_observer`]); [`EnvTrace`] records the
//! process into the file named by `SYNCMEM_TRACE`.
//!
//! Save a trace as JSON lines ([`Trace::save`], [`Trace::save_file`]), load it back
//! ([`Trace::load`], [`Trace::load_file`]; files holding only `alloc`/`free` lines, as written
//! before copies and evictions were recorded, still load), and replay it ([`replay_with`]) with
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
//!     let m = SyncedMemory::new(4096, &dev);
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
//! let opts = ReplayOptions { cap: Some(1 << 20), ..ReplayOptions::default() };
//! let r = replay_with(&back, &PoolConfig::new(PoolKind::Binned), &opts).unwrap();
//! let cpu = r.device("cpu").unwrap();
//! assert_eq!(cpu.ooms, 0);
//! assert!(cpu.peak_reserved >= cpu.peak_allocated && cpu.peak_allocated >= 4096);
//! assert_eq!(r.total.copies.host_to_device.bytes, 4096);
//! ```

pub mod hub;
mod replay;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::alloc::pool::{PoolEvent, PoolObserver, StreamId};
use crate::alloc::stats::{CopyDir, CopyStats, Direction};
use crate::error::{Error, Result};

pub(crate) use hub::HOST_SOURCE;
pub use hub::{EnvTrace, TraceGuard, TRACE_ENV};
pub use replay::{replay, replay_with, DeviceReplay, ReplayOptions, ReplayReport, ReplaySummary};

/// One recorded event: a line of a saved trace (`{"op":"alloc",...}`).
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
    /// A copy between host and device memory (or within a device).
    Copy {
        /// Which way (`host_to_device`, `device_to_host`, `device_to_device`).
        direction: Direction,
        /// Bytes copied.
        bytes: usize,
        /// The device whose stream made the copy.
        device: String,
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

impl TraceEvent {
    /// `alloc`, `free`, `copy`, `evict` or `oom`.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceEvent::Alloc { .. } => "alloc",
            TraceEvent::Free { .. } => "free",
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
            | TraceEvent::Copy { device, .. }
            | TraceEvent::Evict { device, .. }
            | TraceEvent::Oom { device, .. } => device,
        }
    }
}

/// Which pool a live block belongs to: the trace source (`None` for a pool observed directly),
/// the pool's label, the pool's block id.
type LiveKey = (Option<u64>, String, u64);

#[derive(Default)]
struct Recorder {
    events: Vec<TraceEvent>,
    /// Live blocks -> trace id.
    live: HashMap<LiveKey, u64>,
    next_id: u64,
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

/// Counts of a trace's events (see [`Trace::summary`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TraceSummary {
    /// Number of events.
    pub events: usize,
    /// Block allocations.
    pub allocs: u64,
    /// Bytes asked for by the allocations.
    pub alloc_bytes: u64,
    /// Block frees.
    pub frees: u64,
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

impl Trace {
    /// An empty trace, ready to record (share it in an `Arc` to attach it).
    pub fn new() -> Self {
        Self::default()
    }

    /// A trace of these events.
    pub fn from_events(events: Vec<TraceEvent>) -> Self {
        let next_id = events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::Alloc { id, .. } | TraceEvent::Free { id, .. } => Some(id + 1),
                _ => None,
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

    /// Runs `f` on the recorded events without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[TraceEvent]) -> R) -> R {
        f(&self.inner.lock().events)
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
    /// allocated before a trace is attached, their frees are not recorded.
    pub fn clear(&self) {
        let mut r = self.inner.lock();
        r.events.clear();
        r.live.clear();
    }

    /// Counts the events by kind, bytes copied by direction, and the devices seen.
    pub fn summary(&self) -> TraceSummary {
        summarize(self.inner.lock().events.iter())
    }

    /// [`Trace::summary`] of each device (pool label), in order of first appearance.
    pub fn summaries_by_device(&self) -> Vec<(String, TraceSummary)> {
        let r = self.inner.lock();
        let mut labels: Vec<&str> = Vec::new();
        for e in &r.events {
            if !labels.contains(&e.device()) {
                labels.push(e.device());
            }
        }
        labels
            .into_iter()
            .map(|l| {
                let s = summarize(r.events.iter().filter(|e| e.device() == l));
                (l.to_string(), s)
            })
            .collect()
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

    /// Writes the events as JSON lines into the file `path` (created or truncated).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn save_file(&self, path: &Path) -> Result<()> {
        let io = |op, error| Error::Io {
            op,
            path: path.to_path_buf(),
            error,
        };
        let file = std::fs::File::create(path).map_err(|e| io("create", e))?;
        let mut out = std::io::BufWriter::new(file);
        for e in &self.inner.lock().events {
            serde_json::to_writer(&mut out, e).map_err(|e| io("write", e.into()))?;
            out.write_all(b"\n").map_err(|e| io("write", e))?;
        }
        out.flush().map_err(|e| io("write", e))
    }

    /// Reads a trace written by [`Trace::save`] (blank lines are skipped).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the line that does not parse, or a read error.
    pub fn load(input: impl BufRead) -> Result<Self> {
        read_events(input)
            .map(Self::from_events)
            .map_err(|(line, reason)| match line {
                Some(n) => invalid(format!("trace line {n}: {reason}")),
                None => invalid(format!("reading a trace: {reason}")),
            })
    }

    /// Reads the trace file `path` (JSON lines, as written by [`Trace::save_file`]).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read, [`Error::Format`] naming the first line that
    /// is not a trace event (or an empty file).
    pub fn load_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|error| Error::Io {
            op: "open",
            path: path.to_path_buf(),
            error,
        })?;
        let events =
            read_events(std::io::BufReader::new(file)).map_err(|(line, reason)| match line {
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
            })?;
        if events.is_empty() {
            return Err(Error::Format {
                format: "trace",
                path: path.to_path_buf(),
                reason: "no events (an empty file)".to_string(),
            });
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

    /// Records an event of pool `label` (of trace source `source`, `None` for an observed pool).
    pub(crate) fn record_pool(&self, source: Option<u64>, label: &str, event: &PoolEvent) {
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
                r.live.insert((source, label.to_string(), *block), id);
                r.events.push(TraceEvent::Alloc {
                    id,
                    size: *requested,
                    stream: *stream,
                    device: label.to_string(),
                });
            }
            PoolEvent::Free { block, .. } => {
                // A block allocated before the trace was attached has no id: skipped.
                if let Some(id) = r.live.remove(&(source, label.to_string(), *block)) {
                    r.events.push(TraceEvent::Free {
                        id,
                        device: label.to_string(),
                    });
                }
            }
            PoolEvent::Evict {
                label: buffer,
                bytes,
            } => r.events.push(TraceEvent::Evict {
                label: buffer.clone(),
                bytes: *bytes,
                device: label.to_string(),
            }),
            PoolEvent::OutOfMemory { requested } => r.events.push(TraceEvent::Oom {
                size: *requested,
                device: label.to_string(),
            }),
            _ => {}
        }
    }

    /// Records a copy made by a stream of device `device`.
    pub(crate) fn record_copy(&self, device: &str, direction: Direction, bytes: usize) {
        self.inner.lock().events.push(TraceEvent::Copy {
            direction,
            bytes,
            device: device.to_string(),
        });
    }
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
                s.alloc_bytes += *size as u64;
            }
            TraceEvent::Free { .. } => s.frees += 1,
            TraceEvent::Copy {
                direction, bytes, ..
            } => add_copy(&mut s.copies, *direction, *bytes),
            TraceEvent::Evict { bytes, .. } => {
                s.evictions += 1;
                s.evicted_bytes += *bytes as u64;
            }
            TraceEvent::Oom { .. } => s.ooms += 1,
        }
    }
    s.devices = devices.into_iter().collect();
    s
}

/// Parses JSON lines; an error names the line (`None`: a read error).
fn read_events(
    input: impl BufRead,
) -> std::result::Result<Vec<TraceEvent>, (Option<usize>, String)> {
    let mut events = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| (None, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let e = serde_json::from_str(&line).map_err(|e| (Some(n + 1), e.to_string()))?;
        events.push(e);
    }
    Ok(events)
}

/// Adds one copy to `c`.
fn add_copy(c: &mut CopyStats, d: Direction, bytes: usize) {
    let slot: &mut CopyDir = match d {
        Direction::HostToDevice => &mut c.host_to_device,
        Direction::DeviceToHost => &mut c.device_to_host,
        Direction::DeviceToDevice => &mut c.device_to_device,
    };
    slot.count += 1;
    slot.bytes += bytes as u64;
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
