//! The events of a trace: what one line of a saved trace holds, and the bounds that keep a
//! hostile file from exhausting memory or overflowing the statistics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::frames::Frame;
use crate::alloc::pool::StreamId;
use crate::alloc::stats::Direction;
use crate::error::Error;

#[cfg(doc)]
use super::Trace;

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
        /// The operator running when it was allocated (`NET[INDEX] TYPE -> OUTPUTS`, see
        /// [`super::op_scope`]), when one was marked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operator: Option<String>,
        /// The call stack of the allocation, innermost first, when stacks were captured
        /// ([`super::TRACE_STACKS_ENV`]); empty otherwise.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        frames: Vec<Frame>,
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
    /// A net with a memory plan was built while the trace recorded: the blobs each planner
    /// slot (`__shared_N`) holds, in the order the net first uses them, so that a view names
    /// the slots. Moves no memory.
    Plan {
        /// The net's name.
        net: String,
        /// The device the net runs on.
        device: String,
        /// Per slot, its blobs in the order of first use.
        slots: BTreeMap<String, Vec<String>>,
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
    /// `alloc`, `free`, `segment_alloc`, `segment_free`, `copy`, `evict`, `oom` or `plan`.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceEvent::Alloc { .. } => "alloc",
            TraceEvent::Free { .. } => "free",
            TraceEvent::SegmentAlloc { .. } => "segment_alloc",
            TraceEvent::SegmentFree { .. } => "segment_free",
            TraceEvent::Copy { .. } => "copy",
            TraceEvent::Evict { .. } => "evict",
            TraceEvent::Oom { .. } => "oom",
            TraceEvent::Plan { .. } => "plan",
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
            | TraceEvent::Oom { device, .. }
            | TraceEvent::Plan { device, .. } => device,
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
            TraceEvent::Free { .. } | TraceEvent::Plan { .. } => None,
        }
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
pub(crate) fn check_event_size(e: &TraceEvent) -> std::result::Result<(), String> {
    let (what, n) = match e {
        TraceEvent::Alloc { size, .. } => ("allocation size", *size),
        TraceEvent::Copy { bytes, .. } => ("copy size", *bytes),
        TraceEvent::Evict { bytes, .. } => ("eviction size", *bytes),
        TraceEvent::Oom { size, .. } => ("out-of-memory request", *size),
        TraceEvent::SegmentAlloc { size, .. } | TraceEvent::SegmentFree { size, .. } => {
            ("segment size", *size)
        }
        TraceEvent::Free { .. } | TraceEvent::Plan { .. } => return Ok(()),
    };
    if n as u64 > MAX_EVENT_BYTES {
        return Err(format!(
            "{what} {n} bytes is above the {MAX_EVENT_BYTES}-byte (256 TiB) limit of an event"
        ));
    }
    Ok(())
}

/// A trace that cannot be read or replayed, for `reason`.
pub(crate) fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        what: "trace".to_string(),
        reason,
    }
}
