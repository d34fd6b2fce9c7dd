//! The out-of-memory report of a device.

use std::fmt;

use super::mirror::LiveBuffer;
use crate::alloc::pool::PoolStats;
use crate::alloc::stats::human_bytes;

/// What the out-of-memory path saw and did, attached to the error it returns (formatted into
/// [`crate::Error::OutOfMemory`]'s detail) and kept by the device
/// ([`crate::Device::last_oom_report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    /// The device.
    pub device: String,
    /// Bytes asked for.
    pub requested: usize,
    /// The device pool after every attempt.
    pub pool: PoolStats,
    /// Total memory the device reports.
    pub device_total: u64,
    /// Bytes of cached segments released while retrying.
    pub released_cache: u64,
    /// Clean mirrors dropped while retrying (label, bytes).
    pub evicted: Vec<(String, usize)>,
    /// The largest live mirrors left, largest first (at most 8).
    pub holders: Vec<LiveBuffer>,
    /// The last refusal (the cap, or the backend's message).
    pub cause: String,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pool;
        let cap = p.cap.map_or_else(
            || "no cap".to_string(),
            |c| format!("cap {}", human_bytes(c)),
        );
        write!(
            f,
            "{} pool: requested {}, allocated {}, reserved {}, direct {}, free {}, largest free \
             block {}, fragmentation {:.2}, {cap}, device total {}",
            p.kind,
            human_bytes(self.requested as u64),
            human_bytes(p.allocated.current),
            human_bytes(p.reserved.current),
            human_bytes(p.direct_bytes),
            human_bytes(p.free_bytes),
            human_bytes(p.largest_free_block),
            p.fragmentation(),
            human_bytes(self.device_total),
        )?;
        write!(
            f,
            "; released {} of cache, dropped {} clean mirror(s)",
            human_bytes(self.released_cache),
            self.evicted.len()
        )?;
        if self.holders.is_empty() {
            write!(f, "; no synced buffer holds device memory")?;
        } else {
            write!(f, "; biggest holders: ")?;
            for (i, h) in self.holders.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{h}")?;
            }
        }
        write!(f, "; last refusal: {}", self.cause)
    }
}
