//! Per-thread caches of pool blocks: a thread's recent frees served again to the same thread
//! without touching a shard (tcmalloc's and glibc's tcache design).
//!
//! A pool with [`super::PoolConfig::thread_cache`] bytes gives each thread that allocates from
//! it on the host stream a *magazine*: at most [`SLOTS`] leases, at most that many bytes.
//! A lease handed out by [`Pool::alloc_host`] without an owner's name, given back by a
//! thread that holds a magazine of its pool, goes into that magazine (it stays handed out in
//! its shard's eyes); the thread's next request of exactly the same length takes it back.
//! Both are a move of the lease under the magazine's flag: one atomic swap and one plain store,
//! against the shard lock's two read-modify-writes each way, and a few dozen instructions
//! against the shard's several hundred.
//!
//! What the pool promises stays as it was:
//! - **Readings.** Each magazine counts what it took and gave (under its flag), and
//!   [`Pool::stats`] folds the counts in: a block in a magazine reads as free, a hit as an
//!   allocation and a cache hit, an absorbed lease as a free. A request that misses its
//!   magazine and would raise a peak of its shard (which counts cached blocks as handed out)
//!   first gives the magazine's blocks back to their shards, so a shard's peak only rises
//!   with none of this thread's blocks cached, and the pool's use never passes it (see
//!   [`ThreadCaches::before_shards`]): exact for one thread; with several, an upper bound by
//!   at most the other threads' cached bytes (as the sum of the shards' peaks already is).
//!   Under a peak set earlier (a program's first step), the cache stays.
//! - **Snapshots, trims, idle checks, retirement, peak resets, observers and drops** first
//!   take every thread's magazine back into the shards ([`ThreadCaches::drain_all`]), so they
//!   see cached blocks as free blocks of the arena, and `empty_cache` can give them back.
//! - **Events.** While the pool is observed, or publishes and a trace records (a sink is
//!   attached), no lease enters or leaves a magazine: every allocation and free is reported by
//!   its shard, in the shard's order. While only the history records, device blocks keep
//!   going through the magazines, and each hit and each block taken in is written into the
//!   history by the thread that makes it (with the block's segment, which its lease keeps);
//!   a block a magazine gives back to its shard makes no event (its free was the one into the
//!   magazine). A block's events keep their order across threads by their times (see
//!   `crate::alloc::ring`'s notes on order). Host magazines still stand aside then.
//! - **Threads that end** give their magazines back from their thread-local destructor. A
//!   lease given back after that (from another thread-local's destructor) goes to its shard.
//!
//! Which leases: unnamed host leases of the host stream ([`Pool::alloc_host`]; a named host
//! block goes to its shard, which keeps its owner's name for snapshots), and device leases
//! ([`Pool::alloc_device`]), named or not, given back with no use in flight
//! ([`Lease::give_back`]). A device block keeps the name of the owner it went to in its
//! shard while cached; a hit that hands it to a request with a name, or takes it from a
//! named owner, writes the request's name there under the shard's lock (a tensor mirror of
//! a net under a cap, dropped after its last use and made again at the next step, takes the
//! block another one gave back), so snapshots name every handed-out block's owner. A
//! device block waits for its own stream's next request only (its stream is the lease's
//! tag, [`Slim::with_tag`]'s bits), so the block's order on the device and the owner the
//! pool keeps for its stream ([`Pool::alloc_with`]) stay what they were; a block with work in
//! flight goes to its shard, with its fences. A stream let go ([`Pool::release_stream`])
//! empties every thread's cache first, and the device layer keeps the stream's later frees
//! out of them (`absorb`'s `stays`), so that no cached block holds the stream's owner.
//!
//! [`Pool::alloc_host`]: super::Pool::alloc_host
//! [`Pool::alloc_device`]: super::Pool::alloc_device
//! [`Pool::alloc_with`]: super::Pool::alloc_with
//! [`Pool::release_stream`]: super::Pool::release_stream
//! [`Lease::give_back`]: super::Lease::give_back

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::slim::{Slim, CACHEABLE};
use super::stats::Counters;

/// The most leases a magazine holds.
pub(crate) const SLOTS: usize = 32;

/// `Vec::swap_remove` of the lease at `i < v.len()`, always inlined: a call moves the lease
/// through memory once more (about 27 instructions a hit), and the compiler stops inlining
/// the standard one into the device pool's allocation path, which is large.
#[inline(always)]
fn swap_remove<T: Send + Sync + 'static, V: Send + 'static>(
    v: &mut Vec<Slim<T, V>>,
    i: usize,
) -> Slim<T, V> {
    let last = v.len() - 1;
    assert!(i <= last, "a cached lease's index is in its magazine");
    // SAFETY: `i` and `last` are indices of live elements; the element at `i` is read out
    // once, the last one moved over it (or onto itself when `i == last`, no longer counted),
    // and the length shrunk by one, so every remaining element is owned once.
    unsafe {
        let base = v.as_mut_ptr();
        let taken = std::ptr::read(base.add(i));
        std::ptr::copy(base.add(last), base.add(i), 1);
        v.set_len(last);
        taken
    }
}

/// Keys of the pools with thread caches, from 1 (0: none).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// [`CacheCounts`]: requests served from the magazine.
const HIT: usize = 0;
/// [`CacheCounts`]: blocks given back into the magazine.
const ABSORBED: usize = 1;
/// [`CacheCounts`]: cached blocks given back to their shards.
const FLUSHED: usize = 2;

/// What a magazine took and gave ([`HIT`], [`ABSORBED`], [`FLUSHED`]), counted under its
/// flag, folded into the pool's readings. Each event writes three words a row apart: never
/// two neighbours, which the compiler would join into one wide write that the next event's
/// narrow ones would stall.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CacheCounts {
    /// Blocks.
    n: [u64; 3],
    /// Block bytes.
    bytes: [u64; 3],
    /// Requested bytes.
    req: [u64; 3],
}

impl CacheCounts {
    /// Counts a block of `size` bytes (`req` requested) for `event`.
    #[inline(always)]
    fn count(&mut self, event: usize, size: usize, req: usize) {
        self.n[event] = self.n[event].wrapping_add(1);
        self.bytes[event] = self.bytes[event].wrapping_add(size as u64);
        self.req[event] = self.req[event].wrapping_add(req as u64);
    }

    fn plus(&mut self, o: &CacheCounts) {
        for e in [HIT, ABSORBED, FLUSHED] {
            self.n[e] = self.n[e].wrapping_add(o.n[e]);
            self.bytes[e] = self.bytes[e].wrapping_add(o.bytes[e]);
            self.req[e] = self.req[e].wrapping_add(o.req[e]);
        }
    }

    /// Folds the counts into the shards' counters `c`: the blocks cached read as free small
    /// blocks (they stay handed out in the shards), hits as allocations and absorbed leases
    /// as frees (less those given back to the shards, which counted them).
    pub(super) fn fold_into(&self, c: &mut Counters) {
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

/// The leases of a magazine and its counts.
pub(super) struct Held<T: Send + Sync + 'static, V: Send + 'static> {
    leases: Vec<Slim<T, V>>,
    counts: CacheCounts,
    /// Block bytes of `leases`.
    bytes: usize,
    /// The thread ended or the pool is gone: takes no lease any more.
    closed: bool,
}

/// One thread's cache of one pool: its leases behind a flag that the owning thread takes
/// with one swap (and never waits for), and others with a spin (rare: readings and drains).
pub(super) struct Magazine<T: Send + Sync + 'static, V: Send + 'static> {
    busy: AtomicBool,
    /// Set once with `held.closed`, read without the flag (pruning).
    closed: AtomicBool,
    held: UnsafeCell<Held<T, V>>,
}

// SAFETY: `held` is only reached through a `Guard`, which exists only while `busy` is set by
// the thread holding it (taken with an acquiring swap, given back with a releasing store), so
// one thread at a time touches it: as a `Mutex<Held>` would, which is `Sync` when `Held` is
// `Send` (leases are, for these bounds).
unsafe impl<T: Send + Sync + 'static, V: Send + 'static> Sync for Magazine<T, V> {}

/// Access to a magazine's contents while its flag is held.
pub(super) struct Guard<'a, T: Send + Sync + 'static, V: Send + 'static>(&'a Magazine<T, V>);

impl<T: Send + Sync + 'static, V: Send + 'static> Deref for Guard<'_, T, V> {
    type Target = Held<T, V>;
    fn deref(&self) -> &Held<T, V> {
        // SAFETY: this guard holds the flag (see `Magazine`'s `Sync`).
        unsafe { &*self.0.held.get() }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> DerefMut for Guard<'_, T, V> {
    fn deref_mut(&mut self) -> &mut Held<T, V> {
        // SAFETY: as in `deref`; `&mut self` keeps this the only reference made from it.
        unsafe { &mut *self.0.held.get() }
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Guard<'_, T, V> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Magazine<T, V> {
    fn new() -> Self {
        Self {
            busy: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            held: UnsafeCell::new(Held {
                leases: Vec::with_capacity(SLOTS),
                bytes: 0,
                counts: CacheCounts::default(),
                closed: false,
            }),
        }
    }

    /// The flag if it is free now (the owner's path: never waits).
    #[inline]
    fn try_lock(&self) -> Option<Guard<'_, T, V>> {
        // A guard is made only when the flag was free: dropping one gives the flag back, so
        // one made (and dropped) while another thread holds the flag would give back theirs.
        if self.busy.swap(true, Ordering::Acquire) {
            None
        } else {
            Some(Guard(self))
        }
    }

    /// The flag, waiting for it (held by the owner for a few instructions at a time).
    fn lock(&self) -> Guard<'_, T, V> {
        loop {
            if !self.busy.load(Ordering::Relaxed) && !self.busy.swap(true, Ordering::Acquire) {
                return Guard(self);
            }
            std::thread::yield_now();
        }
    }

    /// Gives every cached block back to its shard, counting them (`close`: and takes no
    /// more). The blocks go back with the flag held (their shards' locks are taken under it,
    /// never the other way round), so that the list keeps its capacity.
    fn flush(&self, close: bool) {
        let mut g = self.lock();
        if close {
            g.closed = true;
            self.closed.store(true, Ordering::Relaxed);
        }
        let Held {
            leases,
            counts,
            bytes,
            ..
        } = &mut *g;
        for mut l in leases.drain(..) {
            counts.count(FLUSHED, l.size, l.requested);
            // To its shard, not into a cache again, and with no event: its free was the
            // one into the cache.
            l.flags &= !CACHEABLE;
            l.silence();
        }
        *bytes = 0;
    }
}

/// A magazine seen from its thread, whatever its pool's types: closed when the thread ends.
trait Close: Send + Sync {
    fn close(&self);
    fn is_closed(&self) -> bool;
}

impl<T: Send + Sync + 'static, V: Send + 'static> Close for Magazine<T, V> {
    fn close(&self) {
        self.flush(true);
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// A thread's magazine of the pool keyed `key`; `ptr` is `mag`'s `Magazine<T, V>` (the types
/// of that pool).
struct Entry {
    key: u64,
    mag: Arc<dyn Close>,
    ptr: *const (),
}

/// The thread's magazines; closes them when the thread ends.
struct Entries(Vec<Entry>);

impl Drop for Entries {
    fn drop(&mut self) {
        LAST.with(|l| l.set((0, std::ptr::null())));
        for e in self.0.drain(..) {
            e.mag.close();
        }
    }
}

thread_local! {
    /// The magazine used last: its pool's key and its address (no destructor: readable while
    /// other thread-locals are destroyed; cleared before `ENTRIES` goes).
    static LAST: Cell<(u64, *const ())> = const { Cell::new((0, std::ptr::null())) };
    static ENTRIES: RefCell<Entries> = const { RefCell::new(Entries(Vec::new())) };
}

/// This thread's magazine of the pool keyed `key`, if it has one.
///
/// # Safety
/// `key` is the key of a pool of types `T`, `V`. The reference is used before this thread
/// registers another magazine (which may prune entries) and before it ends.
#[inline]
unsafe fn mine<'a, T: Send + Sync + 'static, V: Send + 'static>(
    key: u64,
) -> Option<&'a Magazine<T, V>> {
    let (k, p) = LAST.with(Cell::get);
    let p = if k == key {
        p
    } else {
        let p = ENTRIES
            .try_with(|e| {
                let e = e.try_borrow().ok()?;
                e.0.iter().find(|x| x.key == key).map(|x| x.ptr)
            })
            .ok()
            .flatten()?;
        LAST.with(|l| l.set((key, p)));
        p
    };
    // SAFETY: `p` is the address of the `Magazine<T, V>` (the types of the pool keyed `key`,
    // as the caller promises) of an entry this thread holds in an `Arc`: alive until the
    // entry is pruned or the thread ends, which the caller rules out while it is used.
    Some(unsafe { &*p.cast::<Magazine<T, V>>() })
}

/// The registry of a pool's magazines.
struct Registry<T: Send + Sync + 'static, V: Send + 'static> {
    live: Vec<Arc<Magazine<T, V>>>,
    /// The counts of closed magazines, pruned.
    gone: CacheCounts,
}

/// A pool's thread caches: its key, its limit, and every thread's magazine.
pub(super) struct ThreadCaches<T: Send + Sync + 'static, V: Send + 'static> {
    key: u64,
    /// Most block bytes per magazine.
    limit: usize,
    registry: Mutex<Registry<T, V>>,
}

impl<T: Send + Sync + 'static, V: Send + 'static> ThreadCaches<T, V> {
    /// Thread caches of `limit` bytes each.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            limit,
            registry: Mutex::new(Registry {
                live: Vec::new(),
                gone: CacheCounts::default(),
            }),
        }
    }

    /// The key the pool's shards give their leases' frees (see [`absorb`]).
    pub(super) fn key(&self) -> u64 {
        self.key
    }

    /// The most bytes a magazine holds.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// A cached block of exactly `bytes` requested, from this thread's magazine, put in
    /// `into` (which holds `None`); returns whether there was one.
    #[inline]
    pub(super) fn take(&self, bytes: usize, into: &mut Option<Slim<T, V>>) -> bool {
        self.take_if(bytes, |_| true, into)
    }

    /// [`ThreadCaches::take`] of a block that `fits` (a device block: of the request's
    /// stream).
    #[inline(always)]
    pub(super) fn take_if(
        &self,
        bytes: usize,
        fits: impl Fn(&Slim<T, V>) -> bool,
        into: &mut Option<Slim<T, V>>,
    ) -> bool {
        // `into` holds `None`, as the caller promises: tested, so that no drop of it is made
        // when the block is put there (the compiler made a call for one).
        if into.is_some() {
            return false;
        }
        // SAFETY: the key is this pool's; the reference ends in this function, which
        // registers nothing.
        let Some(mag) = (unsafe { mine::<T, V>(self.key) }) else {
            return false;
        };
        let Some(mut g) = mag.try_lock() else {
            return false;
        };
        // The newest first (`rposition`, which the compiler once stopped inlining here).
        let leases: &[Slim<T, V>] = &g.leases;
        let mut found = None;
        for (i, l) in leases.iter().enumerate().rev() {
            if l.requested == bytes && fits(l) {
                found = Some(i);
                break;
            }
        }
        let Some(i) = found else {
            return false;
        };
        // The sizes are read in place and the block then moved untouched, straight into
        // `into`: a move whose pieces were split into registers stalls the next one that
        // reads it whole.
        let size = g.leases[i].size;
        g.bytes -= size;
        g.counts.count(HIT, size, bytes);
        *into = Some(swap_remove(&mut g.leases, i));
        true
    }

    /// Before a request goes to the shards: gives this thread's cached blocks back to them
    /// when `raises` (the request would raise a peak of its shard, which counts the cached
    /// blocks as handed out), and gives the thread a magazine if it has none. Must not be
    /// called with a shard locked.
    ///
    /// So a shard's peak only rises while this thread caches nothing: every peak it records
    /// is a value the pool's use reached, and no use passes it (a hit or a request that left
    /// the cache alone stays under the shard's count, which is under its peak). Exact for one
    /// thread; with several, an upper bound by at most the other threads' cached bytes.
    pub(super) fn before_shards(&self, raises: impl FnOnce() -> bool) {
        // SAFETY: the key is this pool's; the reference is dropped before registering.
        match unsafe { mine::<T, V>(self.key) } {
            Some(mag) => {
                // Only when free now: held, it is being flushed (by another thread, or by
                // this one, which a free under the flag may have brought back here).
                let holds = mag.try_lock().is_some_and(|g| !g.leases.is_empty());
                if holds && raises() {
                    mag.flush(false);
                }
            }
            None => self.register(),
        }
    }

    /// Gives this thread a magazine of the pool.
    #[cold]
    fn register(&self) {
        let mag = Arc::new(Magazine::<T, V>::new());
        let ptr = Arc::as_ptr(&mag).cast::<()>();
        let added = ENTRIES.try_with(|e| {
            let Ok(mut e) = e.try_borrow_mut() else {
                return false;
            };
            // Entries of pools gone, or closed, are dropped here (never while a `mine`
            // reference is in use: this runs on the thread's own allocation path only).
            e.0.retain(|x| !x.mag.is_closed());
            e.0.push(Entry {
                key: self.key,
                mag: mag.clone(),
                ptr,
            });
            true
        });
        if added == Ok(true) {
            LAST.with(|l| l.set((self.key, ptr)));
            let mut r = self.registry.lock();
            let Registry { live, gone } = &mut *r;
            live.retain(|m| {
                let closed = m.is_closed();
                if closed {
                    gone.plus(&m.lock().counts);
                }
                !closed
            });
            live.push(mag);
        }
    }

    /// Gives every thread's cached leases back to their shards (`close`: for good, the pool is
    /// going). Must not be called with a shard locked.
    pub(super) fn drain_all(&self, close: bool) {
        let mags: Vec<_> = self.registry.lock().live.clone();
        for m in mags {
            m.flush(close);
        }
    }

    /// Runs `read_shards` (a reading of the shards' counters) with every magazine's flag held,
    /// and returns it with the magazines' counts summed (see [`CacheCounts::fold_into`]). A
    /// magazine gives its blocks back to their shards with its flag held: the shards and the
    /// counts are read at one moment of each magazine, never halfway through such a flush.
    /// Takes the shards' locks under the flags, as a flush does.
    pub(super) fn read<R>(&self, read_shards: impl FnOnce() -> R) -> (R, CacheCounts) {
        let r = self.registry.lock();
        let guards: Vec<_> = r.live.iter().map(|m| m.lock()).collect();
        let shards = read_shards();
        let mut sum = r.gone;
        for g in &guards {
            sum.plus(&g.counts);
        }
        (shards, sum)
    }
}

/// Moves the block of `lease` (being dropped) into this thread's magazine of its pool, keyed
/// `key`, when there is room, and returns whether it went (`lease` then holds nothing to give
/// back). The caller checked that the lease may be cached. `stays` is asked last, with the
/// magazine's flag held: a `false` keeps the lease out (a device block whose stream was let
/// go: no drain of the magazines can run between that answer and the lease's move, so a
/// stream let go after it finds the lease there; see `Pool::release_stream`).
///
/// # Safety
/// `key` is the key of the pool (of types `T`, `V`) the lease belongs to.
#[inline]
pub(super) unsafe fn absorb<T: Send + Sync + 'static, V: Send + 'static>(
    key: u64,
    limit: usize,
    lease: &mut Slim<T, V>,
    stays: impl FnOnce() -> bool,
) -> bool {
    // SAFETY: as the caller promises; the reference ends here, and nothing here registers.
    let Some(mag) = (unsafe { mine::<T, V>(key) }) else {
        return false;
    };
    let Some(mut g) = mag.try_lock() else {
        return false;
    };
    if g.closed || g.leases.len() >= SLOTS || g.bytes + lease.size > limit || !stays() {
        return false;
    }
    g.bytes += lease.size;
    g.counts.count(ABSORBED, lease.size, lease.requested);
    g.leases.push(lease.take_for_cache());
    true
}

#[cfg(test)]
mod tests {
    use super::Magazine;

    /// A thread that finds the flag taken leaves it taken: a failed `try_lock` once gave the
    /// holder's flag back (the guard was made before the test and dropped), so that the
    /// owner's next `try_lock` and the holder (a drain) touched the leases at once.
    #[test]
    fn a_failed_try_lock_leaves_the_holder_its_flag() {
        let m = Magazine::<(), ()>::new();
        let held = m.lock();
        assert!(m.try_lock().is_none());
        assert!(m.try_lock().is_none(), "the holder's flag was given back");
        drop(held);
        assert!(m.try_lock().is_some());
    }
}
