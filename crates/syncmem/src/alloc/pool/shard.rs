//! Shards: a pool's blocks split over independent parts, each behind its own lock, so threads
//! allocating at the same time do not queue on one lock (and one cache line).
//!
//! A thread takes the shard of its index in the process (numbered in the order threads first
//! use a pool), modulo the pool's shard count ([`super::PoolConfig::shards`]); a lease goes
//! back to the shard it came from, whichever thread drops it. Each shard is a whole pool of
//! its own (segments, best-fit arena, exact-size lists, counters); they share the label, the
//! configuration and the budget (the memory cap holds for all of them together). The ids a
//! shard reports (blocks and segments, in events and snapshots) are its own ids times the
//! number of shards plus its index, so they stay unique in the pool (and are the shard's own
//! with one shard).
//!
//! Readings add the shards up. Current values and cumulative counts are exact. A peak is the
//! sum of the shards' peaks: exact while one shard is in use (one thread allocating, or one
//! shard), otherwise an upper bound (the shards need not have peaked at the same time).
//!
//! A lease takes no reference count: it points at its shard, which the pool holds. A pool
//! dropped while blocks are still handed out gives each busy shard to its blocks, and the last
//! one given back drops it (and gives its cached segments' budget back).
//!
//! Measured on a 2-core VM, 4 KiB allocate + free on one host pool, wall time per operation:
//! with one lock and a reference count of the pool per lease, 96-127 ns from 8 threads against
//! 56-66 ns for the system allocator, and 77 ns from one thread; with a shard per core and no
//! count, 36-42 ns from 2 threads and 37-57 ns from 8 (the system allocator 48-62 ns in the
//! same runs; the figures move with the VM's load), and 64 ns from one thread. Short samples
//! (20,000 operations per thread) showed 2 threads at 97-107 ns: the shards' exact-size lists
//! were allocations of a few bytes, side by side in one cache line, written by both threads.
//! With each list a cache line and more of its own ([`super::front`]): 35-37 ns from 2 threads
//! and 44-45 ns from 8, against 47 and 59-61 ns for the system allocator.

use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use super::stats::{Counters, PoolUsage};
use super::{BlockId, Inner, Keep, Pool, SegId};
use super::{Budget, PendingUse, PoolEvent, PoolObserver, PoolStats};
use crate::alloc::event;
use crate::error::{Error, Result};

/// One shard: aligned to its own cache lines, so that the shards' locks do not share one.
#[repr(align(128))]
pub(super) struct Shard<T, V> {
    /// Its index in the pool.
    pub(super) index: usize,
    /// The pool's number of shards.
    pub(super) count: usize,
    /// The pool's label.
    pub(super) label: Arc<str>,
    /// The pool's budget.
    pub(super) budget: Arc<Budget>,
    /// The key of the pool's thread caches (0: none; see [`super::tcache`]).
    pub(super) cache_key: u64,
    /// The most bytes of a thread cache.
    pub(super) cache_limit: usize,
    /// Who listens to the shard's events, readable without its lock: [`OBSERVED`],
    /// [`PUBLISHED`].
    pub(super) listened: AtomicU8,
    /// The source of a published pool ([`Pool::publish`]; `u64::MAX`: none), readable without
    /// its lock, for its thread caches' events.
    pub(super) source: AtomicU64,
    /// The pool's label, numbered for the events (as [`Inner`]'s).
    pub(super) label_key: u32,
    pub(super) inner: Mutex<Inner<T, V>>,
}

/// [`Shard::listened`]: an observer is attached.
const OBSERVED: u8 = 1;
/// [`Shard::listened`]: the pool publishes to the process-wide sinks and history.
const PUBLISHED: u8 = 2;

impl<T, V> Shard<T, V> {
    /// True when no event of the shard would be seen now: no observer, and no sink or history
    /// recording a published pool. Host blocks enter and leave thread caches only then (see
    /// [`super::tcache`]; device blocks: [`Shard::cache_state`]).
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        match self.listened.load(Relaxed) {
            0 => true,
            PUBLISHED => event::state() == 0,
            _ => false,
        }
    }

    /// Whether a device block may enter or leave a thread cache now, and what its events
    /// become: `Some(0)` when nobody listens; `Some(state)` (the hook's [`event::state`])
    /// when only the history records, into which the cache writes its hits and the blocks it
    /// takes in ([`Shard::record_cached_alloc`], [`Shard::record_cached_free`]); `None` while
    /// the pool is observed or sinks are attached (they see every event in its shard's
    /// order: no block enters or leaves a cache).
    #[inline(always)]
    pub(super) fn cache_state(&self) -> Option<u64> {
        match self.listened.load(Relaxed) {
            0 => Some(0),
            PUBLISHED => {
                let state = event::state();
                (!event::state_has_sinks(state)).then_some(state)
            }
            _ => None,
        }
    }

    /// Names `owner` as the owner of `block`, handed out (see `Pool::alloc_device`).
    pub(super) fn rename(&self, block: BlockId, owner: Option<&Arc<str>>) {
        self.inner.lock().core.rename(block, owner);
    }

    /// The id the shard reports for its own id `local` (a block's or a segment's): unique in
    /// the pool, and `local` itself when the pool has one shard.
    #[inline]
    pub(super) fn tag(&self, local: u64) -> u64 {
        local * self.count as u64 + self.index as u64
    }

    /// Gives back block `block` of the shard at `shard`, `size` bytes (`requested` asked for;
    /// `small` as handed out, `mark` its lease's mark in the history: see
    /// [`Inner::emit_free`]), with its uses in flight and its view. When the pool is gone
    /// and this was the shard's last block handed out, drops the shard.
    ///
    /// # Safety
    /// `shard` points to a live shard of which `block` is handed out, and the block is given
    /// back once.
    pub(super) unsafe fn release_block(
        shard: NonNull<Self>,
        block: BlockId,
        (size, requested, small, mark): (usize, usize, bool, u8),
        kept: Option<NonZeroU64>,
        pending: Vec<PendingUse>,
        view: Option<Box<V>>,
    ) {
        // The stream's owner when this was its last lease and it was released: dropped last,
        // once nothing of the shard is touched any more (it may hold the pool).
        let mut owner = None;
        let last = {
            // SAFETY: live, as the caller promises; the reference ends in this block.
            let sh = unsafe { shard.as_ref() };
            let (segs, last) = {
                let mut inner = sh.inner.lock();
                inner.c.frees += 1;
                inner.c.on_free(size as u64, requested as u64, small);
                inner.emit_free(&sh.label, size, sh.tag(block), mark);
                let segs = inner.core.free(block, pending, view);
                let segs = if segs.is_empty() {
                    Vec::new()
                } else {
                    sh.take_segments(&mut inner, segs)
                };
                if let Some(stream) = kept {
                    owner = inner.kept.give_back(stream.get());
                }
                let last = inner.orphaned && inner.c.block_count.all().current == 0;
                (segs, last)
            };
            if !segs.is_empty() {
                sh.drop_segments(segs);
            }
            last
        };
        if last {
            // SAFETY: the pool gave its reference to the shard to the shard's blocks when it
            // was dropped (`Arc::into_raw` in `Pool::drop`), and this was the last of them:
            // nothing else can reach the shard any more (no pool to allocate from, no block
            // to give back), so the reference is taken back and dropped, once.
            drop(unsafe { Arc::from_raw(shard.as_ptr().cast_const()) });
        }
        drop(owner);
    }

    /// Removes segments `segs` from the shard (`inner`: its state, locked), counting and
    /// reporting each; returns them to drop outside the lock.
    pub(super) fn take_segments(
        &self,
        inner: &mut Inner<T, V>,
        segs: Vec<(SegId, usize)>,
    ) -> Vec<(Arc<T>, usize)> {
        let mut out = Vec::with_capacity(segs.len());
        for (sid, size) in segs {
            if let Some(s) = inner.segments.remove(sid) {
                inner.c.backend_frees += 1;
                inner.c.on_segment(size as u64, s.small, false);
                inner.emit(&self.label, || PoolEvent::SegmentFree {
                    bytes: size,
                    segment: self.tag(sid),
                });
                out.push((s.seg, s.size));
            }
        }
        out
    }

    /// Frees segments outside the lock (a backend free may synchronize), then gives back the
    /// budget. Returns the bytes released.
    pub(super) fn drop_segments(&self, segs: Vec<(Arc<T>, usize)>) -> u64 {
        let mut bytes = 0;
        for (seg, size) in segs {
            drop(seg);
            self.budget.give(size as u64);
            bytes += size as u64;
        }
        bytes
    }
}

impl<T, V> Drop for Shard<T, V> {
    /// Gives the budget of the segments still cached back (their memory goes with them).
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        for (_, seg) in inner.segments.iter() {
            self.budget.give(seg.size as u64);
        }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Pool<T, V> {
    /// Drops every shard with no block handed out; a shard with blocks still handed out
    /// passes to them (the last one given back drops it). Leases take no reference count of
    /// their own, so that threads allocating at once do not share one counter.
    fn drop(&mut self) {
        // The threads' cached blocks go back to their shards, and their caches take no more.
        if let Some(t) = &self.tcache {
            t.drain_all(true);
        }
        for shard in std::mem::take(&mut self.shards).into_vec() {
            // The pool's reference, raw from here on: once `orphaned` is set and the lock is
            // released, the shard's last block given back may drop it on another thread.
            let raw = Arc::into_raw(shard);
            let busy = {
                // SAFETY: `raw` holds the pool's reference: the shard is alive until the lock
                // below is released (no block can see `orphaned` before that).
                let mut inner = unsafe { (*raw).inner.lock() };
                inner.orphaned = inner.c.block_count.all().current > 0;
                inner.orphaned
            };
            if !busy {
                // SAFETY: `raw` came from `Arc::into_raw` above and no block holds the shard
                // (none is handed out, and the pool allocates no more).
                drop(unsafe { Arc::from_raw(raw) });
            }
            // Else the reference now belongs to the shard's blocks (see `release_block`).
        }
    }
}

/// The multiplier of [`shard_of`] for `n` shards: `ceil(2^64 / n)`, 0 for one shard.
pub(super) fn shard_multiplier(n: usize) -> u64 {
    match n as u64 {
        0 | 1 => 0,
        n => u64::MAX / n + 1,
    }
}

/// `x % n` for `n` (at least 2, at most `u32::MAX`) shards and `mul` =
/// [`shard_multiplier`]`(n)`, with two multiplications instead of a division (Lemire, Kaser
/// and Kurz, "Faster remainder by direct computation", 2019: exact for 32-bit `x` and `n`).
/// A 32-bit `div` costs 10 to 40 cycles, about a tenth of an allocate + free of the pool.
#[inline]
pub(super) fn shard_of(x: u32, n: usize, mul: u64) -> usize {
    let low = mul.wrapping_mul(u64::from(x));
    ((u128::from(low) * n as u128) >> 64) as usize
}

impl<T: Send + Sync + 'static, V: Send + 'static> Pool<T, V> {
    /// The index of the calling thread's shard: the thread's index (its low 32 bits; any
    /// shard is a correct one) modulo the number of shards, by multiplication (see
    /// [`shard_of`]).
    #[inline]
    pub(super) fn shard_index(&self) -> usize {
        match self.shards.len() {
            1 => 0,
            n => shard_of(crate::alloc::thread::index() as u32, n, self.shard_mul),
        }
    }

    /// The number of shards (see [`super::PoolConfig::shards`]).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Attaches (or with `None` detaches) an observer of every event.
    pub fn set_observer(&self, observer: Option<std::sync::Arc<dyn PoolObserver>>) {
        // Blocks cached by threads go back first: the observer sees every block as the
        // shards do, and no free of them is missed.
        self.drain_thread_caches();
        for s in self.shards.iter() {
            let mut inner = s.inner.lock();
            if observer.is_some() {
                s.listened.fetch_or(OBSERVED, Relaxed);
            } else {
                s.listened.fetch_and(!OBSERVED, Relaxed);
            }
            inner.observer = observer.clone();
        }
    }

    /// Marks a process pool: its events also go to the sinks attached for `source` (a
    /// device's source, or the host's; see [`crate::alloc::event`]).
    pub(crate) fn publish(&self, source: u64) {
        for s in self.shards.iter() {
            s.source.store(source, Relaxed);
            s.inner.lock().source = Some(source);
            s.listened.fetch_or(PUBLISHED, Relaxed);
        }
    }

    /// Bytes of blocks handed out and of segments held, now.
    pub(crate) fn gauges(&self) -> (u64, u64) {
        let c = self.counters();
        (c.allocated.all().current, c.reserved.all().current)
    }

    /// A reading of the statistics (the sum of the shards'; see the module docs on peaks).
    pub fn stats(&self) -> PoolStats {
        let (sum, (inactive, free, largest)) = self.with_thread_caches(|| {
            let mut sum = Counters::default();
            let mut inactive = super::stats::SplitGauge::default();
            let (mut free, mut largest) = (0, 0);
            for s in self.shards.iter() {
                let inner = s.inner.lock();
                sum.absorb(&inner.c);
                inactive.absorb(&inner.core.inactive_split());
                free += inner.core.free_bytes();
                largest = largest.max(inner.core.largest_free());
            }
            (sum, (inactive, free, largest))
        });
        self.stats_from(&sum, &inactive, free, largest)
    }

    /// Resets the peaks to the current values.
    pub fn reset_peak(&self) {
        // With no block cached by a thread, the shards' current values are the pool's.
        self.drain_thread_caches();
        for s in self.shards.iter() {
            let mut inner = s.inner.lock();
            inner.c.reset_peaks();
            inner.core.reset_peaks();
        }
    }

    /// True when no block is handed out.
    pub fn is_idle(&self) -> bool {
        self.drain_thread_caches();
        self.shards
            .iter()
            .all(|s| s.inner.lock().c.allocated.all().current == 0)
    }

    /// The use of the pool by its callers: bytes requested by the blocks handed out (now and
    /// the peak, the sum of the shards' peaks), allocations and frees. A device counts its
    /// pooled buffers with it (their length is the bytes requested), so that a pooled
    /// allocation writes no counter outside its shard.
    pub(crate) fn usage(&self) -> PoolUsage {
        PoolUsage::default().plus(&self.counters())
    }

    /// Retires the pool if no block is handed out: with every shard locked, runs `replace`
    /// with the pool's final [`Pool::usage`] (it publishes the pool's successor), then marks
    /// the pool retired, so that every later allocation fails (see [`Pool::is_retired`]) and
    /// none can slip in between the check and the replacement. Returns `busy`'s error (with
    /// the bytes handed out) when blocks are out, `replace`'s when it fails; the pool is then
    /// unchanged.
    pub(crate) fn retire_if_idle(
        &self,
        busy: impl FnOnce(u64) -> Error,
        replace: impl FnOnce(PoolUsage) -> Result<()>,
    ) -> Result<()> {
        self.drain_thread_caches();
        // The shards locked at one moment of the threads' caches, whose counts (hits served
        // and blocks taken in and given back) belong to the final usage.
        let lock_all = || -> Vec<_> { self.shards.iter().map(|s| s.inner.lock()).collect() };
        let (mut held, cached) = match &self.tcache {
            Some(t) => {
                let (held, counts) = t.read(lock_all);
                (held, Some(counts))
            }
            None => (lock_all(), None),
        };
        // A block a thread cached since the drain counts as handed out here.
        let used: u64 = held.iter().map(|i| i.c.allocated.all().current).sum();
        if used > 0 {
            return Err(busy(used));
        }
        let mut sum = Counters::default();
        for i in &held {
            sum.absorb(&i.c);
        }
        if let Some(counts) = cached {
            counts.fold_into(&mut sum);
        }
        let usage = PoolUsage::default().plus(&sum);
        replace(usage)?;
        self.retired.store(true, Relaxed);
        // Nothing is handed out and nothing will be: every kept owner goes (after the locks).
        let mut owners: Vec<Keep> = Vec::new();
        for inner in held.iter_mut() {
            inner.kept.take_idle(&mut owners);
        }
        drop(held);
        drop(owners);
        Ok(())
    }

    /// Gives a retired pool's bookkeeping back (its arena, lists and slabs, each with the
    /// capacity they grew to): every shard with no segment left starts empty again. A retired
    /// pool stays allocated while its owner keeps it (see `DeviceMemory::set_pool`); this
    /// leaves it its fixed size.
    pub(crate) fn shed_retired(&self) {
        if !self.is_retired() {
            return;
        }
        for s in self.shards.iter() {
            let mut inner = s.inner.lock();
            if inner.segments.iter().next().is_none() {
                inner.core = super::strategy::Core::new(&self.config);
                inner.segments = super::slab::Slab::default();
            }
        }
    }

    /// True once the pool was retired (replaced by `Device::set_pool`, with nothing handed
    /// out): its allocations fail, and its owner has published a successor to allocate from.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Relaxed)
    }

    /// The error of an allocation from a retired pool.
    #[cold]
    pub(super) fn retired_error(&self) -> Error {
        Error::InvalidState {
            op: "pool allocation",
            buffer: self.label.to_string(),
            reason: "the pool was replaced by another (Device::set_pool)".to_string(),
        }
    }

    /// Runs `f` on the counters of the calling thread's shard.
    pub(super) fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.shards[self.shard_index()].inner.lock().c);
    }

    pub(crate) fn note_retry(&self) {
        self.count(|c| c.alloc_retries += 1);
    }

    /// Counts a dirty mirror spilled to the host (its write-back is traced as a transfer).
    pub(crate) fn note_spill(&self, bytes: usize) {
        self.count(|c| {
            c.spills += 1;
            c.spilled_bytes = c.spilled_bytes.saturating_add(bytes as u64);
        });
    }

    /// Counts dead mirrors dropped without a write-back: `n` of `bytes` in all.
    pub(crate) fn note_dead_drops(&self, n: u64, bytes: u64) {
        self.count(|c| {
            c.drops += n;
            c.dropped_bytes = c.dropped_bytes.saturating_add(bytes);
        });
    }

    /// Counts a spilled mirror brought back to the device.
    pub(crate) fn note_refill(&self, bytes: usize) {
        self.count(|c| {
            c.refills += 1;
            c.refilled_bytes = c.refilled_bytes.saturating_add(bytes as u64);
        });
    }
}
