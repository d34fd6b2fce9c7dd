//! The device's side of its [`crate::device::MemPool`]s: making one (under the device's cap,
//! preallocated), allocating from it in a scope, keeping its pool until its last block is
//! freed, and counting it in the device's memory statistics. And the preallocation of any of
//! the device's pools.

use std::sync::Arc;

use super::{max_segment, DeviceMemory, PoolStorage};
use crate::alloc::pool::stats::PoolUsage;
use crate::alloc::pool::{Budget, Pool, PoolConfig};
use crate::backend::dispatch::RawMem;
use crate::device::mem_pool::mem_pool_error;
use crate::device::{Device, DeviceBuffer, Stream};
use crate::error::Result;

/// The device's MemPools: the pools of live ones and of those let go with blocks still in
/// use, and the use of those gone.
#[derive(Default)]
pub(super) struct MemPools {
    pools: Vec<Arc<Pool<RawMem, RawMem>>>,
    gone: PoolUsage,
}

impl DeviceMemory {
    /// The pool of a new MemPool of `dev` labelled `label`: its budget inside the device's
    /// (the device's pool made first, so that its cap holds), preallocated as `cfg` asks.
    pub(crate) fn make_mem_pool(
        &self,
        dev: &Device,
        label: &str,
        mut cfg: PoolConfig,
    ) -> Result<Arc<Pool<RawMem, RawMem>>> {
        self.pool(dev)?;
        let named = |e| mem_pool_error(dev, label, e);
        cfg.round = cfg
            .round
            .max(dev.shared.raw.sub_align())
            .next_power_of_two();
        let own = cfg.memory_cap.map(|c| c.resolve(dev.info().total_memory));
        let budget = Arc::new(Budget::nested(own, self.budget.clone()));
        let p = Pool::new(label, cfg, budget, max_segment(dev)).map_err(named)?;
        self.preallocate(dev, &p).map_err(named)?;
        self.mem_pools.lock().pools.push(p.clone());
        Ok(p)
    }

    /// Reserves what `p`'s configuration preallocates (see `PoolConfig::preallocate`): a
    /// percentage is of the cap in effect, else of the device's memory.
    pub(super) fn preallocate(&self, dev: &Device, p: &Pool<RawMem, RawMem>) -> Result<()> {
        let Some(amount) = p.config().preallocate else {
            return Ok(());
        };
        let cap = p.budget().governing().map(|(cap, _)| cap);
        let bytes = amount.resolve(cap, dev.info().total_memory);
        let storage = PoolStorage {
            dev,
            zero_copy: &self.zero_copy,
        };
        p.preallocate(bytes, &storage)?;
        Ok(())
    }

    /// A block of the MemPool `pool` (the calling thread's scope on this device): after a
    /// refusal, retried once the pool gave back as much of its own cache as the request needs
    /// (largest idle segments first), then through the device's out-of-memory path.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_scoped(
        &self,
        dev: &Device,
        len: usize,
        stream: &Stream,
        owner: Option<&Arc<str>>,
        pool: &Arc<Pool<RawMem, RawMem>>,
    ) -> Result<DeviceBuffer> {
        let storage = PoolStorage {
            dev,
            zero_copy: &self.zero_copy,
        };
        // No owner kept for the stream's leases: the buffer holds the device itself, so that
        // the pool keeps no handle that would hold the device (and so the pool).
        let once = || pool.alloc_with(len, stream.id(), &storage, owner, None);
        let attempt = || match once() {
            Err(e) if e.is_out_of_memory() && pool.release_at_least(len as u64) > 0 => {
                pool.note_retry();
                self.or_drained(once(), once)
            }
            r => self.or_drained(r, once),
        };
        let lease = self.with_retries(dev, len, attempt).inspect_err(|e| {
            if e.is_out_of_memory() {
                pool.note_oom(len);
            }
        })?;
        Ok(DeviceBuffer::from_pool(stream, len, lease))
    }

    /// `r`, or when it is out of memory and MemPools let go gave cached memory back (see
    /// [`DeviceMemory::release_drained`]), `retry`'s result.
    pub(super) fn or_drained<R>(
        &self,
        r: Result<R>,
        retry: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        match r {
            Err(e) if e.is_out_of_memory() && self.release_drained() > 0 => retry(),
            r => r,
        }
    }

    /// Gives back the cached segments of the MemPools let go, waiting for their pending work:
    /// a block freed into such a pool with work still queued on it leaves its segment cached
    /// until then (a free never waits). Returns the bytes released.
    fn release_drained(&self) -> u64 {
        let drained: Vec<_> = {
            let m = self.mem_pools.lock();
            m.pools.iter().filter(|p| p.is_retired()).cloned().collect()
        };
        let bytes = drained.iter().map(|p| p.empty_cache()).sum();
        drop(drained);
        self.prune_mem_pools();
        bytes
    }

    /// A MemPool's last handle and scope are gone: its pool drains (refuses work, gives its
    /// cache back now and each segment as it empties) and stays listed until its last block
    /// is freed.
    pub(crate) fn let_go(&self, pool: &Arc<Pool<RawMem, RawMem>>) {
        pool.drain();
        self.prune_mem_pools();
    }

    /// Forgets the pools of MemPools let go whose blocks have all been freed, keeping their
    /// counts.
    fn prune_mem_pools(&self) {
        let mut gone = Vec::new();
        {
            let mut m = self.mem_pools.lock();
            let mut i = 0;
            while i < m.pools.len() {
                let p = &m.pools[i];
                if p.is_retired() && p.is_idle() {
                    let p = m.pools.swap_remove(i);
                    m.gone = m.gone.fold(p.usage());
                    gone.push(p);
                } else {
                    i += 1;
                }
            }
        }
        // Nothing is handed out: whatever a fence still held goes now (outside the lock).
        for p in gone {
            p.empty_cache();
        }
    }

    /// The use of the device's MemPools, live and gone (see [`DeviceMemory::stats_with`]).
    pub(super) fn mem_pool_usage(&self) -> PoolUsage {
        self.prune_mem_pools();
        let m = self.mem_pools.lock();
        m.pools.iter().fold(m.gone, |u, p| u.fold(p.usage()))
    }

    /// Bytes charged to the device's budget: its pools' segments and direct allocations.
    pub(crate) fn reserved(&self) -> u64 {
        self.budget.used()
    }

    /// Resets the peaks of the device's MemPools.
    pub(super) fn reset_mem_pool_peaks(&self) {
        let mut m = self.mem_pools.lock();
        m.gone.peak = 0;
        m.pools.iter().for_each(|p| p.reset_peak());
    }
}
