//! Exact-size free lists in front of the best-fit arena: the fast path of small blocks.
//!
//! A freed small block (at most [`super::PoolConfig::size_class_limit`]) whose uses in flight
//! are all on one stream is not merged into the arena: it goes on the list of its size class
//! (its size divided by the rounding unit) for that stream, and the next request of the same
//! class on that stream takes it back. Both are a push or a pop on a `Vec` that keeps its
//! capacity, so once a program has allocated every size it uses, a cycle of allocations and
//! frees costs O(1) and allocates nothing. Reuse on the list's own stream needs no fence check:
//! the stream runs in order.
//!
//! Larger blocks get a short list of their own: the [`LARGE_SLOTS`] most recently freed, each
//! reused by the next request of exactly its size on its stream (a program that frees and
//! allocates the same big buffer again, step after step, so never searches the arena); when the
//! list is full, its oldest block goes into the arena.
//!
//! The lists hold block ids only; the blocks stay in the arena, marked cached, so the arena's
//! invariants (segments tiled by blocks) hold throughout. When the arena cannot serve a request
//! without a new segment, and before any segment is given back, the lists are flushed: every
//! cached block is merged back into the arena, so cached blocks never make the pool reserve
//! more than the best-fit arena alone would.

use super::{BlockId, StreamId};

/// The lists of one stream, indexed by size class.
struct StreamLists {
    stream: StreamId,
    /// `lists[c]` holds free blocks of exactly `c` rounding units, most recently freed last.
    lists: Vec<Vec<BlockId>>,
}

/// Lists of classes above the largest in use that a stream's table of lists has room for.
const SLACK: usize = 8;
/// The capacity of a new list, in blocks (128 bytes).
const MIN_LIST: usize = 16;

/// How many large blocks (above the size-class limit) the large list holds.
pub(crate) const LARGE_SLOTS: usize = 4;

/// A large block on the large list.
#[derive(Clone, Copy)]
struct Large {
    stream: StreamId,
    size: usize,
    id: BlockId,
}

/// Exact-size free lists per stream.
#[derive(Default)]
pub(crate) struct Front {
    streams: Vec<StreamLists>,
    /// Large blocks, most recently freed last (at most [`LARGE_SLOTS`]).
    large: Vec<Large>,
    /// Blocks on all lists.
    count: usize,
    /// Bytes of the blocks on all lists.
    bytes: u64,
}

impl Front {
    #[inline]
    fn lists_of(&mut self, stream: StreamId) -> Option<&mut StreamLists> {
        // Few streams use a pool; the first is nearly always the one asked for.
        self.streams.iter_mut().find(|s| s.stream == stream)
    }

    /// Takes a free block of `class` rounding units (`size` bytes) for work on `stream`.
    #[inline]
    pub(crate) fn pop(&mut self, stream: StreamId, class: usize, size: usize) -> Option<BlockId> {
        if self.count == 0 {
            return None;
        }
        let id = self.lists_of(stream)?.lists.get_mut(class)?.pop()?;
        self.count -= 1;
        self.bytes -= size as u64;
        Some(id)
    }

    /// Puts free block `id` of `class` rounding units (`size` bytes) on `stream`'s list.
    #[inline]
    pub(crate) fn push(&mut self, stream: StreamId, class: usize, size: usize, id: BlockId) {
        match self.lists_of(stream).and_then(|s| s.lists.get_mut(class)) {
            Some(list) => list.push(id),
            None => self.push_new(stream, class, id),
        }
        self.count += 1;
        self.bytes += size as u64;
    }

    /// `push` for a stream or class seen for the first time.
    #[cold]
    fn push_new(&mut self, stream: StreamId, class: usize, id: BlockId) {
        let pos = match self.streams.iter().position(|s| s.stream == stream) {
            Some(p) => p,
            None => {
                self.streams.push(StreamLists {
                    stream,
                    lists: Vec::new(),
                });
                self.streams.len() - 1
            }
        };
        let lists = &mut self.streams[pos].lists;
        if lists.len() <= class {
            // Room past the last list: its header (written by every push and pop) is not at
            // the end of the allocation, next to memory another shard may write.
            lists.reserve(class + 1 + SLACK - lists.len());
            lists.resize_with(class + 1, Vec::new);
        }
        let list = &mut lists[class];
        if list.capacity() == 0 {
            // A cache line and more of its own, not a few bytes beside another shard's list.
            list.reserve_exact(MIN_LIST);
        }
        list.push(id);
    }

    /// Takes the large block of exactly `size` bytes most recently freed for `stream`.
    #[inline]
    pub(crate) fn pop_large(&mut self, stream: StreamId, size: usize) -> Option<BlockId> {
        let pos = self
            .large
            .iter()
            .rposition(|l| l.size == size && l.stream == stream)?;
        // The newest, the usual hit, is the last: popped (a `remove` calls `memmove`).
        let l = if pos + 1 == self.large.len() {
            self.large.pop()?
        } else {
            self.large.remove(pos)
        };
        self.count -= 1;
        self.bytes -= size as u64;
        Some(l.id)
    }

    /// Puts large block `id` of `size` bytes on the large list of `stream`. When the list was
    /// full, returns its oldest block, which the caller puts into the arena.
    #[inline]
    pub(crate) fn push_large(
        &mut self,
        stream: StreamId,
        size: usize,
        id: BlockId,
    ) -> Option<(BlockId, usize)> {
        let out = if self.large.len() >= LARGE_SLOTS {
            let old = self.large.remove(0);
            self.count -= 1;
            self.bytes -= old.size as u64;
            Some((old.id, old.size))
        } else {
            if self.large.capacity() == 0 {
                self.large.reserve_exact(LARGE_SLOTS);
            }
            None
        };
        self.large.push(Large { stream, size, id });
        self.count += 1;
        self.bytes += size as u64;
        out
    }

    /// Empties every list (keeping their capacity) and returns the blocks they held.
    pub(crate) fn drain(&mut self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.count);
        for s in &mut self.streams {
            for l in &mut s.lists {
                out.append(l);
            }
        }
        out.extend(self.large.drain(..).map(|l| l.id));
        self.count = 0;
        self.bytes = 0;
        out
    }

    /// True when no block is on any list.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the blocks on the lists.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The largest block on the large list.
    pub(crate) fn largest_large(&self) -> Option<usize> {
        self.large.iter().map(|l| l.size).max()
    }

    /// The largest class with a block on some list.
    pub(crate) fn largest_class(&self) -> Option<usize> {
        if self.count == 0 {
            return None;
        }
        self.streams
            .iter()
            .filter_map(|s| s.lists.iter().rposition(|l| !l.is_empty()))
            .max()
    }

    /// Every listed block with its stream and class (`usize::MAX`: the large list; tests).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<(StreamId, usize, BlockId)> {
        let mut v = Vec::new();
        for s in &self.streams {
            for (c, l) in s.lists.iter().enumerate() {
                v.extend(l.iter().map(|&id| (s.stream, c, id)));
            }
        }
        v.extend(self.large.iter().map(|l| (l.stream, usize::MAX, l.id)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_per_stream_and_exact_size() {
        let mut f = Front::default();
        assert!(f.is_empty());
        assert_eq!(f.pop(1, 2, 1024), None);
        f.push(1, 2, 1024, 10);
        f.push(1, 2, 1024, 11);
        f.push(2, 2, 1024, 12);
        f.push(1, 3, 1536, 13);
        assert_eq!(f.bytes(), 3 * 1024 + 1536);
        assert_eq!(f.pop(1, 2, 1024), Some(11), "most recently freed first");
        assert_eq!(
            f.pop(2, 3, 1536),
            None,
            "another stream's class 3 is not shared"
        );
        assert_eq!(f.pop(3, 2, 1024), None, "an unknown stream has nothing");
        assert_eq!(f.pop(1, 4, 2048), None, "a larger class is not split");
        let mut rest = f.drain();
        rest.sort_unstable();
        assert_eq!(rest, [10, 12, 13]);
        assert!(f.is_empty());
        assert_eq!(f.bytes(), 0);
        assert_eq!(f.pop(1, 2, 1024), None);
    }

    #[test]
    fn the_large_list_keeps_the_newest_blocks_and_matches_exactly() {
        let mut f = Front::default();
        for (i, size) in [4 << 20, 8 << 20, 4 << 20, 16 << 20]
            .into_iter()
            .enumerate()
        {
            assert_eq!(f.push_large(1, size, i as BlockId), None);
        }
        assert_eq!(f.bytes(), 32 << 20);
        assert_eq!(f.largest_large(), Some(16 << 20));
        assert_eq!(
            f.pop_large(2, 4 << 20),
            None,
            "another stream's block is not shared"
        );
        assert_eq!(f.pop_large(1, 6 << 20), None, "sizes match exactly");
        assert_eq!(
            f.pop_large(1, 4 << 20),
            Some(2),
            "most recently freed first"
        );
        assert_eq!(f.push_large(2, 32 << 20, 4), None);
        assert_eq!(
            f.push_large(2, 32 << 20, 5),
            Some((0, 4 << 20)),
            "a full list gives up its oldest block"
        );
        assert_eq!(f.bytes(), (8 + 16 + 32 + 32) << 20);
        let mut rest = f.drain();
        rest.sort_unstable();
        assert_eq!(rest, [1, 3, 4, 5]);
        assert!(f.is_empty());
        assert_eq!(f.bytes(), 0);
    }
}
