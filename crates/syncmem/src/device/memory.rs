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
//! 1. freeing cached blocks (waiting for their pending uses, then releasing free segments);
//! 2. dropping clean device mirrors of [`crate::SyncedMemory`] buffers (head synced: the host
//!    copy is current), largest first, one at a time, retrying after each. Buffers in use (a
//!    guard alive, a transfer in flight, their lock held) are skipped; dirty data (head at
//!    device) is never dropped;
//! 3. failing with [`Error::OutOfMemory`] whose detail is an [`OomReport`]: requested,
//!    allocated, reserved, largest free block, fragmentation, the cap, and the biggest holders.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use super::buffer::Release;
use super::mirror::{live_buffers, LiveBuffer, Mirrors};
use super::oom::OomReport;
use super::{Device, DeviceBuffer, PinnedBuffer, Stream};
use crate::alloc::pool::config::{
    check_env, PoolConfig, DEVICE_POOL_CONF_ENV, DEVICE_POOL_ENV, PINNED_POOL_CONF_ENV,
    PINNED_POOL_ENV,
};
use crate::alloc::pool::{Budget, Lease, Pool, PoolSnapshot, PoolStats, StreamId, HOST_STREAM};
use crate::backend::dispatch::{PinnedStorage, RawMem, RawPinned};
use crate::error::{Error, Result};

/// Memory management state of one device.
pub(crate) struct DeviceMemory {
    pool: RwLock<Option<Arc<Pool<RawMem, RawMem>>>>,
    pinned: RwLock<Option<Arc<Pool<RawPinned>>>>,
    budget: Arc<Budget>,
    /// Bytes of live direct allocations (charged to `budget` too).
    direct: AtomicU64,
    /// The registry of evictable mirrors, installed by the synced layer on first use.
    mirrors: OnceLock<Arc<dyn Mirrors>>,
    last_oom: Mutex<Option<OomReport>>,
    /// This device's trace source: its pools and copies report under it to attached traces.
    trace_source: u64,
}

impl Default for DeviceMemory {
    fn default() -> Self {
        Self {
            pool: RwLock::new(None),
            pinned: RwLock::new(None),
            budget: Arc::new(Budget::new(None)),
            direct: AtomicU64::new(0),
            mirrors: OnceLock::new(),
            last_oom: Mutex::new(None),
            trace_source: crate::alloc::trace::hub::new_source(),
        }
    }
}

fn max_segment(dev: &Device) -> usize {
    usize::try_from(dev.info().max_alloc)
        .unwrap_or(usize::MAX)
        .min(isize::MAX as usize)
}

impl DeviceMemory {
    /// The device pool, made from the environment on first use.
    pub(crate) fn pool(&self, dev: &Device) -> Result<Arc<Pool<RawMem, RawMem>>> {
        if let Some(p) = &*self.pool.read() {
            return Ok(p.clone());
        }
        let mut slot = self.pool.write();
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        check_env()?;
        let cfg = PoolConfig::from_env(DEVICE_POOL_ENV, DEVICE_POOL_CONF_ENV)?;
        let p = self.make_pool(dev, cfg)?;
        *slot = Some(p.clone());
        Ok(p)
    }

    fn make_pool(&self, dev: &Device, mut cfg: PoolConfig) -> Result<Arc<Pool<RawMem, RawMem>>> {
        cfg.round = cfg
            .round
            .max(dev.shared.raw.sub_align())
            .next_power_of_two();
        cfg.validate()?;
        let cap = cfg.memory_cap.map(|c| c.resolve(dev.info().total_memory));
        self.budget.set_cap(cap);
        let p = Pool::new(dev.label(), cfg, self.budget.clone(), max_segment(dev))?;
        p.publish(self.trace_source);
        Ok(p)
    }

    /// This device's trace source (see [`crate::alloc::trace::hub`]).
    pub(crate) fn trace_source(&self) -> u64 {
        self.trace_source
    }

    /// The device pool if it exists.
    pub(crate) fn current_pool(&self) -> Option<Arc<Pool<RawMem, RawMem>>> {
        self.pool.read().clone()
    }

    /// Replaces the device pool (which must have no block handed out).
    pub(crate) fn set_pool(&self, dev: &Device, cfg: PoolConfig) -> Result<()> {
        let mut slot = self.pool.write();
        if let Some(old) = &*slot {
            if !old.is_idle() {
                let used = old.stats().allocated.current;
                return Err(Error::InvalidState {
                    op: "Device::set_pool",
                    buffer: dev.label().to_string(),
                    reason: format!(
                        "{used} bytes of the current pool are still in use; drop them first"
                    ),
                });
            }
        }
        let new = self.make_pool(dev, cfg)?;
        if let Some(old) = slot.replace(new) {
            old.empty_cache();
        }
        Ok(())
    }

    /// The pinned host pool, made from the environment on first use.
    pub(crate) fn pinned_pool(&self, dev: &Device) -> Result<Arc<Pool<RawPinned>>> {
        if let Some(p) = &*self.pinned.read() {
            return Ok(p.clone());
        }
        let mut slot = self.pinned.write();
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        check_env()?;
        let cfg = PoolConfig::from_env(PINNED_POOL_ENV, PINNED_POOL_CONF_ENV)?;
        let total = crate::Device::cpu().info().total_memory;
        let budget = Arc::new(Budget::new(cfg.memory_cap.map(|c| c.resolve(total))));
        let p = Pool::new(
            format!("{} pinned", dev.label()),
            cfg,
            budget,
            max_segment(dev),
        )?;
        p.publish(self.trace_source);
        *slot = Some(p.clone());
        Ok(p)
    }

    /// The pinned pool if it exists.
    pub(crate) fn current_pinned_pool(&self) -> Option<Arc<Pool<RawPinned>>> {
        self.pinned.read().clone()
    }

    /// The cap in effect, if any; before the device pool is built, the cap it will be built
    /// with (from `SYNCMEM_POOL_CONF`; `None` while that variable is invalid).
    pub(crate) fn cap(&self, dev: &Device) -> Option<u64> {
        if self.pool.read().is_some() {
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
    pub(crate) fn alloc_pooled(
        &self,
        dev: &Device,
        len: usize,
        stream: &Stream,
        release: Release,
        owner: Option<&Arc<str>>,
    ) -> Result<DeviceBuffer> {
        let lease = self.lease(dev, len, stream.id(), owner)?;
        Ok(DeviceBuffer::from_pool(dev, len, lease, release))
    }

    /// A block of the device pool with its view (a sub-buffer, an offset pointer): made by the
    /// pool the first time the block is handed out, reused while the block keeps its placement.
    fn lease(
        &self,
        dev: &Device,
        len: usize,
        stream: StreamId,
        owner: Option<&Arc<str>>,
    ) -> Result<Lease<RawMem, RawMem>> {
        let storage = &dev.shared.raw;
        // The common case: the pool exists and has room. It is used under the read lock (no
        // reference count taken); the lease holds the pool from then on.
        if let Some(pool) = &*self.pool.read() {
            match pool.alloc_labelled(len, stream, storage, owner) {
                Err(e) if e.is_out_of_memory() => {}
                r => return r,
            }
        }
        let pool = self.pool(dev)?;
        self.with_retries(dev, len, || {
            pool.alloc_labelled(len, stream, storage, owner)
        })
    }

    /// A pooled pinned host block of `len >= 1` bytes (zero only when its lease says so), for
    /// `owner` (as in [`DeviceMemory::alloc_pooled`]).
    pub(crate) fn alloc_pinned(
        &self,
        dev: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
    ) -> Result<PinnedBuffer> {
        let pool = self.pinned_pool(dev)?;
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
        Error::OutOfMemory {
            device: dev.label().to_string(),
            requested: len,
            detail: format!(
                " (the cap of {} bytes would be exceeded: {} bytes reserved)",
                self.budget.cap().unwrap_or(u64::MAX),
                self.budget.used()
            ),
        }
    }

    /// Runs `attempt`; on out-of-memory frees cached blocks, then drops clean mirrors one at a
    /// time, retrying after each step; finally reports.
    fn with_retries<R>(
        &self,
        dev: &Device,
        requested: usize,
        mut attempt: impl FnMut() -> Result<R>,
    ) -> Result<R> {
        let mut cause = match attempt() {
            Ok(r) => return Ok(r),
            Err(e) if e.is_out_of_memory() => cause_of(&e),
            Err(e) => return Err(e),
        };
        let pool = self.current_pool();
        // Nothing freed could make room for more than the cap or the largest allocation.
        let hopeless =
            self.budget.cap().is_some_and(|c| requested as u64 > c) || requested > max_segment(dev);
        if let Some(p) = pool.as_ref().filter(|_| !hopeless) {
            p.note_retry();
        }
        let release = || pool.as_ref().map_or(0, |p| p.empty_cache());
        let mut released = if hopeless { 0 } else { release() };
        if released > 0 {
            match attempt() {
                Ok(r) => return Ok(r),
                Err(e) if e.is_out_of_memory() => cause = cause_of(&e),
                Err(e) => return Err(e),
            }
        }
        let mut evicted = Vec::new();
        let candidates = if hopeless {
            Vec::new()
        } else {
            self.mirrors.get().map_or_else(Vec::new, |m| m.candidates())
        };
        for (item, _) in candidates {
            let Some(bytes) = item.try_evict() else {
                continue;
            };
            let label = item.label_now();
            if let Some(p) = &pool {
                p.note_eviction(&label, bytes);
            }
            evicted.push((label, bytes));
            released += release();
            match attempt() {
                Ok(r) => return Ok(r),
                Err(e) if e.is_out_of_memory() => cause = cause_of(&e),
                Err(e) => return Err(e),
            }
        }
        let mut stats = match &pool {
            Some(p) => {
                p.note_oom(requested);
                p.stats()
            }
            None => {
                return Err(Error::OutOfMemory {
                    device: dev.label().to_string(),
                    requested,
                    detail: format!(" ({cause})"),
                })
            }
        };
        let mut holders = self.live_buffers();
        holders.truncate(8);
        stats.direct_bytes = self.direct.load(Relaxed);
        let report = OomReport {
            device: dev.label().to_string(),
            requested,
            pool: stats,
            device_total: dev.info().total_memory,
            released_cache: released,
            evicted,
            holders,
            cause,
        };
        let detail = format!(" ({report})");
        *self.last_oom.lock() = Some(report);
        Err(Error::OutOfMemory {
            device: dev.label().to_string(),
            requested,
            detail,
        })
    }
}

fn cause_of(e: &Error) -> String {
    match e {
        Error::OutOfMemory { detail, .. } => {
            let d = detail.trim();
            let d = d
                .strip_prefix('(')
                .and_then(|d| d.strip_suffix(')'))
                .unwrap_or(d);
            if d.is_empty() {
                "the backend refused".to_string()
            } else {
                d.to_string()
            }
        }
        e => e.to_string(),
    }
}
