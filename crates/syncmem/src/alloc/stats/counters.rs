//! [`MemCounters`]: the live counters of one memory space, in stripes that threads write apart.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::MemStats;
use crate::alloc::thread::{Padded, STRIPES};

/// One stripe of [`MemCounters`] (each alone in its cache lines).
#[derive(Debug, Default)]
struct Stripe {
    in_use: AtomicU64,
    peak: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
}

impl Stripe {
    const fn new() -> Self {
        Self {
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }
}

/// Live counters for one memory space (host, or one device, or one device's pinned memory).
///
/// A thread counts in the stripe of its index ([`crate::alloc::thread::index`]), and a free
/// goes to the stripe of its allocation (the [`Counted`] token the allocation keeps), so that
/// threads allocating at once do not all write one cache line, and each stripe's use never
/// goes below zero. A reading adds the stripes up: the current use and the counts are exact,
/// the peak is the sum of the stripes' peaks, exact while the allocations come from one thread
/// (or from threads of one stripe), otherwise an upper bound.
#[derive(Debug)]
pub(crate) struct MemCounters {
    stripes: [Padded<Stripe>; STRIPES],
}

impl Default for MemCounters {
    fn default() -> Self {
        Self::new()
    }
}

/// Which stripe of a [`MemCounters`] counted an allocation: its free goes there too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted(u8);

impl Counted {
    /// The stripe, as a number (see [`Counted::from_stripe`]).
    pub(crate) fn stripe(self) -> u8 {
        self.0
    }

    /// The token of a stripe number that [`Counted::stripe`] gave.
    pub(crate) fn from_stripe(stripe: u8) -> Counted {
        Counted(stripe)
    }
}

impl MemCounters {
    /// New zeroed counters.
    pub const fn new() -> Self {
        Self {
            stripes: [const { Padded(Stripe::new()) }; STRIPES],
        }
    }

    /// Records an allocation of `bytes`; the free of the same bytes passes the token back.
    #[inline]
    pub fn on_alloc(&self, bytes: usize) -> Counted {
        let i = crate::alloc::thread::index() % STRIPES;
        let s = &self.stripes[i].0;
        let bytes = bytes as u64;
        let now = s.in_use.fetch_add(bytes, Relaxed) + bytes;
        // A read is cheaper than a read-modify-write, and the peak rarely moves.
        if now > s.peak.load(Relaxed) {
            s.peak.fetch_max(now, Relaxed);
        }
        s.allocs.fetch_add(1, Relaxed);
        Counted(i as u8)
    }

    /// Records the free of `bytes` counted as `counted`.
    #[inline]
    pub fn on_free(&self, counted: Counted, bytes: usize) {
        let s = &self.stripes[usize::from(counted.0)].0;
        s.in_use.fetch_sub(bytes as u64, Relaxed);
        s.frees.fetch_add(1, Relaxed);
    }

    /// Resets the peak to the current use.
    pub fn reset_peak(&self) {
        for Padded(s) in &self.stripes {
            s.peak.store(s.in_use.load(Relaxed), Relaxed);
        }
    }

    /// Reads the counters (the sums of the stripes).
    pub fn snapshot(&self, label: impl Into<String>) -> MemStats {
        let sum = |f: fn(&Stripe) -> &AtomicU64| {
            self.stripes
                .iter()
                .map(|s| f(&s.0).load(Relaxed))
                .sum::<u64>()
        };
        MemStats {
            label: label.into(),
            in_use: sum(|s| &s.in_use),
            peak: sum(|s| &s.peak),
            allocs: sum(|s| &s.allocs),
            frees: sum(|s| &s.frees),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_track_peak_and_counts() {
        let c = MemCounters::new();
        let a = c.on_alloc(100);
        c.on_alloc(50);
        c.on_free(a, 100);
        let s = c.snapshot("x");
        assert_eq!((s.in_use, s.peak, s.allocs, s.frees), (50, 150, 2, 1));
        c.reset_peak();
        assert_eq!(c.snapshot("x").peak, 50);
    }

    #[test]
    fn frees_from_other_threads_go_back_to_the_allocating_stripe() {
        let c = MemCounters::new();
        let a = c.on_alloc(100);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Another thread: its own stripe for its allocation, ours for our block.
                let b = c.on_alloc(30);
                c.on_free(a, 100);
                c.on_free(b, 30);
            });
        });
        let s = c.snapshot("x");
        assert_eq!((s.in_use, s.allocs, s.frees), (0, 2, 2));
        // Each stripe peaked on its own: the sum bounds the true peak (130) from above.
        assert_eq!(s.peak, 130);
        c.reset_peak();
        assert_eq!(c.snapshot("x").peak, 0);
        // No stripe went below zero: a new allocation reads back exactly.
        let d = c.on_alloc(8);
        assert_eq!(c.snapshot("x").in_use, 8);
        c.on_free(d, 8);
    }
}
