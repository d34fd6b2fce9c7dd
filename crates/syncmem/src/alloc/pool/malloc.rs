//! The allocation path of a [`Pool`], in the steps of PyTorch's `malloc` (its CUDA caching
//! allocator): **round** the request to a block size, **find** a cached block, else **free
//! cached** memory the request cannot use and **allocate** a new segment. The pool's strategy
//! **splits** the block off the free block it found or off the new segment; the block is then
//! handed out with its view, counted, and reported.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::num::NonZeroU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::grant::{Grant, Request};
use super::shard::Shard;
use super::slim::Slim;
use super::{arc_ptr, Inner, Keep, Lease, Pool, PoolEvent, RawStorage, Seg, StreamId};
use crate::alloc::ring::AllocRecord;
use crate::alloc::ring::MARK_UNKNOWN;
use crate::alloc::stats::human_bytes;
use crate::error::{Error, OomReport, Result};

thread_local! {
    /// This thread's refusals are quiet (see [`quietly`]).
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's out-of-memory refusals quiet: their report carries no cause
/// text (formatting one costs more than the allocation attempt). For the retries of an
/// out-of-memory path, whose final refusal is made again loudly when they all fail.
pub(crate) fn quietly<R>(f: impl FnOnce() -> R) -> R {
    let _quiet = crate::alloc::thread::SetFlag::new(&QUIET, true);
    f()
}

/// Why `why()` (empty when refusals are quiet).
fn reason(why: impl FnOnce() -> String) -> String {
    if QUIET.with(Cell::get) {
        String::new()
    } else {
        why()
    }
}

/// Why no segment was made.
enum Refused {
    /// Out of memory: the report, without the pool's usage (read once the shard's lock is
    /// given back).
    Oom(Box<OomReport>),
    /// Any other error: the segment size overflowed, the backend failed.
    Failed(Error),
}

impl<T: Send + Sync + 'static, V: Send + 'static> Pool<T, V> {
    /// [`Pool::alloc_labelled`]; with `keep`, keeping an owner alive for the lease: the one
    /// `keep` makes, which the pool holds from the stream's first lease in the shard until
    /// [`Pool::release_stream`] and the stream's last lease given back (or until the pool is
    /// retired). `keep` is called under the shard's lock when the shard keeps no owner for
    /// `stream` (once per stream and shard, and again after a release): it must only clone,
    /// never use this pool. Owners are matched by stream id: every call for one stream must
    /// make the same owner. The leases take no reference count of their own: the shard counts
    /// the stream's leases under its lock, which threads each allocating on a stream of their
    /// own then share with no other counter.
    ///
    /// Whatever the owner holds lives at least as long as the lease ([`Lease::is_kept`]; a
    /// lease of [`HOST_STREAM`](super::HOST_STREAM) keeps nothing and is not kept). An owner holding the pool
    /// itself (a device's stream holds the device, which holds its pool) is a cycle until the
    /// stream is released: release it when its last user is gone.
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    #[inline(never)]
    pub(crate) fn alloc_with<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamId,
        source: &S,
        owner: Option<&Arc<str>>,
        keep: Option<&dyn Fn() -> Keep>,
    ) -> Result<Lease<T, V>> {
        self.alloc_inner(bytes, stream, source, owner, keep)
    }

    /// [`Pool::alloc_with`] for a device buffer. A request is served first from the calling
    /// thread's cache of the blocks it gave back on the same stream with no use in flight
    /// (see [`super::tcache`]), and its lease may go there again ([`Lease::give_back`]);
    /// every request goes to the shards while the pool's events are seen. Always inlined:
    /// returned from a call, the lease moves through memory (about 60 more instructions an
    /// allocation).
    ///
    /// A cached block's shard keeps the name of the owner it was handed out to (snapshots
    /// read it there): a hit for a request with a name, or of a block that had one, writes
    /// the request's name there under the shard's lock (a tensor's buffer of a net under a
    /// cap, dropped after its last use and allocated again the next step, takes a block
    /// another tensor gave back). Unnamed hits of unnamed blocks take no lock.
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    #[inline(always)]
    pub(crate) fn alloc_device<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamId,
        source: &S,
        owner: Option<&Arc<str>>,
        keep: Option<&dyn Fn() -> Keep>,
    ) -> Result<Lease<T, V>> {
        // While the pool's events are seen by an observer or sinks, no block enters or
        // leaves a thread's cache (see `tcache`): the request goes to the shards, as
        // `alloc_with`. Blocks this thread cached before then stay there, counted in its
        // shard's peaks as handed out (an upper bound, as other threads' cached blocks are).
        // While only the history records, a hit is written into it.
        let Some(t) = self.tcache.as_ref() else {
            return self.alloc_with(bytes, stream, source, owner, keep);
        };
        let Some(state) = self.shards[0].cache_state() else {
            return self.alloc_with(bytes, stream, source, owner, keep);
        };
        if !self.retired.load(Relaxed) {
            let fits = |l: &Slim<T, V>| l.tag() == stream;
            // The block is read where the cache wrote it: a move out of the cache, then out
            // of an `Option`, then into the lease copied it whole three times.
            let mut slot = MaybeUninit::<Slim<T, V>>::uninit();
            // SAFETY: `slot` is room for one block, and drops nothing.
            if unsafe { t.take_to(bytes, fits, slot.as_mut_ptr()) } {
                // SAFETY: `take_to` wrote the block there.
                let slim = unsafe { slot.assume_init_mut() };
                let mark = if state != 0 {
                    Self::record_hit(state, slim, stream, owner)
                } else {
                    MARK_UNKNOWN
                };
                // SAFETY: `slot` is a `MaybeUninit`, never read again nor dropped.
                return Ok(unsafe { slim.lease_out(owner, mark) });
            }
        }
        // As for the host (see `alloc_host`): no peak counts a cached block.
        t.before_shards(|| self.peak_would_rise(bytes));
        // Marked in place (a lease taken out of the result and put back was copied twice).
        let mut granted = self.alloc_with(bytes, stream, source, owner, keep);
        if let Ok(lease) = &mut granted {
            // A block whose segment a lease cannot name stays out of the caches: the history
            // records a cached block's hit with its segment.
            lease.cacheable = if !lease.small || lease.seg == super::lease::NO_SEG {
                0
            } else if owner.is_some() {
                super::lease::CACHEABLE_NAMED
            } else {
                super::lease::CACHEABLE
            };
        }
        granted
    }

    /// Writes the hit of a thread cache that took `slim` (for a request of `stream` for
    /// `owner`) into the history of the hook's `state` (not 0); returns the mark of its
    /// lease.
    #[inline(always)]
    fn record_hit(state: u64, slim: &Slim<T, V>, stream: StreamId, owner: Option<&Arc<str>>) -> u8 {
        // SAFETY: the shard lives while the block is handed out (see `Lease::shard`).
        let sh = unsafe { slim.shard.as_ref() };
        sh.record_cached_alloc(state, owner, || AllocRecord {
            requested: slim.requested,
            size: slim.size,
            cache_hit: true,
            block: sh.tag(slim.block),
            stream,
            segment: sh.tag(u64::from(slim.seg())),
            offset: slim.offset,
            owner,
        })
    }

    /// [`Pool::alloc_labelled`] on [`HOST_STREAM`](super::HOST_STREAM) with no owner kept:
    /// the allocation path compiled for those constants (a host pool's), whatever the
    /// compiler decides for [`Pool::alloc_with`].
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    #[inline(never)]
    pub(crate) fn alloc_host<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        source: &S,
        owner: Option<&Arc<str>>,
    ) -> Result<Slim<T, V>> {
        // The thread's cache (see `tcache`), tried first for unnamed requests (a block's
        // owner is kept by its shard, for snapshots: `take_cached`), is emptied into the
        // shards before they serve a request that would raise a peak, so that no peak counts
        // its blocks.
        if let Some(t) = &self.tcache {
            t.before_shards(|| self.peak_would_rise(bytes));
        }
        let lease = self.alloc_inner(bytes, super::HOST_STREAM, source, owner, None)?;
        let cacheable = self.tcache.is_some() && owner.is_none() && lease.small;
        Ok(lease.into_slim(cacheable))
    }

    /// Whether a request of `bytes` from this thread's shard would raise one of its peaks,
    /// counting it as a new block of its rounded size (true when that cannot be told: a
    /// large request may get a block larger than its rounding).
    #[cold]
    fn peak_would_rise(&self, bytes: usize) -> bool {
        let inner = self.shards[self.shard_index()].inner.lock();
        match inner.core.round(bytes) {
            Some(rounded) if rounded <= self.config.small_size => {
                inner.c.would_raise_peak(rounded as u64, bytes as u64, true)
            }
            _ => true,
        }
    }

    /// Gives the calling thread's cached blocks of the pool back to their shards (see
    /// [`super::tcache`]): the out-of-memory path's retries then see, at any size, every
    /// block its victims freed into the cache. Must not be called with a shard locked.
    pub(crate) fn flush_thread_cache(&self) {
        if let Some(t) = &self.tcache {
            t.before_shards(|| true);
        }
    }

    /// A block of exactly `bytes` requested from the calling thread's cache of the pool (see
    /// [`super::tcache`]), put in `into` (which holds `None`), when it has one and nobody
    /// listens to the pool's events; returns whether it did (else the request goes to
    /// [`Pool::alloc_host`]).
    #[inline]
    pub(crate) fn take_cached(&self, bytes: usize, into: &mut Option<Slim<T, V>>) -> bool {
        let Some(t) = self.tcache.as_ref() else {
            return false;
        };
        if self.retired.load(Relaxed) || !self.shards[0].quiet() {
            return false;
        }
        t.take(bytes, into)
    }

    /// The body of [`Pool::alloc_with`].
    #[inline(always)]
    fn alloc_inner<S: RawStorage<Segment = T, View = V> + ?Sized>(
        self: &Arc<Self>,
        bytes: usize,
        stream: StreamId,
        source: &S,
        owner: Option<&Arc<str>>,
        keep: Option<&dyn Fn() -> Keep>,
    ) -> Result<Lease<T, V>> {
        let sh = &self.shards[self.shard_index()];
        let mut inner = sh.inner.lock();
        if self.retired.load(Relaxed) {
            return Err(self.retired_error());
        }
        let req = Request {
            stream,
            requested: bytes,
            owner,
        };
        // Round: the size of the block the request takes.
        let Some(rounded) = inner.core.round(bytes) else {
            return Err(self.overflow(bytes));
        };
        // Find: a cached block (split off a larger free one where the strategy splits). Under
        // a cap, a small request keeps whole segments of larger sizes whole while the pool can
        // grow (the cap is read on a miss of the exact-size lists only).
        let mut keep_whole = false;
        let capped = || {
            keep_whole = self.budget.governing().is_some();
            keep_whole
        };
        if let Some(grant) = inner.core.find(rounded, req, capped) {
            return self.hand_out(sh, inner, (grant, true), req, source, keep);
        }
        // Free cached: give back the idle memory the request cannot use, so that the new
        // segment is sized by what the pool holds now. Not under a cap: segments a program
        // left idle come back as its demand returns, and the cap bounds what they hold (the
        // out-of-memory path gives back what a request needs).
        if !keep_whole {
            free_cached(sh, &mut inner, bytes, rounded);
        }
        // Allocate: a new segment, the block split off it.
        match self.allocate(sh, &mut inner, (req, rounded, keep_whole), source) {
            Ok(grant) => {
                let lease = self.hand_out(sh, inner, (grant, false), req, source, keep)?;
                // The pool grew: the garbage collector looks at the cap (after the lock).
                if let Some(fraction) = self.config.gc_threshold {
                    self.collect_garbage(fraction);
                }
                Ok(lease)
            }
            Err(Refused::Oom(report)) => {
                // The cap refused a segment: a whole one kept for its size is split after all,
                // when the storage agrees (a device's first frees what it can).
                if keep_whole && source.may_split_whole() {
                    if let Some(grant) = inner.core.find(rounded, req, || false) {
                        return self.hand_out(sh, inner, (grant, true), req, source, keep);
                    }
                }
                Err(self.with_usage(inner, report))
            }
            Err(Refused::Failed(e)) => Err(e),
        }
    }

    /// A new segment for a block of `rounded` bytes, charged to the budget before the backend
    /// is asked; the block the strategy splits off it.
    fn allocate<S: RawStorage<Segment = T, View = V> + ?Sized>(
        &self,
        sh: &Shard<T, V>,
        inner: &mut Inner<T, V>,
        (req, rounded, keep_whole): (Request<'_>, usize, bool),
        source: &S,
    ) -> std::result::Result<Grant<V>, Refused> {
        let size = self.segment_size(inner, req.requested, rounded, keep_whole)?;
        let size = self.charge(size, req.requested, rounded)?;
        let seg = source.alloc(size).map_err(|e| {
            self.budget.give(size as u64);
            Refused::Failed(e)
        })?;
        let sid = inner.segments.insert(Seg {
            seg: Arc::new(seg),
            size,
            small: false,
        });
        let grant = inner.core.add_segment(sid, size, rounded, req);
        inner.segments[sid].small = grant.small;
        inner.c.backend_allocs += 1;
        inner.c.on_segment(size as u64, grant.small, true);
        inner.emit(&self.label, || PoolEvent::SegmentAlloc {
            bytes: size,
            segment: sh.tag(sid),
            stream: req.stream,
        });
        Ok(grant)
    }

    /// The size of a new segment for `bytes` rounded to `rounded`: the strategy's, or just the
    /// block where the strategy's exceeds the largest allocation.
    fn segment_size(
        &self,
        inner: &Inner<T, V>,
        bytes: usize,
        rounded: usize,
        capped: bool,
    ) -> std::result::Result<usize, Refused> {
        let size = inner
            .core
            .segment_size(bytes, rounded, capped)
            .ok_or_else(|| Refused::Failed(self.overflow(bytes)))?;
        let size = if size > self.max_segment && rounded <= self.max_segment {
            rounded
        } else {
            size
        };
        if size > self.max_segment {
            let why = reason(|| {
                format!(
                    "a {size}-byte segment exceeds the largest allocation ({} bytes)",
                    self.max_segment
                )
            });
            let report = self.refusal(bytes, why);
            return Err(Refused::Oom(Box::new(
                report.with_max_alloc(self.max_segment as u64),
            )));
        }
        Ok(size)
    }

    /// Charges the budget for a segment of `size` bytes; near the cap, for a tight one of
    /// `rounded` bytes (just the block) where the standard one (e.g. 20 MiB for a 2 MiB
    /// request) does not fit. Returns the size charged.
    fn charge(
        &self,
        size: usize,
        bytes: usize,
        rounded: usize,
    ) -> std::result::Result<usize, Refused> {
        if self.budget.try_take(size as u64) {
            return Ok(size);
        }
        // Near the cap, for a small block: the room left (rounded down to the block unit), so
        // that the small requests that follow share the segment instead of each making a tight
        // one; else (and for a large block, as PyTorch) just the block.
        let round = self.config.round.max(1);
        let small = rounded <= self.config.small_size;
        let room = match self.budget.room() {
            Some(r) if small => usize::try_from(r).unwrap_or(usize::MAX).min(size) / round * round,
            _ => 0,
        };
        if rounded < room && self.budget.try_take(room as u64) {
            return Ok(room);
        }
        if rounded < size && self.budget.try_take(rounded as u64) {
            return Ok(rounded);
        }
        // The budget that refused: the pool's own, or an enclosing one (a device's).
        let (cap, used) = self
            .budget
            .refusing(rounded as u64)
            .unwrap_or((u64::MAX, self.budget.used()));
        let why = reason(|| {
            format!(
                "a {} segment would exceed the cap ({} of {} used)",
                human_bytes(rounded as u64),
                human_bytes(used),
                human_bytes(cap)
            )
        });
        Err(Refused::Oom(Box::new(self.refusal(bytes, why))))
    }

    /// Hands out the block of `grant` (`hit`: found cached) for `req`: with its view (the one
    /// the block kept, or a new one from `source`), counted, reported, with the owner `keep`
    /// makes kept for its stream. Always inlined: a call moves the grant through memory, about
    /// 20 more instructions per allocation.
    #[inline(always)]
    fn hand_out<S: RawStorage<Segment = T, View = V> + ?Sized>(
        &self,
        sh: &Arc<Shard<T, V>>,
        mut inner: MutexGuard<'_, Inner<T, V>>,
        (grant, hit): (Grant<V>, bool),
        req: Request<'_>,
        source: &S,
        keep: Option<&dyn Fn() -> Keep>,
    ) -> Result<Lease<T, V>> {
        let seg = &inner.segments[grant.seg].seg;
        // From `Arc::as_ptr`, not from a reference: the pointer may become an `Arc` again
        // (`Lease::segment_arc`), which needs the whole allocation's provenance.
        let segment = arc_ptr(seg);
        let view = match grant.view {
            Some(v) => v,
            None => match source.view(seg, grant.offset, grant.size) {
                // Boxed: the view moves with the block at the cost of a pointer.
                Ok(v) => Box::new(v),
                Err(e) => {
                    // The block goes back unused, with its uses in flight (a new segment stays
                    // cached).
                    let segs = inner.core.free(grant.block, grant.pending, None);
                    let segs = sh.take_segments(&mut inner, segs);
                    drop(inner);
                    sh.drop_segments(segs);
                    return Err(e);
                }
            },
        };
        let (stream, bytes) = (req.stream, req.requested);
        inner.c.allocations += 1;
        inner.c.cache_hits += u64::from(hit);
        inner
            .c
            .on_alloc(grant.size as u64, bytes as u64, grant.small);
        let mark = inner.emit_alloc(&self.label, req.owner, || AllocRecord {
            requested: bytes,
            size: grant.size,
            cache_hit: hit,
            block: sh.tag(grant.block),
            stream,
            segment: sh.tag(grant.seg),
            offset: grant.offset,
            owner: req.owner,
        });
        // The host stream (0) has no owner to keep: its leases are not kept.
        let kept = keep.and_then(|keep| {
            let id = NonZeroU64::new(stream)?;
            inner.kept.lend(stream, keep);
            Some(id)
        });
        Ok(Lease {
            // As `segment`: the shard's last block turns it back into an `Arc` once the pool
            // is gone (`Shard::release_block`).
            shard: arc_ptr(sh),
            segment,
            block: grant.block,
            offset: grant.offset,
            size: grant.size,
            requested: bytes,
            zeroed: grant.zeroed,
            small: grant.small,
            cacheable: 0,
            mark,
            seg: u16::try_from(grant.seg).unwrap_or(super::lease::NO_SEG),
            pending: grant.pending,
            view: Some(view),
            kept,
        })
    }

    /// The error of a request of `bytes` whose rounding (or segment size) overflows.
    #[cold]
    fn overflow(&self, bytes: usize) -> Error {
        Error::SizeOverflow {
            what: format!("{bytes} bytes rounded for pool {}", self.label),
        }
    }

    /// The refusal of `bytes` for `why`, with the cap (the pool's usage comes later: see
    /// [`Pool::with_usage`]).
    #[cold]
    fn refusal(&self, bytes: usize, why: String) -> OomReport {
        let cap = self.budget.governing().map(|(cap, _)| cap);
        OomReport::new(self.label.to_string(), bytes, why).with_cap(cap)
    }

    /// `report` with the pool's usage, read once the lock of the shard that refused, `held`,
    /// is given back.
    #[cold]
    fn with_usage(&self, held: MutexGuard<'_, Inner<T, V>>, report: Box<OomReport>) -> Error {
        drop(held);
        let (allocated, reserved) = self.gauges();
        let report = Box::new(report.with_usage(Some(allocated), Some(reserved)));
        Error::OutOfMemory { report }
    }
}

/// Gives back the idle segments of shard `sh` that a request of `bytes` (`rounded`) cannot use.
fn free_cached<T, V>(sh: &Shard<T, V>, inner: &mut Inner<T, V>, bytes: usize, rounded: usize) {
    let idle = inner.core.idle_segments(bytes, rounded);
    let idle = sh.take_segments(inner, idle);
    sh.drop_segments(idle);
}
