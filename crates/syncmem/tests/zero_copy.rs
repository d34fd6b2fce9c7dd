//! Zero-copy buffers against Caffe: the canonical nine steps and every row of the transition
//! table report Caffe's heads, with one allocation for both sides, and every transfer a
//! zero-copy sync instead of a copy (tests/synced.rs runs the same sequences with two mirrors).
//! Each test runs on the `cpu` device, on OpenCL (in place on PoCL, a CPU device) and on OpenCL
//! with the map protocol of integrated GPUs forced ([`ZeroCopy::Map`]).

use syncmem::{CopyStats, Device, Head, SyncedMemory, ZeroCopy, ZeroCopyProtocol};

/// The devices of a test: `dev`, and for OpenCL also an isolated handle of it with the map
/// protocol.
fn modes(dev: &Device) -> Vec<(Device, ZeroCopyProtocol)> {
    let mut v = vec![dev.clone()];
    if dev.backend() == syncmem::BackendKind::OpenCl {
        let mapped = dev.isolated();
        mapped.set_zero_copy(ZeroCopy::Map);
        assert_eq!(mapped.zero_copy_protocol(), Some(ZeroCopyProtocol::Map));
        v.push(mapped);
    }
    // (With SYNCMEM_ZERO_COPY=off, `dev` itself keeps two mirrors and is left out.)
    v.into_iter()
        .filter_map(|d| Some((d.clone(), d.zero_copy_protocol()?)))
        .collect()
}

fn device_bytes(buf: &SyncedMemory) -> Vec<u8> {
    let g = buf.device().unwrap();
    let mut out = vec![0u8; buf.len()];
    g.read_into(&mut out).unwrap();
    out
}

/// (copies of any direction, zero-copy syncs) since `before`.
fn moved(m: &SyncedMemory, before: &CopyStats) -> (u64, u64) {
    let d = m.copy_stats().since(before);
    (d.total_count(), d.mapped.count)
}

#[derive(Clone, Copy, Debug)]
#[allow(clippy::enum_variant_names)]
enum Call {
    GpuData,
    CpuData,
    MutableGpuData,
    MutableCpuData,
}

fn call(m: &SyncedMemory, c: Call) {
    match c {
        Call::GpuData => drop(m.device().unwrap()),
        Call::CpuData => drop(m.host().unwrap()),
        Call::MutableGpuData => drop(m.device_mut().unwrap()),
        Call::MutableCpuData => drop(m.host_mut().unwrap()),
    }
}

/// Caffe's nine steps: the heads of the copying protocol, a zero-copy sync where it copies
/// (4 of them), not a byte copied; one allocation serves both sides.
fn canonical_nine_steps(dev: &Device) {
    use Call::*;
    for (d, protocol) in modes(dev) {
        const N: usize = 4096;
        let m = SyncedMemory::new(N, &d);
        m.host_mut().unwrap().fill(3);
        assert_eq!(m.zero_copy_protocol(), Some(protocol));
        assert!(m.host_allocated() && m.device_allocated(), "one allocation");
        let steps: [(Call, bool, Head); 9] = [
            (GpuData, true, Head::Synced),
            (CpuData, false, Head::Synced),
            (MutableGpuData, false, Head::AtDevice),
            (MutableGpuData, false, Head::AtDevice),
            (CpuData, true, Head::Synced),
            (GpuData, false, Head::Synced),
            (MutableCpuData, false, Head::AtHost),
            (MutableGpuData, true, Head::AtDevice),
            (MutableCpuData, true, Head::AtHost),
        ];
        for (i, (c, sync, head)) in steps.into_iter().enumerate() {
            let before = m.copy_stats();
            call(&m, c);
            let what = format!("{protocol} step {} ({c:?})", i + 1);
            assert_eq!(moved(&m, &before), (0, u64::from(sync)), "{what}");
            assert_eq!(m.head(), head, "{what}: head");
        }
        assert!(m.host().unwrap().iter().all(|&b| b == 3));
        let s = m.copy_stats();
        assert_eq!(
            (s.total_count(), s.mapped.count, s.mapped.bytes),
            (0, 4, 4 * N as u64)
        );
    }
}

/// A buffer brought to `head`, holding 5s (or nothing yet).
fn at(dev: &Device, head: Head, n: usize) -> SyncedMemory {
    let m = SyncedMemory::new(n, dev);
    match head {
        Head::Uninitialized => {}
        Head::AtHost => m.host_mut().unwrap().fill(5),
        Head::AtDevice => m.device_mut().unwrap().fill(5).unwrap(),
        Head::Synced => {
            m.host_mut().unwrap().fill(5);
            drop(m.device().unwrap());
        }
        // Caffe's table has one device: no replica elsewhere (`Head::Elsewhere`), and no head
        // added after it.
        other => unreachable!("{other}: not a head of Caffe's table"),
    }
    assert_eq!(m.head(), head);
    m
}

/// Every row of Caffe's table: the same heads as with two mirrors, a sync where the copying
/// protocol copies, both sides allocated by the first access, and the right bytes on both.
fn transition_table(dev: &Device) {
    use Call::*;
    use Head::*;
    const N: usize = 256;
    // (head before, call, sync, head after)
    let rows: [(Head, Call, bool, Head); 16] = [
        (Uninitialized, CpuData, false, AtHost),
        (Uninitialized, MutableCpuData, false, AtHost),
        (Uninitialized, GpuData, false, AtDevice),
        (Uninitialized, MutableGpuData, false, AtDevice),
        (AtHost, CpuData, false, AtHost),
        (AtHost, MutableCpuData, false, AtHost),
        (AtHost, GpuData, true, Synced),
        (AtHost, MutableGpuData, true, AtDevice),
        (AtDevice, CpuData, true, Synced),
        (AtDevice, MutableCpuData, true, AtHost),
        (AtDevice, GpuData, false, AtDevice),
        (AtDevice, MutableGpuData, false, AtDevice),
        (Synced, CpuData, false, Synced),
        (Synced, GpuData, false, Synced),
        (Synced, MutableCpuData, false, AtHost),
        (Synced, MutableGpuData, false, AtDevice),
    ];
    for (d, protocol) in modes(dev) {
        for (before, c, sync, after) in rows {
            let m = at(&d, before, N);
            let stats = m.copy_stats();
            call(&m, c);
            let row = format!("{protocol}: {before:?} + {c:?}");
            assert_eq!(moved(&m, &stats), (0, u64::from(sync)), "{row}");
            assert_eq!(m.head(), after, "{row}: head");
            assert!(
                m.host_allocated() && m.device_allocated(),
                "{row}: one allocation"
            );
            let want = if before == Uninitialized { 0 } else { 5 };
            assert!(
                m.host().unwrap().iter().all(|&b| b == want),
                "{row}: host bytes"
            );
            assert_eq!(device_bytes(&m), vec![want; N], "{row}: device bytes");
        }
    }
}

/// Prefetching moves nothing: the device (or host) side is current at once, as a sync.
fn prefetch_rows(dev: &Device) {
    const N: usize = 1 << 16;
    for (d, protocol) in modes(dev) {
        let m = at(&d, Head::AtHost, N);
        let s = m.copy_stats();
        assert!(
            m.prefetch_to_device(None).unwrap().is_none(),
            "nothing queued"
        );
        assert_eq!(m.head(), Head::Synced);
        assert_eq!(device_bytes(&m), vec![5u8; N], "{protocol}");
        assert_eq!(moved(&m, &s), (0, 1), "{protocol}");
        let m = at(&d, Head::AtDevice, N);
        let s = m.copy_stats();
        assert!(m.prefetch_to_host(None).unwrap().is_none());
        assert_eq!(m.head(), Head::Synced);
        assert!(m.host().unwrap().iter().all(|&b| b == 5), "{protocol}");
        assert_eq!(moved(&m, &s), (0, 1), "{protocol}");
    }
}

/// A host write lands in the device's memory itself: a device read sees it with no copy.
fn host_writes_are_device_memory(dev: &Device) {
    for (d, protocol) in modes(dev) {
        let m = SyncedMemory::new(1 << 20, &d);
        {
            let mut h = m.host_mut().unwrap();
            for (i, b) in h.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
        }
        let want: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        // A read of the device buffer itself (the driver's read of its memory).
        assert_eq!(device_bytes(&m), want, "{protocol}");
        let s = m.copy_stats();
        assert_eq!((s.total_count(), s.mapped.count), (0, 1), "{protocol}");
        // And the other way: a device write is what the host reads.
        m.device_mut().unwrap().fill(0xA5).unwrap();
        assert!(m.host().unwrap().iter().all(|&b| b == 0xA5), "{protocol}");
        assert_eq!(m.copy_stats().total_count(), 0);
    }
}

/// Adopted memory ends the sharing: the buffer keeps two mirrors from then on and copies.
fn adopted_memory_ends_sharing(dev: &Device) {
    for (d, protocol) in modes(dev) {
        let m = at(&d, Head::Synced, 64);
        m.set_host_data(vec![9u8; 64]).unwrap();
        assert_eq!(m.zero_copy_protocol(), None, "{protocol}");
        assert_eq!(m.head(), Head::AtHost);
        assert_eq!(device_bytes(&m), vec![9u8; 64]);
        assert_eq!(m.copy_stats().host_to_device.count, 1, "a copy now");

        let m = at(&d, Head::AtHost, 64);
        let mut ext = d.alloc(64).unwrap();
        d.default_stream()
            .unwrap()
            .write(&mut ext, 0, &[4u8; 64])
            .unwrap();
        m.set_device_data(ext).unwrap();
        assert_eq!(m.zero_copy_protocol(), None, "{protocol}");
        assert_eq!(m.head(), Head::AtDevice);
        assert_eq!(&*m.host().unwrap(), &[4u8; 64]);
        assert_eq!(m.copy_stats().device_to_host.count, 1);
    }
}

/// A fresh buffer reads zeros on both sides, even in a block another buffer dirtied.
fn fresh_buffers_read_zeros(dev: &Device) {
    for (d, protocol) in modes(dev) {
        for round in 0..3u8 {
            let m = SyncedMemory::new(4096, &d);
            assert!(
                m.host().unwrap().iter().all(|&b| b == 0),
                "{protocol} {round}"
            );
            m.host_mut().unwrap().fill(round + 1);
            drop(m);
            let m = SyncedMemory::new(4096, &d);
            assert_eq!(device_bytes(&m), vec![0u8; 4096], "{protocol} {round}");
            m.device_mut().unwrap().fill(0xFF).unwrap();
        }
    }
}

/// Two mirrors where asked: a buffer built without zero-copy, or a device set off.
fn zero_copy_can_be_turned_off(dev: &Device) {
    for (d, _) in modes(dev) {
        let m = SyncedMemory::new(64, &d).with_zero_copy(false);
        m.host_mut().unwrap().fill(1);
        assert_eq!(device_bytes(&m), vec![1u8; 64]);
        assert_eq!(m.zero_copy_protocol(), None);
        assert_eq!(m.copy_stats().host_to_device.count, 1);
        let off = d.isolated();
        off.set_zero_copy(ZeroCopy::Off);
        assert_eq!(off.zero_copy_protocol(), None);
        let m = SyncedMemory::new(64, &off);
        m.host_mut().unwrap().fill(2);
        assert_eq!(device_bytes(&m), vec![2u8; 64]);
        assert_eq!(
            (
                m.copy_stats().host_to_device.count,
                m.copy_stats().mapped.count
            ),
            (1, 0)
        );
    }
}

/// Switching a device from two mirrors back to sharing empties its pool cache: a new buffer
/// does not get a cached block of a segment made for two mirrors (which the host cannot use in
/// place, so the buffer would copy), it shares memory again.
fn switching_back_does_not_reuse_two_mirror_blocks(dev: &Device) {
    for (d, protocol) in modes(dev) {
        let setting = d.zero_copy();
        let d = d.isolated(); // a pool of its own
        d.set_zero_copy(ZeroCopy::Off);
        let m = SyncedMemory::new(4096, &d);
        drop(m.device_mut().unwrap()); // a block of a two-mirror segment
        drop(m); // cached
        assert!(d.pool_stats().is_some_and(|p| p.free_bytes > 0));
        d.set_zero_copy(setting);
        assert_eq!(d.zero_copy_protocol(), Some(protocol));
        let m = SyncedMemory::new(4096, &d);
        m.host_mut().unwrap().fill(3);
        assert_eq!(device_bytes(&m), vec![3u8; 4096]);
        assert_eq!(moved(&m, &CopyStats::default()), (0, 1), "{protocol:?}");
        assert_eq!(m.zero_copy_protocol(), Some(protocol));
    }
}

syncmem::for_each_device!(
    switching_back_does_not_reuse_two_mirror_blocks,
    canonical_nine_steps,
    transition_table,
    prefetch_rows,
    host_writes_are_device_memory,
    adopted_memory_ends_sharing,
    fresh_buffers_read_zeros,
    zero_copy_can_be_turned_off,
);
