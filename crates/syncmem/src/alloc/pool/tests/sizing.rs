//! Tests of the exact-size free lists, segment growth, idle release and the finer bins.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{check, fake, pool, Fake, Flag, KIB, MIB};
use crate::alloc::pool::{Fence, Lease, Pool, PoolConfig, PoolKind};

fn lists(p: &Pool<Fake>) -> usize {
    match &p.shards[p.shard_index()].inner.lock().core {
        crate::alloc::pool::strategy::Core::Caching(a) => a.listed(),
        _ => 0,
    }
}

#[test]
fn a_small_block_comes_back_from_its_exact_size_list() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(4000, 1, &fake).unwrap();
    let (seg, offset) = (std::ptr::from_ref(a.segment()), a.offset());
    let _b = p.alloc(4096, 1, &fake).unwrap();
    drop(a);
    assert_eq!(
        lists(&p),
        1,
        "the freed block waits on its list, not merged"
    );
    let s = p.stats();
    assert_eq!(
        s.free_bytes,
        s.reserved.current - 4096,
        "listed bytes are free"
    );
    check(&p);
    let c = p.alloc(4096, 1, &fake).unwrap();
    assert_eq!(
        (std::ptr::from_ref(c.segment()), c.offset()),
        (seg, offset),
        "same size, same stream: the same block"
    );
    assert!(!c.zeroed(), "a reused block is not known zero");
    assert_eq!(lists(&p), 0);
    assert_eq!(p.stats().cache_hits, 2);
    check(&p);
    // Another stream does not take the block from stream 1's list while the arena can serve it.
    drop(c);
    let d = p.alloc(4096, 2, &fake).unwrap();
    assert_ne!((std::ptr::from_ref(d.segment()), d.offset()), (seg, offset));
    assert_eq!(lists(&p), 1);
    check(&p);
}

#[test]
fn lists_are_flushed_before_the_pool_grows() {
    // Fill one 16 KiB segment with 1 KiB blocks, free them all onto their list, then ask for
    // 16 KiB: merged, they serve it without a new segment.
    let p = pool(PoolConfig::default());
    let v: Vec<_> = (0..16).map(|_| p.alloc(KIB, 1, &fake).unwrap()).collect();
    assert_eq!(p.stats().segments, 1);
    assert_eq!(
        v[0].segment().0,
        16 * KIB,
        "a pool starts with a 16 KiB segment"
    );
    drop(v);
    assert_eq!(lists(&p), 16);
    let big = p.alloc(16 * KIB, 1, &fake).unwrap();
    assert_eq!(lists(&p), 0);
    let s = p.stats();
    assert_eq!(
        (s.segments, s.backend_allocs),
        (1, 1),
        "no new segment: {s}"
    );
    assert_eq!(big.offset(), 0);
    drop(big);
    // A block with uses in flight on two streams is not listed: it goes to the arena.
    let mut e = p.alloc(KIB, 1, &fake).unwrap();
    let (f1, f2) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
    e.add_pending(1, f1.clone());
    e.add_pending(2, f2.clone());
    drop(e);
    assert_eq!(lists(&p), 0);
    // One stream's pending use: listed for that stream, reused by it at once.
    let mut g = p.alloc(KIB, 1, &fake).unwrap();
    g.add_pending(3, f1.clone());
    let at = g.offset();
    drop(g);
    assert_eq!(p.alloc(KIB, 3, &fake).unwrap().offset(), at);
    check(&p);
    // Giving back segments flushes the lists too. (Two segments: stream 1 could not use the
    // first while stream 2's use of `e` was pending.)
    f1.wait();
    f2.wait();
    assert_eq!(p.empty_cache(), 32 * KIB as u64);
    assert_eq!(p.stats().reserved.current, 0);
}

#[test]
fn segments_start_small_and_grow_with_demand() {
    let p = pool(PoolConfig::default());
    let mut v = Vec::new();
    let mut sizes = Vec::new();
    // Small requests: 16 KiB segments until 6 % of the pool exceeds 16 KiB, then growing.
    for _ in 0..2000 {
        let l = p.alloc(4 * KIB, 1, &fake).unwrap();
        if l.offset() == 0 {
            sizes.push(l.segment().0);
        }
        v.push(l);
    }
    assert_eq!(sizes[0], 16 * KIB);
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
    let reserved: usize = sizes.iter().sum();
    assert_eq!(reserved as u64, p.stats().reserved.current);
    for (i, &s) in sizes.iter().enumerate() {
        let before: usize = sizes[..i].iter().sum();
        let want = (before * 6 / 100)
            .clamp(16 * KIB, 2 * MIB)
            .next_multiple_of(512);
        assert_eq!(s, want, "segment {i} after {before} bytes");
    }
    // Little is left unused: the last segment's tail, and tails shorter than a block.
    let s = p.stats();
    let unused = s.reserved.current - s.allocated.current;
    let bound = *sizes.last().unwrap() + sizes.len() * 4 * KIB;
    assert!(unused < bound as u64, "{s}");
    assert!(unused * 10 < s.reserved.current, "{s}");
    // A min_segment that is not a multiple of the rounding is rounded up.
    let r = pool(PoolConfig::default().with_segment_growth(100, 0));
    assert_eq!(r.alloc(1, 1, &fake).unwrap().segment().0, 512);
    // Growth stops at small_segment.
    let q = pool(PoolConfig::default().with_segment_growth(16 * KIB, 100));
    let w: Vec<_> = (0..16).map(|_| q.alloc(MIB, 1, &fake).unwrap()).collect();
    assert_eq!(w.last().unwrap().segment().0, 2 * MIB);
    // Large requests: a segment of their own size while the large pool is small.
    let a = p.alloc(4 * MIB, 1, &fake).unwrap();
    assert_eq!(a.segment().0, 4 * MIB);
    let b = p.alloc(3 * MIB + 1, 1, &fake).unwrap();
    assert_eq!(b.segment().0, 3 * MIB + 512);
    // From 10 MiB: their own, rounded to 2 MiB.
    let c = p.alloc(11 * MIB, 1, &fake).unwrap();
    assert_eq!(c.segment().0, 12 * MIB);
    check(&p);
}

#[test]
fn idle_segments_go_back_before_the_pool_grows() {
    // A 2 MiB block is freed; a 3 MiB request cannot use its segment.
    let run = |cfg: PoolConfig| {
        let p = pool(cfg);
        let keep = p.alloc(MIB + 512, 1, &fake).unwrap();
        drop(p.alloc(2 * MIB, 1, &fake).unwrap());
        let big = p.alloc(3 * MIB, 1, &fake).unwrap();
        check(&p);
        let s = p.stats();
        drop((keep, big));
        s
    };
    let s = run(PoolConfig::default());
    assert_eq!(s.backend_frees, 1, "the idle 2 MiB segment went back: {s}");
    assert_eq!(s.reserved.current, (MIB + 512 + 3 * MIB) as u64);
    let s = run(PoolConfig::default().with_max_idle_percent(None));
    assert_eq!(s.backend_frees, 0, "kept: {s}");
    // Idle memory within the allowed share is kept.
    let s = run(PoolConfig::default().with_max_idle_percent(Some(200)));
    assert_eq!(
        s.backend_frees, 0,
        "2 MiB idle is within 200 % of 1 MiB in use: {s}"
    );
}

#[test]
fn idle_segments_with_pending_work_stay() {
    let p = pool(PoolConfig::default());
    let mut a = p.alloc(2 * MIB, 1, &fake).unwrap();
    let fence = Arc::new(Flag::default());
    a.add_pending(1, fence.clone());
    drop(a);
    // Stream 2 cannot use the block yet, and the pool may not give it back either.
    let b = p.alloc(3 * MIB, 2, &fake).unwrap();
    assert_eq!(p.stats().backend_frees, 0);
    drop(b);
    fence.0.store(true, Ordering::SeqCst);
    check(&p);
}

#[test]
fn binned_gives_back_other_bins_before_growing() {
    let p = pool(PoolConfig::new(PoolKind::Binned));
    let live = p.alloc(64 * KIB, 1, &fake).unwrap();
    drop((
        p.alloc(32 * KIB, 1, &fake).unwrap(),
        p.alloc(KIB, 1, &fake).unwrap(),
    ));
    assert_eq!(p.stats().free_bytes, 33 * KIB as u64);
    // A 1 KiB request reuses its bin's block: nothing goes.
    let again = p.alloc(KIB, 1, &fake).unwrap();
    assert_eq!(p.stats().backend_frees, 0);
    drop(again);
    // A new bin: the cached 32 KiB block (more than 6 % of the 64 KiB in use) goes back, the
    // 1 KiB one (within it) stays.
    let c = p.alloc(48 * KIB, 1, &fake).unwrap();
    let s = p.stats();
    assert_eq!((s.backend_frees, s.free_bytes), (1, KIB as u64), "{s}");
    assert_eq!(c.block_size(), 48 * KIB, "1.5 x 32 KiB is a bin");
    drop((live, c));
    // Without idle release nothing goes back.
    let q = pool(PoolConfig::new(PoolKind::Binned).with_max_idle_percent(None));
    let live = q.alloc(64 * KIB, 1, &fake).unwrap();
    drop(q.alloc(32 * KIB, 1, &fake).unwrap());
    drop(q.alloc(48 * KIB, 1, &fake).unwrap());
    assert_eq!(q.stats().backend_frees, 0);
    drop(live);
}

#[test]
fn steady_state_cycles_serve_every_size_from_the_lists() {
    let p = pool(PoolConfig::default());
    let sizes = [100, 4096, 5000, 65536, 700_000];
    let mut warm: Vec<Lease<Fake>> = sizes
        .iter()
        .map(|&s| p.alloc(s, 1, &fake).unwrap())
        .collect();
    warm.clear();
    let before = p.stats();
    for _ in 0..100 {
        let v: Vec<_> = sizes
            .iter()
            .map(|&s| p.alloc(s, 1, &fake).unwrap())
            .collect();
        drop(v);
    }
    let after = p.stats();
    assert_eq!(after.backend_allocs, before.backend_allocs);
    assert_eq!(after.cache_hits - before.cache_hits, 500);
    assert_eq!(lists(&p), sizes.len());
    check(&p);
}
