//! A ring of one thread and one source: slots of machine words, each behind a seqlock (its
//! first word is the sequence number of the event in it, plus one; [`WRITING`] while it is
//! written), so that the one thread writing never waits and readers copy what is complete.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::alloc::stats::Direction;

/// Words of an event (after the sequence word).
pub(crate) const WORDS: usize = 12;

/// Kinds of events (the low byte of word 2).
pub(crate) const ALLOC: u64 = 1;
pub(crate) const FREE: u64 = 2;
pub(crate) const SEGMENT_ALLOC: u64 = 3;
pub(crate) const SEGMENT_FREE: u64 = 4;
pub(crate) const EVICT: u64 = 5;
pub(crate) const OOM: u64 = 6;
pub(crate) const COPY: u64 = 7;

/// Bits of a shard's sequence number in an event's order word (word 3 of a pool event): the
/// shard's key above them. A shard's events are put in order by the number modulo 2^40 (more
/// than a trillion events); keys are unique below 2^24 shards made in the process.
pub(crate) const ORDER_SEQ_BITS: u32 = 40;

/// The order word of event `seq` of the shard keyed `key`.
pub(crate) fn order_word(key: u64, seq: u64) -> u64 {
    key << ORDER_SEQ_BITS | (seq & ((1 << ORDER_SEQ_BITS) - 1))
}

/// The shard key and sequence number of order word `w` ([`order_word`]).
pub(crate) fn split_order(w: u64) -> (u64, u64) {
    (w >> ORDER_SEQ_BITS, w & ((1 << ORDER_SEQ_BITS) - 1))
}

/// The sequence word of a slot being written.
const WRITING: u64 = u64::MAX;

/// Slots per chunk at most (chunks are made at their first use, so that a thread with few
/// events holds little).
const CHUNK_BITS: u32 = 10;

/// One event: its sequence word, then its words.
#[derive(Debug)]
pub(crate) struct Slot([AtomicU64; WORDS + 1]);

impl Slot {
    fn new() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    /// Starts writing (one writer at a time): readers leave the slot alone until [`Slot::end`].
    #[inline(always)]
    pub(crate) fn begin(&self) {
        self.0[0].store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Sets word `i` of the event being written.
    #[inline(always)]
    pub(crate) fn set(&self, i: usize, v: u64) {
        self.0[i + 1].store(v, Ordering::Relaxed);
    }

    /// Ends writing event `seq`.
    #[inline(always)]
    pub(crate) fn end(&self, seq: u64) {
        self.0[0].store(seq + 1, Ordering::Release);
    }

    /// Writes event `seq` whole.
    fn write(&self, seq: u64, w: &[u64; WORDS]) {
        self.begin();
        for (i, v) in w.iter().enumerate() {
            self.set(i, *v);
        }
        self.end(seq);
    }

    /// The event in the slot and its sequence number, when one was written and did not change
    /// while it was copied.
    fn read(&self) -> Option<(u64, [u64; WORDS])> {
        let s = self.0[0].load(Ordering::Acquire);
        if s == 0 || s == WRITING {
            return None;
        }
        let w: [u64; WORDS] = std::array::from_fn(|i| self.0[i + 1].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (self.0[0].load(Ordering::Relaxed) == s).then_some((s - 1, w))
    }
}

/// The ring of one source written by one thread (or, for threads that ended, by the history).
#[derive(Debug)]
pub(crate) struct SourceRing {
    pub(crate) source: u64,
    /// Slots: a power of two, at least the history's number of events.
    mask: u64,
    chunk_bits: u32,
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// Events written (read and written by the writer only; atomic so that the ring is shared).
    /// A thread writing into the ring keeps the number in its hot state and leaves it here
    /// when it switches to another ring.
    next: AtomicU64,
    /// The stacks of its allocations, by sequence number.
    stacks: Mutex<HashMap<u64, Arc<Backtrace>>>,
}

impl SourceRing {
    /// A ring for `source` holding at least `max` events.
    pub(crate) fn new(source: u64, max: usize) -> Self {
        let slots = (max.max(1) as u64).next_power_of_two();
        let chunk_bits = CHUNK_BITS.min(slots.trailing_zeros());
        let chunks = (slots >> chunk_bits) as usize;
        Self {
            source,
            mask: slots - 1,
            chunk_bits,
            chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
            next: AtomicU64::new(0),
            stacks: Mutex::new(HashMap::new()),
        }
    }

    /// The slot of the next event and its sequence number. One writer at a time.
    fn next_slot(&self) -> (u64, &Slot) {
        let seq = self.next.load(Ordering::Relaxed);
        self.next.store(seq + 1, Ordering::Relaxed);
        let i = seq & self.mask;
        let chunk = &self.chunks[(i >> self.chunk_bits) as usize];
        let slots = match chunk.get() {
            Some(c) => c,
            None => self.new_chunk(chunk),
        };
        (seq, &slots[(i & ((1 << self.chunk_bits) - 1)) as usize])
    }

    /// The slots of the events from `seq` on, up to the end of their chunk or to the next
    /// multiple of `sample` (a power of two), whichever comes first (at least one slot); the
    /// chunk is made at its first use. The range points into the ring's memory, which stays
    /// where it is while the ring lives.
    pub(crate) fn run(&self, seq: u64, sample: u64) -> Range<*const Slot> {
        let i = seq & self.mask;
        let len = 1u64 << self.chunk_bits;
        let chunk = &self.chunks[(i >> self.chunk_bits) as usize];
        let slots = match chunk.get() {
            Some(c) => c,
            None => self.new_chunk(chunk),
        };
        let at = i & (len - 1);
        let count = (sample - seq % sample).min(len - at);
        slots[at as usize..(at + count) as usize].as_ptr_range()
    }

    /// The sequence number of the next event (the writer's, while no thread writes into the
    /// ring through its hot state).
    pub(crate) fn next(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Sets the sequence number of the next event (the writer leaving the ring).
    pub(crate) fn set_next(&self, seq: u64) {
        self.next.store(seq, Ordering::Relaxed);
    }

    /// Writes the next event whole; returns its sequence number. One writer at a time.
    pub(crate) fn push(&self, w: &[u64; WORDS]) -> u64 {
        let (seq, slot) = self.next_slot();
        slot.write(seq, w);
        seq
    }

    #[cold]
    fn new_chunk<'a>(&self, chunk: &'a OnceLock<Box<[Slot]>>) -> &'a [Slot] {
        chunk.get_or_init(|| {
            (0..1usize << self.chunk_bits)
                .map(|_| Slot::new())
                .collect()
        })
    }

    /// Keeps the stack of allocation `seq`, dropping the one of the event it replaced.
    pub(crate) fn keep_stack(&self, seq: u64, bt: Arc<Backtrace>) {
        let mut stacks = self.stacks.lock();
        stacks.insert(seq, bt);
        if let Some(old) = seq.checked_sub(self.mask + 1) {
            stacks.remove(&old);
        }
    }

    /// The events held now, in order, with the stacks of those that have one.
    pub(crate) fn events(&self) -> Vec<(u64, [u64; WORDS], Option<Arc<Backtrace>>)> {
        let mut out: Vec<_> = self
            .chunks
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|c| c.iter().filter_map(Slot::read))
            .map(|(seq, w)| (seq, w, None))
            .collect();
        out.sort_unstable_by_key(|(seq, ..)| *seq);
        let stacks = self.stacks.lock();
        if !stacks.is_empty() {
            for (seq, _, bt) in &mut out {
                *bt = stacks.get(seq).cloned();
            }
        }
        out
    }

    /// Appends `events` (of rings of threads that ended, in order) to this one.
    pub(crate) fn absorb(&self, events: Vec<(u64, [u64; WORDS], Option<Arc<Backtrace>>)>) {
        for (_, w, bt) in events {
            let seq = self.push(&w);
            if let Some(bt) = bt {
                self.keep_stack(seq, bt);
            }
        }
    }
}

/// The number of a copy's direction in a slot.
pub(crate) fn direction_code(d: Direction) -> u64 {
    Direction::ALL.iter().position(|x| *x == d).unwrap_or(0) as u64
}

/// The direction numbered `code` ([`direction_code`]).
pub(crate) fn direction_of(code: u64) -> Direction {
    Direction::ALL
        .get(code as usize)
        .copied()
        .unwrap_or(Direction::HostToDevice)
}

#[cfg(test)]
mod tests {
    use super::{order_word, split_order, ORDER_SEQ_BITS};

    #[test]
    fn an_order_word_gives_back_its_key_and_sequence_number() {
        for (key, seq) in [
            (1, 0),
            (1, 1),
            (7, 123_456_789),
            ((1 << 24) - 1, (1 << 40) - 1),
        ] {
            assert_eq!(split_order(order_word(key, seq)), (key, seq));
        }
        // The shard's counter adds one to the word: the sequence number, under the key.
        let w = order_word(3, 41) + 1;
        assert_eq!(split_order(w), (3, 42));
        // A sequence number past its bits is taken modulo 2^40, the key unchanged.
        assert_eq!(split_order(order_word(5, 1 << ORDER_SEQ_BITS)), (5, 0));
    }
}
