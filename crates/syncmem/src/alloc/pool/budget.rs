//! [`Budget`]: the byte budget (memory cap) a pool charges for its segments.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A byte budget shared by a pool's segments and direct allocations of the same memory.
#[derive(Debug)]
pub struct Budget {
    cap: AtomicU64,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `cap` bytes (`None`: unlimited).
    pub fn new(cap: Option<u64>) -> Self {
        Self {
            cap: AtomicU64::new(cap.unwrap_or(u64::MAX)),
            used: AtomicU64::new(0),
        }
    }

    /// The cap, if any.
    pub fn cap(&self) -> Option<u64> {
        Some(self.cap.load(Relaxed)).filter(|&c| c != u64::MAX)
    }

    /// Changes the cap (bytes already charged stay charged).
    pub fn set_cap(&self, cap: Option<u64>) {
        self.cap.store(cap.unwrap_or(u64::MAX), Relaxed);
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Charges `n` bytes if they fit under the cap.
    pub fn try_take(&self, n: u64) -> bool {
        let cap = self.cap.load(Relaxed);
        self.used
            .fetch_update(Relaxed, Relaxed, |u| u.checked_add(n).filter(|&t| t <= cap))
            .is_ok()
    }

    /// Gives back `n` charged bytes.
    pub fn give(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(n)));
    }
}
