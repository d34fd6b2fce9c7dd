//! Caching memory pools over an abstract segment source.
//!
//! A [`Pool`] hands out blocks ([`Lease`]s) carved from *segments* that a [`RawStorage`]
//! makes (host memory, pinned host memory, device memory: the pool never touches the bytes).
//! Three kinds ([`PoolKind`]):
//!
//! | kind | model | reuse |
//! |---|---|---|
//! | `caching` (default) | PyTorch's CUDA caching allocator | best fit, split, merge |
//! | `binned` | CUB's `CachingDeviceAllocator` | same geometric bin only |
//! | `none` | direct allocation | never |
//!
//! # Stream-ordered reuse
//!
//! Allocations name a stream ([`StreamId`]); a lease may record uses still in flight
//! ([`Lease::add_pending`]: a stream and a [`Fence`], e.g. an event recorded when the block was
//! freed). A freed block is reused at once by work on the stream of its pending uses
//! (streams run in order), and by other streams only once the fences have completed.
//!
//! A block handed out at once comes with those uses ([`Lease::pending`]): the stream named at
//! allocation is not always the one that first touches the block, so whoever holds the lease
//! must order its first work on any other stream after them (the device layer records them as
//! the new buffer's last writer).
//!
//! # Limits
//!
//! A [`Budget`] (the memory cap) is charged for every segment before the backend is asked, so a
//! cap holds exactly even on backends that allocate lazily (PoCL). Cached free segments are
//! given back by [`Pool::trim`] (no waiting) and [`Pool::empty_cache`] (waits for fences), and
//! beyond [`PoolConfig::max_cached_bytes`] after each free.
//!
//! # Thread caches
//!
//! A caching pool keeps, for each thread that allocates from it, a cache of that thread's own
//! frees ([`PoolConfig::thread_cache`] bytes, 256 KiB by default, at most 32 blocks): a
//! request of the same length as one of them (on the host, unnamed; on a device, named or
//! not, on the same stream, and freed with no work in flight) takes it back with no shard
//! lock (a device block handed to a name, or taken from one, has its owner's name written
//! in its shard under the shard's lock) (glibc's tcache and
//! tcmalloc's thread caches do the same). A host pool's allocate + free then costs about a
//! quarter of the shard path, a device pool's about two thirds of its former cost (the rest
//! is the device buffer's own bookkeeping), with no atomic read-modify-write but the cache's
//! own flag. The readings, snapshots and releases see
//! through it (`tcache`'s notes): a cached block reads as free
//! ([`PoolStats::thread_cached_bytes`]), [`Pool::snapshot`], [`Pool::trim`] and
//! [`Pool::empty_cache`] give every thread's cached blocks back to their shards first, and a
//! request that would raise a shard's peak gives the thread's back before, so that peaks stay
//! exact for one thread. While a pool is observed, or publishes and a trace records, the
//! caches stand aside: every allocation and free is an event of its shard. While only the
//! history records, a device pool's caches keep serving and write their events into it (a
//! host pool's stand aside).
//!
//! # Statistics and tracing
//!
//! Every pool keeps [`PoolStats`]; a [`PoolObserver`] sees every allocation, free, segment and
//! out-of-memory event (the hook a recorder attaches to). The process's own pools (each
//! device's device and pinned pools, the global host pool) also publish their events to the
//! sinks attached process-wide (a trace recording a device, for one), which survive
//! [`crate::Device::set_pool`].

mod arena;
mod binned;
mod budget;
pub mod config;
mod front;
mod grant;
pub mod host;
mod ids;
mod keep;
mod lease;
mod malloc;
mod pending;
mod reserve;
mod shard;
mod shard_history;
mod slab;
mod slim;
pub mod snapshot;
pub mod stats;
mod strategy;
pub mod summary;
mod tcache;
/// `Arc::as_ptr(a)` as a `NonNull`, with the provenance of the whole `Arc` allocation (so that
/// `Arc::from_raw` may take it back).
fn arc_ptr<X>(a: &Arc<X>) -> NonNull<X> {
    // SAFETY: `Arc::as_ptr` points into a live allocation: never null.
    unsafe { NonNull::new_unchecked(Arc::as_ptr(a).cast_mut()) }
}

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

pub use budget::Budget;
pub use config::{MemoryCap, PoolConfig, PoolKind, Preallocation};
pub use host::{HostAllocation, HostPool};
pub(crate) use keep::Keep;
pub use lease::Lease;
pub(crate) use malloc::quietly;
pub use pending::Fence;
pub(crate) use pending::{
    in_flight, merge_one, merge_pending, usable_by, PendingFence, PendingUse, Queue, QueuePoint,
};
pub(crate) use slim::Slim;
pub use snapshot::{
    BlockSnapshot, BlockState, MemorySnapshot, PoolSnapshot, SegmentSnapshot, SizeClass,
};
pub use stats::{Gauge, PoolStats, SizeStats};
pub use summary::MemorySummary;

pub use crate::alloc::event::{PoolEvent, PoolObserver, StreamId};
pub use crate::backend::RawStorage;

use crate::alloc::event;
use crate::error::Result;
use shard::Shard;
use slab::Slab;
use stats::{Counters, SplitGauge};
use strategy::Core;

#[cfg(doc)]
use crate::error::Error;

/// The stream of host allocations (no device work orders them).
pub const HOST_STREAM: StreamId = 0;

pub(crate) use ids::{BlockId, IdMap, SegId};

/// A segment the pool holds.
struct Seg<T> {
    seg: Arc<T>,
    size: usize,
    /// It serves small blocks.
    small: bool,
}

struct Inner<T, V> {
    core: Core<V>,
    /// The segments, by id (a slot: no hashing on the way to a block's segment).
    segments: Slab<Seg<T>>,
    c: Counters,
    observer: Option<Arc<dyn PoolObserver>>,
    /// The source of a process pool (a device's pools, the global host pool): its events also
    /// go to the sinks attached process-wide ([`crate::alloc::event`]).
    source: Option<u64>,
    /// The pool was dropped while blocks of this shard were handed out: the shard belongs to
    /// them, and the last one given back drops it (see [`shard`]).
    orphaned: bool,
    /// Owners kept for the leases of streams (see [`Pool::alloc_with`]).
    kept: keep::KeptList,
    /// The shard's key in the events it publishes (unique in the process) and the sequence
    /// number of its last one, in one word ([`crate::alloc::ring::order_word`]), under the
    /// shard's lock: the order of its events across threads for the history.
    order: Cell<u64>,
    /// The generation of the history and the time of the shard's newest event in it (see
    /// [`crate::alloc::ring::Recorded`]): the next is stamped after it.
    last_t: Cell<(u64, u64)>,
    /// The pool's label, numbered for the events ([`crate::alloc::ring::label_key`]).
    label_key: u32,
}

/// Keys of pool shards in events, from 1.
static NEXT_SHARD_KEY: AtomicU64 = AtomicU64::new(1);

impl<T, V> Inner<T, V> {
    /// Reports the event `ev` makes; costs two tests when nobody observes the pool (the
    /// event, which may hold a shared name, is only made for an observer). Always inlined: a
    /// call would cost more than the two tests.
    #[inline(always)]
    fn emit(&self, label: &str, ev: impl FnOnce() -> PoolEvent) {
        if self.observer.is_some() || (self.source.is_some() && event::active()) {
            self.emit_observed(label, &ev());
        }
    }

    #[cold]
    fn emit_observed(&self, label: &str, ev: &PoolEvent) {
        if let Some(o) = &self.observer {
            o.on_event(label, ev);
        }
        if let Some(source) = self.source {
            let order = crate::alloc::ring::split_order(self.next_order());
            event::publish_pool(source, label, self.label_key, ev, order);
            // The history stamped it with this thread's time: the shard's next event comes
            // after it (see `crate::alloc::ring::Recorded`).
            let generation = event::history_generation();
            let t = crate::alloc::ring::thread_time(generation);
            self.stamped(generation, t);
        }
    }
}

/// A caching pool of blocks carved from segments of type `T`. Thread-safe; share it in an
/// `Arc`.
///
/// # Shards and lifetime
///
/// A pool is split into shards ([`PoolConfig::shards`]), each a whole pool of its own behind
/// its own lock; a thread allocates from the shard of its index, and a lease goes back to the
/// shard it came from, whichever thread drops it. Readings add the shards up: current values
/// and counts exact, a peak the sum of the shards' peaks (exact while one shard is in use).
/// A lease takes no reference count of the pool: it keeps its shard alive, so a pool dropped
/// with blocks still handed out passes each busy shard to its blocks, and the last one given
/// back frees the shard's memory.
///
/// # Views
///
/// `V` is the [`RawStorage::View`] of the storage the pool allocates from (an OpenCL
/// sub-buffer, a CUDA pointer offset; `()` for storages without views). A block's view is made
/// the first time the block is handed out, for the whole block, and lives as long as the
/// block's placement (segment, offset, size): the lease holds it ([`Lease::view`]) and gives it
/// back with the block, and a later allocation of the same block gets the same view. A split or merge drops the views of the blocks involved, and a
/// released segment the views of its blocks, so a view always describes exactly its block.
pub struct Pool<T: Send + Sync + 'static, V: Send + 'static = ()> {
    label: Arc<str>,
    config: PoolConfig,
    max_segment: usize,
    budget: Arc<Budget>,
    /// The shards (see [`shard`]): at least one, each in an `Arc` of its own (see
    /// [`Pool`]'s `Drop`).
    shards: Box<[Arc<Shard<T, V>>]>,
    /// Replaced by another pool (see [`Pool::retire_if_idle`]): refuses every allocation.
    /// Written with every shard locked, read under a shard's lock.
    retired: AtomicBool,
    /// Picks a thread's shard without a division ([`shard::shard_multiplier`]).
    shard_mul: u64,
    /// The threads' caches of host blocks ([`PoolConfig::thread_cache`]; see [`tcache`]).
    tcache: Option<tcache::ThreadCaches<T, V>>,
}

impl<T: Send + Sync + 'static, V: Send + 'static> Pool<T, V> {
    /// A pool labelled `label` (used in statistics and errors), charging `budget` for its
    /// segments, whose segments never exceed `max_segment` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the configuration does not validate, or sets a
    /// `gc_threshold` while `budget` (and every budget enclosing it) has no cap.
    pub fn new(
        label: impl Into<String>,
        config: PoolConfig,
        budget: Arc<Budget>,
        max_segment: usize,
    ) -> Result<Arc<Self>> {
        config.validate()?;
        config.check_gc_cap(budget.governing().map(|(cap, _)| cap))?;
        let label: Arc<str> = label.into().into();
        let count = config.effective_shards();
        let label_key = crate::alloc::ring::label_key(&label);
        let tcache = (config.thread_cache > 0 && config.kind == PoolKind::Caching)
            .then(|| tcache::ThreadCaches::new(config.thread_cache));
        let (cache_key, cache_limit) = tcache.as_ref().map_or((0, 0), |t| (t.key(), t.limit()));
        let shards = (0..count)
            .map(|index| {
                Arc::new(Shard {
                    index,
                    count,
                    label: label.clone(),
                    budget: budget.clone(),
                    cache_key,
                    cache_limit,
                    listened: AtomicU8::new(0),
                    source: AtomicU64::new(u64::MAX),
                    label_key,
                    inner: Mutex::new(Inner {
                        core: Core::new(&config),
                        segments: Slab::default(),
                        c: Counters::default(),
                        observer: None,
                        source: None,
                        orphaned: false,
                        kept: keep::KeptList::default(),
                        order: Cell::new(crate::alloc::ring::order_word(
                            NEXT_SHARD_KEY.fetch_add(1, Relaxed),
                            0,
                        )),
                        last_t: Cell::new((0, 0)),
                        label_key,
                    }),
                })
            })
            .collect();
        Ok(Arc::new(Self {
            label,
            max_segment,
            budget,
            shards,
            config,
            retired: AtomicBool::new(false),
            shard_mul: shard::shard_multiplier(count),
            tcache,
        }))
    }

    /// The pool's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The configuration the pool was made with.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The budget (memory cap) the pool charges.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Hands out a block of at least `bytes` bytes for work on `stream`: a cached block when
    /// one fits, else a new segment from `source` (charged to the budget first). The lease
    /// holds the block's view: the one the block kept from its last use, or a new one from
    /// `source` (see [Views](Pool#views)).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the budget or the backend refuses, [`Error::SizeOverflow`]
    /// when rounding overflows, the source's error (making a segment or a view), or
    /// [`Error::InvalidState`] once the pool was retired (replaced by `Device::set_pool`).
    pub fn alloc<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamId,
        source: &S,
    ) -> Result<Lease<T, V>> {
        self.alloc_labelled(bytes, stream, source, None)
    }

    /// [`Pool::alloc`] for an owner named `owner` (a tensor's or blob's name): the pool keeps
    /// the name with the block while it is handed out, for [memory snapshots](Pool::snapshot).
    /// The name is shared, not copied.
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    pub fn alloc_labelled<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamId,
        source: &S,
        owner: Option<&Arc<str>>,
    ) -> Result<Lease<T, V>> {
        self.alloc_with(bytes, stream, source, owner, None)
    }

    /// Lets `stream`'s owner (see [`Pool::alloc_with`]) go: now in the shards where none
    /// of its leases is out, with the last one given back in the others. Owners are dropped
    /// after the shards' locks are released.
    ///
    /// The threads' cached blocks go back to their shards first: a device block cached for
    /// the stream would keep its owner until its thread's cache is next emptied. The caller
    /// has made sure that no lease of the stream is cached after this starts (see
    /// [`Lease::give_back`]'s `stays`).
    pub(crate) fn release_stream(&self, stream: StreamId) {
        self.drain_thread_caches();
        let mut owners = Vec::new();
        for s in self.shards.iter() {
            owners.extend(s.inner.lock().kept.release(stream));
        }
        drop(owners);
    }

    /// Gives every wholly free segment whose pending uses have completed back to the backend,
    /// without waiting. Returns the bytes released.
    pub fn trim(&self) -> u64 {
        self.release(false)
    }

    /// Waits for the pending uses of free blocks, then gives every wholly free segment back to
    /// the backend. Returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.release(true)
    }

    /// Gives cached memory back to the backend, largest idle segments first, until at least
    /// `need` bytes went back or none is left (waiting for work queued on them); returns the
    /// bytes released. The out-of-memory path frees only what a request needs this way, so
    /// that the segments a program reuses step after step stay cached.
    pub(crate) fn release_at_least(&self, need: u64) -> u64 {
        self.release_at_least_sparing(need, usize::MAX, false)
    }

    /// [`Pool::release_at_least`], passing over whole segments of `spare` bytes or more: under
    /// a cap, those a small request keeps for larger ones ([`Pool::kept_whole_from`]). With
    /// `enough_only`, nothing goes unless `need` bytes can (as the shards read one after the
    /// other: another thread may take some meanwhile): under a cap, less makes no room for
    /// the request, and would only give back segments to be made again.
    pub(crate) fn release_at_least_sparing(
        &self,
        need: u64,
        spare: usize,
        enough_only: bool,
    ) -> u64 {
        self.drain_thread_caches();
        if enough_only {
            let can: u64 = self
                .shards
                .iter()
                .map(|s| s.inner.lock().core.releasable(spare))
                .sum();
            if can < need {
                return 0;
            }
        }
        let mut bytes = 0;
        for s in self.shards.iter() {
            if bytes >= need {
                break;
            }
            let segs = {
                let mut inner = s.inner.lock();
                let segs = inner.core.release_at_least(true, need - bytes, spare);
                s.take_segments(&mut inner, segs)
            };
            bytes += s.drop_segments(segs);
        }
        bytes
    }

    /// The size from which wholly free segments are kept for larger requests when a request
    /// of `bytes` finds no room under a cap (see the caching core's `find`); `usize::MAX` for a
    /// request too large for that.
    pub(crate) fn kept_whole_from(&self, bytes: usize) -> usize {
        if bytes > self.config.small_size {
            return usize::MAX;
        }
        let round = self.config.round.max(1);
        bytes
            .div_ceil(round)
            .saturating_mul(round)
            .saturating_mul(arena::KEEP_WHOLE)
    }

    fn release(&self, wait: bool) -> u64 {
        self.drain_thread_caches();
        let mut bytes = 0;
        for s in self.shards.iter() {
            let segs = {
                let mut inner = s.inner.lock();
                let segs = inner.core.release(wait, 0);
                s.take_segments(&mut inner, segs)
            };
            bytes += s.drop_segments(segs);
        }
        bytes
    }

    /// The statistics of counters `c` and of a core's `inactive` split blocks, `free` bytes
    /// and `largest` free block.
    fn stats_from(
        &self,
        c: &Counters,
        inactive: &SplitGauge,
        free: u64,
        largest: u64,
    ) -> PoolStats {
        PoolStats {
            label: self.label.to_string(),
            kind: self.config.kind,
            allocated: c.allocated.all(),
            requested: c.requested.all(),
            reserved: c.reserved.all(),
            inactive_split: inactive.all(),
            small: c.size_stats(true, inactive.small()),
            large: c.size_stats(false, inactive.large()),
            small_size: self.config.small_size as u64,
            segments: c.segments[0] + c.segments[1],
            block_count: c.block_count.all(),
            segment_count: c.segment_count.all(),
            allocations: c.allocations,
            frees: c.frees,
            cache_hits: c.cache_hits,
            thread_cache_hits: c.thread_cache_hits,
            thread_cached_bytes: c.thread_cached_bytes,
            backend_allocs: c.backend_allocs,
            backend_frees: c.backend_frees,
            free_bytes: free,
            largest_free_block: largest,
            alloc_retries: c.alloc_retries,
            ooms: c.ooms,
            evictions: c.evictions,
            evicted_bytes: c.evicted_bytes,
            spills: c.spills,
            spilled_bytes: c.spilled_bytes,
            refills: c.refills,
            refilled_bytes: c.refilled_bytes,
            drops: c.drops,
            dropped_bytes: c.dropped_bytes,
            gc_releases: c.gc_releases,
            gc_released_bytes: c.gc_released_bytes,
            preallocated_bytes: c.preallocated,
            parked_bytes: self.budget.parked(),
            cap: self.budget.governing().map(|(cap, _)| cap),
            direct_bytes: 0,
        }
    }

    /// Every segment of the pool and every block in it (size, offset, state, stream, owner),
    /// with the statistics of the same instant. Walks every block under every shard's lock: a
    /// tool for reports, not for every step.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.drain_thread_caches();
        let guards: Vec<_> = self.shards.iter().map(|s| s.inner.lock()).collect();
        let mut segments: Vec<SegmentSnapshot> = Vec::new();
        let mut sum = Counters::default();
        let mut inactive = SplitGauge::default();
        let (mut free, mut largest) = (0, 0);
        for (shard, inner) in guards.iter().enumerate() {
            sum.absorb(&inner.c);
            inactive.absorb(&inner.core.inactive_split());
            free += inner.core.free_bytes();
            largest = largest.max(inner.core.largest_free());
            segments.extend(inner.core.walk().into_iter().map(|(id, small, blocks)| {
                SegmentSnapshot {
                    id: self.shards[shard].tag(id),
                    size: inner.segments.get(id).map_or(0, |s| s.size as u64),
                    class: if small {
                        SizeClass::Small
                    } else {
                        SizeClass::Large
                    },
                    blocks,
                }
            }));
        }
        segments.sort_unstable_by_key(|s| s.id);
        PoolSnapshot {
            label: self.label.to_string(),
            kind: self.config.kind,
            stats: self.stats_from(&sum, &inactive, free, largest),
            segments,
        }
    }

    /// Gives every thread's cached blocks back to their shards (see [`tcache`]): before a
    /// reading that walks the blocks, a release, an idle check. Never with a shard locked.
    fn drain_thread_caches(&self) {
        if let Some(t) = &self.tcache {
            t.drain_all(false);
        }
    }

    /// The shards' counters summed, with the threads' caches folded in (see [`tcache`]).
    fn counters(&self) -> Counters {
        self.with_thread_caches(|| {
            let mut sum = Counters::default();
            for s in self.shards.iter() {
                sum.absorb(&s.inner.lock().c);
            }
            (sum, ())
        })
        .0
    }

    /// Runs `read` (a reading of the shards: their counters summed, and more) at one moment
    /// of every thread's cache, and folds the caches' counts into the counters it returns
    /// (see [`tcache`]).
    fn with_thread_caches<R>(&self, read: impl FnOnce() -> (Counters, R)) -> (Counters, R) {
        match &self.tcache {
            None => read(),
            Some(t) => {
                let ((mut sum, more), counts) = t.read(read);
                counts.fold_into(&mut sum);
                (sum, more)
            }
        }
    }

    pub(crate) fn note_oom(&self, requested: usize) {
        let mut inner = self.shards[self.shard_index()].inner.lock();
        inner.c.ooms += 1;
        inner.emit(&self.label, || PoolEvent::OutOfMemory { requested });
    }

    pub(crate) fn note_eviction(&self, label: &str, bytes: usize) {
        let mut inner = self.shards[self.shard_index()].inner.lock();
        inner.c.evictions += 1;
        inner.c.evicted_bytes += bytes as u64;
        inner.emit(&self.label, || PoolEvent::Evict {
            label: label.to_string(),
            bytes,
        });
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> std::fmt::Debug for Pool<T, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("label", &self.label)
            .field("kind", &self.config.kind)
            .finish()
    }
}
