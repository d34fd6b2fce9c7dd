//! Memory snapshots in PyTorch's format, for PyTorch's memory tools.
//!
//! `torch.cuda.memory._dump_snapshot()` pickles the dict that `torch.cuda.memory._snapshot()`
//! returns; PyTorch's viewer (`pytorch.org/memory_viz`, stacked allocations over time, the
//! segment map, the list of allocator events) and `python -m torch.cuda._memory_viz`
//! (`stats`, `trace`, ...) read it, as do the tools of other backends that copied the
//! format. [`TorchSnapshot`] is that dict, made from a [`Trace`]
//! ([`TorchSnapshot::from_trace`]: the final state and the history) or from a
//! [`MemorySnapshot`] of the pools now ([`TorchSnapshot::from_snapshot`]: the state only),
//! ([`TorchSnapshot::from_trace_at`]: the state at an instant [`At`], the peak by default in
//! `syncmem trace export-torch`, and the history up to it)
//! and [`TorchSnapshot::write_pickle`] writes it as a protocol-3 pickle (the viewer reads
//! protocols 2 to 4 only; write yours with `protocol=4` at most when you re-pickle it in
//! Python 3.14 or later, whose default is 5).
//!
//! # The mapping
//!
//! - Each pool (`opencl:0`, `opencl:0 pinned`, `host`) is a device ordinal: device pools in
//!   order of first appearance, then pinned pools, then the host pool (as PyTorch gives CPU
//!   memory the ordinal after the last GPU); `device_labels` (a key of syncmem's own, which
//!   PyTorch's tools ignore) lists the labels by ordinal.
//! - Segments keep their sizes, blocks their offsets, rounded sizes and requested sizes.
//!   Addresses are made up: OpenCL buffers have none, so each segment gets a range of its
//!   own (the first at `0x10_0000_0000`, never reused), and a block's address is its
//!   segment's plus its offset.
//! - Every block is named by a first frame `{"filename": pool label, "line": step (0 when
//!   none was marked), "name": owner}` (`"(no owner)"` for a block handed out without a
//!   name); a block allocated while an operator ran has a second one,
//!   `{"filename": "(operator)", "line": step, "name": op}`, and one recorded with stacks
//!   ([`super::TRACE_STACKS_ENV`]) its call stack after them, innermost first.
//! - A free is `free_requested` then `free_completed` at once (the viewer shows them as one
//!   `free`); an out-of-memory failure is `oom` with `device_free` 0 (the pool does not know
//!   what the driver has left). Copies and evictions have no PyTorch action and are left out
//!   (the free of an evicted mirror's block is there).
//! - Traces written before placements were recorded get one segment per block, of the
//!   block's size rounded up to 512 bytes.
//!
//! The blocks of every segment tile it (gaps are `inactive` blocks) and, for a trace that
//! began with empty pools, replaying the history backwards from the final state ends with no
//! segment and no block: the two things the viewer relies on.

use std::io::Write;
use std::path::Path;

mod at;
mod convert;

pub use at::At;

use super::frames::Frame;
use super::pickle::Pickler;
use super::trace::Trace;
use crate::alloc::pool::{BlockState, MemorySnapshot, StreamId};
use crate::error::Result;

/// The address of the first segment of every device.
const BASE: u64 = 0x10_0000_0000;
/// Segments start on this alignment.
const ALIGN: u64 = 512;
/// Segments larger than this are `"large"` (PyTorch's large pool), the others `"small"`.
const SMALL_SEGMENT: u64 = 1 << 20;

/// What a block of a [`TorchSegment`] is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchState {
    /// `active_allocated`: handed out.
    Allocated,
    /// `active_pending_free`: freed, with work queued before the free that may still use it.
    PendingFree,
    /// `inactive`: free.
    Inactive,
}

impl TorchState {
    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            TorchState::Allocated => "active_allocated",
            TorchState::PendingFree => "active_pending_free",
            TorchState::Inactive => "inactive",
        }
    }
}

/// The frame that names a block: its pool, step and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchFrame {
    /// `filename`: the pool's label.
    pub pool: String,
    /// `line`: the step marked when the block was allocated (0: none).
    pub step: u64,
    /// `name`: the owner's label, `"(no owner)"` when the block had none.
    pub owner: String,
    /// The operator running at the allocation, written as a second frame
    /// `{"filename": "(operator)", "line": step, "name": op}`.
    pub op: Option<String>,
    /// The allocation's call stack, innermost first, written after those two frames.
    pub stack: Vec<Frame>,
}

/// A block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchBlock {
    /// Bytes it occupies.
    pub size: u64,
    /// Bytes asked for (0 for an inactive block).
    pub requested_size: u64,
    /// What it is doing.
    pub state: TorchState,
    /// Who holds it (none for an inactive block).
    pub frame: Option<TorchFrame>,
}

/// A segment and its blocks, which tile it in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchSegment {
    /// Device ordinal.
    pub device: usize,
    /// Start address (made up, see the module docs).
    pub address: u64,
    /// Bytes.
    pub total_size: u64,
    /// The stream of the allocation that made it.
    pub stream: StreamId,
    /// Its blocks.
    pub blocks: Vec<TorchBlock>,
}

/// The action of a [`TorchEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchAction {
    /// `alloc`.
    Alloc,
    /// `free_requested`.
    FreeRequested,
    /// `free_completed`.
    FreeCompleted,
    /// `segment_alloc`.
    SegmentAlloc,
    /// `segment_free`.
    SegmentFree,
    /// `oom`.
    Oom,
}

impl TorchAction {
    /// The name PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            TorchAction::Alloc => "alloc",
            TorchAction::FreeRequested => "free_requested",
            TorchAction::FreeCompleted => "free_completed",
            TorchAction::SegmentAlloc => "segment_alloc",
            TorchAction::SegmentFree => "segment_free",
            TorchAction::Oom => "oom",
        }
    }
}

/// One event of a device's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchEntry {
    /// What happened.
    pub action: TorchAction,
    /// The block's or segment's address (absent from an `oom`, which has `device_free` 0).
    pub addr: u64,
    /// Bytes asked for (`alloc`, frees, `oom`) or of the segment.
    pub size: u64,
    /// The stream.
    pub stream: StreamId,
    /// Microseconds since the trace began.
    pub time_us: u64,
    /// Who held the block (block events only).
    pub frame: Option<TorchFrame>,
}

/// The dict of `torch.cuda.memory._snapshot()` (see the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchSnapshot {
    /// The pool label of each device ordinal.
    pub device_labels: Vec<String>,
    /// Every segment alive at the end, of every device.
    pub segments: Vec<TorchSegment>,
    /// The history of each device ordinal, oldest first.
    pub device_traces: Vec<Vec<TorchEntry>>,
}

/// The device ordinals of pool labels: devices, then pinned pools, then the host pool.
fn ordinals<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in labels {
        if !out.iter().any(|o| o == l) {
            out.push(l.to_string());
        }
    }
    out.sort_by_key(|l| match l.as_str() {
        "host" => 2,
        l if l.ends_with(" pinned") => 1,
        _ => 0,
    });
    out
}

fn frame(pool: &str, step: Option<u64>, owner: Option<&str>) -> TorchFrame {
    TorchFrame {
        pool: pool.to_string(),
        step: step.unwrap_or(0),
        owner: owner.unwrap_or("(no owner)").to_string(),
        op: None,
        stack: Vec::new(),
    }
}

impl TorchSnapshot {
    /// The final state and the history of `trace` (see the [module docs](self)).
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] for a trace that allocates a block id twice or places two
    /// live blocks over each other.
    pub fn from_trace(trace: &Trace) -> Result<TorchSnapshot> {
        trace.with_stamped(convert::from_events)
    }

    /// The pools of `snapshot` now, without history (every device's trace is empty).
    pub fn from_snapshot(snapshot: &MemorySnapshot) -> TorchSnapshot {
        let labels = ordinals(snapshot.pools.iter().map(|p| p.label.as_str()));
        let mut segments = Vec::new();
        for (device, label) in labels.iter().enumerate() {
            let mut addr = BASE;
            for pool in snapshot.pools.iter().filter(|p| &p.label == label) {
                for s in &pool.segments {
                    let mut stream = None;
                    let blocks = s
                        .blocks
                        .iter()
                        .map(|b| {
                            let state = match b.state {
                                BlockState::Allocated => TorchState::Allocated,
                                BlockState::Pending => TorchState::PendingFree,
                                BlockState::Free => TorchState::Inactive,
                            };
                            let active = state != TorchState::Inactive;
                            if active {
                                stream.get_or_insert(b.stream);
                            }
                            TorchBlock {
                                size: b.size,
                                requested_size: if active { b.requested } else { 0 },
                                state,
                                frame: active.then(|| frame(label, None, b.owner.as_deref())),
                            }
                        })
                        .collect();
                    segments.push(TorchSegment {
                        device,
                        address: addr,
                        total_size: s.size,
                        stream: stream.unwrap_or(0),
                        blocks,
                    });
                    addr += s.size.max(1).div_ceil(ALIGN) * ALIGN;
                }
            }
        }
        TorchSnapshot {
            device_traces: vec![Vec::new(); labels.len()],
            device_labels: labels,
            segments,
        }
    }

    /// Writes the snapshot as a pickle (protocol 3) to `out`.
    ///
    /// # Errors
    /// The writer's error.
    pub fn write_pickle<W: Write>(&self, out: W) -> std::io::Result<W> {
        let mut p = Pickler::new(out)?;
        p.dict()?;
        p.key("segments")?;
        p.list()?;
        for s in &self.segments {
            write_segment(&mut p, s)?;
        }
        p.end()?;
        p.key("device_traces")?;
        p.list()?;
        for t in &self.device_traces {
            p.list()?;
            for e in t {
                write_entry(&mut p, e)?;
            }
            p.end()?;
        }
        p.end()?;
        p.key("device_labels")?;
        p.list()?;
        for l in &self.device_labels {
            p.str(l)?;
        }
        p.end()?;
        p.end()?;
        p.finish()
    }

    /// The snapshot as the bytes of a pickle.
    pub fn to_pickle(&self) -> Vec<u8> {
        // Writing to memory cannot fail.
        self.write_pickle(Vec::new()).unwrap_or_default()
    }

    /// Writes the snapshot as a pickle into the file `path`, replacing it atomically through a
    /// temporary file ([`crate::file::write_atomic`]: a symbolic link is followed; a directory,
    /// a device node, a FIFO or a socket is refused).
    ///
    /// # Errors
    /// [`crate::Error::Io`] naming the file.
    pub fn save_file(&self, path: &Path) -> Result<()> {
        crate::file::write_atomic(path, |out| self.write_pickle(out).map(drop))
    }
}

fn write_frames<W: Write>(p: &mut Pickler<W>, f: Option<&TorchFrame>) -> std::io::Result<()> {
    p.key("frames")?;
    p.list()?;
    if let Some(f) = f {
        write_frame(p, &f.pool, f.step, &f.owner)?;
        if let Some(op) = &f.op {
            write_frame(p, "(operator)", f.step, op)?;
        }
        for s in &f.stack {
            write_frame(p, &s.filename, s.line, &s.name)?;
        }
    }
    p.end()
}

fn write_frame<W: Write>(
    p: &mut Pickler<W>,
    filename: &str,
    line: u64,
    name: &str,
) -> std::io::Result<()> {
    p.dict()?;
    p.key("filename")?;
    p.str(filename)?;
    p.key("line")?;
    p.uint(line)?;
    p.key("name")?;
    p.str(name)?;
    p.end()
}

fn write_segment<W: Write>(p: &mut Pickler<W>, s: &TorchSegment) -> std::io::Result<()> {
    let sum = |f: &dyn Fn(&TorchBlock) -> u64| s.blocks.iter().map(f).sum::<u64>();
    let active = |b: &TorchBlock| b.state != TorchState::Inactive;
    p.dict()?;
    p.key("device")?;
    p.uint(s.device as u64)?;
    p.key("address")?;
    p.uint(s.address)?;
    p.key("total_size")?;
    p.uint(s.total_size)?;
    p.key("allocated_size")?;
    p.uint(sum(&|b| {
        if b.state == TorchState::Allocated {
            b.size
        } else {
            0
        }
    }))?;
    p.key("active_size")?;
    p.uint(sum(&|b| if active(b) { b.size } else { 0 }))?;
    p.key("requested_size")?;
    p.uint(sum(&|b| b.requested_size))?;
    p.key("stream")?;
    p.uint(s.stream)?;
    p.key("segment_type")?;
    p.str(if s.total_size > SMALL_SEGMENT {
        "large"
    } else {
        "small"
    })?;
    p.key("is_expandable")?;
    p.bool(false)?;
    write_frames(p, None)?;
    p.key("blocks")?;
    p.list()?;
    let mut addr = s.address;
    for b in &s.blocks {
        p.dict()?;
        p.key("address")?;
        p.uint(addr)?;
        p.key("size")?;
        p.uint(b.size)?;
        p.key("requested_size")?;
        p.uint(b.requested_size)?;
        p.key("state")?;
        p.str(b.state.as_str())?;
        write_frames(p, b.frame.as_ref())?;
        p.end()?;
        addr += b.size;
    }
    p.end()?;
    p.end()
}

fn write_entry<W: Write>(p: &mut Pickler<W>, e: &TorchEntry) -> std::io::Result<()> {
    p.dict()?;
    p.key("action")?;
    p.str(e.action.as_str())?;
    if e.action == TorchAction::Oom {
        p.key("device_free")?;
        p.uint(0)?;
    } else {
        p.key("addr")?;
        p.uint(e.addr)?;
    }
    p.key("size")?;
    p.uint(e.size)?;
    p.key("stream")?;
    p.uint(e.stream)?;
    p.key("time_us")?;
    p.uint(e.time_us)?;
    write_frames(p, e.frame.as_ref())?;
    p.end()
}
