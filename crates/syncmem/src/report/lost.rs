//! Allocations of a bounded history whose free is not among the events kept.
//!
//! Each thread's ring keeps its own newest events, and the rings of threads that ended are
//! merged and cut again; so a block's free can be dropped (a thread that freed many blocks and
//! ended) while its allocation, in a ring that holds fewer events, is kept. A trace with that
//! allocation would show the block live until the end, under the next allocation over the same
//! bytes. The free is known to be lost when that next allocation comes, or when the block's
//! segment is given back with the block in it: such allocations are left out, as a free whose
//! allocation was dropped is (so that every view, replay and export takes the trace).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::alloc::pool::PoolEvent;
use crate::alloc::ring::{RawEvent, RawWhat};

/// A pool's blocks: by source, label and the pool's block id.
type BlockKey<'a> = (u64, &'a str, u64);
/// A pool's segment: by source, label and the pool's segment id.
type SegKey<'a> = (u64, &'a str, u64);

/// The indexes in `events` of allocations whose free is lost (see the module notes).
pub(super) fn lost_frees(events: &[RawEvent]) -> HashSet<usize> {
    // Live blocks per segment: offset -> (end, index of the allocation, block id).
    let mut live: HashMap<SegKey<'_>, BTreeMap<usize, (usize, usize, u64)>> = HashMap::new();
    // Where each live block lies: its segment and offset.
    let mut at: HashMap<BlockKey<'_>, (u64, usize)> = HashMap::new();
    let mut lost = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let RawWhat::Pool(event, ..) = &e.what else {
            continue;
        };
        let label: &str = &e.label;
        match *event {
            PoolEvent::Alloc {
                block,
                segment,
                offset,
                size,
                ..
            } => {
                let end = offset.saturating_add(size.max(1));
                let blocks = live.entry((e.source, label, segment)).or_default();
                // Blocks lie apart, so those over [offset, end) are the last ones starting
                // before `end` whose ends pass `offset`.
                let over: Vec<usize> = blocks
                    .range(..end)
                    .rev()
                    .take_while(|(_, (b_end, ..))| *b_end > offset)
                    .map(|(o, _)| *o)
                    .collect();
                for o in over {
                    if let Some((_, index, id)) = blocks.remove(&o) {
                        lost.insert(index);
                        at.remove(&(e.source, label, id));
                    }
                }
                // The same block id live elsewhere (its free lost too).
                if let Some((seg, off)) = at.insert((e.source, label, block), (segment, offset)) {
                    if let Some(b) = live.get_mut(&(e.source, label, seg)) {
                        if let Some((_, index, _)) = b.remove(&off) {
                            lost.insert(index);
                        }
                    }
                }
                live.entry((e.source, label, segment))
                    .or_default()
                    .insert(offset, (end, i, block));
            }
            PoolEvent::Free { block, .. } => {
                if let Some((seg, off)) = at.remove(&(e.source, label, block)) {
                    if let Some(b) = live.get_mut(&(e.source, label, seg)) {
                        b.remove(&off);
                    }
                }
            }
            PoolEvent::SegmentFree { segment, .. } => {
                if let Some(blocks) = live.remove(&(e.source, label, segment)) {
                    for (_, (_, index, id)) in blocks {
                        lost.insert(index);
                        at.remove(&(e.source, label, id));
                    }
                }
            }
            _ => {}
        }
    }
    lost
}
