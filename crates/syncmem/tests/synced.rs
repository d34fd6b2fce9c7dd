//! SyncedMemory against Caffe: its seven unit tests, the canonical nine-step example, and
//! every row of the transition table. Each test runs on the `cpu` device and on OpenCL.

use syncmem::{CopyStats, Device, Direction, Error, Head, SyncedMemory};

/// The copy one call made, read from the buffer's counters.
/// A buffer with two mirrors (zero-copy off): these are Caffe's tests of the copying protocol.
/// The same sequences with zero-copy are in tests/zero_copy.rs.
fn mem(size: usize, dev: &Device) -> SyncedMemory {
    SyncedMemory::new(size, dev).with_zero_copy(false)
}

fn copy_since(buf: &SyncedMemory, before: &CopyStats) -> Option<(Direction, u64)> {
    let d = buf.copy_stats().since(before);
    assert!(
        d.total_count() <= 1,
        "one call made more than one copy: {d:?}"
    );
    [Direction::HostToDevice, Direction::DeviceToHost]
        .into_iter()
        .find(|&dir| d.get(dir).count == 1)
        .map(|dir| (dir, d.get(dir).bytes))
}

fn device_bytes(buf: &SyncedMemory) -> Vec<u8> {
    let g = buf.device().unwrap();
    let mut out = vec![0u8; buf.len()];
    g.read_into(&mut out).unwrap();
    out
}

// ----- Caffe's test_syncedmem.cpp ------------------------------------------------------------

fn test_initialization(dev: &Device) {
    let m = mem(10, dev);
    assert_eq!(m.head(), Head::Uninitialized);
    assert_eq!(m.len(), 10);
    let p = Box::new(mem(10 * std::mem::size_of::<f32>(), dev));
    assert_eq!(p.len(), 40);
    assert!(!m.host_allocated() && !m.device_allocated());
}

fn test_allocation_cpu_gpu(dev: &Device) {
    let m = mem(10, dev);
    assert_eq!(m.host().unwrap().len(), 10);
    assert_eq!(m.device().unwrap().buffer().len(), 10);
    assert_eq!(m.host_mut().unwrap().len(), 10);
    assert_eq!(m.device_mut().unwrap().buffer().len(), 10);
    assert!(m.host_allocated() && m.device_allocated());
}

fn test_allocation_cpu(dev: &Device) {
    let m = mem(10, dev);
    assert_eq!(m.host().unwrap().len(), 10);
    assert_eq!(m.host_mut().unwrap().len(), 10);
    assert!(m.host_allocated());
    assert!(
        !m.device_allocated(),
        "host-only use must not allocate the device mirror"
    );
}

fn test_allocation_gpu(dev: &Device) {
    let m = mem(10, dev);
    assert_eq!(m.device().unwrap().buffer().len(), 10);
    assert_eq!(m.device_mut().unwrap().buffer().len(), 10);
    assert!(m.device_allocated());
    assert!(
        !m.host_allocated(),
        "device-only use must not allocate the host mirror"
    );
}

fn test_cpu_write(dev: &Device) {
    let m = mem(10, dev);
    {
        let mut h = m.host_mut().unwrap();
        assert_eq!(m.head(), Head::AtHost);
        h.fill(1);
    }
    assert!(m.host().unwrap().iter().all(|&b| b == 1));
    {
        let mut h = m.host_mut().unwrap();
        assert_eq!(m.head(), Head::AtHost);
        h.fill(2);
    }
    assert!(m.host().unwrap().iter().all(|&b| b == 2));
}

fn test_gpu_read(dev: &Device) {
    let m = mem(10, dev);
    m.host_mut().unwrap().fill(1);
    assert_eq!(m.head(), Head::AtHost);
    drop(m.device().unwrap());
    assert_eq!(m.head(), Head::Synced);
    assert_eq!(device_bytes(&m), vec![1; 10]);
    m.host_mut().unwrap().fill(2);
    assert_eq!(m.head(), Head::AtHost);
    assert!(m.host().unwrap().iter().all(|&b| b == 2));
    drop(m.device().unwrap());
    assert_eq!(m.head(), Head::Synced);
    assert_eq!(device_bytes(&m), vec![2; 10]);
}

fn test_gpu_write(dev: &Device) {
    let m = mem(10, dev);
    m.device_mut().unwrap().fill(1).unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    assert!(m.host().unwrap().iter().all(|&b| b == 1));
    assert_eq!(m.head(), Head::Synced);
    m.device_mut().unwrap().fill(2).unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    assert!(m.host().unwrap().iter().all(|&b| b == 2));
    assert_eq!(m.head(), Head::Synced);
}

// ----- The canonical nine-step example (docs/tutorial/net_layer_blob.md) -----------------------

/// Caffe's four accessors, named as in Caffe.
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

fn canonical_nine_steps(dev: &Device) {
    use Call::*;
    use Direction::*;
    const N: usize = 4096;
    let m = mem(N, dev);
    // The blob's data starts with head at host.
    m.host_mut().unwrap().fill(3);
    let steps: [(Call, Option<Direction>, Head); 9] = [
        (GpuData, Some(HostToDevice), Head::Synced),
        (CpuData, None, Head::Synced),
        (MutableGpuData, None, Head::AtDevice),
        (MutableGpuData, None, Head::AtDevice),
        (CpuData, Some(DeviceToHost), Head::Synced),
        (GpuData, None, Head::Synced),
        (MutableCpuData, None, Head::AtHost),
        (MutableGpuData, Some(HostToDevice), Head::AtDevice),
        (MutableCpuData, Some(DeviceToHost), Head::AtHost),
    ];
    for (i, (c, copy, head)) in steps.into_iter().enumerate() {
        let before = m.copy_stats();
        call(&m, c);
        let made = copy_since(&m, &before);
        assert_eq!(
            made,
            copy.map(|d| (d, N as u64)),
            "step {} ({c:?}): copy",
            i + 1
        );
        assert_eq!(m.head(), head, "step {} ({c:?}): head", i + 1);
    }
    assert!(m.host().unwrap().iter().all(|&b| b == 3));
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (2, 2));
}

// ----- Every row of the transition table ------------------------------------------------------

/// Brings a fresh buffer to `head` with known contents (host bytes 5 / device bytes 5).
fn at(dev: &Device, head: Head, n: usize) -> SyncedMemory {
    let m = mem(n, dev);
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

fn transition_table(dev: &Device) {
    use Call::*;
    use Direction::*;
    use Head::*;
    const N: usize = 256;
    // (head before, call, host allocated after?, device allocated after?, copy, head after)
    let rows: [(Head, Call, bool, bool, Option<Direction>, Head); 16] = [
        (Uninitialized, CpuData, true, false, None, AtHost),
        (Uninitialized, MutableCpuData, true, false, None, AtHost),
        (Uninitialized, GpuData, false, true, None, AtDevice),
        (Uninitialized, MutableGpuData, false, true, None, AtDevice),
        (AtHost, CpuData, true, false, None, AtHost),
        (AtHost, MutableCpuData, true, false, None, AtHost),
        (AtHost, GpuData, true, true, Some(HostToDevice), Synced),
        (
            AtHost,
            MutableGpuData,
            true,
            true,
            Some(HostToDevice),
            AtDevice,
        ),
        (AtDevice, CpuData, true, true, Some(DeviceToHost), Synced),
        (
            AtDevice,
            MutableCpuData,
            true,
            true,
            Some(DeviceToHost),
            AtHost,
        ),
        (AtDevice, GpuData, false, true, None, AtDevice),
        (AtDevice, MutableGpuData, false, true, None, AtDevice),
        (Synced, CpuData, true, true, None, Synced),
        (Synced, GpuData, true, true, None, Synced),
        (Synced, MutableCpuData, true, true, None, AtHost),
        (Synced, MutableGpuData, true, true, None, AtDevice),
    ];
    for (before, c, host_alloc, dev_alloc, copy, after) in rows {
        let m = at(dev, before, N);
        let stats = m.copy_stats();
        call(&m, c);
        let row = format!("{before:?} + {c:?}");
        assert_eq!(
            copy_since(&m, &stats),
            copy.map(|d| (d, N as u64)),
            "{row}: copy"
        );
        assert_eq!(m.head(), after, "{row}: head");
        assert_eq!(m.host_allocated(), host_alloc, "{row}: host allocated");
        assert_eq!(m.device_allocated(), dev_alloc, "{row}: device allocated");
        // Contents: zero out of Uninitialized (zero fill on first allocation), 5 otherwise.
        let want = if before == Uninitialized { 0 } else { 5 };
        assert!(
            m.host().unwrap().iter().all(|&b| b == want),
            "{row}: host bytes"
        );
        assert_eq!(device_bytes(&m), vec![want; N], "{row}: device bytes");
    }
}

fn set_host_data_row(dev: &Device) {
    for before in [
        Head::Uninitialized,
        Head::AtHost,
        Head::AtDevice,
        Head::Synced,
    ] {
        let m = at(dev, before, 8);
        let had_device = m.device_allocated();
        m.set_host_data(vec![9u8; 8]).unwrap();
        assert_eq!(m.head(), Head::AtHost, "{before:?}");
        assert!(!m.owns_host(), "{before:?}: adopted memory is not owned");
        assert_eq!(
            m.device_allocated(),
            had_device,
            "{before:?}: device mirror kept"
        );
        assert_eq!(&*m.host().unwrap(), &[9u8; 8]);
        // The kept device mirror is refreshed from the adopted memory on the next device read.
        assert_eq!(device_bytes(&m), vec![9u8; 8]);
        assert_eq!(m.head(), Head::Synced);
    }
}

fn set_device_data_row(dev: &Device) {
    for before in [
        Head::Uninitialized,
        Head::AtHost,
        Head::AtDevice,
        Head::Synced,
    ] {
        let m = at(dev, before, 8);
        let had_host = m.host_allocated();
        let mut ext = dev.alloc(8).unwrap();
        dev.default_stream()
            .unwrap()
            .write(&mut ext, 0, &[4u8; 8])
            .unwrap();
        m.set_device_data(ext).unwrap();
        assert_eq!(m.head(), Head::AtDevice, "{before:?}");
        assert!(!m.owns_device());
        assert_eq!(m.host_allocated(), had_host, "{before:?}: host mirror kept");
        // to_cpu from AtDevice copies into the host mirror.
        assert_eq!(&*m.host().unwrap(), &[4u8; 8]);
        assert_eq!(m.head(), Head::Synced);
        // Getting the adopted buffer back leaves the host copy as the only one.
        let back = m.take_device_data().unwrap().expect("adopted buffer");
        assert_eq!(back.len(), 8);
        assert_eq!(m.head(), Head::AtHost);
    }
}

fn prefetch_rows(dev: &Device) {
    const N: usize = 1 << 16;
    // Uninitialized: nothing to push (Caffe: fatal CHECK; here an error).
    let m = mem(N, dev);
    assert!(matches!(
        m.prefetch_to_device(None),
        Err(Error::InvalidState { .. })
    ));
    // AtDevice / Synced: already current, no copy, no event.
    for before in [Head::AtDevice, Head::Synced] {
        let m = at(dev, before, N);
        let s = m.copy_stats();
        assert!(m.prefetch_to_device(None).unwrap().is_none());
        assert_eq!(m.copy_stats().since(&s).total_count(), 0);
        assert_eq!(m.head(), before);
    }
    // AtHost: one async copy, head synced at once, device read sees the data, no second copy.
    let m = at(dev, Head::AtHost, N);
    let s = m.copy_stats();
    let ev = m
        .prefetch_to_device(None)
        .unwrap()
        .expect("a copy was queued");
    assert_eq!(m.head(), Head::Synced);
    assert!(
        m.host().unwrap().iter().all(|&b| b == 5),
        "host read during the copy"
    );
    assert_eq!(device_bytes(&m), vec![5u8; N]);
    assert!(ev.is_complete().unwrap());
    assert_eq!(m.pending().unwrap(), None);
    let d = m.copy_stats().since(&s);
    assert_eq!(
        (d.host_to_device.count, d.host_to_device.bytes),
        (1, N as u64)
    );
    assert_eq!(d.device_to_host.count, 0);
    // A host write after a prefetch waits for it, then makes the host the only current copy.
    let m = at(dev, Head::AtHost, N);
    m.prefetch_to_device(None).unwrap();
    m.host_mut().unwrap().fill(6);
    assert_eq!(m.head(), Head::AtHost);
    assert_eq!(device_bytes(&m), vec![6u8; N]);
    // And back: prefetch to host from AtDevice.
    let m = at(dev, Head::AtDevice, N);
    let s = m.copy_stats();
    m.prefetch_to_host(None)
        .unwrap()
        .expect("a copy was queued");
    assert_eq!(m.head(), Head::Synced);
    assert!(m.host().unwrap().iter().all(|&b| b == 5));
    let d = m.copy_stats().since(&s);
    assert_eq!((d.device_to_host.count, d.host_to_device.count), (1, 0));
}

// ----- Beyond Caffe ---------------------------------------------------------------------------

fn overwrite_skips_copy_and_fill(dev: &Device) {
    let m = at(dev, Head::AtDevice, 64);
    let s = m.copy_stats();
    m.host_overwrite().unwrap().copy_from_slice(&[8u8; 64]);
    assert_eq!(
        m.copy_stats().since(&s).total_count(),
        0,
        "no device-to-host copy"
    );
    assert_eq!(m.head(), Head::AtHost);
    let s = m.copy_stats();
    m.device_overwrite()
        .unwrap()
        .write_from(0, &[7u8; 64])
        .unwrap();
    assert_eq!(
        m.copy_stats().since(&s).total_count(),
        0,
        "no host-to-device copy"
    );
    assert_eq!(m.head(), Head::AtDevice);
    assert_eq!(&*m.host().unwrap(), &[7u8; 64]);
}

fn size_zero(dev: &Device) {
    let m = mem(0, dev);
    assert!(m.host().unwrap().is_empty());
    assert_eq!(m.head(), Head::AtHost);
    assert_eq!(m.device().unwrap().buffer().len(), 0);
    assert_eq!(m.head(), Head::Synced);
    m.device_mut().unwrap().fill(1).unwrap();
    assert!(m.host_mut().unwrap().is_empty());
    assert_eq!(
        m.copy_stats().total_count(),
        0,
        "nothing to copy for 0 bytes"
    );
    assert_eq!(dev.alloc(0).unwrap().len(), 0);
}

fn external_host_memory(dev: &Device) {
    // Owned external memory: the Vec moves in, no copy; to_cpu from the device writes into it.
    let m = mem(16, dev);
    m.set_host_data((0u8..16).collect::<Vec<u8>>()).unwrap();
    assert_eq!(m.host().unwrap()[15], 15);
    m.device_mut().unwrap().fill(3).unwrap();
    assert_eq!(&*m.host().unwrap(), &[3u8; 16]);
    // Wrong size is an error naming both sizes.
    let e = m.set_host_data(vec![0u8; 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::SizeMismatch {
                expected: 16,
                actual: 3,
                ..
            }
        ),
        "{e}"
    );
    // Raw, non-owned memory.
    let mut raw = vec![1u8; 16];
    let m = mem(16, dev);
    // SAFETY: `raw` outlives `m` (dropped first below) and is not touched while adopted.
    unsafe { m.set_host_ptr(raw.as_mut_ptr(), raw.len()).unwrap() };
    m.device_mut().unwrap().fill(2).unwrap();
    assert_eq!(&*m.host().unwrap(), &[2u8; 16]);
    drop(m);
    assert_eq!(
        raw,
        vec![2u8; 16],
        "the device data was copied into the caller's memory"
    );
}

fn pinned_host_mirror(dev: &Device) {
    let before = dev.pinned_stats();
    let m = mem(1 << 20, dev).with_pinned_host(true);
    m.host_mut().unwrap().fill(11);
    let during = dev.pinned_stats();
    assert!(
        during.allocs > before.allocs,
        "host mirror came from the pinned allocator"
    );
    assert_eq!(device_bytes(&m), vec![11u8; 1 << 20]);
    assert!(m.owns_host());

    // Set at run time, through a shared reference: the host mirror the buffer has stays
    // where it is; the next one, once that is freed, is pinned.
    let m = mem(4096, dev);
    m.host_mut().unwrap().fill(5);
    let before = dev.pinned_stats();
    m.set_pinned_host(true);
    assert!(m.pinned_host());
    assert_eq!(&*m.host().unwrap(), &[5u8; 4096][..]);
    assert_eq!(
        dev.pinned_stats().allocs,
        before.allocs,
        "the mirror it has stays"
    );
    let m = SyncedMemory::new(4096, dev);
    m.set_pinned_host(true);
    m.host_mut().unwrap().fill(6);
    assert!(
        dev.pinned_stats().allocs > before.allocs,
        "a host mirror made after the setting is pinned"
    );
    // Pinned buffers keep two mirrors, where the device could share host memory too.
    assert_eq!(device_bytes(&m), vec![6u8; 4096]);
    assert!(m.zero_copy_protocol().is_none());
    m.set_pinned_host(false);
    assert!(!m.pinned_host());
}

fn device_errors(dev: &Device) {
    let m = SyncedMemory::host_only(8);
    assert!(matches!(m.device(), Err(Error::NoDevice { .. })));
    assert!(matches!(m.device_mut(), Err(Error::NoDevice { .. })));
    assert_eq!(m.host().unwrap().len(), 8);
    // Foreign device buffer size mismatch.
    let m = mem(8, dev).with_label("weights");
    let e = m.set_device_data(dev.alloc(4).unwrap()).unwrap_err();
    assert!(e.to_string().contains("weights"), "{e}");
    // try_ accessors report a conflicting guard instead of waiting.
    let r = m.host().unwrap();
    assert!(matches!(m.try_host_mut(), Err(Error::Busy { .. })));
    assert!(m.try_host().is_ok(), "readers share");
    drop(r);
    let w = m.host_mut().unwrap();
    assert!(matches!(m.try_device(), Err(Error::Busy { .. })));
    drop(w);
    assert!(m.try_device_mut().is_ok());
}

fn overflowing_sizes_are_errors(dev: &Device) {
    let e = SyncedMemory::with_elements(usize::MAX / 2, 4, Some(dev)).unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    // A size no device can hold: an error, not an abort.
    let m = mem(usize::MAX / 2, dev);
    assert!(m.device().is_err());
    assert!(m.host().is_err());
    assert_eq!(
        m.head(),
        Head::Uninitialized,
        "a failed access leaves the state alone"
    );
}

syncmem::for_each_device!(
    test_initialization,
    test_allocation_cpu_gpu,
    test_allocation_cpu,
    test_allocation_gpu,
    test_cpu_write,
    test_gpu_read,
    test_gpu_write,
    canonical_nine_steps,
    transition_table,
    set_host_data_row,
    set_device_data_row,
    prefetch_rows,
    overwrite_skips_copy_and_fill,
    size_zero,
    external_host_memory,
    pinned_host_mirror,
    device_errors,
    overflowing_sizes_are_errors,
);
