//! The arena's invariants, checked by the pool tests.

use super::{pool_index, Arena, State};
use crate::alloc::pool::BlockId;

impl<V> Arena<V> {
    /// Blocks on the exact-size lists (tests).
    pub(crate) fn listed(&self) -> usize {
        self.front.entries().len()
    }

    /// Checks the invariants (tests): blocks of a segment tile it, free sets and lists match
    /// the blocks' states, reserved bytes match the segments.
    pub(crate) fn check(&self) {
        let mut free = [0u64; 2];
        let mut reserved = [0u64; 2];
        let mut inactive = [0u64; 2];
        let mut listed: Vec<BlockId> = self.front.entries().iter().map(|e| e.2).collect();
        listed.sort_unstable();
        let mut cached = Vec::new();
        for (id, b) in self.blocks.iter() {
            if b.prev.is_none() {
                let mut size = 0;
                let mut cur = Some(id);
                while let Some(c) = cur {
                    size += self.blocks[c].size as u64;
                    cur = self.blocks[c].next;
                }
                reserved[pool_index(b.small)] += size;
            }
            if let Some(n) = b.next {
                let nb = &self.blocks[n];
                assert_eq!(nb.prev, Some(id));
                assert_eq!(nb.offset, b.offset + b.size);
                assert_eq!(nb.seg, b.seg);
                assert!(
                    b.state != State::Free || nb.state != State::Free,
                    "two free neighbours not merged"
                );
            }
            let mut streams: Vec<_> = b.pending.iter().map(|p| p.stream).collect();
            streams.sort_unstable();
            streams.dedup();
            assert_eq!(streams.len(), b.pending.len(), "one pending use per stream");
            let in_set = self.free[pool_index(b.small)].contains(&(b.size, id));
            assert_eq!(in_set, b.state == State::Free);
            match b.state {
                State::Free => free[pool_index(b.small)] += b.size as u64,
                State::Cached => cached.push(id),
                State::Allocated => {}
            }
            if b.state != State::Allocated && b.is_split() {
                inactive[pool_index(b.small)] += b.size as u64;
            }
            if b.state != State::Allocated {
                assert!(b.owner.is_none(), "a free block has no owner");
            }
        }
        cached.sort_unstable();
        assert_eq!(cached, listed, "cached blocks are exactly the listed ones");
        assert_eq!(free, self.free_bytes);
        assert_eq!(reserved, self.reserved);
        assert_eq!(
            inactive,
            [self.inactive.small().current, self.inactive.large().current],
            "inactive split bytes"
        );
    }
}
