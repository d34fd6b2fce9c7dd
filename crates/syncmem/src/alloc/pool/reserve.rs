//! Memory a pool holds on purpose, and memory it gives back on its own: preallocation (JAX's
//! reservation at start), the garbage collector of PyTorch's `garbage_collection_threshold`,
//! and draining a pool its owner let go.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::{Inner, Pool, PoolEvent, RawStorage, Seg, HOST_STREAM};
use crate::alloc::stats::human_bytes;
use crate::error::{OomReport, Result};

#[cfg(doc)]
use super::PoolConfig;
#[cfg(doc)]
use crate::error::Error;

impl<T: Send + Sync + 'static, V: Send + 'static> Pool<T, V> {
    /// Reserves about `bytes` (rounded up to the pool's rounding in each shard) as cached free
    /// segments from `source`, charged to the budget, split evenly over the shards; in each,
    /// one small segment of `small_segment` bytes when the share is at least four of them,
    /// the rest in large segments of at most the pool's largest segment (see
    /// [`PoolConfig::preallocate`]). Returns the bytes reserved.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a pool that is not a caching pool, a share above
    /// `max_cached_bytes` or a total above `gc_threshold x cap` (the pool would give it back); [`Error::OutOfMemory`] when
    /// the budget refuses the whole (then nothing is reserved) or the backend refuses a
    /// segment (the segments made before stay cached).
    pub fn preallocate<S: RawStorage<Segment = T, View = V> + ?Sized>(
        &self,
        bytes: u64,
        source: &S,
    ) -> Result<u64> {
        let share = bytes.div_ceil(self.shards.len() as u64);
        self.check_preallocation(share)?;
        let plan = self.preallocation_plan(share);
        let per_shard: u64 = plan.iter().map(|&(size, _)| size as u64).sum();
        let total = per_shard * self.shards.len() as u64;
        // All of it charged first: under a cap, all or nothing.
        if !self.budget.try_take(total) {
            return Err(self.preallocation_refused(total, None));
        }
        let mut made = 0;
        for sh in self.shards.iter() {
            let mut inner = sh.inner.lock();
            for &(size, small) in &plan {
                let seg = match source.alloc(size) {
                    Ok(seg) => seg,
                    Err(e) => {
                        // What was made stays cached; the rest is not charged.
                        self.budget.give(total - made);
                        drop(inner);
                        return Err(self.preallocation_refused(total, Some(e)));
                    }
                };
                let sid = inner.segments.insert(Seg {
                    seg: Arc::new(seg),
                    size,
                    small,
                });
                inner.core.add_free_segment(sid, size, small);
                inner.c.backend_allocs += 1;
                inner.c.preallocated += size as u64;
                inner.c.on_segment(size as u64, small, true);
                inner.emit(&self.label, || PoolEvent::SegmentAlloc {
                    bytes: size,
                    segment: sh.tag(sid),
                    stream: HOST_STREAM,
                });
                made += size as u64;
            }
        }
        Ok(made)
    }

    /// Checks that the pool can keep a preallocated share of `share` bytes per shard.
    fn check_preallocation(&self, share: u64) -> Result<()> {
        let invalid = |reason: String| crate::error::Error::InvalidConfig {
            what: format!("preallocate ({})", self.label),
            reason,
        };
        if !self.config.kind.eq(&super::PoolKind::Caching) {
            return Err(invalid(format!(
                "needs the caching pool, not {}",
                self.config.kind
            )));
        }
        if let (Some(f), Some((cap, _))) = (self.config.gc_threshold, self.budget.governing()) {
            let limit = (cap as f64 * f) as u64;
            let total = share.saturating_mul(self.shards.len() as u64);
            if total > limit {
                return Err(invalid(format!(
                    "{} exceeds gc_threshold x cap ({}): the collector would give it back",
                    human_bytes(total),
                    human_bytes(limit)
                )));
            }
        }
        let max_cached = self.config.effective_max_cached_bytes();
        if share > max_cached {
            return Err(invalid(format!(
                "{} per shard exceeds max_cached_bytes ({}): the pool would give it back",
                human_bytes(share),
                human_bytes(max_cached)
            )));
        }
        Ok(())
    }

    /// The segments (size, small) of a preallocated share of `share` bytes.
    fn preallocation_plan(&self, share: u64) -> Vec<(usize, bool)> {
        let round = self.config.round as u64;
        let share = share.div_ceil(round).saturating_mul(round);
        let small = self.config.small_segment as u64;
        let mut plan = Vec::new();
        let mut rest = share;
        if share >= 4 * small {
            plan.push((self.config.small_segment, true));
            rest -= small;
        }
        // Large segments no larger than the largest allocation, rounded down to `round`.
        let most = (self.max_segment as u64 / round * round).max(round);
        while rest > 0 {
            let size = rest.min(most);
            plan.push((usize::try_from(size).unwrap_or(usize::MAX), false));
            rest -= size;
        }
        plan
    }

    #[cold]
    fn preallocation_refused(
        &self,
        bytes: u64,
        backend: Option<crate::error::Error>,
    ) -> crate::error::Error {
        let why = match backend {
            Some(e) => format!("preallocating {}: {e}", human_bytes(bytes)),
            None => {
                let (cap, used) = self
                    .budget
                    .refusing(bytes)
                    .unwrap_or((u64::MAX, self.budget.used()));
                format!(
                    "preallocating {} would exceed the cap ({} of {} used)",
                    human_bytes(bytes),
                    human_bytes(used),
                    human_bytes(cap)
                )
            }
        };
        let requested = usize::try_from(bytes).unwrap_or(usize::MAX);
        let report = OomReport::new(self.label.to_string(), requested, why)
            .with_cap(self.budget.governing().map(|(cap, _)| cap));
        report.into()
    }

    /// The garbage collector: while the bytes charged under the cap in effect exceed
    /// `fraction` of it, gives back idle cached segments (no pending work), largest first in
    /// each shard, counting them in `gc_releases` (see [`PoolConfig::gc_threshold`]). Called
    /// after an allocation that made a segment, with no shard locked.
    pub(super) fn collect_garbage(&self, fraction: f64) {
        let limit = |cap: u64| (cap as f64 * fraction) as u64;
        for sh in self.shards.iter() {
            let Some((cap, used)) = self.budget.governing() else {
                return;
            };
            let Some(excess) = used.checked_sub(limit(cap)).filter(|&e| e > 0) else {
                return;
            };
            let segs = {
                let mut inner = sh.inner.lock();
                let segs = inner.core.release_at_least(false, excess, usize::MAX);
                count_collected(&mut inner, &segs);
                sh.take_segments(&mut inner, segs)
            };
            sh.drop_segments(segs);
        }
    }

    /// Lets the pool go while blocks may still be handed out: it refuses every allocation
    /// from now on, its cached segments go back to the backend now (waiting for their
    /// pending work), and each segment that becomes wholly free later goes back when its
    /// last block does. Returns the bytes released now.
    pub(crate) fn drain(&self) -> u64 {
        // Nothing is cached any more: each free gives its wholly free segments back, through
        // the check of the cap on cached bytes that every free makes anyway.
        for s in self.shards.iter() {
            s.inner.lock().core.stop_caching();
        }
        self.retired.store(true, Relaxed);
        self.empty_cache()
    }
}

/// Counts segments `segs` given back by the garbage collector.
fn count_collected<T, V>(inner: &mut Inner<T, V>, segs: &[(super::SegId, usize)]) {
    inner.c.gc_releases += segs.len() as u64;
    inner.c.gc_released_bytes += segs.iter().map(|&(_, size)| size as u64).sum::<u64>();
}
