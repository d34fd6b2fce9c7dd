//! Per-device memory: the device pool, the pinned host pool, the memory cap, the registry of
//! evictable mirrors and the out-of-memory path.
//!
//! Every device has one [`DeviceMemory`]. Its device pool is made on first use from
//! `SYNCMEM_DEVICE_POOL` / `SYNCMEM_POOL_CONF`, or replaced by [`crate::Device::set_pool`]. The
//! block size rounding is raised to the backend's sub-buffer alignment (OpenCL's
//! `CL_DEVICE_MEM_BASE_ADDR_ALIGN`), so every block can be handed out as a sub-buffer.
//!
//! # The cap
//!
//! One [`Budget`] per device is charged for every pool segment and every direct allocation
//! ([`crate::Device::alloc`]) before the backend is asked: the cap is exact even where the
//! backend allocates lazily (PoCL reports gigabytes and creates buffers on first use).
//!
//! # Out of memory
//!
//! An allocation the backend or the cap refuses is retried after, in order:
//! 1. freeing cached blocks (waiting for their pending uses, then releasing free segments;
//!    under a cap only when enough can go to make room for the request);
//! 2. dropping clean device mirrors of [`crate::SyncedMemory`] buffers (head synced: the host
//!    copy is current), largest first (a running net's dead values first), retrying after
//!    each. Buffers in use (a guard alive, a transfer in flight, their lock held) are
//!    skipped; dirty data (head at device) is never dropped;
//! 3. spilling dirty mirrors (and zero-copy buffers) to the host: written back to a host
//!    mirror, their device memory freed, least recently used first and about twice the
//!    request at a time before the next attempt; while a net runs, in its order (Belady's
//!    rule), retried at once after a victim that alone holds the request. Buffers a guard
//!    holds are never spilled, nor buffers with queued work but in a last round that waits
//!    for it. The next device access brings a spilled buffer back (a refill);
//! 4. failing with [`Error::OutOfMemory`] carrying an [`OomReport`]: requested, allocated,
//!    reserved, largest free block, fragmentation, the cap, the biggest holders, and what the
//!    path dropped and spilled.
//!
//! The path itself is in [`oom`].
//!
//! # MemPools
//!
//! A [`crate::device::MemPool`] is a pool of the device's memory of its own, charged to the
//! device's budget; a pooled allocation made while the calling thread has a scope of one open
//! on this device comes from it ([`mem_pools`]).

mod mem_pools;
mod oom;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::handle::OnStream;
use super::mirror::{live_buffers, LiveBuffer, Mirrors};
use super::zero_copy::ZeroCopySetting;
use super::{Device, DeviceBuffer, PinnedBuffer, Stream};
use crate::alloc::pool::config::{
    check_env, PoolConfig, DEVICE_POOL_CONF_ENV, DEVICE_POOL_ENV, PINNED_POOL_CONF_ENV,
    PINNED_POOL_ENV,
};
use crate::alloc::pool::stats::PoolUsage;
use crate::alloc::pool::{
    Budget, Keep, Lease, Pool, PoolSnapshot, PoolStats, StreamId, HOST_STREAM,
};
use crate::alloc::stats::{MemCounters, MemStats};
use crate::alloc::thread::Published;
use crate::backend::dispatch::{PinnedStorage, RawMem, RawPinned, UnifiedStorage};
use crate::backend::RawStorage;
use crate::error::{Error, OomReport, Result};

/// Memory management state of one device.
pub(crate) struct DeviceMemory {
    /// The device pool (`None` before its first use), read on every pooled allocation with
    /// one load (threads allocating at once write nothing shared); made and replaced under
    /// `install`. A replaced pool is retired ([`Pool::retire_if_idle`]) and stays allocated,
    /// empty, until the device is dropped.
    pool: Published<Arc<Pool<RawMem, RawMem>>>,
    /// The pinned host pool, as `pool` (never replaced).
    pinned: Published<Arc<Pool<RawPinned>>>,
    /// Held while a pool is made or replaced.
    install: Mutex<()>,
    /// The use of the device pools replaced so far ([`DeviceMemory::set_pool`]): the device's
    /// memory statistics count pooled buffers with their pool's usage.
    retired: Mutex<PoolUsage>,
    budget: Arc<Budget>,
    /// Bytes of live direct allocations (charged to `budget` too).
    direct: AtomicU64,
    /// The pools of the device's MemPools (see [`mem_pools`]).
    mem_pools: Mutex<mem_pools::MemPools>,
    /// The registry of evictable mirrors, installed by the synced layer on first use.
    mirrors: OnceLock<Arc<dyn Mirrors>>,
    last_oom: Mutex<Option<OomReport>>,
    /// This device's event source: its pools and copies publish under it to attached sinks.
    trace_source: u64,
    /// Whether buffers share one allocation between host and device (see [`super::zero_copy`]).
    pub(crate) zero_copy: ZeroCopySetting,
    /// The schedule running on the device, if one says what it uses next (see
    /// [`NextUse`]): the out-of-memory path's order of victims.
    pub(crate) next_use: parking_lot::RwLock<Option<Arc<dyn super::NextUse>>>,
}

impl Default for DeviceMemory {
    fn default() -> Self {
        Self {
            pool: Published::new(),
            pinned: Published::new(),
            install: Mutex::new(()),
            retired: Mutex::new(PoolUsage::default()),
            budget: Arc::new(Budget::new(None)),
            direct: AtomicU64::new(0),
            mem_pools: Mutex::default(),
            mirrors: OnceLock::new(),
            last_oom: Mutex::new(None),
            trace_source: crate::alloc::event::new_source(),
            zero_copy: ZeroCopySetting::default(),
            next_use: parking_lot::RwLock::new(None),
        }
    }
}

fn max_segment(dev: &Device) -> usize {
    usize::try_from(dev.info().max_alloc)
        .unwrap_or(usize::MAX)
        .min(isize::MAX as usize)
}

/// The device pool's storage. Where buffers share memory with the host
/// ([`super::zero_copy`]), new segments are memory the host can use in place, so that every
/// block has a host address. The setting is read when a segment is made (a cached block needs
/// no storage), not on every allocation.
struct PoolStorage<'a> {
    dev: &'a Device,
    zero_copy: &'a ZeroCopySetting,
}

impl RawStorage for PoolStorage<'_> {
    type Segment = RawMem;
    type View = RawMem;

    fn alloc(&self, bytes: usize) -> Result<RawMem> {
        let raw = &self.dev.shared.raw;
        if self.zero_copy.get().protocol_for(self.dev.info()).is_some() {
            UnifiedStorage(raw).alloc(bytes)
        } else {
            raw.alloc(bytes)
        }
    }

    fn view(&self, segment: &Arc<RawMem>, offset: usize, len: usize) -> Result<RawMem> {
        self.dev.shared.raw.view(segment, offset, len)
    }

    fn may_split_whole(&self) -> bool {
        oom::may_split_whole()
    }
}

impl DeviceMemory {
    /// The device pool, made from the environment on first use.
    pub(crate) fn pool(&self, dev: &Device) -> Result<&Arc<Pool<RawMem, RawMem>>> {
        if let Some(p) = self.pool.load() {
            return Ok(p);
        }
        let _install = self.install.lock();
        if let Some(p) = self.pool.load() {
            return Ok(p);
        }
        check_env()?;
        let cfg = PoolConfig::from_env(DEVICE_POOL_ENV, DEVICE_POOL_CONF_ENV)?;
        let p = self.make_pool(dev, cfg)?;
        Ok(self.pool.publish(p))
    }

    fn make_pool(&self, dev: &Device, mut cfg: PoolConfig) -> Result<Arc<Pool<RawMem, RawMem>>> {
        cfg.round = cfg
            .round
            .max(dev.shared.raw.sub_align())
            .next_power_of_two();
        cfg.validate()?;
        let cap = cfg.memory_cap.map(|c| c.resolve(dev.info().total_memory));
        let before = self.budget.cap();
        self.budget.set_cap(cap);
        let made = Pool::new(dev.label(), cfg, self.budget.clone(), max_segment(dev))
            .and_then(|p| self.preallocate(dev, &p).map(|()| p));
        match made {
            Ok(p) => {
                p.publish(self.trace_source);
                Ok(p)
            }
            Err(e) => {
                self.budget.set_cap(before);
                Err(e)
            }
        }
    }

    /// This device's event source (see [`crate::alloc::event`]).
    pub(crate) fn trace_source(&self) -> u64 {
        self.trace_source
    }

    /// The device pool if it exists.
    pub(crate) fn current_pool(&self) -> Option<Arc<Pool<RawMem, RawMem>>> {
        self.pool.load().cloned()
    }

    /// Replaces the device pool (which must have no block handed out).
    pub(crate) fn set_pool(&self, dev: &Device, cfg: PoolConfig) -> Result<()> {
        let _install = self.install.lock();
        let Some(old) = self.pool.load() else {
            self.pool.publish(self.make_pool(dev, cfg)?);
            return Ok(());
        };
        if cfg.preallocate.is_some() {
            // The new pool's reservation is charged while the old pool is still there: its
            // cache goes first.
            old.empty_cache();
        }
        // The old pool's shards stay locked from the check to the replacement: no allocation
        // can take a block of it in between, and one that comes later finds it retired and
        // reads the new one.
        let busy = |used| Error::InvalidState {
            op: "Device::set_pool",
            buffer: dev.label().to_string(),
            reason: format!("{used} bytes of the current pool are still in use; drop them first"),
        };
        // The old pool's counts move to `retired` as the new pool is published, both under
        // `retired`'s lock: a reading of the statistics sees one or the other (see
        // `stats_with`).
        old.retire_if_idle(busy, |usage| {
            let new = self.make_pool(dev, cfg)?;
            let mut r = self.retired.lock();
            r.allocs += usage.allocs;
            r.frees += usage.frees;
            r.peak = r.peak.max(usage.peak);
            self.pool.publish(new);
            Ok(())
        })?;
        old.empty_cache();
        old.shed_retired();
        Ok(())
    }

    /// The pinned host pool, made from the environment on first use.
    pub(crate) fn pinned_pool(&self, dev: &Device) -> Result<&Arc<Pool<RawPinned>>> {
        if let Some(p) = self.pinned.load() {
            return Ok(p);
        }
        let _install = self.install.lock();
        if let Some(p) = self.pinned.load() {
            return Ok(p);
        }
        check_env()?;
        let cfg = PoolConfig::from_env(PINNED_POOL_ENV, PINNED_POOL_CONF_ENV)?;
        let total = crate::Device::cpu().info().total_memory;
        let cap = cfg.memory_cap.map(|c| c.resolve(total));
        let p = Pool::new(
            format!("{} pinned", dev.label()),
            cfg,
            Arc::new(Budget::new(cap)),
            max_segment(dev),
        )?;
        if let Some(amount) = p.config().preallocate {
            p.preallocate(amount.resolve(cap, total), &PinnedStorage(&dev.shared.raw))?;
        }
        p.publish(self.trace_source);
        Ok(self.pinned.publish(p))
    }

    /// The pinned pool if it exists.
    pub(crate) fn current_pinned_pool(&self) -> Option<Arc<Pool<RawPinned>>> {
        self.pinned.load().cloned()
    }

    /// The device's memory statistics: its direct allocations (`direct`, counted as they are
    /// made) and its pooled buffers (counted by the pools, see [`Pool::usage`]: the device
    /// pool's, and its MemPools'). The peak is
    /// the direct peak plus the pooled one: exact while only one of them moves, an upper
    /// bound otherwise.
    pub(crate) fn stats_with(&self, direct: &MemCounters, label: &str) -> MemStats {
        let mut s = direct.snapshot(label);
        // The pool read with the counts of the pools it replaced (`set_pool` changes both
        // under this lock); its own counts are read after the lock is given back (its shards'
        // locks are taken before this one by `set_pool`).
        let (retired, pool) = {
            let r = self.retired.lock();
            (*r, self.pool.load())
        };
        let pooled = pool.map(|p| p.usage()).unwrap_or_default();
        let private = self.mem_pool_usage();
        s.in_use += pooled.in_use + private.in_use;
        s.peak += pooled.peak.max(retired.peak) + private.peak;
        s.allocs += pooled.allocs + retired.allocs + private.allocs;
        s.frees += pooled.frees + retired.frees + private.frees;
        s
    }

    /// Resets the peaks of the device pool and of the pools it replaced.
    pub(crate) fn reset_pool_peaks(&self) {
        self.retired.lock().peak = 0;
        if let Some(p) = self.pool.load() {
            p.reset_peak();
        }
        if let Some(p) = self.pinned.load() {
            p.reset_peak();
        }
        self.reset_mem_pool_peaks();
    }

    /// The cap in effect, if any; before the device pool is built, the cap it will be built
    /// with (from `SYNCMEM_POOL_CONF`; `None` while that variable is invalid).
    pub(crate) fn cap(&self, dev: &Device) -> Option<u64> {
        if self.pool.load().is_some() {
            return self.budget.cap();
        }
        let cfg = PoolConfig::from_env(DEVICE_POOL_ENV, DEVICE_POOL_CONF_ENV).ok()?;
        cfg.memory_cap.map(|c| c.resolve(dev.info().total_memory))
    }

    /// The registry of evictable mirrors, installed by `init` on first use.
    pub(crate) fn mirrors_hook(
        &self,
        init: impl FnOnce() -> Arc<dyn Mirrors>,
    ) -> &Arc<dyn Mirrors> {
        self.mirrors.get_or_init(init)
    }

    /// Label, size and head of every live mirror, in eviction order.
    pub(crate) fn live_buffers(&self) -> Vec<LiveBuffer> {
        self.mirrors
            .get()
            .map_or_else(Vec::new, |m| live_buffers(m.as_ref()))
    }

    /// Counts a spilled mirror brought back to this device (see [`crate::SyncedMemory`]).
    pub(crate) fn note_refill(&self, bytes: usize) {
        if let Some(p) = self.current_pool() {
            p.note_refill(bytes);
        }
    }

    /// The most recent out-of-memory report.
    pub(crate) fn last_oom(&self) -> Option<OomReport> {
        self.last_oom.lock().clone()
    }

    /// Device pool statistics (with the direct bytes), if the pool exists.
    pub(crate) fn stats(&self) -> Option<PoolStats> {
        self.current_pool().map(|p| {
            let mut s = p.stats();
            s.direct_bytes = self.direct.load(Relaxed);
            s
        })
    }

    /// Snapshots of the device pool (with the direct bytes) and of the pinned pool, those that
    /// exist.
    pub(crate) fn snapshots(&self) -> Vec<PoolSnapshot> {
        let mut out = Vec::new();
        if let Some(p) = self.current_pool() {
            let mut s = p.snapshot();
            s.stats.direct_bytes = self.direct.load(Relaxed);
            out.push(s);
        }
        out.extend(self.current_pinned_pool().map(|p| p.snapshot()));
        out
    }

    /// Charges `bytes` parked in `budget` (a block spilled in place, see
    /// [`Budget::park`]) again, making room as an allocation would: the out-of-memory path
    /// frees cached segments, drops clean mirrors and spills others until they fit.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when nothing made room (the bytes stay parked).
    pub(crate) fn unpark(&self, dev: &Device, budget: &Budget, bytes: usize) -> Result<()> {
        self.with_retries(dev, bytes, || {
            if budget.try_unpark(bytes as u64) {
                return Ok(());
            }
            let (cap, used) = budget
                .refusing(bytes as u64)
                .unwrap_or((u64::MAX, budget.used()));
            Err(OomReport::new(
                dev.label(),
                bytes,
                format!(
                    "a block spilled in place would exceed the cap ({used} of {cap} bytes used)"
                ),
            )
            .with_cap(Some(cap))
            .into())
        })
    }

    /// Gives back `bytes` of a direct allocation.
    pub(crate) fn uncharge(&self, bytes: usize) {
        self.direct.fetch_sub(bytes as u64, Relaxed);
        self.budget.give(bytes as u64);
    }

    /// A direct (unpooled) allocation of `len >= 1` bytes, charged to the cap.
    pub(crate) fn alloc_direct(&self, dev: &Device, len: usize) -> Result<DeviceBuffer> {
        self.pool(dev)?;
        self.with_retries(dev, len, || {
            if !self.budget.try_take(len as u64) {
                return Err(self.cap_refusal(dev, len));
            }
            match dev.shared.raw.alloc(len) {
                Ok(raw) => {
                    self.direct.fetch_add(len as u64, Relaxed);
                    Ok(DeviceBuffer::from_direct(dev, len, raw))
                }
                Err(e) => {
                    self.budget.give(len as u64);
                    Err(e)
                }
            }
        })
    }

    /// A pooled allocation of `len >= 1` bytes for work on `stream`, for `owner` (a buffer's
    /// label, kept with the block for memory snapshots).
    #[inline(always)]
    pub(crate) fn alloc_pooled(
        &self,
        dev: &Device,
        len: usize,
        stream: &Stream,
        owner: Option<&Arc<str>>,
    ) -> Result<DeviceBuffer> {
        // A MemPool scope of the calling thread on this device takes the allocation (one
        // thread-local read when the thread has no scope open).
        if let Some(pool) = super::mem_pool::scoped(dev) {
            return self.alloc_scoped(dev, len, stream, owner, &pool);
        }
        // A stream of `new_stream`: the pool keeps its handle for the buffer (see
        // `StreamHandle`), cloned only for the stream's first lease in a shard.
        let keep = stream
            .device_handle()
            .on_stream()
            .map(|on| move || -> Keep { OnStream::keep(on) });
        let keep = keep.as_ref().map(|k| k as &dyn Fn() -> Keep);
        let storage = &PoolStorage {
            dev,
            zero_copy: &self.zero_copy,
        };
        // The common case: the pool exists and has room (no reference count taken; the lease
        // holds its shard from then on).
        if let Some(pool) = self.pool.load() {
            match pool.alloc_device(len, stream.id(), storage, owner, keep) {
                Ok(lease) => return Ok(DeviceBuffer::from_pool(stream, len, lease)),
                // Full (retried below), or replaced since it was read (`set_pool`: the new
                // one is published).
                Err(e) if e.is_out_of_memory() || pool.is_retired() => {}
                Err(e) => return Err(e),
            }
        }
        let lease = self.lease(dev, len, stream.id(), owner, keep, storage)?;
        Ok(DeviceBuffer::from_pool(stream, len, lease))
    }

    /// [`DeviceMemory::alloc_pooled`] on `dev`'s default stream, without a handle of the
    /// stream (see [`DeviceBuffer::pooled_default`]).
    pub(crate) fn alloc_pooled_default(
        &self,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<DeviceBuffer> {
        match self.lease_default(dev, len, owner) {
            Some(lease) => Ok(DeviceBuffer::from_pool_default(dev, len, lease?)),
            None => self.alloc_pooled_bound(dev, len, owner),
        }
    }

    /// The block of [`DeviceMemory::alloc_pooled_default`]; `None` where a handle of the
    /// stream is needed (a MemPool scope is open on the device, or the default stream is not
    /// made yet: [`DeviceMemory::alloc_pooled_bound`] serves those).
    #[inline(always)]
    pub(crate) fn lease_default(
        &self,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Option<Result<Lease<RawMem, RawMem>>> {
        // The default stream's owner is the device itself: nothing kept.
        let stream = dev
            .default_unbound()
            .filter(|_| super::mem_pool::scoped(dev).is_none())?;
        let storage = &PoolStorage {
            dev,
            zero_copy: &self.zero_copy,
        };
        if let Some(pool) = self.pool.load() {
            match pool.alloc_device(len, stream.id(), storage, owner, None) {
                Ok(lease) => return Some(Ok(lease)),
                // As in `alloc_pooled`.
                Err(e) if e.is_out_of_memory() || pool.is_retired() => {}
                Err(e) => return Some(Err(e)),
            }
        }
        Some(self.lease(dev, len, stream.id(), owner, None, storage))
    }

    /// [`DeviceMemory::alloc_pooled`] on a handle of `dev`'s default stream: the way of
    /// [`DeviceMemory::alloc_pooled_default`] in a MemPool scope or before the stream is made
    /// (out of line: the allocation path is inlined once, in each of the two).
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_pooled_bound(
        &self,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<DeviceBuffer> {
        self.alloc_pooled(dev, len, &*dev.default_stream_lent()?, owner)
    }

    /// The last handle of stream `stream` (made by `new_stream`) is gone: the device pool lets
    /// its handle go (see [`Pool::alloc_with`]).
    pub(crate) fn release_stream(&self, stream: StreamId) {
        if let Some(p) = self.pool.load() {
            p.release_stream(stream);
        }
    }

    /// A block of the device pool with its view (a sub-buffer, an offset pointer), the way of
    /// `alloc_pooled` when the pool is yet to be made, full, or replaced: on the current pool,
    /// retried after freeing what can be freed (see `with_retries`). The view is made by the
    /// pool the first time the block is handed out, reused while the block keeps its placement.
    #[cold]
    #[inline(never)]
    fn lease(
        &self,
        dev: &Device,
        len: usize,
        stream: StreamId,
        owner: Option<&Arc<str>>,
        keep: Option<&dyn Fn() -> Keep>,
        storage: &PoolStorage<'_>,
    ) -> Result<Lease<RawMem, RawMem>> {
        loop {
            let pool = self.pool(dev)?;
            // As the first try: through this thread's cache, its block cacheable.
            let attempt = || pool.alloc_device(len, stream, storage, owner, keep);
            // The cache of MemPools let go goes first (see `DeviceMemory::or_drained`).
            match self.with_retries(dev, len, || self.or_drained(attempt(), attempt)) {
                // Replaced meanwhile: the new one is published.
                Err(_) if pool.is_retired() => continue,
                r => return r,
            }
        }
    }

    /// A pooled pinned host block of `len >= 1` bytes (zero only when its lease says so), for
    /// `owner` (as in [`DeviceMemory::alloc_pooled`]).
    pub(crate) fn alloc_pinned(
        &self,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<PinnedBuffer> {
        // As `lease`: no reference count taken (the pinned pool is never replaced).
        Self::pinned_from(self.pinned_pool(dev)?, dev, len, owner)
    }

    fn pinned_from(
        pool: &Arc<Pool<RawPinned>>,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<PinnedBuffer> {
        let source = PinnedStorage(&dev.shared.raw);
        let lease = match pool.alloc_labelled(len, HOST_STREAM, &source, owner) {
            Err(e) if e.is_out_of_memory() && pool.empty_cache() > 0 => {
                pool.note_retry();
                pool.alloc_labelled(len, HOST_STREAM, &source, owner)
            }
            r => r,
        }
        .inspect_err(|e| {
            if e.is_out_of_memory() {
                pool.note_oom(len);
            }
        })?;
        Ok(PinnedBuffer::from_pool(dev, len, lease))
    }

    fn cap_refusal(&self, dev: &Device, len: usize) -> Error {
        let (cap, used) = (self.budget.cap(), self.budget.used());
        OomReport::new(
            dev.label(),
            len,
            format!(
                "the cap of {} bytes would be exceeded: {used} bytes reserved",
                cap.unwrap_or(u64::MAX)
            ),
        )
        .with_cap(cap)
        .with_usage(None, Some(used))
        .into()
    }
}
