//! Per-thread caches of pool blocks: a thread's recent frees served again to the same thread
//! without touching a shard (tcmalloc's and glibc's tcache design).
//!
//! A pool with [`super::PoolConfig::thread_cache`] bytes gives each thread that allocates from
//! it on the host stream a *magazine*: at most [`SLOTS`] leases, at most that many bytes.
//! A lease handed out by [`Pool::alloc_host`] without an owner's name, given back by a
//! thread that holds a magazine of its pool, goes into that magazine (it stays handed out in
//! its shard's eyes); the thread's next request of exactly the same length takes it back.
//! Both are a move of the lease under the magazine's flag, which its thread takes with two
//! plain stores and a load (no atomic read-modify-write, no fence the processor executes),
//! against the shard lock's two read-modify-writes each way, and a few dozen instructions
//! against the shard's several hundred.
//!
//! **The flag.** A magazine has two: `busy`, stored by its thread alone around each use, and
//! `claimed`, taken by any other thread that reaches in (a reading, a drain: rare). The thread
//! stores `busy`, then loads `claimed`, and steps back (a miss) when it is set; a claimer
//! stores `claimed`, then waits for `busy` to clear. Each side's store must be seen before its
//! load (Dekker's algorithm): the thread pays only a compiler fence, and a claimer makes every
//! running thread of the process execute a barrier (`crate::backend::barrier`: Linux's
//! `membarrier`), once for all the magazines a drain claims; a claimer needs none for its own
//! thread's magazine. Where the system has no such barrier, both sides use full fences. A
//! reading of the counts claims the magazines (which keeps flushes out) but neither makes
//! the barrier nor waits for `busy`: it reads each magazine's counts through a sequence
//! number that the flag's holder writes around each event (`magazine::Tally`), and the
//! owner's fast path touches no shard.
//!
//! What the pool promises stays as it was:
//! - **Readings.** Each magazine counts what it took and gave (written under its flag), and
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

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::slim::Slim;
use crate::backend::barrier;

#[path = "magazine.rs"]
mod magazine;
pub(super) use magazine::CacheCounts;
use magazine::{Magazine, ABSORBED, HIT};

/// The most leases a magazine holds.
pub(crate) const SLOTS: usize = 32;

/// `Vec::swap_remove` of the lease at `i < v.len()`, moved straight into `dst`, always
/// inlined: a call, or a return by value, moves the lease through memory once more (about
/// 8 to 27 instructions a hit), and the compiler stops inlining the standard one into the
/// device pool's allocation path, which is large.
///
/// # Safety
/// `dst` is valid for a write of one lease and does not point into `v`.
#[inline(always)]
unsafe fn swap_remove_to<T: Send + Sync + 'static, V: Send + 'static>(
    v: &mut Vec<Slim<T, V>>,
    i: usize,
    dst: *mut Slim<T, V>,
) {
    let last = v.len() - 1;
    assert!(i <= last, "a cached lease's index is in its magazine");
    // SAFETY: `i` and `last` are indices of live elements; the element at `i` is moved out
    // once (into `dst`, valid and apart from `v` as the caller promises), the last one moved
    // over it (unless it is the last, no longer counted), and the length shrunk by one, so
    // every remaining element is owned once.
    unsafe {
        let base = v.as_mut_ptr();
        std::ptr::copy_nonoverlapping(base.add(i), dst, 1);
        // The newest block, the usual hit, is the last: nothing moves over it.
        if i != last {
            std::ptr::copy_nonoverlapping(base.add(last), base.add(i), 1);
        }
        v.set_len(last);
    }
}

/// Keys of the pools with thread caches, from 1 (0: none).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A magazine seen from its thread, whatever its pool's types: closed when the thread ends.
trait Close: Send + Sync {
    fn close(&self);
    fn is_closed(&self) -> bool;
}

impl<T: Send + Sync + 'static, V: Send + 'static> Close for Magazine<T, V> {
    /// Called by the owning thread as it ends.
    fn close(&self) {
        self.flush(true, true);
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
        // `into` holds `None`, as the caller promises: tested, so that it is overwritten
        // below with nothing to drop (an assignment made a call to drop it).
        if into.is_some() {
            return false;
        }
        let mut slot = MaybeUninit::uninit();
        // SAFETY: `slot` is room for one block.
        if !unsafe { self.take_to(bytes, |_| true, slot.as_mut_ptr()) } {
            return false;
        }
        // SAFETY: `take_to` wrote the block into `slot`; `into` holds `None` (tested above),
        // which owns nothing.
        unsafe { std::ptr::write(into, Some(slot.assume_init())) };
        true
    }

    /// A cached block of exactly `bytes` requested that `fits` (a device block: of the
    /// request's stream), from this thread's magazine, moved into `dst` straight from the
    /// magazine; returns whether there was one (`dst` is left alone when not).
    ///
    /// # Safety
    /// `dst` is valid for a write of one block, and holds nothing that needs a drop: on
    /// `true`, the caller owns the block written there (a `MaybeUninit` it reads the block
    /// out of, or drops it from, once).
    #[inline(always)]
    pub(super) unsafe fn take_to(
        &self,
        bytes: usize,
        fits: impl Fn(&Slim<T, V>) -> bool,
        dst: *mut Slim<T, V>,
    ) -> bool {
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
        // `dst`: a move whose pieces were split into registers stalls the next one that
        // reads it whole.
        let size = g.leases[i].size;
        g.bytes -= size;
        g.count(HIT, size, bytes);
        // SAFETY: as the caller promises for `dst`.
        unsafe { swap_remove_to(&mut g.leases, i, dst) };
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
                    mag.flush(false, true);
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
                    // Closed: its thread is gone, no barrier needed.
                    gone.plus(&m.tally.read());
                }
                !closed
            });
            live.push(mag);
        }
    }

    /// Gives every thread's cached leases back to their shards (`close`: for good, the pool is
    /// going). Must not be called with a shard locked.
    ///
    /// Claims every magazine first, then makes one barrier for all of them (none when the
    /// only open one is this thread's), then empties them one by one.
    pub(super) fn drain_all(&self, close: bool) {
        let mags: Vec<_> = self.registry.lock().live.clone();
        self.claim_all(&mags);
        for m in &mags {
            Magazine::flush_held(m.enter(), close);
        }
    }

    /// Claims `mags` (in the registry's order, which every claimer follows: no two wait for
    /// each other), then makes the barrier that lets them [`Magazine::enter`], when one of
    /// them is open and not this thread's.
    fn claim_all(&self, mags: &[Arc<Magazine<T, V>>]) {
        // SAFETY: the key is this pool's; only the address is kept, never dereferenced.
        let own = unsafe { mine::<T, V>(self.key) }
            .map_or(std::ptr::null(), |m| m as *const Magazine<T, V>);
        let mut others = false;
        for m in mags {
            m.claim();
            others |= !std::ptr::eq(Arc::as_ptr(m), own) && !m.is_closed();
        }
        if others {
            barrier::heavy(barrier::asymmetric());
        }
    }

    /// Runs `read_shards` (a reading of the shards' counters) with every magazine claimed,
    /// and returns it with the magazines' counts summed (see [`CacheCounts::fold_into`]). A
    /// magazine gives its blocks back to their shards only with its `claimed` flag held: the
    /// shards and the counts are read at one moment of each magazine, never halfway through
    /// such a flush. Takes the shards' locks under the flags, as a flush does.
    ///
    /// No barrier and no wait for the owners: an owner's fast path (a hit or a block taken
    /// in) touches no shard, and its counts are read through their sequence number
    /// ([`super::magazine::Tally`]).
    pub(super) fn read<R>(&self, read_shards: impl FnOnce() -> R) -> (R, CacheCounts) {
        /// Gives the claims back, also when `read_shards` panics.
        struct Claims<'a, T: Send + Sync + 'static, V: Send + 'static>(&'a [Arc<Magazine<T, V>>]);
        impl<T: Send + Sync + 'static, V: Send + 'static> Drop for Claims<'_, T, V> {
            fn drop(&mut self) {
                self.0.iter().for_each(|m| m.unclaim());
            }
        }
        let r = self.registry.lock();
        r.live.iter().for_each(|m| m.claim());
        let claims = Claims(&r.live);
        let shards = read_shards();
        let mut sum = r.gone;
        for m in claims.0 {
            sum.plus(&m.tally.read());
        }
        drop(claims);
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
    let len = g.leases.len();
    if g.closed || len >= SLOTS || g.bytes + lease.size > limit || !stays() {
        return false;
    }
    g.bytes += lease.size;
    g.count(ABSORBED, lease.size, lease.requested);
    // Into the room the list was made with (`SLOTS`; a drain keeps it): no call to a `push`
    // that can grow, which the compiler may leave out of line (about 20 instructions).
    match g.leases.spare_capacity_mut().first_mut() {
        Some(slot) => {
            // SAFETY: the spare room holds nothing; the block is moved there once.
            unsafe { lease.move_to(slot.as_mut_ptr()) };
            // SAFETY: the element at `len` was written just above, within the capacity.
            unsafe { g.leases.set_len(len + 1) };
        }
        None => {
            let mut slot = MaybeUninit::uninit();
            // SAFETY: as above, into `slot`, then pushed once.
            unsafe {
                lease.move_to(slot.as_mut_ptr());
                g.leases.push(slot.assume_init());
            }
        }
    }
    true
}
