//! The out-of-memory path of a device: an allocation the backend or the cap refuses is retried
//! after freeing cached blocks, dropping clean mirrors and spilling dirty ones, in that order
//! (see the [parent module](super)); when nothing helped, the refusal is reported.
//!
//! Each step ends in [`Run::retry`], the one place that retries the allocation: the run stops
//! there when the allocation succeeds or fails with an error other than out of memory
//! ([`ControlFlow::Break`]), and goes on to the next step otherwise, keeping the newest
//! refusal as the cause to report.
//!
//! The path never empties the whole cache until the very end: a mirror dropped or spilled
//! gives its block back to the pool, where the retry may find it; only when that is not
//! enough does the pool give cached memory back to the backend, largest idle segments first
//! and only as many bytes as the request needs, and under a cap only when that many can go
//! ([`Run::release_needed`]). The segments a program reuses step after step so stay cached
//! instead of being released and made again at every step under a cap.

use std::cell::Cell;
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::{max_segment, DeviceMemory};
use crate::alloc::pool::{quietly, Pool};
use crate::alloc::thread::SetFlag;
use crate::backend::dispatch::RawMem;
use crate::device::mirror::{Evictable, NextUse};
use crate::device::Device;
use crate::error::{Error, OomReport, OomRetry, Result};

thread_local! {
    /// This thread's allocations may split whole segments kept for larger requests (see
    /// [`may_split_whole`]).
    static SPLIT_WHOLE: Cell<bool> = const { Cell::new(false) };
}

/// Whether an allocation of this thread may split, under a cap, a wholly free segment the pool
/// keeps for larger requests ([`crate::backend::RawStorage::may_split_whole`]): not on the
/// way in, nor while the out-of-memory path drops dead values and evicts clean mirrors (a
/// small request so takes the room of a mirror the schedule does not need, instead of
/// breaking the block the next large request needs); from then on, before anything is spilled.
pub(super) fn may_split_whole() -> bool {
    SPLIT_WHOLE.with(Cell::get)
}

/// Sets this thread's [`may_split_whole`] to `now` until the guard is dropped.
fn split_whole(now: bool) -> SetFlag {
    SetFlag::new(&SPLIT_WHOLE, now)
}

/// Where a run of the path stands: `Break` with what the allocation returned, or `Continue`.
type Step<R> = ControlFlow<Result<R>>;

/// One run of the out-of-memory path: what it freed so far, and the last refusal.
struct Run {
    pool: Option<Arc<Pool<RawMem, RawMem>>>,
    requested: usize,
    /// The device's memory cap.
    cap: Option<u64>,
    cause: Box<OomReport>,
    /// Bytes of cached blocks freed.
    released: u64,
    evicted: Vec<(String, usize)>,
    spilled: Vec<(String, usize)>,
}

impl DeviceMemory {
    /// Runs `attempt`; on out-of-memory frees cached blocks, then drops clean mirrors one at a
    /// time, then spills dirty ones, retrying after each step; finally reports.
    pub(super) fn with_retries<R>(
        &self,
        dev: &Device,
        requested: usize,
        mut attempt: impl FnMut() -> Result<R>,
    ) -> Result<R> {
        let cause = match attempt() {
            Ok(r) => return Ok(r),
            Err(Error::OutOfMemory { report }) => report,
            Err(e) => return Err(e),
        };
        let mut run = Run {
            pool: self.current_pool(),
            requested,
            cap: self.budget.cap(),
            cause,
            released: 0,
            evicted: Vec::new(),
            spilled: Vec::new(),
        };
        // Nothing freed could make room for more than the cap or the largest allocation.
        let hopeless =
            self.budget.cap().is_some_and(|c| requested as u64 > c) || requested > max_segment(dev);
        if !hopeless {
            // The retries' refusals are quiet; when they all failed, the last is made again
            // with its cause.
            let _split = split_whole(false);
            if let Break(done) = quietly(|| self.free_room(&mut run, &mut attempt)) {
                return done;
            }
            let _split = split_whole(true);
            if let Break(done) = run.retry(&mut attempt) {
                return done;
            }
        }
        let e = self.report(dev, run);
        if let Error::OutOfMemory { report } = &e {
            crate::device::notify_oom(report);
        }
        Err(e)
    }

    /// Frees room step by step, retrying after each.
    fn free_room<R>(&self, run: &mut Run, attempt: &mut impl FnMut() -> Result<R>) -> Step<R> {
        if let Some(p) = &run.pool {
            p.note_retry();
        }
        run.released = run.release_needed();
        if run.released > 0 {
            run.retry(attempt)?;
        }
        let mut candidates = self.mirrors.get().map_or_else(Vec::new, |m| m.candidates());
        // A running schedule's order (Belady's rule, dead values first), else largest first for
        // the evictions and least recently used first for the spills.
        let schedule = self.next_use.read().clone();
        if let Some(s) = &schedule {
            by_next_use(&mut candidates, s.as_ref(), run.requested);
        }
        let dead = |item: &dyn Evictable| schedule.as_ref().is_some_and(|s| s.is_dead(item.key()));
        // Victims smaller than the request are freed in batches of at least the request
        // before the allocation is retried: one retry per victim cost more than the victims.
        let mut batch = 0usize;
        for (item, _) in &candidates {
            let freed = if dead(item.as_ref()) {
                run.drop_dead(item.as_ref(), false)
            } else {
                run.evict(item.as_ref())
            };
            batch += freed.unwrap_or(0);
            if batch >= run.requested {
                batch = 0;
                run.retry_freed(attempt)?;
            }
        }
        if batch > 0 {
            run.retry_freed(attempt)?;
        }
        // Before anything is written back, whole segments kept for larger requests may go to
        // the request (until the path ends).
        let _split = split_whole(true);
        run.retry(attempt)?;
        // Spill: dirty mirrors written back to the host.
        let mut by_age: Vec<_> = candidates.into_iter().map(|(item, _)| item).collect();
        if schedule.is_none() {
            by_age.sort_by_key(|item| item.last_use());
        }
        // Without a schedule, first the mirrors with nothing queued, then, in a last round, the
        // others after their queued work. With one, its order comes first: a victim with work
        // still queued is waited for rather than passed over for one needed sooner (the one
        // used furthest ahead was last used long ago: its work is most likely done).
        let rounds: &[bool] = if schedule.is_some() {
            &[true]
        } else {
            &[false, true]
        };
        for &wait in rounds {
            run.spill(&by_age, wait, &dead, schedule.is_some(), attempt)?;
        }
        // Blocks spilled in place keep their segments: copied out, they let them go.
        let parked = self.mirrors.get().map_or_else(Vec::new, |m| m.parked());
        for item in &parked {
            if item.try_copy_out().is_some() {
                run.retry_freed(attempt)?;
            }
        }
        // The last resort: every cached byte back to the backend.
        let all = run.pool.as_ref().map_or(0, |p| p.empty_cache());
        if all > 0 {
            run.released += all;
            run.retry(attempt)?;
        }
        Continue(())
    }

    /// The out-of-memory error once nothing helped: the pool's figures, the biggest holders
    /// and what the run freed, also kept as the device's last report.
    fn report(&self, dev: &Device, run: Run) -> Error {
        let Run {
            pool,
            requested,
            cap: _,
            mut cause,
            released,
            evicted,
            spilled,
        } = run;
        let Some(pool) = pool else {
            return Error::OutOfMemory { report: cause };
        };
        pool.note_oom(requested);
        let stats = pool.stats();
        let holders = self
            .live_buffers()
            .into_iter()
            .take(8)
            .map(|h| (h.label, usize::try_from(h.bytes).unwrap_or(usize::MAX)))
            .collect();
        let mut retry = OomRetry::new(stats.kind.to_string(), dev.info().total_memory);
        retry.direct = self.direct.load(Relaxed);
        retry.free = stats.free_bytes;
        retry.largest_free_block = stats.largest_free_block;
        retry.released_cache = released;
        retry.evicted = evicted;
        retry.spilled = spilled;
        let last = if cause.cause.is_empty() {
            "the backend refused".to_string()
        } else {
            std::mem::take(&mut cause.cause)
        };
        // The last refusal's own figures (a cap, the largest allocation) are kept.
        let mut report = OomReport::new(dev.label(), requested, last)
            .with_cap(self.budget.cap())
            .with_usage(Some(stats.allocated.current), Some(stats.reserved.current))
            .with_holders(holders)
            .with_retry(retry);
        report.max_alloc = cause.max_alloc;
        *self.last_oom.lock() = Some(report.clone());
        report.into()
    }
}

impl Device {
    /// Counts a spill of `bytes` made outside the out-of-memory path (a buffer offloaded on
    /// request) on the device pool.
    pub(crate) fn note_spill(&self, bytes: usize) {
        if let Some(p) = self.shared.memory.current_pool() {
            p.note_spill(bytes);
        }
    }

    /// Drops the device mirror of `item`, whose contents a running schedule knows to be dead
    /// ([`NextUse::is_dead`]), when nothing holds it and no transfer is in flight. Returns the
    /// bytes freed, when it went: the caller counts them ([`Device::note_dead_drops`]).
    pub(crate) fn drop_dead(&self, item: &dyn Evictable) -> Option<usize> {
        item.try_drop_dead(false)
    }

    /// Counts `n` dead mirrors of `bytes` in all dropped by [`Device::drop_dead`] on the
    /// device pool.
    pub(crate) fn note_dead_drops(&self, n: u64, bytes: u64) {
        if let Some(p) = self.shared.memory.current_pool() {
            p.note_dead_drops(n, bytes);
        }
    }
}

/// Orders `candidates` as the schedule `s` uses them (Belady's rule: the mirror needed last is
/// the one whose absence costs least): first the mirrors whose block alone holds the
/// `requested` bytes (so that one victim makes room, in the block the request then reuses,
/// instead of several small ones whose segments would be given back and made again), then
/// the others; within each, first the dead values (nothing to write back, nothing to bring
/// back: largest first), then the mirrors the schedule does not use (largest first), then
/// those it uses furthest ahead first. Mirrors smaller than the request that the schedule does
/// not use go in the order they lie in the pool (segment, offset): freed one after the other,
/// neighbours merge into room in one piece, where the largest first or the least recently
/// used would leave holes between the blocks they keep.
fn by_next_use(candidates: &mut [(Arc<dyn Evictable>, usize)], s: &dyn NextUse, requested: usize) {
    candidates.sort_by_cached_key(|(item, bytes)| {
        let small = *bytes < requested;
        let key = item.key();
        match s.next_use(key) {
            Some(_) if s.is_dead(key) => (small, 0, usize::MAX - bytes, item.last_use()),
            None if small => {
                let (seg, offset) = item.placement().unwrap_or((usize::MAX, 0));
                (small, 1, seg, offset as u64)
            }
            None => (small, 1, usize::MAX - bytes, item.last_use()),
            Some(d) => (small, 2, usize::MAX - d, item.last_use()),
        }
    });
}

impl Run {
    /// Retries the allocation: `Break` with its result when it succeeded or failed otherwise
    /// than out of memory, else `Continue` with the refusal kept as the cause. The blocks the
    /// path's victims freed into this thread's cache go back to their shards first: the
    /// attempt finds a cached block of its own length only.
    fn retry<R>(&mut self, attempt: &mut impl FnMut() -> Result<R>) -> Step<R> {
        if let Some(p) = &self.pool {
            p.flush_thread_cache();
        }
        match attempt() {
            Err(Error::OutOfMemory { report }) => {
                self.cause = report;
                Continue(())
            }
            done => Break(done),
        }
    }

    /// Gives back to the backend as much cached memory as the request needs, largest idle
    /// segments first: under a cap, what the reserved bytes exceed the cap by with the request
    /// added; without one (the backend refused), the request's size. Returns the bytes.
    fn release_needed(&self) -> u64 {
        let Some(p) = &self.pool else { return 0 };
        let requested = self.requested as u64;
        let need = match self.cap {
            Some(cap) => {
                // Blocks spilled in place are reserved but not charged to the cap.
                let s = p.stats();
                (s.reserved.current.saturating_sub(s.parked_bytes) + requested).saturating_sub(cap)
            }
            None => requested,
        };
        if need == 0 {
            return 0;
        }
        // Until whole segments may be split, those kept for larger requests stay too. Under a
        // cap (`need` is then what the cap lacks), segments go only when enough can go: less
        // leaves the request refused, and the segments given back for nothing are made again
        // by the next steps. Without one, the backend's refusal may still be helped by less.
        let spare = if may_split_whole() {
            usize::MAX
        } else {
            p.kept_whole_from(self.requested)
        };
        p.release_at_least_sparing(need, spare, self.cap.is_some())
    }

    /// Retries after freeing a mirror (its block is back in the pool, where the request may
    /// fit); when it still does not, gives back what the request needs and retries again.
    fn retry_freed<R>(&mut self, attempt: &mut impl FnMut() -> Result<R>) -> Step<R> {
        self.retry(attempt)?;
        let released = self.release_needed();
        if released == 0 {
            return Continue(());
        }
        self.released += released;
        self.retry(attempt)
    }

    /// Drops `item`'s clean mirror if it can go; returns the bytes freed.
    fn evict(&mut self, item: &dyn Evictable) -> Option<usize> {
        let bytes = item.try_evict()?;
        self.note_evicted(item.label_now(), bytes);
        Some(bytes)
    }

    /// Drops `item`'s dead contents if it can go (see [`Evictable::try_drop_dead`]); returns
    /// the bytes freed.
    fn drop_dead(&mut self, item: &dyn Evictable, wait: bool) -> Option<usize> {
        let bytes = item.try_drop_dead(wait)?;
        self.note_dropped(item.label_now(), bytes);
        Some(bytes)
    }

    /// Spills the mirrors of `by_age` that can go (waiting for their queued work with `wait`),
    /// retrying after each batch of about twice the request, so that the next request does not
    /// spill again at once. In a schedule's order (`scheduled`), a mirror that alone holds the
    /// request is retried at once: its block is where the request goes, and the mirrors after
    /// it are needed sooner (spilled now, they would only come back sooner; under a cap, small
    /// ones would give back segments that the next steps make again). A dead one (`dead`) is
    /// dropped instead, without a write-back, and the allocation retried at once when it alone
    /// holds the request.
    fn spill<R>(
        &mut self,
        by_age: &[Arc<dyn Evictable>],
        wait: bool,
        dead: &dyn Fn(&dyn Evictable) -> bool,
        scheduled: bool,
        attempt: &mut impl FnMut() -> Result<R>,
    ) -> Step<R> {
        let mut batch = 0usize;
        for item in by_age {
            if dead(item.as_ref()) {
                // Nothing to write back: retried at once when it alone holds the request.
                if let Some(bytes) = self.drop_dead(item.as_ref(), wait) {
                    if bytes >= self.requested {
                        self.retry_freed(attempt)?;
                    } else {
                        batch += bytes;
                    }
                }
                continue;
            }
            let Some(freed) = item.try_spill(wait) else {
                continue;
            };
            let (label, bytes) = (item.label_now(), freed.bytes);
            if freed.spilled {
                if let Some(p) = &self.pool {
                    p.note_spill(bytes);
                }
                self.spilled.push((label, bytes));
            } else {
                // A clean or stale mirror the eviction could not have (still in use then).
                self.note_evicted(label, bytes);
            }
            batch += bytes;
            let alone = scheduled && bytes >= self.requested;
            if !alone && batch / 2 < self.requested {
                continue;
            }
            batch = 0;
            self.retry_freed(attempt)?;
        }
        if batch > 0 {
            self.retry_freed(attempt)?;
        }
        Continue(())
    }

    /// A dead mirror dropped: counted on the pool as a drop, reported with the evictions (freed
    /// without a write-back).
    fn note_dropped(&mut self, label: String, bytes: usize) {
        if let Some(p) = &self.pool {
            p.note_dead_drops(1, bytes as u64);
        }
        self.evicted.push((label, bytes));
    }

    fn note_evicted(&mut self, label: String, bytes: usize) {
        if let Some(p) = &self.pool {
            p.note_eviction(&label, bytes);
        }
        self.evicted.push((label, bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Freed, Head};

    /// A mirror of `bytes` bytes, last used at `age`.
    struct Fake(&'static str, u64);

    impl Evictable for Fake {
        fn try_evict(&self) -> Option<usize> {
            None
        }
        fn try_spill(&self, _: bool) -> Option<Freed> {
            None
        }
        fn try_drop_dead(&self, _: bool) -> Option<usize> {
            None
        }
        fn last_use(&self) -> u64 {
            self.1
        }
        fn head_now(&self) -> Option<Head> {
            Some(Head::AtDevice)
        }
        fn label_now(&self) -> String {
            self.0.into()
        }
        fn key(&self) -> usize {
            self.0.len()
        }
    }

    /// Next uses by key (the label's length): "a" in 1, "bb" in 5, "ccc" unused, "dddd" in 9,
    /// "eeeee" in 2 but dead (overwritten then).
    struct Uses;

    impl NextUse for Uses {
        fn next_use(&self, key: usize) -> Option<usize> {
            [None, Some(1), Some(5), None, Some(9), Some(2)][key]
        }
        fn is_dead(&self, key: usize) -> bool {
            key == 5
        }
    }

    #[test]
    fn a_schedule_orders_victims_by_next_use_big_enough_ones_first() {
        let mut c: Vec<(Arc<dyn Evictable>, usize)> = vec![
            (Arc::new(Fake("a", 1)), 64),
            (Arc::new(Fake("bb", 2)), 64),
            (Arc::new(Fake("ccc", 3)), 8),
            (Arc::new(Fake("dddd", 4)), 64),
            (Arc::new(Fake("eeeee", 5)), 16),
        ];
        by_next_use(&mut c, &Uses, 32);
        let order: Vec<String> = c.iter().map(|(i, _)| i.label_now()).collect();
        // Big enough first, furthest next use first; the unused one and the dead one are too
        // small for the request, so they go after them, the dead one first.
        assert_eq!(order, ["dddd", "bb", "a", "eeeee", "ccc"]);
        by_next_use(&mut c, &Uses, 8);
        let order: Vec<String> = c.iter().map(|(i, _)| i.label_now()).collect();
        // All big enough: the dead one first although it is used soon, then the unused one.
        assert_eq!(order, ["eeeee", "ccc", "dddd", "bb", "a"]);
    }
}
