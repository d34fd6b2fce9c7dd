//! Isolated devices: a second [`Device`] on the same hardware with memory state of its own.

use super::Device;
use crate::error::Result;

impl Device {
    /// Opens an isolated device: a new handle to the hardware `spec` names (`"cpu"`,
    /// `"opencl:0"`, `"cuda:0"`) with memory state of its own. Shorthand for
    /// `Device::open(spec)?.isolated()`; see [`Device::isolated`].
    ///
    /// ```
    /// use syncmem::{Device, MemoryCap, PoolConfig};
    ///
    /// let loader = Device::open_isolated("cpu")?;
    /// loader.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(64 << 20)))?;
    /// assert_eq!(loader.memory_cap(), Some(64 << 20));
    /// assert!(!loader.same(&Device::cpu()), "another device on the same hardware");
    /// # Ok::<(), syncmem::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn open_isolated(spec: &str) -> Result<Device> {
        Ok(Self::open(spec)?.isolated())
    }

    /// A new device on the same hardware as `self`, isolated from it and from every other
    /// handle: its own device pool and pinned pool (and their cached memory), memory cap,
    /// memory counters ([`Device::memory_stats`], [`Device::pool_stats`]), registry of
    /// evictable mirrors, default stream and out-of-memory report. Every call makes another
    /// one; clones of the result share its state, as clones of any device do.
    ///
    /// [`Device::open`] gives every caller in the process the same device, so a pool or cap
    /// set by one caller ([`Device::set_pool`]) applies to all. Use an isolated device when a
    /// part of a program needs memory rules of its own:
    /// - a subsystem with its own budget (a data loader capped at a few hundred MiB beside a
    ///   training loop that uses the rest), or its own pool kind;
    /// - a library that must not see, or change, the pool settings of the program using it;
    /// - tests and benchmarks that need statistics, caps and out-of-memory behaviour no other
    ///   thread disturbs.
    ///
    /// Points to know:
    /// - The hardware is shared: caps are bookkeeping, so the caps of the devices on one
    ///   piece of hardware add up, and one device's out-of-memory path frees only its own
    ///   cache and mirrors, never another device's.
    /// - It is another device for the crate: [`Device::same`] is false against `self`,
    ///   streams and pooled allocations of one cannot be mixed with the other
    ///   ([`crate::Error::DeviceMismatch`]), and [`crate::stats`] does not list it (read its
    ///   own counters). It shares the backend context with `self` (OpenCL context, CUDA
    ///   context), so a [`crate::Stream::copy`] between their buffers works.
    /// - Its first pool is built from the same environment variables as any device's
    ///   (`SYNCMEM_POOL_CONF`...), unless [`Device::set_pool`] is called first.
    /// - Copies it makes are counted in the process-wide copy counters as well.
    /// - Dropping its last handle (and its buffers and streams) frees its pools.
    pub fn isolated(&self) -> Device {
        Device::from_raw(self.shared.raw.duplicate())
    }

    /// The former name of [`Device::isolated`].
    #[doc(hidden)]
    pub fn detached(&self) -> Device {
        self.isolated()
    }
}
