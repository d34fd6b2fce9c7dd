//! Always-on memory and copy statistics.
//!
//! Counters are plain atomics updated with `Relaxed` ordering: cheap enough to stay on in
//! production. A device's pooled buffers are counted by its pool instead, under the lock of
//! the shard that serves them (see `Device::memory_stats`): a reading of a device's memory
//! takes each shard's lock once. A [`crate::Snapshot`] (from [`crate::stats`]) reads them all and
//! prints readably.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

mod counters;

pub(crate) use counters::{Counted, MemCounters};

/// A reading of one memory space's counters (kept by the crate; see [`crate::stats`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MemStats {
    /// Memory space (`host`, `opencl:0`, `opencl:0 pinned`, ...).
    pub label: String,
    /// Bytes allocated now.
    pub in_use: u64,
    /// Highest `in_use` seen (since the last reset): exact while one thread allocates (and,
    /// on a device, one kind: direct or pooled); allocations that count apart (several threads
    /// at once, direct and pooled buffers) add their peaks, an upper bound.
    pub peak: u64,
    /// Number of allocations.
    pub allocs: u64,
    /// Number of frees.
    pub frees: u64,
}

/// What moved a buffer's data between host and device memory: a copy in one direction, a
/// zero-copy sync, or the write-back and return of a spilled mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Direction {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory.
    DeviceToDevice,
    /// A zero-copy sync: host and device share the memory, and the side that was stale became
    /// current without a copy (a map or an unmap where the device needs one, nothing
    /// otherwise; see [`crate::device::zero_copy`]).
    Mapped,
    /// A dirty device mirror written back to the host to make room on the device (a spill).
    Spill,
    /// A spilled buffer brought back to the device by its next device access.
    Refill,
}

impl Direction {
    /// Every kind, in the order of [`CopyStats`]'s fields.
    pub const ALL: [Direction; 6] = [
        Direction::HostToDevice,
        Direction::DeviceToHost,
        Direction::DeviceToDevice,
        Direction::Mapped,
        Direction::Spill,
        Direction::Refill,
    ];

    /// `host_to_device`, `device_to_host`, `device_to_device`, `mapped`, `spill` or `refill`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::HostToDevice => "host_to_device",
            Direction::DeviceToHost => "device_to_host",
            Direction::DeviceToDevice => "device_to_device",
            Direction::Mapped => "mapped",
            Direction::Spill => "spill",
            Direction::Refill => "refill",
        }
    }

    /// True for the copies proper (host to device, device to host, device to device): the
    /// kinds that move bytes to keep the mirrors coherent.
    pub fn is_copy(self) -> bool {
        matches!(
            self,
            Direction::HostToDevice | Direction::DeviceToHost | Direction::DeviceToDevice
        )
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number of [`Direction`]s.
const KINDS: usize = Direction::ALL.len();

/// Live copy counters by direction.
#[derive(Debug, Default)]
pub(crate) struct CopyCounters {
    counts: [AtomicU64; KINDS],
    bytes: [AtomicU64; KINDS],
}

impl CopyCounters {
    /// New zeroed counters.
    pub const fn new() -> Self {
        Self {
            counts: [const { AtomicU64::new(0) }; KINDS],
            bytes: [const { AtomicU64::new(0) }; KINDS],
        }
    }

    fn index(d: Direction) -> usize {
        match d {
            Direction::HostToDevice => 0,
            Direction::DeviceToHost => 1,
            Direction::DeviceToDevice => 2,
            Direction::Mapped => 3,
            Direction::Spill => 4,
            Direction::Refill => 5,
        }
    }

    /// Records one copy of `bytes` in direction `d`.
    pub fn record(&self, d: Direction, bytes: usize) {
        let i = Self::index(d);
        self.counts[i].fetch_add(1, Relaxed);
        self.bytes[i].fetch_add(bytes as u64, Relaxed);
    }

    /// Reads the counters.
    pub fn snapshot(&self) -> CopyStats {
        CopyStats::from_fn(|d| {
            let i = Self::index(d);
            CopyDir {
                count: self.counts[i].load(Relaxed),
                bytes: self.bytes[i].load(Relaxed),
            }
        })
    }
}

/// Count and bytes of copies in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CopyDir {
    /// Number of copies.
    pub count: u64,
    /// Bytes copied.
    pub bytes: u64,
}

impl CopyDir {
    /// `count` copies of `bytes` bytes in all (for figures derived from readings: sums, maxima).
    pub fn new(count: u64, bytes: u64) -> Self {
        Self { count, bytes }
    }
}

/// A reading of copy counters (of the process, of a thread, or of one buffer): copies by
/// direction, zero-copy syncs, spills and refills.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct CopyStats {
    /// Host to device.
    pub host_to_device: CopyDir,
    /// Device to host.
    pub device_to_host: CopyDir,
    /// Device to device.
    pub device_to_device: CopyDir,
    /// Zero-copy syncs: a stale side made current without a copy ([`Direction::Mapped`]).
    pub mapped: CopyDir,
    /// Dirty device mirrors written back to the host to make room ([`Direction::Spill`]).
    pub spilled: CopyDir,
    /// Spilled buffers brought back to the device ([`Direction::Refill`]).
    pub refilled: CopyDir,
}

impl CopyStats {
    /// The figures of `f(direction)` for every direction.
    pub fn from_fn(mut f: impl FnMut(Direction) -> CopyDir) -> CopyStats {
        CopyStats {
            host_to_device: f(Direction::HostToDevice),
            device_to_host: f(Direction::DeviceToHost),
            device_to_device: f(Direction::DeviceToDevice),
            mapped: f(Direction::Mapped),
            spilled: f(Direction::Spill),
            refilled: f(Direction::Refill),
        }
    }

    /// The counts for one direction.
    pub fn get(&self, d: Direction) -> CopyDir {
        match d {
            Direction::HostToDevice => self.host_to_device,
            Direction::DeviceToHost => self.device_to_host,
            Direction::DeviceToDevice => self.device_to_device,
            Direction::Mapped => self.mapped,
            Direction::Spill => self.spilled,
            Direction::Refill => self.refilled,
        }
    }

    /// The counts for one direction, mutably.
    pub fn get_mut(&mut self, d: Direction) -> &mut CopyDir {
        match d {
            Direction::HostToDevice => &mut self.host_to_device,
            Direction::DeviceToHost => &mut self.device_to_host,
            Direction::DeviceToDevice => &mut self.device_to_device,
            Direction::Mapped => &mut self.mapped,
            Direction::Spill => &mut self.spilled,
            Direction::Refill => &mut self.refilled,
        }
    }

    /// Total number of copies proper, in all three directions (zero-copy syncs, spills and
    /// refills are not copies: see their own fields).
    pub fn total_count(&self) -> u64 {
        self.host_to_device.count + self.device_to_host.count + self.device_to_device.count
    }

    /// Total bytes of the copies proper, in all three directions.
    pub fn total_bytes(&self) -> u64 {
        self.host_to_device.bytes + self.device_to_host.bytes + self.device_to_device.bytes
    }

    /// Difference `self - earlier`, per direction (saturating).
    pub fn since(&self, earlier: &CopyStats) -> CopyStats {
        CopyStats::from_fn(|d| {
            let (a, b) = (self.get(d), earlier.get(d));
            CopyDir {
                count: a.count.saturating_sub(b.count),
                bytes: a.bytes.saturating_sub(b.bytes),
            }
        })
    }

    /// Sum `self + other`, per direction (saturating).
    pub fn plus(&self, other: &CopyStats) -> CopyStats {
        CopyStats::from_fn(|d| {
            let (a, b) = (self.get(d), other.get(d));
            CopyDir {
                count: a.count.saturating_add(b.count),
                bytes: a.bytes.saturating_add(b.bytes),
            }
        })
    }
}

impl fmt::Display for CopyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in Direction::ALL {
            let c = self.get(d);
            let what = if d.is_copy() { "copies" } else { "times" };
            writeln!(
                f,
                "  {:<17} {:>8} {what:<6} {:>14}",
                d.as_str(),
                c.count,
                human_bytes(c.bytes)
            )?;
        }
        Ok(())
    }
}

/// Counts the times the host blocked on device work: waits for an event or a command that was
/// not complete yet, blocking copies and queue finishes on a device that runs asynchronously
/// (never on the `cpu` device, whose work is done when it returns).
#[derive(Debug, Default)]
pub(crate) struct WaitCounter(AtomicU64);

impl WaitCounter {
    /// A counter at zero (usable in a `static`).
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Counts one wait.
    pub fn count(&self) {
        self.0.fetch_add(1, Relaxed);
    }

    /// The waits counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Every host wait on device work in the process (see [`WaitCounter`]).
pub(crate) static WAITS: WaitCounter = WaitCounter::new();

/// The host waits on device work counted so far in the process: waits for events or commands
/// not complete yet, blocking copies and queue finishes on devices that run asynchronously.
/// A training step that reads its loss and accuracy back needs one.
pub fn host_waits() -> u64 {
    WAITS.get()
}

/// The copies and host waits of the calling thread (see [`thread_copies`]).
struct ThreadCounters {
    counts: [Cell<u64>; KINDS],
    bytes: [Cell<u64>; KINDS],
    waits: Cell<u64>,
}

thread_local! {
    static THREAD: ThreadCounters = const {
        ThreadCounters {
            counts: [const { Cell::new(0) }; KINDS],
            bytes: [const { Cell::new(0) }; KINDS],
            waits: Cell::new(0),
        }
    };
}

/// Counts a copy made through a stream: in the process's counters and the calling thread's.
pub(crate) fn count_copy(d: Direction, bytes: usize) {
    COPIES.record(d, bytes);
    let i = CopyCounters::index(d);
    // A thread being torn down counts in the process's counters only.
    let _ = THREAD.try_with(|t| {
        t.counts[i].set(t.counts[i].get() + 1);
        t.bytes[i].set(t.bytes[i].get() + bytes as u64);
    });
}

/// Counts a host wait on device work: in the process's counter and the calling thread's.
pub(crate) fn count_wait() {
    WAITS.count();
    let _ = THREAD.try_with(|t| t.waits.set(t.waits.get() + 1));
}

/// The copies the calling thread made through syncmem streams so far (every direction).
///
/// Unlike the process's counters ([`crate::stats`]), work other threads do at the same time
/// does not count here: take a reading before and after a piece of work that runs on one
/// thread (a training step, say) to count exactly its copies. A copy is counted by the thread
/// that queues it, whenever it completes.
pub fn thread_copies() -> CopyStats {
    THREAD
        .try_with(|t| {
            CopyStats::from_fn(|d| {
                let i = CopyCounters::index(d);
                CopyDir {
                    count: t.counts[i].get(),
                    bytes: t.bytes[i].get(),
                }
            })
        })
        .unwrap_or_default()
}

/// The host waits on device work of the calling thread so far (see [`host_waits`] and
/// [`thread_copies`]).
pub fn thread_host_waits() -> u64 {
    THREAD.try_with(|t| t.waits.get()).unwrap_or(0)
}

/// Every copy made through a [`crate::Stream`] in the process so far, on every thread: one
/// read of the process-wide counters (no walk over devices, unlike [`crate::stats`]).
pub fn process_copies() -> CopyStats {
    COPIES.snapshot()
}

/// Counters for host memory made by [`crate::alloc::HostBlock`].
pub(crate) static HOST: MemCounters = MemCounters::new();
/// Every copy made through a [`crate::Stream`].
pub(crate) static COPIES: CopyCounters = CopyCounters::new();

/// Formats a byte count with a binary unit (`1.5 MiB`).
pub fn human_bytes(b: u64) -> String {
    crate::error::human_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_counters_by_direction() {
        let c = CopyCounters::new();
        c.record(Direction::HostToDevice, 10);
        c.record(Direction::HostToDevice, 5);
        c.record(Direction::DeviceToHost, 7);
        let s = c.snapshot();
        assert_eq!(
            s.host_to_device,
            CopyDir {
                count: 2,
                bytes: 15
            }
        );
        assert_eq!(s.device_to_host, CopyDir { count: 1, bytes: 7 });
        assert_eq!(s.total_count(), 3);
        let later = CopyStats {
            device_to_device: CopyDir { count: 1, bytes: 1 },
            ..s
        };
        assert_eq!(later.since(&s).total_count(), 1);
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
    }
}
