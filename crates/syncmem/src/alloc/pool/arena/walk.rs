//! The arena's blocks, segment by segment, for memory snapshots.

use super::{Arena, State};
use crate::alloc::pool::snapshot::{BlockSnapshot, BlockState};
use crate::alloc::pool::{in_flight, SegId};

impl<V> Arena<V> {
    /// Every segment (with its pool: small or not) and its blocks in address order.
    pub(crate) fn walk(&self) -> Vec<(SegId, bool, Vec<BlockSnapshot>)> {
        let mut out = Vec::new();
        for (head, b) in self.blocks.iter().filter(|(_, b)| b.prev.is_none()) {
            let mut blocks = Vec::new();
            let mut cur = Some(head);
            while let Some(id) = cur {
                let b = &self.blocks[id];
                let state = match b.state {
                    State::Allocated => BlockState::Allocated,
                    _ if in_flight(&b.pending) => BlockState::Pending,
                    _ => BlockState::Free,
                };
                blocks.push(BlockSnapshot {
                    offset: b.offset as u64,
                    size: b.size as u64,
                    requested: b.requested as u64,
                    state,
                    stream: b.stream,
                    owner: b.owner.as_deref().map(str::to_string),
                });
                cur = b.next;
            }
            out.push((b.seg, b.small, blocks));
        }
        out
    }
}
