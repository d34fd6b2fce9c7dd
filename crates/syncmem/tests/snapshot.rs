//! Memory snapshots and summaries of real pools (the device and pinned pools of `cpu` and of
//! each OpenCL device, the host pool): segments and blocks add up to the statistics, allocated
//! blocks name their tensors, snapshots round-trip through JSON; and a pooled block freed with
//! no work pending goes back without a fence.
//!
//! Device tests run on `Device::detached()` handles, whose pools no other test touches.

use syncmem::alloc::pool::{BlockState, PoolSnapshot};
use syncmem::tensor::Tensor;
use syncmem::{Device, MemorySnapshot, SyncedMemory};

/// Checks that a pool's snapshot adds up to the statistics it carries.
fn consistent(p: &PoolSnapshot) {
    let st = &p.stats;
    let reserved: u64 = p.segments.iter().map(|s| s.size).sum();
    assert_eq!(reserved, st.reserved.current, "{}: reserved", p.label);
    assert_eq!(p.segments.len() as u64, st.segments, "{}", p.label);
    assert_eq!(
        p.bytes_in(BlockState::Allocated),
        st.allocated.current,
        "{}: allocated",
        p.label
    );
    assert_eq!(
        p.bytes_in(BlockState::Free) + p.bytes_in(BlockState::Pending),
        st.free_bytes,
        "{}: free",
        p.label
    );
    let requested: u64 = p.blocks().map(|(_, b)| b.requested).sum();
    assert_eq!(requested, st.requested.current, "{}: requested", p.label);
    for s in &p.segments {
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.size);
    }
}

fn owners(p: &PoolSnapshot) -> Vec<&str> {
    p.blocks()
        .filter(|(_, b)| b.state == BlockState::Allocated)
        .filter_map(|(_, b)| b.owner.as_deref())
        .collect()
}

fn allocated_blocks_name_their_tensor(dev: &Device) {
    let d = dev.detached();
    let mut w = Tensor::new(&d).with_label("fc1_w");
    w.resize(&[64, 32]).unwrap();
    w.device_overwrite::<f32>()
        .unwrap()
        .write(&vec![0.5; 64 * 32])
        .unwrap();
    let mut b = Tensor::new(&d).with_label("fc1_b");
    b.resize(&[3 << 18]).unwrap(); // 3 MiB: a large block
    b.device_overwrite::<f32>().unwrap();
    let pinned = SyncedMemory::new(10_000, &d)
        .with_label("staging")
        .with_pinned_host(true);
    pinned.host_mut().unwrap()[0] = 1;
    let unnamed = d.alloc_pooled(4096, &d.default_stream().unwrap()).unwrap();

    let snaps = d.pool_snapshots();
    assert_eq!(snaps.len(), 2, "the device pool and the pinned pool");
    let (dev_pool, pinned_pool) = (&snaps[0], &snaps[1]);
    assert_eq!(dev_pool.label, d.label());
    assert_eq!(pinned_pool.label, format!("{} pinned", d.label()));
    for p in &snaps {
        consistent(p);
    }
    let mut named = owners(dev_pool);
    named.sort_unstable();
    assert_eq!(named, ["fc1_b", "fc1_w"], "{}", d.label());
    assert_eq!(owners(pinned_pool), ["staging"]);
    let fc1_w = dev_pool
        .blocks()
        .find(|(_, b)| b.owner.as_deref() == Some("fc1_w"))
        .unwrap()
        .1;
    assert_eq!(fc1_w.requested, 64 * 32 * 4);
    assert_eq!(
        dev_pool
            .blocks()
            .filter(|(_, b)| b.state == BlockState::Allocated && b.owner.is_none())
            .count(),
        1,
        "a direct pooled allocation has no owner"
    );
    assert_eq!(dev_pool.stats, d.pool_stats().unwrap(), "the same figures");

    // The summary shows the same figures as the statistics.
    let st = d.pool_stats().unwrap();
    let sum = st.summary();
    assert_eq!(sum.allocated.all, st.allocated);
    assert_eq!(sum.reserved.small, st.small.reserved);
    assert_eq!(sum.allocated.large.current, st.large.allocated.current);
    assert!(st.large.allocated.current >= 3 << 20, "{st}");
    assert!(sum.to_string().contains(&format!("pool {}", d.label())));

    // JSON round trip.
    let all = MemorySnapshot::new(snaps);
    let back: MemorySnapshot = serde_json::from_str(&all.to_json()).unwrap();
    assert_eq!(back, all);

    // Freed: no owner is left behind.
    drop((w, b, pinned, unnamed));
    for p in &d.pool_snapshots() {
        consistent(p);
        assert!(p.blocks().all(|(_, b)| b.owner.is_none()), "{}", p.label);
    }
}

syncmem::for_each_device!(allocated_blocks_name_their_tensor);

#[test]
fn the_process_snapshot_has_the_host_pool_and_opened_devices() {
    let m = SyncedMemory::host_only(5000).with_label("host_named");
    m.host_mut().unwrap()[0] = 1;
    let dev = Device::cpu();
    let s = dev.default_stream().unwrap();
    let _b = dev.alloc_pooled(100, &s).unwrap();
    let snap = syncmem::memory_snapshot();
    let host = snap.pool("host").expect("the host pool");
    assert!(owners(host).contains(&"host_named"), "{snap}");
    assert!(snap.pool("cpu").is_some(), "{snap}");
    let json: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
    assert!(json["pools"].as_array().unwrap().len() >= 2);
}

/// A pooled block freed with no work on it goes back free for every stream: no fence. One
/// freed with work queued is pending until that work is done; one whose native handle was
/// handed out is pending too (work may have been queued outside the crate).
#[cfg(feature = "opencl")]
#[test]
fn opencl_a_free_records_a_fence_only_for_pending_work() {
    #[path = "common/gate.rs"]
    mod gate;

    let Some(dev) = syncmem::testing::opencl_or_skip("opencl_fence_only_for_pending_work") else {
        return;
    };
    let d = dev.detached();
    let s = d.new_stream().unwrap();
    let state = |d: &Device| {
        let snap = &d.pool_snapshots()[0];
        consistent(snap);
        // The first block of the first segment: the one every test below allocates.
        snap.segments[0].blocks[0].state
    };
    let guard = d.alloc_pooled(4096, &s).unwrap(); // keeps the segment
    drop(d.alloc_pooled(4096, &s).unwrap());
    // The block freed is the second one: look at it.
    let second = |d: &Device| d.pool_snapshots()[0].segments[0].blocks[1].state;
    assert_eq!(second(&d), BlockState::Free, "nothing was queued on it");

    let gate = gate::Gate::block(&s);
    let mut x = d.alloc_pooled(4096, &s).unwrap();
    s.fill(&mut x, 0, 4096, 1).unwrap();
    drop(x);
    assert_eq!(second(&d), BlockState::Pending, "its fill is queued");
    gate.open();
    s.synchronize().unwrap();
    assert_eq!(second(&d), BlockState::Free, "the fill is done");

    let x = d.alloc_pooled(4096, &s).unwrap();
    assert!(x.as_opencl().is_some());
    drop(x);
    assert_eq!(
        second(&d),
        BlockState::Pending,
        "a handed-out handle: work outside the crate may be queued"
    );
    assert_eq!(state(&d), BlockState::Allocated);
    drop(guard);
}
