//! Spilling under a memory cap: dirty device mirrors written back to the host, least recently
//! used first, about twice the request at a time, and brought back (refilled) by their next
//! device access, counted apart from copies; never a buffer a guard holds or work queued on
//! it still uses. Each test runs with two mirrors and with zero-copy, on `cpu` and OpenCL.
//! Where the host uses the device's memory in place, a zero-copy buffer spills in place (its
//! block parked: no byte copied, see `spill_in_place.rs`); otherwise it is copied out.

use syncmem::{Device, Head, MemoryCap, PoolConfig, SyncedMemory, ZeroCopy, ZeroCopyProtocol};

const MIB: usize = 1 << 20;

/// An isolated device capped at `cap` bytes, with the zero-copy setting.
fn capped(dev: &Device, cap: usize, zero_copy: ZeroCopy) -> Device {
    let d = dev.isolated();
    d.set_zero_copy(zero_copy);
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(cap as u64)))
        .unwrap();
    d
}

fn device_bytes(m: &SyncedMemory) -> Vec<u8> {
    let mut out = vec![0u8; m.len()];
    m.device().unwrap().read_into(&mut out).unwrap();
    out
}

/// Whether a zero-copy buffer of `d` spills in place (its block parked, nothing copied).
fn in_place(d: &Device) -> bool {
    d.zero_copy_protocol() == Some(ZeroCopyProtocol::InPlace)
}

/// A 1 MiB buffer written on the device (dirty), with byte `v`.
fn dirty(d: &Device, name: &str, v: u8) -> SyncedMemory {
    let m = SyncedMemory::new(MIB, d).with_label(name);
    m.device_mut().unwrap().fill(v).unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    m
}

fn spills_least_recently_used_first_and_refills(dev: &Device) {
    for zero_copy in [ZeroCopy::Off, ZeroCopy::Auto] {
        let d = capped(dev, 4 * MIB, zero_copy);
        let bufs: Vec<_> = (0..4)
            .map(|i| dirty(&d, &format!("b{i}"), i as u8 + 1))
            .collect();
        // Used since: b2, then b0. The least recently used are b1, then b3.
        drop(bufs[2].device().unwrap());
        drop(bufs[0].device().unwrap());
        d.synchronize().unwrap();
        let extra = dirty(&d, "extra", 9);
        let s = d.pool_stats().unwrap();
        // Twice the request: two mirrors spilled before the next attempt.
        assert_eq!(
            (s.spills, s.spilled_bytes),
            (2, 2 * MIB as u64),
            "{zero_copy}: {s}"
        );
        let on_device: Vec<_> = bufs.iter().map(SyncedMemory::device_allocated).collect();
        let shared = d.zero_copy_protocol().is_some();
        // Spilled in place where memory is shared in place (nothing written back), else into
        // a host mirror of its own.
        let parks = in_place(&d);
        let moved = u64::from(!parks);
        assert_eq!(on_device, [true, false, true, false], "{zero_copy}");
        for i in [1, 3] {
            assert_eq!(bufs[i].head(), Head::AtHost, "{zero_copy}: b{i}");
            let c = bufs[i].copy_stats();
            assert_eq!(
                (c.spilled.count, c.spilled.bytes, c.total_count()),
                (1, moved * MIB as u64, 0),
                "{zero_copy}: b{i}"
            );
        }
        // The next device access brings b1 back: a refill, not a copy, with its data (in
        // place: the same memory, a zero-copy sync).
        assert_eq!(device_bytes(&bufs[1]), vec![2u8; MIB], "{zero_copy}");
        let c = bufs[1].copy_stats();
        assert_eq!(
            (c.refilled.count, c.refilled.bytes),
            (1, moved * MIB as u64),
            "{zero_copy}"
        );
        assert_eq!(c.total_count(), 0, "{zero_copy}: {c:?}");
        assert_eq!(d.pool_stats().unwrap().refills, 1);
        // Brought back by a read (a host reader may use the host mirror meanwhile), a copied
        // buffer keeps two mirrors; the next write shares its memory again. A parked one
        // shares it all along.
        assert_eq!(bufs[1].zero_copy_protocol().is_some(), parks, "{zero_copy}");
        bufs[1].device_mut().unwrap().fill(2).unwrap();
        assert_eq!(
            bufs[1].zero_copy_protocol().is_some(),
            shared,
            "{zero_copy}"
        );
        // Every buffer still holds its data.
        for (i, m) in bufs.iter().enumerate() {
            assert!(m.host().unwrap().iter().all(|&b| b == i as u8 + 1), "b{i}");
        }
        assert_eq!(device_bytes(&extra), vec![9u8; MIB]);
        // Host data written after a spill makes the next upload an ordinary one.
        bufs[3].host_mut().unwrap().fill(7);
        assert_eq!(device_bytes(&bufs[3]), vec![7u8; MIB]);
        assert_eq!(bufs[3].copy_stats().refilled.count, 0, "{zero_copy}");
    }
}

/// A host view of a spilled buffer stays valid while a device read on the same thread brings
/// the buffer back (the old host mirror is not replaced under the view).
fn a_host_view_survives_a_refill(dev: &Device) {
    for zero_copy in [ZeroCopy::Off, ZeroCopy::Auto] {
        let d = capped(dev, 2 * MIB, zero_copy);
        let a = dirty(&d, "a", 5);
        let b = dirty(&d, "b", 6);
        d.synchronize().unwrap();
        // Room for a third: `a`, used least recently, is spilled.
        let c = dirty(&d, "c", 7);
        assert!(!a.device_allocated(), "{zero_copy}");
        let view = a.host().unwrap();
        // Read back on the device (b or c spilled to make room), the view still reads 5s...
        assert_eq!(device_bytes(&a), vec![5u8; MIB], "{zero_copy}");
        // ...even once the host pool hands out the blocks it has.
        let other = SyncedMemory::host_only(MIB);
        other.host_mut().unwrap().fill(0xEE);
        assert!(
            view.iter().all(|&x| x == 5),
            "{zero_copy}: the view changed"
        );
        drop(view);
        assert!(b.host().unwrap().iter().all(|&x| x == 6));
        assert!(c.host().unwrap().iter().all(|&x| x == 7));
    }
}

fn guarded_buffers_are_never_spilled(dev: &Device) {
    for zero_copy in [ZeroCopy::Off, ZeroCopy::Auto] {
        let d = capped(dev, 3 * MIB, zero_copy);
        let bufs: Vec<_> = (0..3)
            .map(|i| dirty(&d, &format!("g{i}"), i as u8))
            .collect();
        let guards: Vec<_> = bufs[..2].iter().map(|m| m.device().unwrap()).collect();
        let e = dirty(&d, "e", 9);
        // Only the buffer without a guard could go.
        assert!(bufs[0].device_allocated() && bufs[1].device_allocated());
        assert!(!bufs[2].device_allocated(), "{zero_copy}");
        drop(guards);
        assert_eq!(device_bytes(&e), vec![9u8; MIB]);
    }
}

/// `offload` moves a buffer's data to the host and frees its device mirror on request, counted
/// as a spill (dirty) or not at all (clean); the next device access brings it back; a guard or
/// a pin refuses it, a buffer with no device mirror frees nothing.
fn offload_frees_the_device_mirror_and_keeps_the_data(dev: &Device) {
    for zero_copy in [ZeroCopy::Off, ZeroCopy::Auto] {
        let d = capped(dev, 4 * MIB, zero_copy);
        let a = dirty(&d, "a", 3);
        let before = d.pool_stats().unwrap();
        assert_eq!(a.offload().unwrap(), MIB, "{zero_copy}");
        assert!(!a.device_allocated(), "{zero_copy}");
        assert_eq!(a.head(), Head::AtHost, "{zero_copy}");
        let after = d.pool_stats().unwrap();
        // Spilled in place, the block stays allocated as the host mirror, out of the cap's
        // count.
        let parks = in_place(&d);
        let kept = if parks { MIB as u64 } else { 0 };
        assert_eq!(
            (after.spills - before.spills, after.allocated.current),
            (1, kept),
            "{zero_copy}: {after}"
        );
        assert_eq!(
            (after.parked_bytes, d.reserved_bytes() + kept),
            (kept, after.reserved.current)
        );
        let spilled = a.copy_stats().spilled;
        assert_eq!(
            (spilled.count, spilled.bytes),
            (1, u64::from(!parks) * MIB as u64),
            "{zero_copy}"
        );
        // Nothing left to free.
        assert_eq!(a.offload().unwrap(), 0, "{zero_copy}");
        // Back on the device with the same bytes; then clean (the host is current too): the
        // next offload drops the mirror without a write-back.
        assert_eq!(device_bytes(&a), vec![3u8; MIB], "{zero_copy}");
        assert!(a.device_allocated());
        assert_eq!(a.offload().unwrap(), MIB, "{zero_copy}");
        assert_eq!(
            a.copy_stats().spilled.count,
            1 + u64::from(parks),
            "{zero_copy}: a clean mirror is dropped (in place: spilled in place again)"
        );
        assert!(a.host().unwrap().iter().all(|&x| x == 3));
        // A guard of this thread, or a pin, refuses it.
        let g = a.device().unwrap();
        assert!(matches!(a.offload(), Err(syncmem::Error::Busy { .. })));
        drop(g);
        let pin = a.pin_placement();
        assert!(matches!(a.offload(), Err(syncmem::Error::Busy { .. })));
        drop(pin);
        // Never allocated on the device: nothing to free.
        let fresh = SyncedMemory::new(MIB, &d);
        assert_eq!(fresh.offload().unwrap(), 0);
    }
}

syncmem::for_each_device!(
    spills_least_recently_used_first_and_refills,
    a_host_view_survives_a_refill,
    guarded_buffers_are_never_spilled,
    offload_frees_the_device_mirror_and_keeps_the_data,
);

/// Work queued on a buffer is waited for, never spilled under: the write-back holds the queued
/// kernel's result (the kernel is held by a gate until a helper thread opens it).
#[cfg(feature = "opencl")]
#[test]
fn queued_work_is_finished_before_its_buffer_is_spilled() {
    #[path = "common/gate.rs"]
    mod gate;
    let Some(dev) = syncmem::testing::opencl_or_skip("spill after queued work") else {
        return;
    };
    for zero_copy in [ZeroCopy::Off, ZeroCopy::Auto] {
        let d = capped(&dev, 2 * MIB, zero_copy);
        let s = d.new_stream().unwrap();
        let a = SyncedMemory::new(MIB, &d)
            .with_stream(&s)
            .unwrap()
            .with_label("a");
        a.host_mut()
            .unwrap()
            .as_mut_slice_of::<f32>()
            .unwrap()
            .fill(1.0);
        drop(a.device().unwrap());
        let b = dirty(&d, "b", 0);
        s.synchronize().unwrap();
        let gate = gate::Gate::block(&s);
        syncmem::kernels::scale(MIB / 4, 3.0f32, &mut a.device_mut().unwrap()).unwrap();
        // Room for another buffer: `a` is the least recently used, but its kernel is queued
        // behind the gate. Open the gate a moment later, from another thread.
        let c = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                gate.open();
            });
            dirty(&d, "c", 7)
        });
        let st = d.pool_stats().unwrap();
        assert!(st.spills >= 1, "{zero_copy}: {st}");
        let values = a.host().unwrap().as_slice_of::<f32>().unwrap().to_vec();
        assert!(
            values.iter().all(|&v| v == 3.0),
            "{zero_copy}: spilled before the kernel ran ({:?})",
            &values[..4]
        );
        assert!(b.host().unwrap().iter().all(|&x| x == 0));
        assert_eq!(device_bytes(&c), vec![7u8; MIB]);
    }
}
