//! One thread's cache of one pool ([`Magazine`]): its leases, its counts and its two flags
//! (see the parent module's notes on the flag).

use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use super::super::slim::{Slim, CACHEABLE};
use super::super::stats::Counters;
use super::SLOTS;
use crate::backend::barrier;

/// [`CacheCounts`]: requests served from the magazine.
pub(super) const HIT: usize = 0;
/// [`CacheCounts`]: blocks given back into the magazine.
pub(super) const ABSORBED: usize = 1;
/// [`CacheCounts`]: cached blocks given back to their shards.
pub(super) const FLUSHED: usize = 2;

/// What a magazine took and gave ([`HIT`], [`ABSORBED`], [`FLUSHED`]) at one moment, folded
/// into the pool's readings (see [`Tally`], which counts them).
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::alloc::pool) struct CacheCounts {
    /// Blocks.
    n: [u64; 3],
    /// Block bytes.
    bytes: [u64; 3],
    /// Requested bytes.
    req: [u64; 3],
}

/// A magazine's counts as it keeps them: written by the holder of its flag, read by a
/// claimer that does not hold it (a reading of the pool), through a sequence number (a
/// seqlock), so that the reading needs no barrier and never waits for the owner's fast path.
///
/// The writer makes the number odd, writes the counts and makes it even again: on x86 a load
/// and two more plain stores per event, no read-modify-write and no fence the processor
/// executes. A reader reads the number, the counts and the number again, and tries again
/// while it was odd or changed. Each event writes three words a row apart: never two
/// neighbours, which the compiler would join into one wide write that the next event's narrow
/// ones would stall.
#[derive(Debug, Default)]
pub(super) struct Tally {
    seq: AtomicU64,
    n: [AtomicU64; 3],
    bytes: [AtomicU64; 3],
    req: [AtomicU64; 3],
}

impl Tally {
    /// Counts a block of `size` bytes (`req` requested) for `event`. Only the holder of the
    /// magazine's flag calls it (one writer at a time: see [`Guard::count`]).
    #[inline(always)]
    fn count(&self, event: usize, size: usize, req: usize) {
        let add = |a: &AtomicU64, v: u64| {
            a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
        };
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // The odd number is seen before any count written after it.
        fence(Ordering::Release);
        add(&self.n[event], 1);
        add(&self.bytes[event], size as u64);
        add(&self.req[event], req as u64);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The counts at one moment between two events: waits out an event being written (a few
    /// instructions, or its writer's time slice when it was preempted there).
    pub(super) fn read(&self) -> CacheCounts {
        let mut spins = 0u32;
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let load = |a: &[AtomicU64; 3]| a.each_ref().map(|x| x.load(Ordering::Relaxed));
                let counts = CacheCounts {
                    n: load(&self.n),
                    bytes: load(&self.bytes),
                    req: load(&self.req),
                };
                // The counts are read before the number is read again.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return counts;
                }
            }
            spins += 1;
            if spins < 64 {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl CacheCounts {
    pub(super) fn plus(&mut self, o: &CacheCounts) {
        for e in [HIT, ABSORBED, FLUSHED] {
            self.n[e] = self.n[e].wrapping_add(o.n[e]);
            self.bytes[e] = self.bytes[e].wrapping_add(o.bytes[e]);
            self.req[e] = self.req[e].wrapping_add(o.req[e]);
        }
    }

    /// Folds the counts into the shards' counters `c`: the blocks cached read as free small
    /// blocks (they stay handed out in the shards), hits as allocations and absorbed leases
    /// as frees (less those given back to the shards, which counted them).
    pub(in crate::alloc::pool) fn fold_into(&self, c: &mut Counters) {
        let [hits, abs, fl] = self.n;
        let [hit_bytes, abs_bytes, fl_bytes] = self.bytes;
        let [hit_req, abs_req, fl_req] = self.req;
        c.allocations = c.allocations.wrapping_add(hits);
        c.cache_hits = c.cache_hits.wrapping_add(hits);
        c.thread_cache_hits = c.thread_cache_hits.wrapping_add(hits);
        let cached = abs_bytes.wrapping_sub(fl_bytes).wrapping_sub(hit_bytes);
        c.thread_cached_bytes = c.thread_cached_bytes.wrapping_add(cached);
        c.frees = c.frees.wrapping_add(abs.wrapping_sub(fl));
        c.allocated
            .fold_small(hit_bytes, abs_bytes.wrapping_sub(fl_bytes));
        c.requested
            .fold_small(hit_req, abs_req.wrapping_sub(fl_req));
        c.block_count.fold_small(hits, abs.wrapping_sub(fl));
    }
}

/// The leases of a magazine.
pub(super) struct Held<T: Send + Sync + 'static, V: Send + 'static> {
    pub(super) leases: Vec<Slim<T, V>>,
    /// Block bytes of `leases`.
    pub(super) bytes: usize,
    /// The thread ended or the pool is gone: takes no lease any more.
    pub(super) closed: bool,
}

/// One thread's cache of one pool: its leases behind two flags (see the module docs), one
/// that the owning thread stores (and never waits for), one that others claim (rare: drains
/// and snapshots, which then wait for the first to clear; readings, which do not).
pub(super) struct Magazine<T: Send + Sync + 'static, V: Send + 'static> {
    /// Set by the owning thread while it uses the magazine (only it stores it).
    busy: AtomicBool,
    /// Set by a thread that uses the magazine from outside its owner's fast path: another
    /// thread, or the owner giving its blocks back.
    claimed: AtomicBool,
    /// [`barrier::asymmetric`]'s answer: the owner's side is a compiler fence only.
    asym: bool,
    /// Set once with `held.closed`, read without the flag (pruning).
    pub(super) closed: AtomicBool,
    /// What the magazine took and gave: written under the flag, read without it.
    pub(super) tally: Tally,
    held: UnsafeCell<Held<T, V>>,
}

// SAFETY: `held` is only reached through a `Guard`. The owner's guard exists only while it
// stored `busy` and then found `claimed` clear; a claimer's only while it holds `claimed`
// (taken with an acquiring swap) and then found `busy` clear, after a barrier between its
// store and its load that matches the owner's (`barrier::light` / `barrier::heavy`). Each side
// gives its flag back with a releasing store, which the other side's acquiring load reads. So
// one thread at a time touches `held`, as with a `Mutex<Held>`, which is `Sync` when `Held` is
// `Send` (leases are, for these bounds).
unsafe impl<T: Send + Sync + 'static, V: Send + 'static> Sync for Magazine<T, V> {}

/// Access to a magazine's contents while its flag is held: `busy` for its owner's fast path,
/// `claimed` otherwise (the flag given back when the guard goes).
pub(super) struct Guard<'a, T: Send + Sync + 'static, V: Send + 'static> {
    mag: &'a Magazine<T, V>,
    flag: &'a AtomicBool,
}

impl<T: Send + Sync + 'static, V: Send + 'static> Deref for Guard<'_, T, V> {
    type Target = Held<T, V>;
    fn deref(&self) -> &Held<T, V> {
        // SAFETY: this guard holds the flag (see `Magazine`'s `Sync`).
        unsafe { &*self.mag.held.get() }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> DerefMut for Guard<'_, T, V> {
    fn deref_mut(&mut self) -> &mut Held<T, V> {
        // SAFETY: as in `deref`; `&mut self` keeps this the only reference made from it.
        unsafe { &mut *self.mag.held.get() }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Guard<'_, T, V> {
    /// Counts a block of `size` bytes (`req` requested) for `event` in the magazine's
    /// [`Tally`]: the flag this guard holds makes it the only writer.
    #[inline(always)]
    pub(super) fn count(&self, event: usize, size: usize, req: usize) {
        self.mag.tally.count(event, size, req);
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Guard<'_, T, V> {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::Release);
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Magazine<T, V> {
    pub(super) fn new() -> Self {
        Self::with_barrier(barrier::asymmetric())
    }

    /// A magazine whose owner's side is a compiler fence only when `asym` (which the
    /// process's barrier must then back: [`barrier::asymmetric`]), else a full fence.
    pub(super) fn with_barrier(asym: bool) -> Self {
        Self {
            busy: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            asym,
            closed: AtomicBool::new(false),
            tally: Tally::default(),
            held: UnsafeCell::new(Held {
                leases: Vec::with_capacity(SLOTS),
                bytes: 0,
                closed: false,
            }),
        }
    }

    /// The magazine if no other thread claims it now: the owning thread's path (only that
    /// thread calls it), which never waits. Two stores and a load.
    #[inline]
    pub(super) fn try_lock(&self) -> Option<Guard<'_, T, V>> {
        self.busy.store(true, Ordering::Relaxed);
        barrier::light(self.asym);
        if self.claimed.load(Ordering::Acquire) {
            self.busy.store(false, Ordering::Release);
            None
        } else {
            Some(Guard {
                mag: self,
                flag: &self.busy,
            })
        }
    }

    /// Takes `claimed`, waiting for another claimer to give it back (readings and drains
    /// take a few microseconds). Then, after a [`barrier::heavy`] unless the magazine is
    /// the caller's own or closed, [`Magazine::enter`]; or, for a reading of the counts
    /// alone, [`Magazine::unclaim`] after it.
    pub(super) fn claim(&self) {
        while self.claimed.swap(true, Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// Gives back `claimed`, taken by [`Magazine::claim`] and not entered: a reading that
    /// kept drains and flushes out while it read the shards and the [`Tally`].
    pub(super) fn unclaim(&self) {
        self.claimed.store(false, Ordering::Release);
    }

    /// The guard of a claimed magazine, once its owner's fast path (a few dozen
    /// instructions) is out.
    pub(super) fn enter(&self) -> Guard<'_, T, V> {
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            spins += 1;
            if spins < 64 {
                spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard {
            mag: self,
            flag: &self.claimed,
        }
    }

    /// The magazine from outside its owner's fast path: `own` when the caller is its owner
    /// (or the magazine is closed, with no owner any more), when no barrier is needed.
    pub(super) fn lock(&self, own: bool) -> Guard<'_, T, V> {
        self.claim();
        if !own {
            barrier::heavy(self.asym);
        }
        self.enter()
    }

    /// Gives every cached block back to its shard, counting them (`close`: and takes no
    /// more), taking the magazine as [`Magazine::lock`] does. The blocks go back with the
    /// flag held (their shards' locks are taken under it, never the other way round), so that
    /// the list keeps its capacity.
    pub(super) fn flush(&self, close: bool, own: bool) {
        let g = self.lock(own);
        Self::flush_held(g, close);
    }

    /// [`Magazine::flush`] under a guard already held.
    pub(super) fn flush_held(mut g: Guard<'_, T, V>, close: bool) {
        if close {
            g.closed = true;
            g.mag.closed.store(true, Ordering::Relaxed);
        }
        let tally = &g.mag.tally;
        let Held { leases, bytes, .. } = &mut *g;
        for mut l in leases.drain(..) {
            // The guard's flag makes this thread the tally's only writer.
            tally.count(FLUSHED, l.size, l.requested);
            // To its shard, not into a cache again, and with no event: its free was the
            // one into the cache.
            l.flags &= !CACHEABLE;
            l.silence();
        }
        *bytes = 0;
    }
}

#[cfg(test)]
#[path = "magazine_tests.rs"]
mod tests;
