//! Preallocation, the garbage collector and draining, on fake segments.

use super::*;

/// A caching pool of one shard under `budget`.
fn capped(cfg: PoolConfig, budget: &Arc<Budget>) -> Result<Arc<Pool<Fake>>> {
    Pool::new("test", cfg.with_shards(1), budget.clone(), 64 * MIB)
}

#[test]
fn a_preallocation_is_cached_counted_and_serves_small_and_large_requests() {
    let budget = Arc::new(Budget::new(None));
    let p = capped(PoolConfig::default(), &budget).unwrap();
    assert_eq!(
        p.preallocate(200 * MIB as u64, &fake).unwrap(),
        200 * MIB as u64
    );
    let s = p.stats();
    // One 2 MiB small segment, then large ones of at most the largest segment (64 MiB).
    assert_eq!((s.backend_allocs, s.segments), (5, 5));
    assert_eq!(s.preallocated_bytes, 200 * MIB as u64);
    assert_eq!(
        (s.reserved.current, s.free_bytes),
        (s.preallocated_bytes, s.preallocated_bytes)
    );
    assert_eq!(s.small.reserved.current, 2 * MIB as u64);
    assert_eq!(budget.used(), 200 * MIB as u64, "charged to the budget");
    let small = p.alloc(4 * KIB, 1, &fake).unwrap();
    let large = p.alloc(40 * MIB, 1, &fake).unwrap();
    let s = p.stats();
    assert_eq!(s.backend_allocs, 5, "both served from the preallocation");
    assert_eq!(s.cache_hits, 2);
    assert_eq!(large.segment().0, 64 * MIB);
    drop((small, large));
    check(&p);
    assert_eq!(
        p.empty_cache(),
        200 * MIB as u64,
        "empty_cache gives it back"
    );
    assert_eq!(budget.used(), 0);
}

#[test]
fn a_small_preallocation_is_large_segments_only_and_each_shard_gets_a_share() {
    let p = pool(PoolConfig::default().with_shards(4));
    assert_eq!(
        p.preallocate(8 * MIB as u64, &fake).unwrap(),
        8 * MIB as u64
    );
    let s = p.stats();
    assert_eq!(
        (s.segments, s.small.segments),
        (4, 0),
        "2 MiB per shard, no small segment"
    );
    let snap = p.snapshot();
    assert!(snap.segments.iter().all(|g| g.size == 2 * MIB as u64));
}

#[test]
fn a_preallocation_must_fit_the_cap_and_the_kind() {
    let budget = Arc::new(Budget::new(Some(16 * MIB as u64)));
    let p = capped(PoolConfig::default(), &budget).unwrap();
    let e = p.preallocate(32 * MIB as u64, &fake).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("preallocating"), "{e}");
    assert_eq!(budget.used(), 0, "all or nothing under a cap");
    assert_eq!(p.stats().segments, 0);
    let binned = pool(PoolConfig::new(PoolKind::Binned));
    let e = binned.preallocate(MIB as u64, &fake).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    let small_cache = pool(PoolConfig::default().with_max_cached_bytes(MIB as u64));
    let e = small_cache.preallocate(4 * MIB as u64, &fake).unwrap_err();
    assert!(e.to_string().contains("max_cached_bytes"), "{e}");
}

#[test]
fn the_collector_gives_back_idle_segments_above_the_threshold_largest_first() {
    let budget = Arc::new(Budget::new(Some(100 * MIB as u64)));
    // Every segment its own (no idle release before growing), freed blocks merged at once.
    let cfg = pytorch().with_gc_threshold(0.7);
    let p = capped(cfg, &budget).unwrap();
    let a = p.alloc(30 * MIB, 1, &fake).unwrap();
    let b = p.alloc(12 * MIB, 1, &fake).unwrap();
    drop((a, b));
    assert_eq!(
        budget.used(),
        42 * MIB as u64,
        "under the threshold: cached"
    );
    assert_eq!(p.stats().gc_releases, 0);
    // A hit reserves nothing: no collection.
    drop(p.alloc(20 * MIB, 1, &fake).unwrap());
    assert_eq!(p.stats().gc_releases, 0);
    // 42 + 40 MiB = 82 MiB > 70 MiB: the largest idle segment (30 MiB) goes, which is enough.
    let c = p.alloc(40 * MIB, 1, &fake).unwrap();
    let s = p.stats();
    assert_eq!((s.gc_releases, s.gc_released_bytes), (1, 30 * MIB as u64));
    assert_eq!(budget.used(), 52 * MIB as u64);
    assert_eq!(s.reserved.current, 52 * MIB as u64);
    drop(c);
}

#[test]
fn the_collector_needs_a_cap_and_a_fraction() {
    let none = Arc::new(Budget::new(None));
    let e = capped(PoolConfig::default().with_gc_threshold(0.8), &none).unwrap_err();
    assert!(e.to_string().contains("gc_threshold"), "{e}");
    assert!(e.to_string().contains("needs a memory cap"), "{e}");
    let capped_budget = Arc::new(Budget::new(Some(MIB as u64)));
    for bad in [0.0, 1.0, -0.5, f64::NAN] {
        let e = capped(PoolConfig::default().with_gc_threshold(bad), &capped_budget).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{bad}: {e}");
    }
    // A nested budget takes the enclosing cap.
    let nested = Arc::new(Budget::nested(None, capped_budget));
    capped(PoolConfig::default().with_gc_threshold(0.8), &nested).unwrap();
}

#[test]
fn a_drained_pool_refuses_work_and_gives_back_segments_as_they_empty() {
    let budget = Arc::new(Budget::new(None));
    let p = capped(pytorch(), &budget).unwrap();
    let a = p.alloc(30 * MIB, 1, &fake).unwrap();
    let b = p.alloc(12 * MIB, 1, &fake).unwrap();
    drop(b);
    assert_eq!(p.drain(), 12 * MIB as u64, "the idle segment goes at once");
    assert!(p.alloc(KIB, 1, &fake).is_err(), "a drained pool refuses");
    assert_eq!(budget.used(), 30 * MIB as u64);
    drop(a);
    assert_eq!(
        budget.used(),
        0,
        "the last block takes its segment back with it"
    );
    assert_eq!(p.stats().segments, 0);
}
