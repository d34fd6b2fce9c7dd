//! [`OomReport`]: what an allocation that ran out of memory asked for and found, as data.

use std::fmt;

/// Bytes with a binary unit (`512 B`, `1.5 KiB`, `16.0 MiB`): the one formatter of the crate
/// ([`crate::alloc::stats::human_bytes`] is this).
pub(crate) fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut u = 0;
    while u < UNITS.len() - 1 && b >> (10 * (u + 1)) > 0 {
        u += 1;
    }
    if u == 0 {
        return format!("{b} B");
    }
    // Tenths of the unit, rounded as `{:.1}` rounds the exact quotient (half to even), in
    // integers: float formatting costs a few microseconds, and an out-of-memory path under a
    // cap formats a refusal per retry.
    let d = 1u128 << (10 * u);
    let scaled = u128::from(b) * 10;
    let (mut tenths, r) = (scaled / d, scaled % d);
    if 2 * r > d || (2 * r == d && tenths % 2 == 1) {
        tenths += 1;
    }
    format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[u])
}

/// The report of an allocation refused for lack of memory, carried by
/// [`crate::Error::OutOfMemory`] (and kept by the device, [`crate::Device::last_oom_report`]).
///
/// Every figure is a field; [`fmt::Display`] writes the error's message from them. Fields that
/// a refusal does not know are `None` (or empty): a backend that refuses names no holders, a
/// device without a cap has `cap: None`.
///
/// ```
/// use syncmem::{Error, OomReport};
///
/// let cause = "above the device's largest single allocation, 2147483648 bytes";
/// let report = OomReport::new("opencl:0", 4 << 30, cause)
///     .with_max_alloc(2 << 30)
///     .with_purpose("buffer fc3_w");
/// assert_eq!(report.requested, 4 << 30);
/// let e = Error::from(report);
/// assert_eq!(
///     e.to_string(),
///     "out of memory on opencl:0: requested 4294967296 bytes (above the device's largest \
///      single allocation, 2147483648 bytes) for buffer fc3_w"
/// );
/// assert_eq!(e.oom_report().unwrap().max_alloc, Some(2 << 30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OomReport {
    /// The device (`host`, `opencl:0`, `cuda:1`, a pool's label).
    pub device: String,
    /// Bytes asked for.
    pub requested: usize,
    /// What the memory was for (`buffer fc1_w`, `a device read-back`), when known.
    pub purpose: Option<String>,
    /// The last refusal in words: the backend's message, the cap, the largest allocation.
    pub cause: String,
    /// The memory cap of the device or pool, when one is set.
    pub cap: Option<u64>,
    /// The device's largest single allocation, when the request was refused for exceeding it.
    pub max_alloc: Option<u64>,
    /// Bytes handed out (in use) when the allocation failed, when known.
    pub allocated: Option<u64>,
    /// Bytes reserved from the backend (held by the pool, or charged to the cap), when known.
    pub reserved: Option<u64>,
    /// The largest live holders of the device's memory, largest first: (label, bytes).
    pub holders: Vec<(String, usize)>,
    /// What the device's out-of-memory path saw and did, when it ran (see
    /// [`crate::device`]: cached blocks freed, clean mirrors dropped, dirty ones spilled).
    pub retry: Option<OomRetry>,
}

/// The device pool as the out-of-memory path left it, and what the path freed (part of an
/// [`OomReport`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OomRetry {
    /// The pool's kind (`caching`, `binned`, `none`).
    pub pool_kind: String,
    /// Bytes of direct (unpooled) allocations.
    pub direct: u64,
    /// Bytes free inside the pool's segments.
    pub free: u64,
    /// The largest free block of the pool.
    pub largest_free_block: u64,
    /// Total memory the device reports.
    pub device_total: u64,
    /// Bytes of cached segments released while retrying.
    pub released_cache: u64,
    /// Clean mirrors dropped while retrying: (label, bytes).
    pub evicted: Vec<(String, usize)>,
    /// Dirty mirrors written back to the host and freed while retrying: (label, bytes).
    pub spilled: Vec<(String, usize)>,
}

impl OomReport {
    /// A report of `requested` bytes refused on `device` for `cause`, with no other figure.
    pub fn new(device: impl Into<String>, requested: usize, cause: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            requested,
            cause: cause.into(),
            ..Self::default()
        }
    }

    /// The same report with what the memory was for.
    #[must_use]
    pub fn with_purpose(mut self, purpose: impl Into<String>) -> Self {
        self.purpose = Some(purpose.into());
        self
    }

    /// The same report with the cap in force.
    #[must_use]
    pub fn with_cap(mut self, cap: Option<u64>) -> Self {
        self.cap = cap;
        self
    }

    /// The same report with the device's largest single allocation.
    #[must_use]
    pub fn with_max_alloc(mut self, max: u64) -> Self {
        self.max_alloc = Some(max);
        self
    }

    /// The same report with the bytes in use and reserved.
    #[must_use]
    pub fn with_usage(mut self, allocated: Option<u64>, reserved: Option<u64>) -> Self {
        self.allocated = allocated;
        self.reserved = reserved;
        self
    }

    /// The same report with the largest holders (label, bytes), largest first.
    #[must_use]
    pub fn with_holders(mut self, holders: Vec<(String, usize)>) -> Self {
        self.holders = holders;
        self
    }

    /// The same report with what the device's out-of-memory path saw and did.
    #[must_use]
    pub fn with_retry(mut self, retry: OomRetry) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Free space of the pool not in its largest free block, 0 to 1 (0 without a retry).
    pub fn fragmentation(&self) -> f64 {
        match &self.retry {
            Some(r) if r.free > 0 => 1.0 - r.largest_free_block as f64 / r.free as f64,
            _ => 0.0,
        }
    }
}

impl OomRetry {
    /// Figures of a pool of kind `pool_kind` on a device of `device_total` bytes, with nothing
    /// freed yet.
    pub fn new(pool_kind: impl Into<String>, device_total: u64) -> Self {
        Self {
            pool_kind: pool_kind.into(),
            device_total,
            ..Self::default()
        }
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory on {}: requested {} bytes",
            self.device, self.requested
        )?;
        match &self.retry {
            Some(r) => {
                let cap = self
                    .cap
                    .map_or_else(|| "no cap".to_string(), |c| format!("cap {}", human(c)));
                write!(
                    f,
                    " ({} pool: requested {}, allocated {}, reserved {}, direct {}, free {}, \
                     largest free block {}, fragmentation {:.2}, {cap}, device total {}",
                    r.pool_kind,
                    human(self.requested as u64),
                    human(self.allocated.unwrap_or(0)),
                    human(self.reserved.unwrap_or(0)),
                    human(r.direct),
                    human(r.free),
                    human(r.largest_free_block),
                    self.fragmentation(),
                    human(r.device_total),
                )?;
                write!(
                    f,
                    "; released {} of cache, dropped {} clean mirror(s), spilled {} dirty \
                     mirror(s)",
                    human(r.released_cache),
                    r.evicted.len(),
                    r.spilled.len()
                )?;
                if self.holders.is_empty() {
                    write!(f, "; no synced buffer holds device memory")?;
                } else {
                    write!(f, "; biggest holders: ")?;
                    for (i, (label, bytes)) in self.holders.iter().enumerate() {
                        if i > 0 {
                            write!(f, ", ")?;
                        }
                        write!(f, "{label} ({})", human(*bytes as u64))?;
                    }
                }
                write!(f, "; last refusal: {})", self.cause)?;
            }
            None if !self.cause.is_empty() => write!(f, " ({})", self.cause)?,
            None => {}
        }
        if let Some(p) = &self.purpose {
            write!(f, " for {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(16 << 20), "16.0 MiB");
    }

    #[test]
    fn display_of_a_full_report() {
        let mut retry = OomRetry::new("caching", 8 << 30);
        retry.free = 4 << 20;
        retry.largest_free_block = 1 << 20;
        retry.evicted = vec![("a".into(), 1 << 20)];
        let r = OomReport::new("opencl:0", 16 << 20, "the cap")
            .with_cap(Some(64 << 20))
            .with_usage(Some(60 << 20), Some(64 << 20))
            .with_holders(vec![("w".into(), 32 << 20)])
            .with_retry(retry)
            .with_purpose("buffer x");
        assert_eq!(
            r.to_string(),
            "out of memory on opencl:0: requested 16777216 bytes (caching pool: requested 16.0 \
             MiB, allocated 60.0 MiB, reserved 64.0 MiB, direct 0 B, free 4.0 MiB, largest \
             free block 1.0 MiB, fragmentation 0.75, cap 64.0 MiB, device total 8.0 GiB; \
             released 0 B of cache, dropped 1 clean mirror(s), spilled 0 dirty mirror(s); \
             biggest holders: w (32.0 MiB); last refusal: the cap) for buffer x"
        );
        assert_eq!(
            OomReport::new("host", 8, "").to_string(),
            "out of memory on host: requested 8 bytes"
        );
    }
}

#[cfg(test)]
mod human_tests {
    /// The float formatting the integer one replaces.
    fn by_float(b: u64) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = b as f64;
        let mut u = 0;
        while v >= 1024.0 && u < UNITS.len() - 1 {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{b} B")
        } else {
            format!("{v:.1} {}", UNITS[u])
        }
    }

    #[test]
    fn integer_formatting_matches_the_float_one() {
        let mut cases: Vec<u64> = vec![0, 1, 1023, 1024, 1075, 1076, 1126, 1127, 1178, 1179];
        for shift in [10, 20, 30, 40, 50] {
            for k in [1u64, 3, 5, 1023, 1024, 1025] {
                cases.push((k << shift) / 1024 * 1024);
                cases.push(k << shift);
                cases.push((k << shift) + (1 << shift) / 20);
                cases.push((k << shift).wrapping_sub(1));
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x >> (x % 60));
        }
        cases.push(u64::MAX);
        for b in cases {
            assert_eq!(super::human(b), by_float(b), "{b} bytes");
        }
    }
}
