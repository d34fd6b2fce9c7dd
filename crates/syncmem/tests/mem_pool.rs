//! MemPools: a private pool per phase, routed to by a scope on the calling thread.
//!
//! Each check runs on `cpu`, on OpenCL (`opencl:0`) and on CUDA (`cuda:0`), each skipped with
//! a `SKIPPED` line when absent (a failure with `SYNCMEM_REQUIRE_OPENCL=1` or
//! `SYNCMEM_REQUIRE_CUDA=1`), on isolated devices so that no other test moves their
//! statistics.

use syncmem::{Device, Error, MemPool, MemoryCap, PoolConfig, PoolStats, SyncedMemory, ZeroCopy};

const KIB: usize = 1 << 10;

/// The devices of the test named `test`: an isolated `cpu`, and isolated `opencl:0` and
/// `cuda:0` when present.
fn devices(test: &str) -> Vec<Device> {
    let mut v = vec![Device::cpu().isolated()];
    v.extend(syncmem::testing::opencl_or_skip(test).map(|d| d.isolated()));
    v.extend(syncmem::testing::cuda_or_skip(test).map(|d| d.isolated()));
    v
}

fn device_pool(dev: &Device) -> PoolStats {
    dev.pool_stats()
        .expect("the device pool is made with the first MemPool")
}

#[test]
fn scoped_allocations_land_in_the_mem_pool_and_nowhere_else() {
    for dev in devices("scoped_allocations_land_in_the_mem_pool_and_nowhere_else") {
        routes_to_the_pool(&dev);
    }
}

fn routes_to_the_pool(dev: &Device) {
    let s = dev.default_stream().unwrap();
    let pool = MemPool::new(dev, PoolConfig::default()).unwrap();
    assert!(pool
        .label()
        .starts_with(&format!("{} mempool ", dev.label())));
    let before = device_pool(dev).allocations;
    let (a, mirror) = {
        let scope = pool.scope();
        assert_eq!(scope.pool_label(), pool.label());
        let a = dev.alloc_pooled(10 * KIB, &s).unwrap();
        let mirror = SyncedMemory::new(4 * KIB, dev).with_label("in the scope");
        mirror.device_overwrite().unwrap().fill(7).unwrap();
        // Another thread's allocations on the same device stay in the device pool.
        std::thread::scope(|t| {
            t.spawn(|| drop(dev.alloc_pooled(KIB, &s).unwrap()));
        });
        (a, mirror)
    };
    let ps = pool.stats();
    assert_eq!(ps.allocations, 2, "the buffer and the mirror: {ps}");
    assert_eq!(ps.requested.current, 14 * KIB as u64);
    assert_eq!(
        device_pool(dev).allocations,
        before + 1,
        "only the other thread's"
    );
    let owners: Vec<_> = pool
        .snapshot()
        .segments
        .iter()
        .flat_map(|g| g.blocks.iter().filter_map(|b| b.owner.clone()))
        .collect();
    assert_eq!(
        owners,
        ["in the scope"],
        "the snapshot names the mirror's owner"
    );
    // Outside the scope: the device pool again.
    drop(dev.alloc_pooled(KIB, &s).unwrap());
    assert_eq!(device_pool(dev).allocations, before + 2);
    // Blocks go back to the pool they came from, from any thread, scope or none.
    std::thread::scope(|t| {
        t.spawn(move || drop(a));
    });
    let other = MemPool::new(dev, PoolConfig::default()).unwrap();
    {
        let _elsewhere = other.scope();
        drop(mirror);
    }
    let ps = pool.stats();
    assert_eq!((ps.frees, ps.allocated.current), (2, 0), "{ps}");
    assert_eq!(other.stats().frees, 0);
    assert_eq!(device_pool(dev).frees, device_pool(dev).allocations);
}

#[test]
fn scopes_nest_and_route_only_their_own_device() {
    for dev in devices("scopes_nest_and_route_only_their_own_device") {
        let second = dev.isolated();
        let (s, s2) = (
            dev.default_stream().unwrap(),
            second.default_stream().unwrap(),
        );
        let outer = MemPool::new(&dev, PoolConfig::default()).unwrap();
        let inner = MemPool::new(&dev, PoolConfig::default()).unwrap();
        let elsewhere = MemPool::new(&second, PoolConfig::default()).unwrap();
        let _a = outer.scope();
        drop(dev.alloc_pooled(KIB, &s).unwrap());
        {
            let _b = inner.scope();
            let _c = elsewhere.scope();
            drop(dev.alloc_pooled(KIB, &s).unwrap());
            drop(second.alloc_pooled(KIB, &s2).unwrap());
        }
        // The inner scopes are closed: the outer one routes again.
        drop(dev.alloc_pooled(KIB, &s).unwrap());
        drop(second.alloc_pooled(KIB, &s2).unwrap());
        let counts = |p: &MemPool| p.stats().allocations;
        assert_eq!(
            (counts(&outer), counts(&inner), counts(&elsewhere)),
            (2, 1, 1)
        );
        assert_eq!(device_pool(&dev).allocations, 0);
        assert_eq!(device_pool(&second).allocations, 1);
    }
}

#[test]
fn a_released_mem_pool_gives_its_segments_back_at_once() {
    for dev in devices("a_released_mem_pool_gives_its_segments_back_at_once") {
        let s = dev.default_stream().unwrap();
        let pool = MemPool::new(&dev, PoolConfig::default()).unwrap();
        {
            let _scope = pool.scope();
            let bufs: Vec<_> = (0..8)
                .map(|_| dev.alloc_pooled(64 * KIB, &s).unwrap())
                .collect();
            drop(bufs);
        }
        let reserved = pool.stats().reserved.current;
        assert!(reserved >= 8 * 64 * KIB as u64);
        assert_eq!(
            dev.reserved_bytes(),
            reserved,
            "the device counts the pool's segments"
        );
        assert_eq!(pool.release(), reserved, "every cached segment goes back");
        assert_eq!(dev.reserved_bytes(), 0);
        // Dropping works the same way.
        let pool = MemPool::new(&dev, PoolConfig::default()).unwrap();
        {
            let _scope = pool.scope();
            drop(dev.alloc_pooled(64 * KIB, &s).unwrap());
        }
        assert!(dev.reserved_bytes() > 0);
        drop(pool);
        assert_eq!(dev.reserved_bytes(), 0);
    }
}

#[test]
fn blocks_in_use_keep_a_dropped_mem_pool_until_they_are_freed() {
    for dev in devices("blocks_in_use_keep_a_dropped_mem_pool_until_they_are_freed") {
        dev.set_zero_copy(ZeroCopy::Off);
        let pool = MemPool::new(&dev, PoolConfig::default()).unwrap();
        let buf = SyncedMemory::new(16 * KIB, &dev);
        let scope = pool.scope();
        buf.host_overwrite().unwrap().fill(3);
        buf.device().unwrap();
        drop(scope);
        drop(pool);
        assert!(
            dev.reserved_bytes() >= 16 * KIB as u64,
            "the block's segment stays"
        );
        assert_eq!(dev.memory_stats().in_use, 16 * KIB as u64, "and is counted");
        // The block is still the buffer's: written on the device, read back.
        buf.device_mut().unwrap().fill(9).unwrap();
        assert!(buf.host().unwrap().iter().all(|&b| b == 9));
        drop(buf);
        assert_eq!(
            dev.reserved_bytes(),
            0,
            "its segment went with the last block"
        );
        let m = dev.memory_stats();
        assert_eq!((m.in_use, m.allocs, m.frees), (0, 1, 1), "{m:?}");
    }
}

#[test]
fn the_device_cap_counts_mem_pools_and_a_pool_may_have_its_own() {
    for dev in devices("the_device_cap_counts_mem_pools_and_a_pool_may_have_its_own") {
        let s = dev.default_stream().unwrap();
        dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(256 * KIB as u64)))
            .unwrap();
        let pool = MemPool::new(&dev, PoolConfig::default()).unwrap();
        let held = {
            let _scope = pool.scope();
            dev.alloc_pooled(192 * KIB, &s).unwrap()
        };
        assert_eq!(
            pool.stats().cap,
            Some(256 * KIB as u64),
            "the device's cap governs"
        );
        let e = dev.alloc_pooled(128 * KIB, &s).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        drop(held);
        drop(pool);
        drop(dev.alloc_pooled(128 * KIB, &s).unwrap());
        // A cap of the pool's own, below the device's.
        let small = PoolConfig::default().with_memory_cap(MemoryCap::Bytes(64 * KIB as u64));
        let pool = MemPool::new(&dev, small).unwrap();
        let _scope = pool.scope();
        let e = dev.alloc_pooled(96 * KIB, &s).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(
            e.to_string().contains("of 64.0 KiB used"),
            "the pool's cap refused: {e}"
        );
        assert_eq!(pool.stats().ooms, 1);
        drop(dev.alloc_pooled(32 * KIB, &s).unwrap());
    }
}

#[test]
fn errors_name_the_device_and_the_pool() {
    let dev = Device::cpu().isolated();
    let e = MemPool::new(&dev, PoolConfig::default().with_gc_threshold(0.5)).unwrap_err();
    let Error::MemPool {
        device,
        pool,
        error,
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(device, "cpu");
    assert!(pool.starts_with("cpu mempool "), "{pool}");
    assert!(matches!(**error, Error::InvalidConfig { .. }), "{error}");
    assert!(e.to_string().contains("gc_threshold"), "{e}");
    let e = MemPool::new(&dev, PoolConfig::default().with_max_split_size(1)).unwrap_err();
    assert!(matches!(e, Error::MemPool { .. }), "{e}");
    dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(1 << 20)))
        .unwrap();
    let too_much = PoolConfig::default().with_preallocate(syncmem::Preallocation::Bytes(2 << 20));
    let e = MemPool::new(&dev, too_much).unwrap_err();
    assert!(e.oom_report().is_some(), "the preallocation's report: {e}");
    assert!(e.to_string().contains("mempool"), "{e}");
}
