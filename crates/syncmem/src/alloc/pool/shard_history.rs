//! A shard's events in the history ([`crate::report::record_history`]): the order word and
//! time of each, and the events of the thread caches' hits and of the blocks they take in.
//!
//! Each event of a shard carries the shard's sequence number and is stamped after the shard's
//! newest one; an event of a block whose newest event another thread recorded reads the clock
//! (see [`ring::Recorded`]). So a block's allocation reads before its free, and its free
//! before its next allocation, whichever threads made them and whether a thread cache or its
//! shard served them.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::shard::Shard;
use super::{BlockId, Inner};
use crate::alloc::event;
use crate::alloc::pool::PoolEvent;
use crate::alloc::ring::{self, AllocRecord};

impl<T, V> Inner<T, V> {
    /// The order word of the shard's next event: its key and sequence number in one word
    /// ([`ring::order_word`]).
    #[inline(always)]
    pub(super) fn next_order(&self) -> u64 {
        let order = self.order.get() + 1;
        self.order.set(order);
        order
    }

    /// The earliest time of the shard's next event in the history of `generation`.
    #[inline(always)]
    fn floor(&self, generation: u64) -> u64 {
        let (g, t) = self.last_t.get();
        if g == generation {
            t + 1
        } else {
            0
        }
    }

    /// A block comes back from a thread cache with no event (its free into the cache was
    /// one): the shard's next event in the history is stamped after that free, so after now.
    #[cold]
    #[inline(never)]
    fn silent_free(&self) {
        let generation = event::history_generation();
        if generation != 0 {
            self.stamped(generation, ring::clock(generation));
        }
    }

    /// Notes `t` as the time of the shard's newest event in the history of `generation`.
    #[inline(always)]
    pub(super) fn stamped(&self, generation: u64, t: u64) {
        let (g, last) = self.last_t.get();
        if g != generation || t > last {
            self.last_t.set((generation, t));
        }
    }

    /// Reports allocation `a`: as [`Inner::emit`] when the pool is observed or sinks are
    /// attached; when only the history records, written into the thread's ring straight from
    /// `a` (no event made, no call), after the shard's newest event. Costs the tests of
    /// [`Inner::emit`] when nobody listens. Returns the mark the block's lease keeps
    /// ([`ring::Recorded`]).
    #[inline(always)]
    pub(super) fn emit_alloc<'r>(
        &self,
        label: &str,
        owner: Option<&'r Arc<str>>,
        a: impl FnOnce() -> AllocRecord<'r>,
    ) -> u8 {
        if self.observer.is_none() {
            let Some(source) = self.source else {
                return ring::MARK_UNKNOWN;
            };
            let state = event::state();
            if state == 0 {
                return ring::MARK_UNKNOWN;
            }
            if !event::state_has_sinks(state) {
                let order = self.next_order();
                let generation = state >> 1;
                let floor = self.floor(generation);
                let r: ring::Recorded = ring::record_alloc(
                    generation,
                    source,
                    self.label_key,
                    (order, floor),
                    owner,
                    a,
                );
                self.stamped(generation, r.t);
                return r.mark;
            }
        }
        self.emit_alloc_observed(label, &a());
        ring::MARK_UNKNOWN
    }

    /// [`Inner::emit_observed`] of allocation `a` (out of the allocation path's way).
    #[cold]
    #[inline(never)]
    fn emit_alloc_observed(&self, label: &str, a: &AllocRecord<'_>) {
        self.emit_observed(label, &a.event());
    }

    /// Reports the free of `size` bytes of block `block`, as [`Inner::emit_alloc`]; `mark` is
    /// the block's lease's ([`ring::MARK_SILENT`]: no event, a thread cache gives the block
    /// back and its free was recorded when it went in).
    #[inline(always)]
    pub(super) fn emit_free(&self, label: &str, size: usize, block: u64, mark: u8) {
        if mark == ring::MARK_SILENT {
            self.silent_free();
            return;
        }
        if self.observer.is_none() {
            let Some(source) = self.source else {
                return;
            };
            let state = event::state();
            if state == 0 {
                return;
            }
            if !event::state_has_sinks(state) {
                let order = self.next_order();
                let generation = state >> 1;
                let floor = self.floor(generation);
                let t = ring::record_free(
                    generation,
                    source,
                    self.label_key,
                    (order, floor, mark),
                    (size, block),
                );
                self.stamped(generation, t);
                return;
            }
        }
        self.emit_observed(label, &PoolEvent::Free { size, block });
    }
}

impl<T, V> Shard<T, V> {
    /// Records a thread cache's hit (`a`, made once the event is sure to be written, for a
    /// request of `owner`) in the history of the hook's `state` (not 0); returns the mark of
    /// the lease. No shard order: the block's events were on this thread since it went into
    /// the cache (see [`ring::Recorded`]).
    #[inline(always)]
    pub(super) fn record_cached_alloc<'r>(
        &self,
        state: u64,
        owner: Option<&'r Arc<str>>,
        a: impl FnOnce() -> AllocRecord<'r>,
    ) -> u8 {
        match self.source.load(Relaxed) {
            u64::MAX => ring::MARK_UNKNOWN,
            source => ring::record_alloc(state >> 1, source, self.label_key, (0, 0), owner, a).mark,
        }
    }

    /// Records the free of block `block` (`size` bytes, the lease's `mark`) into a thread
    /// cache in the history of the hook's `state` (not 0).
    #[inline(always)]
    pub(super) fn record_cached_free(&self, state: u64, (size, block): (usize, BlockId), mark: u8) {
        if let source @ 0..=0xffff_ffff_ffff_fffe = self.source.load(Relaxed) {
            let tag = self.tag(block);
            ring::record_free(
                state >> 1,
                source,
                self.label_key,
                (0, 0, mark),
                (size, tag),
            );
        }
    }
}
