//! The host pool's per-thread caches (`PoolConfig::thread_cache`): a thread's frees served
//! again to it without a shard, with the pool's readings, snapshots, releases and events as
//! they are without them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use syncmem::alloc::pool::{BlockState, HostAllocation, PoolEvent, PoolObserver};
use syncmem::{HostPool, PoolConfig, PoolKind, PoolStats};

const KIB: usize = 1 << 10;

fn pool(label: &str, thread_cache: usize) -> HostPool {
    let config = PoolConfig::new(PoolKind::Caching).with_thread_cache(thread_cache);
    HostPool::new(label, config).unwrap()
}

/// The readings a thread cache must leave as they are without one.
fn readings(s: &PoolStats) -> [u64; 12] {
    [
        s.allocated.current,
        s.allocated.peak,
        s.allocated.allocated,
        s.allocated.freed,
        s.requested.current,
        s.requested.peak,
        s.block_count.current,
        s.block_count.peak,
        s.allocations,
        s.frees,
        s.small.allocated.current,
        s.small.allocated.peak,
    ]
}

/// Fills `a` with `seed`'s pattern.
fn fill(a: &mut HostAllocation, seed: u8) {
    for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
}

/// Whether `a` holds `seed`'s pattern.
fn holds(a: &HostAllocation, seed: u8) -> bool {
    a.as_slice()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == seed.wrapping_add(i as u8))
}

#[test]
fn a_freed_block_comes_back_to_its_thread_from_its_cache() {
    let p = pool("tc back", 256 * KIB);
    let mut a = p.alloc(4000).unwrap();
    let at = a.as_ptr();
    assert!(a.was_zeroed(), "a fresh block is zero for its first user");
    fill(&mut a, 7);
    drop(a);
    let before = p.stats();
    let b = p.alloc(4000).unwrap();
    assert_eq!(b.as_ptr(), at, "the thread's last free of that length");
    assert!(
        !b.was_zeroed(),
        "a reused block holds its last user's bytes"
    );
    assert!(holds(&b, 7));
    assert_eq!(before.thread_cached_bytes, b.block_size() as u64);
    let after = p.stats();
    assert_eq!(after.allocations, before.allocations + 1);
    assert_eq!(after.cache_hits, before.cache_hits + 1);
    assert_eq!(after.thread_cache_hits, before.thread_cache_hits + 1);
    assert_eq!(after.thread_cached_bytes, 0);
    assert_eq!(after.allocated.current, b.block_size() as u64);
    drop(b);
    let s = p.stats();
    assert_eq!((s.allocated.current, s.requested.current), (0, 0));
    assert_eq!(s.block_count.current, 0);
    assert_eq!((s.allocations, s.frees), (2, 2));
}

#[test]
fn named_and_large_requests_and_a_cache_of_zero_bytes_pass_by() {
    let p = pool("tc by", 8 * KIB);
    let name: Arc<str> = "weights".into();
    let a = p.alloc_labelled(1000, Some(&name)).unwrap();
    let at = a.as_ptr();
    drop(a);
    // A named block went to its shard: a shard hit, at the same address.
    let b = p.alloc_labelled(1000, Some(&name)).unwrap();
    assert_eq!(b.as_ptr(), at);
    drop(b);
    // Larger than the cache: never cached, always correct.
    for _ in 0..3 {
        let mut c = p.alloc(64 * KIB).unwrap();
        fill(&mut c, 3);
        assert!(holds(&c, 3));
    }
    let off = pool("tc off", 0);
    for _ in 0..3 {
        drop(off.alloc(4000).unwrap());
    }
    let s = off.stats();
    assert_eq!((s.allocations, s.frees, s.allocated.current), (3, 3, 0));
}

/// Under a peak set earlier (a first step), requests of other lengths leave the thread's
/// cache alone; one that raises the peak gives it back first, so the peak stays exact.
#[test]
fn alternating_lengths_stay_cached_with_exact_peaks() {
    let cached = pool("tc alternating on", 256 * KIB);
    let plain = pool("tc alternating off", 0);
    for p in [&cached, &plain] {
        // A first step holds both at once: the peak is their sum.
        drop((p.alloc(4096).unwrap(), p.alloc(8192).unwrap()));
        for _ in 0..50 {
            drop(p.alloc(4096).unwrap());
            drop(p.alloc(8192).unwrap());
        }
    }
    // Both lengths wait in the thread's cache: no request would raise a peak (the shard
    // counts cached blocks as handed out, and still stays under it), so none gives the cache
    // back.
    assert_eq!(cached.stats().thread_cache_hits, 100);
    assert_eq!(readings(&cached.stats()), readings(&plain.stats()));
    // A larger request that raises the peak gives the cache back first: the peak is its own.
    let big = cached.alloc(100_000).unwrap();
    let s = cached.stats();
    assert_eq!(s.thread_cached_bytes, 0);
    assert_eq!(s.allocated.peak, big.block_size() as u64);
    let pb = plain.alloc(100_000).unwrap();
    assert_eq!(readings(&cached.stats()), readings(&plain.stats()));
    drop((big, pb));
}

#[derive(Debug, Clone)]
enum Step {
    Alloc { len: usize, named: bool },
    Free { which: usize },
    Trim,
    ResetPeak,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (prop::sample::select(vec![100, 512, 4000, 4096, 20_000, 70_000, 300_000]), any::<bool>())
            .prop_map(|(len, named)| Step::Alloc { len, named: named && len % 3 == 0 }),
        4 => any::<usize>().prop_map(|which| Step::Free { which }),
        1 => Just(Step::Trim),
        1 => Just(Step::ResetPeak),
    ]
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// The same program on a pool with thread caches and on one without: every reading
    /// (current values, peaks, cumulative bytes and counts) is the same after every step, and
    /// every live block keeps its bytes.
    #[test]
    fn one_thread_reads_the_same_with_and_without_a_cache(
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let cached = pool("tc model on", 64 * KIB);
        let plain = pool("tc model off", 0);
        let name: Arc<str> = "named".into();
        let mut live: Vec<(HostAllocation, HostAllocation, u8)> = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match *s {
                Step::Alloc { len, named } => {
                    let owner = named.then_some(&name);
                    let mut a = cached.alloc_labelled(len, owner).unwrap();
                    let mut b = plain.alloc_labelled(len, owner).unwrap();
                    if a.was_zeroed() {
                        prop_assert!(a.as_slice().iter().all(|&x| x == 0), "step {i}: zeroed");
                    }
                    let seed = i as u8;
                    fill(&mut a, seed);
                    fill(&mut b, seed);
                    live.push((a, b, seed));
                }
                Step::Free { which } => {
                    if !live.is_empty() {
                        let (a, _, seed) = live.swap_remove(which % live.len());
                        prop_assert!(holds(&a, seed), "step {i}: a block lost its bytes");
                    }
                }
                Step::Trim => {
                    cached.trim();
                    plain.trim();
                }
                Step::ResetPeak => {
                    cached.reset_peak();
                    plain.reset_peak();
                }
            }
            prop_assert_eq!(
                readings(&cached.stats()),
                readings(&plain.stats()),
                "step {} ({:?})", i, s
            );
        }
        for (a, _, seed) in &live {
            prop_assert!(holds(a, *seed));
        }
        live.clear();
        prop_assert!(cached.stats().allocated.current == 0);
        cached.empty_cache();
        prop_assert_eq!(cached.stats().reserved.current, 0, "every segment given back");
    }
}

#[test]
fn another_threads_cache_is_emptied_by_empty_cache_and_snapshots() {
    let p = pool("tc drain", 256 * KIB);
    let cached = Barrier::new(2);
    let checked = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..3 {
                let mut a = p.alloc(4000).unwrap();
                fill(&mut a, 1);
            }
            cached.wait();
            checked.wait();
            // The thread's cache was emptied under it: it allocates as before.
            let mut a = p.alloc(4000).unwrap();
            fill(&mut a, 2);
            assert!(holds(&a, 2));
        });
        cached.wait();
        // The other thread holds a cached block: it reads as free, and every block of the
        // snapshot is free.
        let s = p.stats();
        assert_eq!(s.allocated.current, 0);
        assert!(s.reserved.current > 0);
        let snap = p.snapshot();
        let blocks: Vec<_> = snap.segments.iter().flat_map(|g| &g.blocks).collect();
        assert!(!blocks.is_empty());
        assert!(
            blocks.iter().all(|b| b.state != BlockState::Allocated),
            "{blocks:?}"
        );
        assert!(p.empty_cache() > 0, "the cached block's segment went back");
        assert_eq!(p.stats().reserved.current, 0);
        checked.wait();
    });
    let s = p.stats();
    assert_eq!((s.allocated.current, s.allocations, s.frees), (0, 4, 4));
}

#[test]
fn a_thread_that_ends_gives_its_cache_back() {
    let p = pool("tc exit", 256 * KIB);
    for round in 0..4u8 {
        std::thread::spawn({
            let p = p.clone();
            move || {
                let mut a = p.alloc(8000).unwrap();
                fill(&mut a, round);
            }
        })
        .join()
        .unwrap();
    }
    let s = p.stats();
    assert_eq!((s.allocated.current, s.allocations, s.frees), (0, 4, 4));
    p.empty_cache();
    assert_eq!(p.stats().reserved.current, 0);
}

#[test]
fn a_block_freed_on_another_thread_goes_to_its_shard() {
    let p = pool("tc cross", 256 * KIB);
    let mut a = p.alloc(4000).unwrap();
    fill(&mut a, 9);
    std::thread::scope(|s| {
        s.spawn(move || assert!(holds(&a, 9)));
    });
    let s = p.stats();
    assert_eq!((s.allocated.current, s.frees), (0, 1));
    // This thread's next request is served (from the shard or its own cache) all the same.
    let b = p.alloc(4000).unwrap();
    assert_eq!(b.len(), 4000);
}

/// Counts allocation and free events.
#[derive(Default)]
struct Count(AtomicU64, AtomicU64);

impl PoolObserver for Count {
    fn on_event(&self, _pool: &str, event: &PoolEvent) {
        match event {
            PoolEvent::Alloc { .. } => self.0.fetch_add(1, Ordering::Relaxed),
            PoolEvent::Free { .. } => self.1.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

#[test]
fn an_observed_pool_reports_every_allocation_and_free() {
    let p = pool("tc observed", 256 * KIB);
    // Blocks cached before the observer comes go back to their shards first.
    drop(p.alloc(4000).unwrap());
    let count = Arc::new(Count::default());
    p.pool().set_observer(Some(count.clone()));
    for _ in 0..10 {
        drop(p.alloc(4000).unwrap());
    }
    let seen = (
        count.0.load(Ordering::Relaxed),
        count.1.load(Ordering::Relaxed),
    );
    assert_eq!(seen, (10, 10));
    p.pool().set_observer(None);
    for _ in 0..10 {
        drop(p.alloc(4000).unwrap());
    }
    assert_eq!(count.0.load(Ordering::Relaxed), 10, "detached");
    let s = p.stats();
    assert_eq!((s.allocations, s.frees, s.allocated.current), (21, 21, 0));
}

#[test]
fn threads_at_once_keep_their_blocks_apart_and_the_counts_exact() {
    let p = pool("tc threads", 64 * KIB);
    const THREADS: usize = 6;
    const ROUNDS: usize = 400;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let p = &p;
            s.spawn(move || {
                let mut live: Vec<(HostAllocation, u8)> = Vec::new();
                for r in 0..ROUNDS {
                    let len = [512, 4000, 20_000][(r + t) % 3];
                    let seed = (t * 31 + r) as u8;
                    let mut a = p.alloc(len).unwrap();
                    fill(&mut a, seed);
                    live.push((a, seed));
                    if live.len() > 4 || r % 5 == 0 {
                        let (a, seed) = live.remove((r * 7) % live.len());
                        assert!(holds(&a, seed), "thread {t} round {r}");
                    }
                }
                for (a, seed) in &live {
                    assert!(holds(a, *seed));
                }
            });
        }
    });
    let s = p.stats();
    let n = (THREADS * ROUNDS) as u64;
    assert_eq!((s.allocations, s.frees), (n, n));
    assert_eq!((s.allocated.current, s.requested.current), (0, 0));
    assert!(s.allocated.peak >= s.allocated.current);
    p.empty_cache();
    assert_eq!(p.stats().reserved.current, 0);
}

/// Readings, snapshots and cache releases from another thread reach into the caches of
/// threads that are allocating (each such reading claims every cache, and the owners step
/// aside): no block is handed to two holders, and the counts stay exact. (The flags' race
/// itself, a window of a few instructions here, is tested where it is made wide: the
/// magazine's unit tests.)
#[test]
fn readings_from_another_thread_while_threads_allocate_keep_blocks_apart() {
    let p = pool("tc readers", 64 * KIB);
    const THREADS: usize = 3;
    const ROUNDS: usize = 3_000;
    let done = AtomicU64::new(0);
    let readings = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, done) = (&p, &done);
            s.spawn(move || {
                let mut live: Vec<(HostAllocation, u8)> = Vec::new();
                for r in 0..ROUNDS {
                    let seed = (t * 31 + r) as u8;
                    let mut a = p.alloc(4000).unwrap();
                    fill(&mut a, seed);
                    live.push((a, seed));
                    if live.len() > 2 {
                        let (a, seed) = live.remove(r % live.len());
                        assert!(holds(&a, seed), "thread {t} round {r}");
                    }
                }
                for (a, seed) in &live {
                    assert!(holds(a, *seed), "thread {t} at the end");
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        s.spawn(|| {
            let mut i = 0u64;
            while done.load(Ordering::Relaxed) < THREADS as u64 || i == 0 {
                match i % 4 {
                    0 => {
                        let s = p.stats();
                        assert!(s.frees <= s.allocations, "{s:?}");
                        assert!(s.allocated.current <= s.reserved.current, "{s:?}");
                    }
                    1 => drop(p.snapshot()),
                    2 => drop(p.empty_cache()),
                    _ => p.reset_peak(),
                }
                i += 1;
            }
            readings.store(i, Ordering::Relaxed);
        });
    });
    assert!(readings.load(Ordering::Relaxed) > 0);
    let s = p.stats();
    let n = (THREADS * ROUNDS) as u64;
    assert_eq!((s.allocations, s.frees), (n, n));
    assert_eq!((s.allocated.current, s.requested.current), (0, 0));
    assert!(s.thread_cache_hits > 0, "the caches served requests");
}

#[test]
fn thread_cache_is_a_pool_setting() {
    let mut c = PoolConfig::default();
    assert_eq!(c.thread_cache, 256 * KIB);
    c = c.apply("thread_cache=1MiB").unwrap();
    assert_eq!(c.thread_cache, 1 << 20);
    c = c.apply("thread_cache=off").unwrap();
    assert_eq!(c.thread_cache, 0);
    assert!(c.apply("thread_cache=lots").is_err());
}
