//! The host pool: cached host memory for [`crate::SyncedMemory`] host mirrors.
//!
//! Large host buffers come from `mmap` and go back to the kernel on every free (glibc above its
//! mmap threshold), so reallocating a 64 MiB buffer pays ~16k page faults again (~45 ms measured
//! on a 2-core VM). The host pool keeps freed blocks: a reuse is a cache hit at the same address
//! with the pages already faulted.
//!
//! Zeroing: segments come from `calloc` (fresh zero pages, nothing touched), so a block that
//! was never handed out is known to be zero ([`HostAllocation::was_zeroed`]); a reused block
//! holds the bytes of its previous user (always initialised memory). Callers that need zeros
//! call [`HostAllocation::zero`], which writes only when the block is not known to be zero.
//!
//! Each thread serves its own unnamed frees back to itself from a cache of its own (see
//! [`super::Pool`]'s notes on thread caches): a small allocate + free there costs a fraction
//! of the system allocator's.
//!
//! The process-wide pool ([`HostPool::global`]) is configured by `SYNCMEM_HOST_POOL` and
//! `SYNCMEM_HOST_POOL_CONF` (see [`super::config`]); [`HostPool::new`] makes private ones.

use std::sync::{Arc, OnceLock};

use super::config::{PoolConfig, HOST_POOL_CONF_ENV, HOST_POOL_ENV};
use super::{Budget, Pool, PoolSnapshot, PoolStats, Slim};
use crate::alloc::stats::{Counted, HOST};
use crate::alloc::{HostBlock, HOST_ALIGN};
use crate::error::{Error, Result};

/// The segments of host pools: zeroed host memory, not counted (the pool counts its blocks).
fn source(bytes: usize) -> Result<HostBlock> {
    HostBlock::zeroed_uncounted(bytes)
}

/// A pool of host memory (64-byte aligned, initialised bytes).
#[derive(Debug, Clone)]
pub struct HostPool {
    pool: Arc<Pool<HostBlock>>,
    /// Whether allocations count in the process-wide host counters (`syncmem::stats().host`).
    counted: bool,
}

static GLOBAL: OnceLock<std::result::Result<HostPool, (String, String)>> = OnceLock::new();

impl HostPool {
    /// The process-wide host pool, configured from the environment on first use.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `SYNCMEM_HOST_POOL` / `SYNCMEM_HOST_POOL_CONF` are invalid
    /// (every call reports it).
    pub fn global() -> Result<&'static HostPool> {
        let r = GLOBAL.get_or_init(|| {
            PoolConfig::from_env(HOST_POOL_ENV, HOST_POOL_CONF_ENV)
                .and_then(|c| Self::build("host", c, true))
                .map_err(|e| match e {
                    Error::InvalidConfig { what, reason } => (what, reason),
                    e => ("host pool".to_string(), e.to_string()),
                })
        });
        r.as_ref().map_err(|(what, reason)| Error::InvalidConfig {
            what: what.clone(),
            reason: reason.clone(),
        })
    }

    /// The global pool if it was created already (does not read the environment).
    pub(crate) fn global_if_initialised() -> Option<&'static HostPool> {
        GLOBAL.get().and_then(|r| r.as_ref().ok())
    }

    /// A private host pool (its own cache and statistics; not counted in the process-wide host
    /// counters). A [`PoolConfig::memory_cap`] fraction is of the machine's memory, a
    /// [`PoolConfig::preallocate`] one of the cap, else of the machine's memory.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the configuration does not validate,
    /// [`Error::OutOfMemory`] when its preallocation does not fit.
    pub fn new(label: impl Into<String>, config: PoolConfig) -> Result<Self> {
        Self::build(label, config, false)
    }

    fn build(label: impl Into<String>, config: PoolConfig, counted: bool) -> Result<Self> {
        let total = crate::backend::cpu::total_memory();
        let cap = config.memory_cap.map(|c| c.resolve(total));
        let budget = Arc::new(Budget::new(cap));
        let pool = Pool::new(label, config, budget, isize::MAX as usize)?;
        if let Some(amount) = pool.config().preallocate {
            pool.preallocate(amount.resolve(cap, total), &source)?;
        }
        if counted {
            // The process-wide pool publishes to the sinks attached process-wide.
            pool.publish(crate::alloc::event::HOST_SOURCE);
        }
        Ok(Self { pool, counted })
    }

    /// Allocates `len` bytes. The contents are initialised but unspecified: zero when
    /// [`HostAllocation::was_zeroed`], else the bytes of an earlier user. `len == 0` allocates
    /// nothing.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] (the system allocator or the pool's cap refused),
    /// [`Error::SizeOverflow`].
    pub fn alloc(&self, len: usize) -> Result<HostAllocation> {
        self.alloc_labelled(len, None)
    }

    /// [`HostPool::alloc`] for an owner named `owner` (a tensor's or blob's name), which the
    /// pool keeps with the block for [memory snapshots](super::Pool::snapshot).
    ///
    /// # Errors
    /// As [`HostPool::alloc`].
    pub fn alloc_labelled(&self, len: usize, owner: Option<&Arc<str>>) -> Result<HostAllocation> {
        if len == 0 {
            return Ok(HostAllocation { block: None });
        }
        // The block is moved once, into place, from the thread's cache (see
        // `HostAllocation`).
        let mut out = HostAllocation { block: None };
        if !(owner.is_none() && self.pool.take_cached(len, &mut out.block)) {
            let block = match self.pool.alloc_host(len, &source, owner) {
                Ok(b) => b,
                Err(e) => self.retry(len, owner, e)?,
            };
            out.block = Some(block);
        }
        if self.counted {
            out.count();
        }
        Ok(out)
    }

    /// After a failed allocation: when out of memory, gives the cache back to the system and
    /// tries once more; a failure for good is reported to the pool's observers.
    #[cold]
    fn retry(&self, len: usize, owner: Option<&Arc<str>>, e: Error) -> Result<Slim<HostBlock>> {
        let r = if e.is_out_of_memory() && self.pool.empty_cache() > 0 {
            self.pool.note_retry();
            self.pool.alloc_host(len, &source, owner)
        } else {
            Err(e)
        };
        r.map_err(|mut e| {
            if let Error::OutOfMemory { report } = &mut e {
                self.pool.note_oom(len);
                report.device = "host".into();
            }
            e
        })
    }

    /// Statistics of the pool.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Every segment and block of the pool (see [`super::Pool::snapshot`]).
    pub fn snapshot(&self) -> PoolSnapshot {
        self.pool.snapshot()
    }

    /// Releases cached free segments (see [`Pool::trim`]). Returns the bytes released.
    pub fn trim(&self) -> u64 {
        self.pool.trim()
    }

    /// Releases every cached free segment (see [`Pool::empty_cache`]).
    pub fn empty_cache(&self) -> u64 {
        self.pool.empty_cache()
    }

    /// Resets the peak statistics.
    pub fn reset_peak(&self) {
        self.pool.reset_peak()
    }

    /// The pool underneath (e.g. to attach an observer).
    pub fn pool(&self) -> &Arc<Pool<HostBlock>> {
        &self.pool
    }
}

/// A block of host memory from a [`HostPool`]: 64-byte aligned, `len()` initialised bytes.
/// Goes back to its pool when dropped.
///
/// Its block is all it holds, in 64 bytes (the block's own form for host pools and thread
/// caches, which moves in whole 16-byte pieces): the length is the block's request, and
/// whether the process-wide host statistics counted it, and in which stripe, is in the
/// block's flags.
pub struct HostAllocation {
    block: Option<Slim<HostBlock>>,
}

/// A flag of a host allocation's block: counted in the host statistics, in the stripe at
/// [`STRIPE_SHIFT`] (above the pool's own flags).
const HOST_COUNTED: u64 = 1 << 16;
/// Where a counted host allocation's block keeps its stripe (8 bits).
const STRIPE_SHIFT: u32 = 8;

impl HostAllocation {
    /// Counts the allocation in the process-wide host statistics (the global pool's): its
    /// stripe goes in the block's tags.
    #[inline(never)]
    fn count(&mut self) {
        if let Some(b) = self.block.take() {
            let stripe = u64::from(HOST.on_alloc(b.len()).stripe());
            self.block = Some(b.with_tag(HOST_COUNTED | stripe << STRIPE_SHIFT));
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.len())
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.block.is_none()
    }

    /// Start of the memory (aligned dangling when empty).
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.block {
            // SAFETY: the block lies inside its segment (offset + block size <= segment size),
            // so the offset pointer stays within the segment's allocation.
            Some(l) => unsafe { l.segment().as_ptr().add(l.offset()) },
            None => HOST_ALIGN as *mut u8,
        }
    }

    /// True when the bytes are known to be zero (a fresh segment's, never handed out before).
    pub fn was_zeroed(&self) -> bool {
        self.block.as_ref().is_none_or(|l| l.zeroed())
    }

    /// Makes every byte zero, writing only when they are not known to be zero already.
    /// Returns whether it wrote.
    pub fn zero(&mut self) -> bool {
        if self.was_zeroed() {
            return false;
        }
        self.as_mut_slice().fill(0);
        true
    }

    /// Bytes the block occupies in its pool (the request rounded up).
    pub fn block_size(&self) -> usize {
        self.block.as_ref().map_or(0, |l| l.block_size())
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let len = self.len();
        if len == 0 {
            return &[];
        }
        // SAFETY: the block is `len` bytes of a live segment (kept alive by the block), its
        // bytes are initialised (calloc'ed, or written by earlier users), no other block covers
        // them, and `&self` excludes writers through this value.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len();
        if len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), len) }
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        // The block goes back to its pool where it lies, after this (a move would copy it).
        if let Some(b) = &self.block {
            if b.flags() & HOST_COUNTED != 0 {
                let stripe = Counted::from_stripe((b.flags() >> STRIPE_SHIFT) as u8);
                HOST.on_free(stripe, b.len());
            }
        }
    }
}

impl std::fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAllocation")
            .field("len", &self.len())
            .field("block_size", &self.block_size())
            .finish()
    }
}
