//! Memory snapshots: every segment of a pool and every block in it, as
//! `torch.cuda.memory_snapshot()` reports them ([`crate::memory_snapshot`] for all pools of the
//! process, [`crate::Device::pool_snapshots`] for one device's).
//!
//! # Owners
//!
//! A block handed out to a [`crate::SyncedMemory`] (so to a [`crate::Tensor`], a blob, a
//! parameter) names it: the buffer passes its label (the tensor's or blob's name) to the pool
//! when it allocates a mirror, and the pool keeps it with the block until the block is freed.
//! The label is shared, not copied (a reference count), so naming costs no allocation. The
//! pools stay generic: they keep a name, never a tensor. Blocks allocated directly
//! ([`crate::Device::alloc_pooled`], [`crate::HostPool::alloc`]) have no owner.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::PoolKind;
use super::stats::PoolStats;
use super::StreamId;
use crate::alloc::stats::human_bytes;

/// What a block is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BlockState {
    /// Handed out.
    Allocated,
    /// Cached and free for any request that fits it.
    Free,
    /// Cached, but work queued before it was freed may still use it: reusable at once by the
    /// streams of that work, by others once it is done (PyTorch's `active_pending_free`).
    Pending,
}

/// The two size classes of blocks and segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SizeClass {
    /// Blocks up to [`PoolStats::small_size`] (the caching pool's small pool).
    Small,
    /// Larger blocks.
    Large,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockSnapshot {
    /// Start in its segment.
    pub offset: u64,
    /// Bytes the block occupies.
    pub size: u64,
    /// Bytes asked for (0 unless allocated).
    pub requested: u64,
    /// What the block is doing.
    pub state: BlockState,
    /// The stream it is (or was last) handed out for; 0 for host memory.
    pub stream: StreamId,
    /// The label of the buffer that holds it (a tensor's or blob's name), when known.
    pub owner: Option<String>,
}

/// One segment (a backend allocation) and its blocks, in address order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SegmentSnapshot {
    /// The segment's id in its pool.
    pub id: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The size class of the blocks it serves.
    pub class: SizeClass,
    /// Its blocks, tiling it.
    pub blocks: Vec<BlockSnapshot>,
}

impl SegmentSnapshot {
    /// Bytes of the blocks in `state`.
    pub fn bytes_in(&self, state: BlockState) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == state)
            .map(|b| b.size)
            .sum()
    }
}

/// One pool: its statistics and its segments, read at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolSnapshot {
    /// The pool's label (`host`, `opencl:0`, `opencl:0 pinned`, ...).
    pub label: String,
    /// Its kind.
    pub kind: PoolKind,
    /// Its statistics at the same instant: the segments' sizes add up to
    /// `stats.reserved.current`, the allocated blocks' to `stats.allocated.current`.
    pub stats: PoolStats,
    /// Every segment, by id.
    pub segments: Vec<SegmentSnapshot>,
}

impl PoolSnapshot {
    /// Every block with its segment.
    pub fn blocks(&self) -> impl Iterator<Item = (&SegmentSnapshot, &BlockSnapshot)> {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter().map(move |b| (s, b)))
    }

    /// Bytes of the blocks in `state`, over every segment.
    pub fn bytes_in(&self, state: BlockState) -> u64 {
        self.segments.iter().map(|s| s.bytes_in(state)).sum()
    }
}

/// Every pool of the process (see [`crate::memory_snapshot`]): the host pool, then each opened
/// device's device pool and pinned host pool (pools not used yet are left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemorySnapshot {
    /// The pools.
    pub pools: Vec<PoolSnapshot>,
}

impl MemorySnapshot {
    /// A snapshot of these pools.
    pub fn new(pools: Vec<PoolSnapshot>) -> Self {
        Self { pools }
    }

    /// The pool labelled `label`.
    pub fn pool(&self, label: &str) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| p.label == label)
    }

    /// The snapshot as one JSON object (`{"pools": [...]}`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One line per pool and per segment: sizes, block counts by state, and the owners of the
/// allocated blocks.
impl fmt::Display for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.pools {
            writeln!(
                f,
                "pool {} ({}): {} reserved in {} segment(s), {} allocated",
                p.label,
                p.kind,
                human_bytes(p.stats.reserved.current),
                p.segments.len(),
                human_bytes(p.stats.allocated.current)
            )?;
            for s in &p.segments {
                let count = |st| s.blocks.iter().filter(|b| b.state == st).count();
                write!(
                    f,
                    "  segment {} ({:?}, {}): {} allocated, {} free, {} pending",
                    s.id,
                    s.class,
                    human_bytes(s.size),
                    count(BlockState::Allocated),
                    count(BlockState::Free),
                    count(BlockState::Pending)
                )?;
                let owners: Vec<&str> =
                    s.blocks.iter().filter_map(|b| b.owner.as_deref()).collect();
                if !owners.is_empty() {
                    write!(f, "; {}", owners.join(", "))?;
                }
                writeln!(f)?;
            }
        }
        Ok(())
    }
}
