//! `Device::open_isolated` / `Device::isolated`: a device on the same hardware whose pools, cap,
//! counters and mirror registry are its own.

use syncmem::{Device, Error, MemoryCap, PoolConfig, SyncedMemory};

const MIB: usize = 1 << 20;

fn capped(d: &Device, cap: usize) {
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(cap as u64)))
        .unwrap();
}

fn isolated_devices_keep_their_memory_state_apart(dev: &Device) {
    let a = Device::open_isolated(dev.label()).unwrap();
    let b = dev.isolated();
    for d in [&a, &b] {
        assert_eq!(d.info(), dev.info(), "the same hardware");
        assert_eq!(d.label(), dev.label());
        assert!(!d.same(dev), "another device than the shared one");
        assert!(d.pool_stats().is_none(), "a pool of its own, not built yet");
    }
    assert!(!a.same(&b), "every call makes another device");
    assert!(a.same(&a.clone()), "clones share it");
    assert!(
        Device::open(dev.label()).unwrap().same(dev),
        "open still shares"
    );

    // A cap on one applies to it alone.
    let shared_cap = dev.memory_cap();
    capped(&a, 4 * MIB);
    assert_eq!(a.memory_cap(), Some(4 * MIB as u64));
    assert_eq!(b.memory_cap(), shared_cap);
    assert_eq!(dev.memory_cap(), shared_cap);
    let e = a.alloc(8 * MIB).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(a.last_oom_report().is_some());
    assert!(b.last_oom_report().is_none());
    let big = b.alloc(8 * MIB).unwrap();

    // Counters and mirror registries of their own.
    let m = SyncedMemory::new(MIB, &a).with_label("on_a");
    m.host_mut().unwrap().fill(3);
    drop(m.device().unwrap());
    assert_eq!(a.memory_stats().in_use, MIB as u64);
    assert_eq!(b.memory_stats().in_use, 8 * MIB as u64);
    let labels =
        |d: &Device| -> Vec<String> { d.live_buffers().into_iter().map(|l| l.label).collect() };
    assert_eq!(labels(&a), ["on_a"]);
    assert!(labels(&b).is_empty());
    assert!(!labels(dev).contains(&"on_a".to_string()));

    // Streams belong to one device.
    let sb = b.new_stream().unwrap();
    let e = a.alloc_pooled(MIB, &sb).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    drop((m, big));
}

syncmem::for_each_device!(isolated_devices_keep_their_memory_state_apart);
