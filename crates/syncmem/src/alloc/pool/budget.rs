//! [`Budget`]: the byte budget (memory cap) a pool charges for its segments.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::lease::Lease;

/// A byte budget shared by a pool's segments and direct allocations of the same memory.
///
/// A budget may sit inside another ([`Budget::nested`]): a private pool's (a
/// [`crate::device::MemPool`]'s) inside its device's, so that the device's cap counts the
/// private pool's segments too, and the private pool may have a cap of its own below it.
#[derive(Debug)]
pub struct Budget {
    cap: AtomicU64,
    used: AtomicU64,
    /// Bytes of blocks parked ([`Budget::park`]): handed out, in segments charged before, but
    /// not charged now.
    parked: AtomicU64,
    /// The enclosing budget, charged for everything this one is.
    parent: Option<Arc<Budget>>,
}

impl Budget {
    /// A budget of `cap` bytes (`None`: unlimited).
    pub fn new(cap: Option<u64>) -> Self {
        Self {
            cap: AtomicU64::new(cap.unwrap_or(u64::MAX)),
            used: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            parent: None,
        }
    }

    /// A budget of `cap` bytes (`None`: only `parent`'s limit) inside `parent`: every charge
    /// must fit both.
    pub fn nested(cap: Option<u64>, parent: Arc<Budget>) -> Self {
        Self {
            parent: Some(parent),
            ..Self::new(cap)
        }
    }

    /// The enclosing budget, if any.
    pub fn parent(&self) -> Option<&Arc<Budget>> {
        self.parent.as_ref()
    }

    /// The cap, if any (this budget's own; see [`Budget::governing`] for the one in effect).
    pub fn cap(&self) -> Option<u64> {
        Some(self.cap.load(Relaxed)).filter(|&c| c != u64::MAX)
    }

    /// The cap in effect and the bytes charged against it: this budget's own cap, else the
    /// nearest enclosing budget's; `None` when no budget of the chain has a cap.
    pub fn governing(&self) -> Option<(u64, u64)> {
        match (self.cap(), &self.parent) {
            (Some(cap), _) => Some((cap, self.used())),
            (None, Some(p)) => p.governing(),
            (None, None) => None,
        }
    }

    /// The cap and bytes charged of the budget of the chain that refuses `n` more bytes (its
    /// own first), or `None` when all of them would take them.
    pub fn refusing(&self, n: u64) -> Option<(u64, u64)> {
        let used = self.used();
        match self.cap() {
            Some(cap) if used.checked_add(n).is_none_or(|t| t > cap) => Some((cap, used)),
            _ => self.parent.as_ref().and_then(|p| p.refusing(n)),
        }
    }

    /// Changes the cap (bytes already charged stay charged).
    pub fn set_cap(&self, cap: Option<u64>) {
        self.cap.store(cap.unwrap_or(u64::MAX), Relaxed);
    }

    /// The bytes that still fit under every cap of the chain (`None`: no cap anywhere).
    pub(crate) fn room(&self) -> Option<u64> {
        let own = self.cap().map(|c| c.saturating_sub(self.used()));
        let up = self.parent.as_ref().and_then(|p| p.room());
        match (own, up) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Bytes charged now (to this budget).
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Charges `n` bytes if they fit under the cap (and under every enclosing budget's).
    pub fn try_take(&self, n: u64) -> bool {
        let cap = self.cap.load(Relaxed);
        let own = self
            .used
            .fetch_update(Relaxed, Relaxed, |u| u.checked_add(n).filter(|&t| t <= cap))
            .is_ok();
        match (&self.parent, own) {
            (Some(p), true) if !p.try_take(n) => {
                self.give_own(n);
                false
            }
            _ => own,
        }
    }

    /// Gives back `n` charged bytes (to the enclosing budgets too).
    pub fn give(&self, n: u64) {
        self.give_own(n);
        if let Some(p) = &self.parent {
            p.give(n);
        }
    }

    /// Parks `n` bytes of a block handed out: they are given back (to the enclosing budgets
    /// too) while the block stays where it is, so the pool's segments then hold more than the
    /// bytes charged, by [`Budget::parked`]. A zero-copy buffer spilled in place parks its
    /// block: the host keeps using it, the cap has the room (see `crate::synced`).
    pub(crate) fn park(&self, n: u64) {
        self.parked.fetch_add(n, Relaxed);
        self.give(n);
    }

    /// Charges `n` parked bytes again if they fit under the cap (and every enclosing one).
    pub(crate) fn try_unpark(&self, n: u64) -> bool {
        if !self.try_take(n) {
            return false;
        }
        self.unparked(n);
        true
    }

    /// Charges `n` parked bytes again, over the cap if need be: the block goes back to its
    /// pool, whose segments are charged whole (an allocation over the cap makes room first).
    pub(crate) fn unpark_anyway(&self, n: u64) {
        self.take_anyway(n);
        self.unparked(n);
    }

    fn unparked(&self, n: u64) {
        let _ = self
            .parked
            .fetch_update(Relaxed, Relaxed, |p| Some(p.saturating_sub(n)));
    }

    /// Bytes parked now (this budget's own blocks).
    pub fn parked(&self) -> u64 {
        self.parked.load(Relaxed)
    }

    fn take_anyway(&self, n: u64) {
        self.used.fetch_add(n, Relaxed);
        if let Some(p) = &self.parent {
            p.take_anyway(n);
        }
    }

    fn give_own(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(n)));
    }
}

impl<T: Send + Sync + 'static, V: Send + 'static> Lease<T, V> {
    /// The budget of the pool the block belongs to, and the bytes the block holds of its
    /// segment: what parking it gives back ([`Budget::park`]).
    pub(crate) fn charge(&self) -> (&Arc<Budget>, usize) {
        (&self.shard().budget, self.block_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_budget_charges_its_parent_and_fits_both_caps() {
        let device = Arc::new(Budget::new(Some(100)));
        let private = Budget::nested(Some(60), device.clone());
        assert!(private.try_take(50));
        assert_eq!((private.used(), device.used()), (50, 50));
        assert_eq!(
            private.refusing(20),
            Some((60, 50)),
            "its own cap refuses first"
        );
        assert!(!private.try_take(20));
        assert!(device.try_take(45));
        assert_eq!(private.refusing(8), Some((100, 95)), "then the device's");
        assert!(!private.try_take(8), "the device's cap holds");
        assert_eq!(
            (private.used(), device.used()),
            (50, 95),
            "a refusal charges nothing"
        );
        private.give(50);
        assert_eq!((private.used(), device.used()), (0, 45));
        let open = Budget::nested(None, device.clone());
        assert_eq!(
            open.governing(),
            Some((100, 45)),
            "the device's cap governs"
        );
        assert_eq!(Budget::new(None).governing(), None);
    }

    #[test]
    fn parked_bytes_leave_the_budget_and_come_back() {
        let device = Arc::new(Budget::new(Some(100)));
        let private = Budget::nested(None, device.clone());
        assert!(private.try_take(80));
        private.park(30);
        assert_eq!(
            (private.used(), device.used(), private.parked()),
            (50, 50, 30)
        );
        assert!(
            device.try_take(40),
            "the room parked bytes left is the cap's"
        );
        assert!(!private.try_unpark(30), "no room to charge them again");
        assert_eq!(private.parked(), 30, "a refusal keeps them parked");
        device.give(40);
        assert!(private.try_unpark(30));
        assert_eq!(
            (private.used(), device.used(), private.parked()),
            (80, 80, 0)
        );
        private.park(30);
        assert!(device.try_take(50));
        private.unpark_anyway(30);
        assert_eq!(
            (device.used(), private.parked()),
            (130, 0),
            "charged over the cap: the block goes back to a segment charged whole"
        );
    }
}
