//! Shards: threads on shards of their own, readings that add up, ids unique across shards, and
//! a pool dropped while its blocks are still handed out.

use super::*;

fn sharded(shards: usize, budget: &Arc<Budget>) -> Arc<Pool<Fake>> {
    Pool::new(
        "sharded",
        pytorch().with_shards(shards),
        budget.clone(),
        isize::MAX as usize,
    )
    .unwrap()
}

/// Runs `f` on a thread of its own.
fn on_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// A block of `bytes` allocated on shard `shard` of `p`, by new threads until one is numbered
/// for that shard (other tests number threads too).
fn alloc_on(p: &Arc<Pool<Fake>>, shard: usize, bytes: usize) -> Lease<Fake> {
    for _ in 0..1000 {
        let l = on_thread(|| p.alloc(bytes, 1, &fake).unwrap());
        if l.shard().index == shard {
            return l;
        }
    }
    panic!("no thread was numbered for shard {shard}");
}

#[test]
fn the_shard_count_follows_the_configuration() {
    let budget = Arc::new(Budget::new(None));
    assert_eq!(sharded(3, &budget).shard_count(), 3);
    let auto = sharded(0, &budget).shard_count();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(auto, cores.min(config::MAX_AUTO_SHARDS));
    let cfg = PoolConfig::default().apply("shards=4").unwrap();
    assert_eq!(cfg.effective_shards(), 4);
    let err = PoolConfig::default()
        .with_shards(config::MAX_SHARDS + 1)
        .validate();
    assert!(err.unwrap_err().to_string().contains("shards"));
}

#[test]
fn threads_fill_shards_of_their_own_and_readings_add_them_up() {
    let budget = Arc::new(Budget::new(None));
    let p = sharded(4, &budget);
    let (a, b) = (alloc_on(&p, 1, 1000), alloc_on(&p, 2, 3000));
    let st = p.stats();
    assert_eq!(st.allocated.current, 1024 + 3072);
    assert_eq!(st.requested.current, 4000);
    assert_eq!(st.block_count.current, 2);
    // The threads that were numbered for other shards made segments there too.
    assert!(st.segments >= 2, "each shard makes segments of its own");
    assert_eq!(st.reserved.current, st.segments * 2 * MIB as u64);
    assert_eq!(
        budget.used(),
        st.reserved.current,
        "one budget for all shards"
    );
    let snap = p.snapshot();
    let mut ids: Vec<_> = snap.segments.iter().map(|s| s.id).collect();
    ids.dedup();
    assert_eq!(
        ids.len() as u64,
        st.segments,
        "ids unique across shards: {ids:?}"
    );
    assert_eq!(snap.stats, st);
    drop(a);
    // A lease goes back to its own shard, whichever thread drops it.
    on_thread(move || drop(b));
    let st = p.stats();
    assert_eq!(st.allocated.current, 0);
    assert_eq!(st.frees, st.allocations);
    assert!(
        st.allocated.peak >= 1024 + 3072,
        "the sum of the shards' peaks"
    );
    assert!(p.is_idle());
    let reserved = st.reserved.current;
    assert_eq!(p.empty_cache(), reserved, "every shard's cache is released");
    assert_eq!(budget.used(), 0);
}

#[test]
fn one_thread_uses_one_shard_and_reads_exactly_as_one_lock() {
    let budget = Arc::new(Budget::new(None));
    let p = sharded(8, &budget);
    let one = pool(pytorch().with_shards(1));
    for q in [&p, &one] {
        let a = q.alloc(5000, 1, &fake).unwrap();
        let b = q.alloc(700, 1, &fake).unwrap();
        drop(a);
        let c = q.alloc(5000, 1, &fake).unwrap();
        drop((b, c));
    }
    let (s, o) = (p.stats(), one.stats());
    assert_eq!(s.allocated, o.allocated);
    assert_eq!(s.reserved, o.reserved);
    assert_eq!((s.cache_hits, s.segments), (o.cache_hits, o.segments));
}

#[test]
fn a_pool_dropped_while_blocks_are_out_lives_until_the_last_one() {
    let budget = Arc::new(Budget::new(None));
    let p = sharded(3, &budget);
    let (a, b) = (alloc_on(&p, 0, 1000), alloc_on(&p, 1, 2000));
    // A shard with a cached segment and no block out: dropped with the pool.
    drop(alloc_on(&p, 2, 4000));
    assert_eq!(budget.used(), (3 * 2 * MIB) as u64);
    drop(p);
    assert_eq!(
        budget.used(),
        (2 * 2 * MIB) as u64,
        "the idle shard gave its budget back"
    );
    // The blocks still read their segments and know their pool.
    assert_eq!(a.segment().0, 2 * MIB);
    assert_eq!(b.pool_label(), "sharded");
    drop(a);
    assert!(budget.used() > 0, "b's shard still holds its segment");
    drop(b);
    assert_eq!(
        budget.used(),
        0,
        "the last block dropped its shard and gave the budget back"
    );
}

#[test]
fn a_pool_retires_only_when_idle_and_then_refuses_allocations() {
    let budget = Arc::new(Budget::new(None));
    let p = sharded(2, &budget);
    let a = alloc_on(&p, 1, 1000);
    let busy = |used| Error::InvalidState {
        op: "test",
        buffer: "sharded".into(),
        reason: format!("{used} bytes out"),
    };
    let mut replaced = false;
    let e = p.retire_if_idle(busy, |_| {
        replaced = true;
        Ok(())
    });
    assert!(e.unwrap_err().to_string().contains("1024 bytes out"));
    assert!(!replaced && !p.is_retired());
    drop(a);
    drop(alloc_on(&p, 0, 3000));
    // The final usage goes to the replacement, taken with every shard locked.
    let mut seen = None;
    p.retire_if_idle(busy, |u| {
        seen = Some(u);
        Ok(())
    })
    .unwrap();
    let u = seen.unwrap();
    // (`alloc_on` may have allocated and freed on other shards too.)
    assert_eq!((u.in_use, u.allocs), (0, u.frees));
    assert!(u.allocs >= 2);
    assert!(u.peak >= 3000);
    assert_eq!(u, p.usage());
    assert!(p.is_retired());
    let e = on_thread(|| p.alloc(64, 1, &fake)).unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
    // Emptied, a retired pool drops its bookkeeping; its counts stay.
    p.empty_cache();
    p.shed_retired();
    assert_eq!(budget.used(), 0);
    assert_eq!(p.usage(), u);
}

#[test]
fn the_shard_of_a_thread_is_its_index_modulo_the_shards() {
    let xs = [
        0,
        1,
        2,
        3,
        7,
        8,
        1023,
        1024,
        65_537,
        u32::MAX / 3,
        u32::MAX - 1,
        u32::MAX,
    ];
    for n in (2..=70).chain([127, 128, 1000, config::MAX_SHARDS]) {
        let mul = shard::shard_multiplier(n);
        for x in xs.into_iter().chain(0..3 * n as u32) {
            assert_eq!(
                shard::shard_of(x, n, mul),
                x as usize % n,
                "{x} modulo {n} shards"
            );
        }
    }
    assert_eq!(
        shard::shard_multiplier(1),
        0,
        "one shard needs no multiplier"
    );
}
