//! [`MemPool`]: a private pool of one device, and [`MemPoolScope`], which routes the calling
//! thread's allocations on that device to it (PyTorch's `torch.cuda.MemPool` and
//! `torch.cuda.use_mem_pool`).
//!
//! The scopes of a thread are a stack in a thread-local: the allocation path of a device reads
//! one thread-local counter, and looks at the stack only when a scope is open on the thread.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::Device;
use crate::alloc::pool::{Pool, PoolConfig, PoolSnapshot, PoolStats};
use crate::backend::dispatch::RawMem;
use crate::error::{Error, Result};

/// A private pool of one device's memory, with the kinds and settings of a device pool (a
/// [`PoolConfig`]): the allocations a thread makes on that device while one of its
/// [scopes](MemPool::scope) is open come from it, and nothing else does.
///
/// Use it to keep one phase's memory apart (a model's activations, an evaluation, a data
/// loader's staging buffers) and give it all back at once: its own statistics
/// ([`MemPool::stats`]) and snapshot ([`MemPool::snapshot`]), and its cached segments go
/// back to the backend when it is dropped ([`MemPool::release`], [`MemPool::empty_cache`]).
///
/// - **Routing.** [`MemPool::scope`] returns a guard; until it is dropped, the pooled device
///   allocations the calling thread makes on the pool's device (device mirrors of
///   [`crate::SyncedMemory`] buffers and tensors, [`Device::alloc_pooled`]) come from the
///   pool. Other threads, other devices and allocations outside every scope never use it.
///   Scopes nest: the innermost scope of a device wins, and dropping a guard gives the
///   routing back to the scope it was opened in. Direct allocations ([`Device::alloc`]) and
///   pinned host memory stay where they are.
/// - **Frees.** A block goes back to the pool it came from, whenever and from whichever thread
///   it is freed (inside or outside the scope).
/// - **Lifetime.** The pool lives while its handle or one of its scopes does. Then its cached
///   segments go back to the backend at once; blocks still in use keep their segments (and the
///   pool's bookkeeping) until they are freed, each segment going back as it empties.
/// - **Memory cap.** The device's cap ([`Device::set_pool`], `SYNCMEM_POOL_CONF`) counts the
///   pool's segments; the config's own `memory_cap` adds a cap of the pool's own below it.
///   `preallocate` and `gc_threshold` work as in a device pool, under the pool's cap or else
///   the device's. An allocation the pool refuses runs the device's out-of-memory path
///   (after the pool's own cache is emptied); the device's path does not empty a live
///   MemPool's cache, as PyTorch leaves a live private pool's: [`MemPool::empty_cache`] does.
/// - **Statistics.** [`Device::memory_stats`] counts the pool's buffers with the device's;
///   [`crate::stats`], [`crate::memory_snapshot`] and traces list the device's own pools only.
///
/// ```
/// use syncmem::{Device, MemPool, PoolConfig, SyncedMemory};
///
/// let dev = Device::open_isolated("cpu")?;
/// let pool = MemPool::new(&dev, PoolConfig::default())?;
/// let kept = {
///     let _scope = pool.scope(); // this thread's allocations on `dev` now come from `pool`
///     let buf = SyncedMemory::new(1 << 20, &dev);
///     buf.device_overwrite()?.fill(0)?; // its device mirror is a block of `pool`
///     buf
/// }; // the scope ends: allocations go to the device's pool again
/// assert_eq!(pool.stats().allocated.current, 1 << 20);
/// assert_eq!(dev.pool_stats().map_or(0, |s| s.allocations), 0);
/// drop(kept); // the block goes back to `pool`, from any thread
/// assert_eq!(pool.stats().allocated.current, 0);
/// let released = pool.release(); // its segments go back to the backend now
/// assert!(released >= 1 << 20);
/// # Ok::<(), syncmem::Error>(())
/// ```
pub struct MemPool {
    private: Arc<Private>,
}

/// The pool, kept by its handle and its open scopes.
struct Private {
    pool: Arc<Pool<RawMem, RawMem>>,
    device: Device,
    id: u64,
}

impl Drop for Private {
    fn drop(&mut self) {
        self.device.shared.memory.let_go(&self.pool);
    }
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);
static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);

impl MemPool {
    /// A private pool of `device` made from `config` (kind, sizes, an own `memory_cap`,
    /// `preallocate`, `gc_threshold`; a fraction or percentage is of the device's total
    /// memory, a preallocated percentage of the cap in effect). It is labelled
    /// `"DEVICE mempool N"` (N numbers the process's MemPools from 1). The device's pool is
    /// made first when it is yet to be, so that a cap from `SYNCMEM_POOL_CONF` holds.
    ///
    /// # Errors
    /// [`Error::MemPool`] naming the device and the pool, with the cause: an
    /// [`Error::InvalidConfig`] (an invalid configuration; a `gc_threshold` when neither the
    /// pool nor the device has a cap; a preallocation above `gc_threshold x cap`), or the
    /// [`Error::OutOfMemory`] of its preallocation. The device pool's own errors (an invalid
    /// `SYNCMEM_POOL_CONF`) as they are.
    pub fn new(device: &Device, config: PoolConfig) -> Result<MemPool> {
        let id = NEXT_POOL.fetch_add(1, Relaxed);
        let label = format!("{} mempool {id}", device.label());
        let pool = device.shared.memory.make_mem_pool(device, &label, config)?;
        Ok(MemPool {
            private: Arc::new(Private {
                pool,
                device: device.clone(),
                id,
            }),
        })
    }

    /// Opens a scope on the calling thread: until the guard is dropped, the thread's pooled
    /// allocations on the pool's device come from this pool (see [`MemPool`]). Scopes nest;
    /// the guard stays on its thread (it is not `Send`).
    pub fn scope(&self) -> MemPoolScope {
        let id = NEXT_SCOPE.fetch_add(1, Relaxed);
        let open = Open {
            device: key(&self.private.device),
            id,
            pool: self.private.clone(),
        };
        SCOPES.with(|s| {
            let mut s = s.borrow_mut();
            s.push(open);
            OPEN.with(|o| o.set(s.len()));
        });
        MemPoolScope {
            id,
            label: self.private.pool.label().into(),
            _on_this_thread: PhantomData,
        }
    }

    /// The number of this pool among the process's MemPools (from 1).
    pub fn id(&self) -> u64 {
        self.private.id
    }

    /// The pool's label, `"DEVICE mempool N"`.
    pub fn label(&self) -> &str {
        self.private.pool.label()
    }

    /// The device whose memory the pool holds.
    pub fn device(&self) -> &Device {
        &self.private.device
    }

    /// The configuration the pool was made with (its rounding raised to the device's
    /// sub-buffer alignment).
    pub fn config(&self) -> &PoolConfig {
        self.private.pool.config()
    }

    /// The pool's statistics: the type of [`Device::pool_stats`]'s, its `cap` the one in
    /// effect (the pool's own, else the device's).
    pub fn stats(&self) -> PoolStats {
        self.private.pool.stats()
    }

    /// Every segment of the pool and every block in it, with the statistics of the same
    /// instant (see [`crate::alloc::pool::snapshot`]).
    pub fn snapshot(&self) -> PoolSnapshot {
        self.private.pool.snapshot()
    }

    /// Gives back the cached segments whose pending work has completed, without waiting.
    /// Returns the bytes released.
    pub fn trim(&self) -> u64 {
        self.private.pool.trim()
    }

    /// Waits for the pending work of cached blocks, then gives every wholly free segment back
    /// to the backend. Returns the bytes released; the pool stays usable.
    pub fn empty_cache(&self) -> u64 {
        self.private.pool.empty_cache()
    }

    /// Lets the pool go now (as dropping it does) and returns the bytes of cached segments
    /// given back to the backend. A scope still open keeps the pool until it ends; blocks still
    /// in use keep their segments until they are freed.
    pub fn release(self) -> u64 {
        let released = self.private.pool.empty_cache();
        drop(self);
        released
    }
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("label", &self.label())
            .field("kind", &self.config().kind)
            .finish()
    }
}

/// A scope of a [`MemPool`] on one thread (see [`MemPool::scope`]): while it lives, the
/// thread's pooled allocations on the pool's device come from the pool. Dropping it gives the
/// routing back to the scope it was opened in (or to the device's pool). It keeps the pool
/// alive, and stays on its thread.
#[must_use = "the scope ends when the guard is dropped"]
pub struct MemPoolScope {
    id: u64,
    label: Box<str>,
    /// Not `Send` or `Sync`: the scope belongs to the thread that opened it.
    _on_this_thread: PhantomData<*const ()>,
}

impl MemPoolScope {
    /// The label of the pool the scope routes to.
    pub fn pool_label(&self) -> &str {
        &self.label
    }
}

impl Drop for MemPoolScope {
    fn drop(&mut self) {
        // The pool may go with the scope: dropped once the thread's stack is borrowed no more.
        let closed = SCOPES.try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let at = s.iter().rposition(|o| o.id == self.id)?;
            let open = s.remove(at);
            OPEN.with(|o| o.set(s.len()));
            Some(open)
        });
        drop(closed);
    }
}

impl fmt::Debug for MemPoolScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPoolScope")
            .field("pool", &self.label)
            .finish()
    }
}

/// A scope open on this thread.
struct Open {
    /// The device's key (see [`key`]).
    device: usize,
    id: u64,
    pool: Arc<Private>,
}

thread_local! {
    /// The number of scopes open on this thread: all the allocation path reads when it is 0.
    static OPEN: Cell<usize> = const { Cell::new(0) };
    /// The scopes open on this thread, innermost last.
    static SCOPES: RefCell<Vec<Open>> = const { RefCell::new(Vec::new()) };
}

/// A device's identity while a handle of it lives (a scope holds one, through its pool).
fn key(device: &Device) -> usize {
    Arc::as_ptr(&device.shared) as usize
}

/// The pool of the calling thread's innermost scope on `device`, if any. Costs one
/// thread-local read when no scope is open on the thread.
#[inline]
pub(crate) fn scoped(device: &Device) -> Option<Arc<Pool<RawMem, RawMem>>> {
    if OPEN.with(Cell::get) == 0 {
        return None;
    }
    routed(device)
}

#[cold]
#[inline(never)]
fn routed(device: &Device) -> Option<Arc<Pool<RawMem, RawMem>>> {
    let device = key(device);
    SCOPES
        .try_with(|s| {
            let s = s.try_borrow().ok()?;
            let open = s.iter().rev().find(|o| o.device == device)?;
            Some(open.pool.pool.clone())
        })
        .ok()
        .flatten()
}

/// The error of making the MemPool `label` of `device`, for `error`.
pub(crate) fn mem_pool_error(device: &Device, label: &str, error: Error) -> Error {
    Error::MemPool {
        device: device.label().to_string(),
        pool: label.to_string(),
        error: Box::new(error),
    }
}
