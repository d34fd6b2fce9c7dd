//! `preallocate` and `gc_threshold`: memory reserved when a pool is made and served from, and
//! idle segments given back above a fraction of the cap. On `cpu`, on OpenCL (`opencl:0`) and
//! on CUDA (`cuda:0`), each skipped with a `SKIPPED` line when absent (a failure with
//! `SYNCMEM_REQUIRE_OPENCL=1` or `SYNCMEM_REQUIRE_CUDA=1`), on isolated devices; and from
//! `SYNCMEM_POOL_CONF`, in child processes.

use std::process::Command;

use syncmem::{Device, Error, MemPool, MemoryCap, PoolConfig, Preallocation, SyncedMemory};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const CHILD: &str = "SYNCMEM_POOL_RESERVE_TEST_CHILD";

fn devices(test: &str) -> Vec<Device> {
    let mut v = vec![Device::cpu().isolated()];
    v.extend(syncmem::testing::opencl_or_skip(test).map(|d| d.isolated()));
    v.extend(syncmem::testing::cuda_or_skip(test).map(|d| d.isolated()));
    v
}

#[test]
fn a_preallocated_device_pool_serves_allocations_from_its_reservation() {
    for dev in devices("a_preallocated_device_pool_serves_allocations_from_its_reservation") {
        let cfg = PoolConfig::default()
            .with_shards(1)
            .with_memory_cap(MemoryCap::Bytes(64 * MIB as u64))
            .with_preallocate(Preallocation::Fraction(0.25));
        dev.set_pool(cfg).unwrap();
        let s = dev.pool_stats().unwrap();
        // A quarter of the cap: one small segment of 2 MiB, one large one of 14 MiB.
        assert_eq!(s.preallocated_bytes, 16 * MIB as u64, "{s}");
        assert_eq!(
            (s.reserved.current, s.free_bytes),
            (16 * MIB as u64, 16 * MIB as u64)
        );
        assert_eq!(
            (s.backend_allocs, s.small.segments, s.large.segments),
            (2, 1, 1)
        );
        assert_eq!(dev.reserved_bytes(), 16 * MIB as u64);
        let stream = dev.default_stream().unwrap();
        let small: Vec<_> = (0..16)
            .map(|_| dev.alloc_pooled(64 * KIB, &stream).unwrap())
            .collect();
        let large: Vec<_> = (0..3)
            .map(|_| dev.alloc_pooled(4 * MIB, &stream).unwrap())
            .collect();
        let mirror = SyncedMemory::new(MIB + 1, &dev);
        mirror.device_overwrite().unwrap().fill(1).unwrap();
        let s = dev.pool_stats().unwrap();
        assert_eq!(
            s.backend_allocs, 2,
            "every allocation served from the reservation: {s}"
        );
        assert_eq!(s.cache_hits, 20);
        assert_eq!(dev.reserved_bytes(), 16 * MIB as u64);
        drop((small, large, mirror));
        // Like any cached memory, `empty_cache` gives it back.
        assert_eq!(dev.empty_cache(), 16 * MIB as u64);
        assert_eq!(dev.reserved_bytes(), 0);
    }
}

#[test]
fn a_mem_pool_preallocates_a_share_of_the_cap_in_effect() {
    for dev in devices("a_mem_pool_preallocates_a_share_of_the_cap_in_effect") {
        dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(32 * MIB as u64)))
            .unwrap();
        let half = PoolConfig::default()
            .with_shards(1)
            .with_preallocate(Preallocation::Fraction(0.5));
        let pool = MemPool::new(&dev, half.clone()).unwrap();
        assert_eq!(
            pool.stats().preallocated_bytes,
            16 * MIB as u64,
            "of the device's cap"
        );
        assert_eq!(dev.reserved_bytes(), 16 * MIB as u64);
        let own =
            MemPool::new(&dev, half.with_memory_cap(MemoryCap::Bytes(8 * MIB as u64))).unwrap();
        assert_eq!(
            own.stats().preallocated_bytes,
            4 * MIB as u64,
            "of its own cap"
        );
        assert_eq!(dev.reserved_bytes(), 20 * MIB as u64);
        {
            let _scope = pool.scope();
            let stream = dev.default_stream().unwrap();
            drop(dev.alloc_pooled(10 * MIB, &stream).unwrap());
        }
        let s = pool.stats();
        assert_eq!(
            (s.backend_allocs, s.cache_hits),
            (2, 1),
            "served from the reservation"
        );
        // Beyond the device's cap: refused, nothing reserved.
        let e = MemPool::new(
            &dev,
            PoolConfig::default().with_preallocate(Preallocation::Bytes(16 * MIB as u64)),
        )
        .unwrap_err();
        assert!(e.oom_report().is_some(), "{e}");
        assert_eq!(dev.reserved_bytes(), 20 * MIB as u64);
        drop((pool, own));
        assert_eq!(dev.reserved_bytes(), 0);
    }
}

#[test]
fn the_collector_keeps_reserved_memory_under_the_threshold() {
    for dev in devices("the_collector_keeps_reserved_memory_under_the_threshold") {
        let cfg = PoolConfig::default()
            .with_shards(1)
            .with_max_idle_percent(None)
            .with_memory_cap(MemoryCap::Bytes(16 * MIB as u64))
            .with_gc_threshold(0.5);
        dev.set_pool(cfg).unwrap();
        let stream = dev.default_stream().unwrap();
        drop(dev.alloc_pooled(4 * MIB, &stream).unwrap());
        assert_eq!(
            dev.reserved_bytes(),
            4 * MIB as u64,
            "cached under the threshold"
        );
        // A 6 MiB block does not fit the cached 4 MiB: a new segment, 10 MiB reserved, above
        // 8 MiB: the idle 4 MiB segment goes.
        let held = dev.alloc_pooled(6 * MIB, &stream).unwrap();
        let s = dev.pool_stats().unwrap();
        assert_eq!(
            (s.gc_releases, s.gc_released_bytes),
            (1, 4 * MIB as u64),
            "{s}"
        );
        assert_eq!(dev.reserved_bytes(), 6 * MIB as u64);
        assert!(s.to_string().contains("gc released 1 segment(s)"), "{s}");
        drop(held);
    }
}

#[test]
fn a_threshold_without_a_cap_is_a_clear_error() {
    let dev = Device::cpu().isolated();
    let e = dev
        .set_pool(PoolConfig::default().with_gc_threshold(0.8))
        .unwrap_err();
    match &e {
        Error::InvalidConfig { what, reason } => {
            assert_eq!(what, "gc_threshold");
            assert!(reason.contains("needs a memory cap"), "{reason}");
        }
        e => panic!("{e:?}"),
    }
    // A MemPool takes the device's cap.
    dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(MIB as u64)))
        .unwrap();
    MemPool::new(&dev, PoolConfig::default().with_gc_threshold(0.8)).unwrap();
    let e = dev
        .set_pool(
            PoolConfig::default()
                .with_memory_cap(MemoryCap::Bytes(MIB as u64))
                .with_gc_threshold(0.25)
                .with_preallocate(Preallocation::Fraction(0.5)),
        )
        .unwrap_err();
    assert!(e.to_string().contains("gc_threshold x cap"), "{e}");
    assert_eq!(
        dev.memory_cap(),
        Some(MIB as u64),
        "a failed set_pool keeps the cap"
    );
}

/// Runs `mode` of [`reserve_child_probe`] in a child process with `SYNCMEM_POOL_CONF=conf`.
fn run_child(mode: &str, conf: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "reserve_child_probe", "--nocapture"])
        .env(CHILD, mode)
        .env("SYNCMEM_POOL_CONF", conf)
        .env_remove("SYNCMEM_DEVICE_POOL")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {mode} failed:\n{text}");
    assert!(text.contains(&format!("probe {mode} ok")), "{text}");
}

#[test]
fn the_keys_work_from_the_environment() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    run_child("preallocate", "memory_cap=64MiB,preallocate=25%,shards=1");
    run_child("no cap", "gc_threshold=0.5");
}

/// Runs only in the child processes of the test above.
#[test]
fn reserve_child_probe() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    if mode == "preallocate" {
        let dev = Device::cpu().isolated();
        drop(dev.alloc(10).unwrap());
        let s = dev.pool_stats().unwrap();
        assert_eq!(s.preallocated_bytes, 16 * MIB as u64, "{s}");
        assert_eq!(
            dev.reserved_bytes(),
            16 * MIB as u64,
            "the direct allocation is gone"
        );
    } else {
        let e = Device::open("cpu").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("SYNCMEM_POOL_CONF (gc_threshold)"), "{text}");
        assert!(text.contains("needs a memory cap"), "{text}");
    }
    println!("probe {mode} ok");
}
