//! Tests of the pool core on fake segments (no memory behind them) and fake fences.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use super::*;
use crate::error::Error;

mod capped;
mod keep;
mod reserve;
mod shards;
mod sizing;
mod snapshot;
mod views;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A segment that is only a size.
#[derive(Debug)]
struct Fake(usize);

fn fake(bytes: usize) -> Result<Fake> {
    Ok(Fake(bytes))
}

fn pool(cfg: PoolConfig) -> Arc<Pool<Fake>> {
    Pool::new(
        "test",
        cfg,
        Arc::new(Budget::new(None)),
        isize::MAX as usize,
    )
    .unwrap()
}

/// PyTorch's caching allocator: fixed 2 MiB / 20 MiB segments, every free merged at once (no
/// exact-size lists), idle segments kept. The tests of splitting, merging and best fit use it.
fn pytorch() -> PoolConfig {
    PoolConfig::default()
        .with_segment_growth(20 * MIB, 0)
        .with_size_class_limit(0)
        .with_max_idle_percent(None)
}

fn caching() -> Arc<Pool<Fake>> {
    pool(pytorch())
}

fn check<V: Send + 'static>(p: &Pool<Fake, V>) {
    if let Core::Caching(a) = &p.shards[p.shard_index()].inner.lock().core {
        a.check();
    }
}

/// A fence completed by hand; `wait` completes it.
#[derive(Default)]
struct Flag(AtomicBool);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    fn wait(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn rounds_to_512_and_splits_a_small_segment() {
    let p = caching();
    let a = p.alloc(1000, 1, &fake).unwrap();
    assert_eq!((a.len(), a.block_size(), a.offset()), (1000, 1024, 0));
    assert_eq!(a.segment().0, 2 * MIB, "small requests get a 2 MiB segment");
    assert!(a.zeroed(), "a fresh segment is zero");
    let s = p.stats();
    assert_eq!((s.allocated.current, s.requested.current), (1024, 1000));
    assert_eq!(
        (s.reserved.current, s.segments, s.backend_allocs),
        (2 * MIB as u64, 1, 1)
    );
    assert_eq!(
        s.free_bytes,
        (2 * MIB - 1024) as u64,
        "the remainder is kept"
    );
    assert_eq!(s.largest_free_block, s.free_bytes);
    assert_eq!(s.fragmentation(), 0.0);
    let b = p.alloc(1, 1, &fake).unwrap();
    assert_eq!(
        (b.offset(), b.block_size()),
        (1024, 512),
        "carved from the remainder"
    );
    assert!(b.zeroed(), "the untouched remainder is still zero");
    assert_eq!(p.stats().cache_hits, 1);
    check(&p);
}

#[test]
fn best_fit_picks_the_smallest_fitting_hole() {
    let p = caching();
    // Holes of 4, 16 and 8 KiB separated by live blocks.
    let sizes = [4 * KIB, KIB, 16 * KIB, KIB, 8 * KIB, KIB];
    let mut v: Vec<_> = sizes
        .iter()
        .map(|&s| Some(p.alloc(s, 1, &fake).unwrap()))
        .collect();
    let offsets: Vec<usize> = v.iter().map(|l| l.as_ref().unwrap().offset()).collect();
    for i in [0, 2, 4] {
        v[i] = None;
    }
    check(&p);
    let l = p.alloc(6 * KIB, 1, &fake).unwrap();
    assert_eq!(l.offset(), offsets[4], "the 8 KiB hole is the best fit");
    assert_eq!(l.block_size(), 6 * KIB);
    let l2 = p.alloc(3 * KIB, 1, &fake).unwrap();
    assert_eq!(l2.offset(), offsets[0], "the 4 KiB hole");
    let l3 = p.alloc(10 * KIB, 1, &fake).unwrap();
    assert_eq!(l3.offset(), offsets[2]);
    check(&p);
}

#[test]
fn free_merges_with_free_neighbours() {
    let p = caching();
    let a = p.alloc(4 * KIB, 1, &fake).unwrap();
    let b = p.alloc(4 * KIB, 1, &fake).unwrap();
    let c = p.alloc(4 * KIB, 1, &fake).unwrap();
    drop(a);
    drop(c);
    let s = p.stats();
    // Free: [a] and [c + tail]: two pieces.
    assert_eq!(s.free_bytes, (2 * MIB - 4 * KIB) as u64);
    assert_eq!(s.largest_free_block, (2 * MIB - 8 * KIB) as u64);
    assert!(s.fragmentation() > 0.0);
    check(&p);
    drop(b);
    let s = p.stats();
    assert_eq!(s.largest_free_block, 2 * MIB as u64, "one block again");
    assert_eq!(s.fragmentation(), 0.0);
    assert_eq!(s.allocated.current, 0);
    assert_eq!(s.allocated.peak, 12 * KIB as u64);
    check(&p);
}

#[test]
fn large_pool_segment_sizes_and_split_rule() {
    let p = caching();
    let a = p.alloc(3 * MIB / 2, 1, &fake).unwrap();
    assert_eq!(
        a.segment().0,
        20 * MIB,
        "1-10 MiB requests share 20 MiB segments"
    );
    let d = p.alloc(2 * MIB, 1, &fake).unwrap();
    assert_eq!(d.offset(), 3 * MIB / 2, "carved from the 20 MiB segment");
    // Small requests never come from large segments.
    let e = p.alloc(KIB, 1, &fake).unwrap();
    assert_eq!(e.segment().0, 2 * MIB);
    assert_eq!(p.stats().backend_allocs, 2);
    let q = caching();
    let b = q.alloc(12 * MIB, 1, &fake).unwrap();
    assert_eq!(b.segment().0, 12 * MIB, "10 MiB and up: own segment");
    let c = q.alloc(11 * MIB + 1, 1, &fake).unwrap();
    assert_eq!(c.segment().0, 12 * MIB, "rounded up to 2 MiB");
    assert_eq!(
        c.block_size(),
        12 * MIB,
        "remainder below 1 MiB is not split off"
    );
    drop(b);
    // The 12 MiB block serves a 5 MiB request: split, the 7 MiB rest is kept.
    let f = q.alloc(5 * MIB, 1, &fake).unwrap();
    assert_eq!(f.block_size(), 5 * MIB);
    assert_eq!(q.stats().free_bytes, 7 * MIB as u64);
    drop((a, c, d, e, f));
    check(&p);
    check(&q);
}

#[test]
fn oversize_blocks_are_not_split() {
    let p = pool(pytorch().with_max_split_size(32 * MIB));
    drop(p.alloc(60 * MIB, 1, &fake).unwrap());
    // A small large-pool request may not take (and split) the oversize block.
    let a = p.alloc(8 * MIB, 1, &fake).unwrap();
    assert_eq!(a.segment().0, 20 * MIB);
    // A big request takes it whole when it wastes less than 20 MiB.
    let b = p.alloc(45 * MIB, 1, &fake).unwrap();
    assert_eq!((b.segment().0, b.block_size()), (60 * MIB, 60 * MIB));
    drop(b);
    // More waste: a new segment.
    let c = p.alloc(33 * MIB, 1, &fake).unwrap();
    assert_eq!(c.block_size(), 34 * MIB, "own segment, 2 MiB rounding");
    assert_eq!(p.stats().backend_allocs, 3);
    // Without a limit, the 40 MiB block would have been split.
    let q = caching();
    drop(q.alloc(60 * MIB, 1, &fake).unwrap());
    let d = q.alloc(8 * MIB, 1, &fake).unwrap();
    assert_eq!((d.segment().0, d.block_size()), (60 * MIB, 8 * MIB));
    check(&p);
    check(&q);
}

#[test]
fn stream_aware_reuse_waits_for_the_fence() {
    let p = caching();
    let mut a = p.alloc(64 * KIB, 1, &fake).unwrap();
    let first = a.offset();
    let fence = Arc::new(Flag::default());
    a.add_pending(1, fence.clone());
    drop(a);
    // Same stream: reusable at once (the stream runs in order).
    let mut b = p.alloc(64 * KIB, 1, &fake).unwrap();
    assert_eq!(b.offset(), first);
    assert_eq!(p.stats().cache_hits, 1);
    b.add_pending(1, fence.clone());
    drop(b);
    // Another stream: not while the fence is pending. The merged free block (whole segment)
    // is pending, so a new segment is made.
    let c = p.alloc(64 * KIB, 2, &fake).unwrap();
    assert_eq!(
        p.stats().backend_allocs,
        2,
        "no reuse across streams before the event"
    );
    drop(c);
    fence.0.store(true, Ordering::SeqCst);
    let d = p.alloc(64 * KIB, 2, &fake).unwrap();
    assert_eq!(
        p.stats().backend_allocs,
        2,
        "reused once the event completed"
    );
    drop(d);
    check(&p);
}

#[test]
fn pending_uses_keep_the_newest_fence_per_stream() {
    let p = caching();
    let fences: Vec<_> = (0..50).map(|_| Arc::new(Flag::default())).collect();
    for f in &fences {
        // Same-stream churn: the block is reused at once every time.
        let mut a = p.alloc(4 * KIB, 1, &fake).unwrap();
        a.add_pending(1, f.clone());
        a.add_pending(1, f.clone());
        drop(a);
        check(&p); // asserts one pending use per stream on every block
    }
    assert_eq!(p.stats().backend_allocs, 1);
    // Only the newest fence of stream 1 matters: completing it frees the block for stream 9.
    fences[49].0.store(true, Ordering::SeqCst);
    let _c = p.alloc(4 * KIB, 9, &fake).unwrap();
    assert_eq!(p.stats().backend_allocs, 1, "reused across streams");
}

#[test]
fn trim_skips_pending_segments_and_empty_cache_waits() {
    let p = caching();
    let mut a = p.alloc(KIB, 1, &fake).unwrap();
    let b = p.alloc(3 * MIB, 1, &fake).unwrap();
    let fence = Arc::new(Flag::default());
    a.add_pending(1, fence.clone());
    drop((a, b));
    assert_eq!(p.stats().segments, 2);
    assert_eq!(p.trim(), 20 * MIB as u64, "the settled large segment goes");
    assert_eq!(p.stats().segments, 1);
    assert_eq!(p.empty_cache(), 2 * MIB as u64, "waits for the fence");
    assert!(fence.is_complete());
    let s = p.stats();
    assert_eq!((s.segments, s.reserved.current, s.backend_frees), (0, 0, 2));
    assert_eq!(s.reserved.peak, 22 * MIB as u64);
    // Live blocks keep their segment.
    let c = p.alloc(KIB, 1, &fake).unwrap();
    assert_eq!(p.trim(), 0);
    drop(c);
    check(&p);
}

#[test]
fn caching_max_cached_bytes_releases_after_free() {
    let p = pool(pytorch().with_max_cached_bytes(3 * MIB as u64));
    // Two small segments, each holding two 1 MiB blocks.
    let v: Vec<_> = (0..4).map(|_| p.alloc(MIB, 1, &fake).unwrap()).collect();
    assert_eq!(p.stats().segments, 2);
    let mut v = v.into_iter();
    drop((v.next(), v.next(), v.next()));
    assert_eq!(p.stats().segments, 2, "3 MiB cached is within the cap");
    drop(v);
    let s = p.stats();
    assert_eq!((s.segments, s.free_bytes), (1, 2 * MIB as u64), "{s}");
}

/// CUB's allocator: bins of 8^3 B to 8^10 B, no divisions, idle blocks kept.
fn cub() -> PoolConfig {
    PoolConfig::new(PoolKind::Binned)
        .with_bins(8, 3, 10)
        .with_max_idle_percent(None)
}

#[test]
fn binned_rounds_to_bins_and_reuses_within_a_bin() {
    let p = pool(cub());
    let a = p.alloc(600, 1, &fake).unwrap();
    assert_eq!((a.block_size(), a.segment().0), (4096, 4096), "8^4");
    let tiny = p.alloc(1, 1, &fake).unwrap();
    assert_eq!(tiny.block_size(), 512, "min bin 8^3");
    let first = std::ptr::from_ref(a.segment());
    drop(a);
    let b = p.alloc(4000, 1, &fake).unwrap();
    assert_eq!(
        std::ptr::from_ref(b.segment()),
        first,
        "same bin: the cached block"
    );
    assert!(!b.zeroed(), "a reused block is not known zero");
    let c = p.alloc(5000, 1, &fake).unwrap();
    assert_eq!(c.block_size(), 32 * KIB);
    drop(b);
    // A 4 KiB block is cached, but a 32 KiB-bin request cannot use it.
    let d = p.alloc(20 * KIB, 1, &fake).unwrap();
    assert_eq!(p.stats().backend_allocs, 4);
    assert_eq!(p.stats().largest_free_block, 4096);
    drop((c, d, tiny));
    // Above the largest bin (8^10 = 1 GiB): exact size, never cached.
    let big = p.alloc((1 << 30) + 1, 1, &fake).unwrap();
    assert_eq!(big.block_size(), (1 << 30) + 1);
    let before = p.stats().backend_frees;
    drop(big);
    assert_eq!(p.stats().backend_frees, before + 1, "released at once");
    let s = p.stats();
    assert_eq!((s.allocations, s.cache_hits), (6, 1));
}

#[test]
fn binned_caches_at_most_max_cached_bytes() {
    let p = pool(PoolConfig::new(PoolKind::Binned).with_max_cached_bytes(8 * KIB as u64));
    let v: Vec<_> = (0..3)
        .map(|_| p.alloc(4 * KIB, 1, &fake).unwrap())
        .collect();
    drop(v);
    let s = p.stats();
    assert_eq!(s.free_bytes, 8 * KIB as u64);
    assert_eq!(
        (s.segments, s.backend_frees),
        (2, 1),
        "the third block went back"
    );
    assert_eq!(p.empty_cache(), 8 * KIB as u64);
    // Custom bins: growth 2, 2^4 .. 2^6.
    let q = pool(PoolConfig::new(PoolKind::Binned).with_bins(2, 4, 6));
    assert_eq!(q.alloc(17, 1, &fake).unwrap().block_size(), 32);
    assert_eq!(q.alloc(65, 1, &fake).unwrap().block_size(), 65);
}

#[test]
fn binned_stream_reuse_needs_the_event() {
    let p = pool(PoolConfig::new(PoolKind::Binned));
    let mut a = p.alloc(KIB, 7, &fake).unwrap();
    let fence = Arc::new(Flag::default());
    a.add_pending(7, fence.clone());
    drop(a);
    let b = p.alloc(KIB, 8, &fake).unwrap();
    assert_eq!(p.stats().cache_hits, 0);
    let c = p.alloc(KIB, 7, &fake).unwrap();
    assert_eq!(p.stats().cache_hits, 1, "same stream: at once");
    drop((b, c));
}

#[test]
fn none_allocates_and_frees_every_time() {
    let p = pool(PoolConfig::new(PoolKind::None));
    for _ in 0..3 {
        let a = p.alloc(1000, 1, &fake).unwrap();
        assert_eq!((a.block_size(), a.segment().0), (1000, 1000), "exact size");
        assert!(a.zeroed());
    }
    let s = p.stats();
    assert_eq!((s.backend_allocs, s.backend_frees, s.cache_hits), (3, 3, 0));
    assert_eq!((s.reserved.current, s.reserved.peak), (0, 1000));
}

#[test]
fn budget_caps_segments_exactly() {
    let budget = Arc::new(Budget::new(Some(4 * MIB as u64)));
    let p = Pool::new("capped", pytorch(), budget.clone(), usize::MAX).unwrap();
    let v: Vec<_> = (0..4).map(|_| p.alloc(MIB, 1, &fake).unwrap()).collect();
    assert_eq!(budget.used(), 4 * MIB as u64, "two 2 MiB segments");
    let e = p.alloc(MIB, 1, &fake).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("cap"), "{e}");
    let mut v = v.into_iter();
    drop(v.next());
    let c = p.alloc(MIB, 1, &fake).unwrap();
    assert_eq!(p.stats().cache_hits, 3, "served from a cached block");
    drop((v, c));
    assert_eq!(p.empty_cache(), 4 * MIB as u64);
    assert_eq!(budget.used(), 0);
    // A failing source gives the budget back.
    let fail = |_: usize| -> Result<Fake> { Err(crate::OomReport::new("x", 1, "").into()) };
    assert!(p.alloc(1, 1, &fail).is_err());
    assert_eq!(budget.used(), 0);
    // Near the cap a standard 20 MiB segment cannot fit: a tight one is made instead.
    let a = p.alloc(3 * MIB, 1, &fake).unwrap();
    assert_eq!(a.segment().0, 3 * MIB);
    drop(a);
    // Overflowing sizes are errors, not panics.
    let e = p.alloc(usize::MAX, 1, &fake).unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
}

#[test]
fn stats_arithmetic_and_peak_reset() {
    let p = caching();
    let a = p.alloc(100, 1, &fake).unwrap();
    let b = p.alloc(3 * MIB, 1, &fake).unwrap();
    let s = p.stats();
    assert_eq!(s.allocated.current, 512 + 3 * MIB as u64);
    assert_eq!(s.requested.current, 100 + 3 * MIB as u64);
    assert_eq!(s.reserved.current, 22 * MIB as u64);
    assert_eq!(s.free_bytes, s.reserved.current - s.allocated.current);
    drop(b);
    p.reset_peak();
    let s = p.stats();
    assert_eq!((s.allocated.current, s.allocated.peak), (512, 512));
    assert_eq!(s.requested.peak, 100);
    assert_eq!(s.reserved.peak, 22 * MIB as u64, "nothing released yet");
    assert_eq!((s.allocations, s.frees), (2, 1));
    drop(a);
    assert!(p.is_idle());
}

#[test]
fn observer_sees_every_event() {
    #[derive(Default)]
    struct Log(StdMutex<Vec<PoolEvent>>);
    impl PoolObserver for Log {
        fn on_event(&self, pool: &str, e: &PoolEvent) {
            assert_eq!(pool, "test");
            self.0.lock().unwrap().push(e.clone());
        }
    }
    let p = caching();
    let log = Arc::new(Log::default());
    p.set_observer(Some(log.clone()));
    drop(p.alloc(10, 1, &fake).unwrap());
    drop(p.alloc(10, 1, &fake).unwrap());
    p.empty_cache();
    let mut ev = log.0.lock().unwrap().clone();
    blank_ids(&mut ev);
    let alloc = |cache_hit| PoolEvent::Alloc {
        requested: 10,
        size: 512,
        cache_hit,
        block: 0,
        stream: 1,
        segment: 0,
        offset: 0,
        owner: None,
    };
    let free = PoolEvent::Free {
        size: 512,
        block: 0,
    };
    assert_eq!(
        ev,
        vec![
            PoolEvent::SegmentAlloc {
                bytes: 2 * MIB,
                segment: 0,
                stream: 1
            },
            alloc(false),
            free.clone(),
            alloc(true),
            free,
            PoolEvent::SegmentFree {
                bytes: 2 * MIB,
                segment: 0
            },
        ]
    );
}

/// Checks the block and segment ids of one segment's events (stream 1) for consistency, then
/// blanks them: they are the pool's own.
fn blank_ids(ev: &mut [PoolEvent]) {
    let mut ids = Vec::new();
    let mut seg = None;
    for e in ev.iter_mut() {
        match e {
            PoolEvent::SegmentAlloc {
                segment, stream, ..
            } => {
                assert_eq!(*stream, 1);
                seg = Some(*segment);
                *segment = 0;
            }
            PoolEvent::Alloc {
                block,
                stream,
                segment,
                offset,
                owner,
                ..
            } => {
                assert_eq!((*stream, Some(*segment), *offset), (1, seg, 0));
                assert!(owner.is_none());
                ids.push(*block);
                *block = 0;
                *segment = 0;
            }
            PoolEvent::Free { block, .. } => {
                assert_eq!(Some(*block), ids.last().copied());
                *block = 0;
            }
            PoolEvent::SegmentFree { segment, .. } => {
                assert_eq!(Some(*segment), seg);
                *segment = 0;
            }
            _ => {}
        }
    }
}

#[test]
fn random_workload_keeps_invariants() {
    let calls = AtomicUsize::new(0);
    let src = |b: usize| {
        calls.fetch_add(1, Ordering::Relaxed);
        Ok(Fake(b))
    };
    for cfg in [
        PoolConfig::default(),
        PoolConfig::default().with_max_split_size(24 * MIB),
        PoolConfig::new(PoolKind::Binned),
    ] {
        let p = pool(cfg);
        let mut live: Vec<Lease<Fake>> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..3000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if live.len() < 40 && !seed.is_multiple_of(3) {
                let size = match seed % 5 {
                    0 => (seed >> 8) as usize % 2048 + 1,
                    1 | 2 => (seed >> 8) as usize % (2 * MIB) + 1,
                    _ => (seed >> 8) as usize % (30 * MIB) + 1,
                };
                let l = p.alloc(size, seed % 3, &src).unwrap();
                assert!(l.offset() + l.block_size() <= l.segment().0);
                assert!(l.block_size() >= size);
                live.push(l);
            } else if !live.is_empty() {
                let i = (seed >> 16) as usize % live.len();
                live.swap_remove(i);
            }
            if step % 500 == 0 {
                check(&p);
            }
            // No two live blocks overlap.
            if step % 97 == 0 {
                let mut spans: Vec<_> = live
                    .iter()
                    .map(|l| {
                        (
                            std::ptr::from_ref(l.segment()) as usize,
                            l.offset(),
                            l.block_size(),
                        )
                    })
                    .collect();
                spans.sort_unstable();
                for w in spans.windows(2) {
                    if w[0].0 == w[1].0 {
                        assert!(w[0].1 + w[0].2 <= w[1].1, "overlap {w:?}");
                    }
                }
            }
        }
        let s = p.stats();
        assert_eq!(
            s.allocated.current,
            live.iter().map(|l| l.block_size() as u64).sum::<u64>()
        );
        drop(live);
        check(&p);
        assert_eq!(p.stats().allocated.current, 0);
        p.empty_cache();
        assert_eq!(p.stats().reserved.current, 0);
    }
    assert!(calls.load(Ordering::Relaxed) > 0);
}
