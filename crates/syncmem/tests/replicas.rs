//! Replicas of one buffer on several devices (MSI): reads copy from the cheapest current place
//! (one command between OpenCL devices of a context, else through the host), a read where a
//! current copy already is copies nothing, and a write anywhere makes every other place stale.
//! On two OpenCL devices (`POCL_DEVICES="pthread pthread"`; a failure when
//! `SYNCMEM_REQUIRE_OPENCL` is set and the second is missing), and on `cpu` + OpenCL.

#![cfg(feature = "opencl")]

use syncmem::alloc::pairs::{pair_copies_since, PairCopies};
use syncmem::{BackendKind, CopyStats, Device, Head, SyncedMemory, ZeroCopy};

/// The per-pair counters are the process's: the tests of this file run one at a time, so that
/// each sees only its own copies there.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn two(test: &str) -> Option<(Device, Device)> {
    syncmem::testing::two_or_skip(BackendKind::OpenCl, test)
}

/// Isolated handles of `a` and `b` (their own pools and zero-copy setting), both with
/// zero-copy `zc`.
fn handles(a: &Device, b: &Device, zc: ZeroCopy) -> (Device, Device) {
    let (a, b) = (a.isolated(), b.isolated());
    a.set_zero_copy(zc);
    b.set_zero_copy(zc);
    (a, b)
}

fn filled(dev: &Device, bytes: &[u8]) -> SyncedMemory {
    let m = SyncedMemory::new(bytes.len(), dev);
    m.host_mut().unwrap().copy_from_slice(bytes);
    m
}

fn on(m: &SyncedMemory, dev: &Device) -> Vec<u8> {
    let g = m.device_on(dev).unwrap();
    let mut out = vec![0u8; m.len()];
    g.read_into(&mut out).unwrap();
    out
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Copies of the buffer since `before`: (host to device, device to host, device to device).
fn copies(m: &SyncedMemory, before: &CopyStats) -> (u64, u64, u64) {
    let d = m.copy_stats().since(before);
    (
        d.host_to_device.count,
        d.device_to_host.count,
        d.device_to_device.count,
    )
}

fn pair(p: &[PairCopies], from: &Device, to: &Device, direct: bool) -> u64 {
    p.iter()
        .filter(|c| c.from == from.label() && c.to == to.label() && c.direct == direct)
        .map(|c| c.count)
        .sum()
}

#[test]
fn a_replica_reads_the_home_data_once() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_replica_reads_the_home_data_once") else {
        return;
    };
    for zc in [ZeroCopy::Auto, ZeroCopy::Off] {
        let (d0, d1) = handles(&d0, &d1, zc);
        let data = pattern(4096, 1);
        let m = filled(&d0, &data);
        assert!(!m.is_current_on(&d1));
        let before = m.copy_stats();
        assert_eq!(on(&m, &d1), data, "{zc:?}");
        // From the current host mirror: one upload to the other device.
        assert_eq!(copies(&m, &before), (1, 0, 0), "{zc:?}");
        assert!(m.is_current_on(&d1));
        assert_eq!(m.head(), Head::AtHost, "home view unchanged");
        // Current already: nothing moves.
        let before = m.copy_stats();
        assert_eq!(on(&m, &d1), data);
        assert_eq!(copies(&m, &before), (0, 0, 0), "{zc:?}");
        assert_eq!(m.replica_devices().len(), 1);
    }
}

#[test]
fn a_write_on_another_device_comes_back_to_the_host() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_write_on_another_device_comes_back_to_the_host") else {
        return;
    };
    for zc in [ZeroCopy::Auto, ZeroCopy::Off] {
        let (d0, d1) = handles(&d0, &d1, zc);
        let m = filled(&d0, &pattern(1000, 2));
        m.device_mut_on(&d1).unwrap().fill(7).unwrap();
        assert_eq!(m.head(), Head::Elsewhere, "{zc:?}");
        assert!(m.is_current_on(&d1) && !m.is_current_on(&d0));
        let before = m.copy_stats();
        let pairs = syncmem::alloc::pairs::pair_copies();
        assert!(m.host().unwrap().iter().all(|&b| b == 7), "{zc:?}");
        // One read from the device that holds the data, through the host.
        assert_eq!(copies(&m, &before), (0, 1, 0), "{zc:?}");
        assert_eq!(pair(&pair_copies_since(&pairs), &d1, &d0, false), 1);
        assert_eq!(m.head(), Head::AtHost);
        // The replica stays current.
        assert!(m.is_current_on(&d1));
        assert_eq!(on(&m, &d1), vec![7; 1000]);
    }
}

#[test]
fn copies_between_devices_of_one_context_are_direct() {
    let _serial = serial();
    let Some((d0, d1)) = two("copies_between_devices_of_one_context_are_direct") else {
        return;
    };
    for zc in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let (d0, d1) = handles(&d0, &d1, zc);
        let m = SyncedMemory::new(512, &d0);
        m.device_mut().unwrap().fill(3).unwrap();
        let pairs = syncmem::alloc::pairs::pair_copies();
        let before = m.copy_stats();
        assert_eq!(on(&m, &d1), vec![3; 512], "{zc:?}");
        // Home device to the other one with one command: no host copy.
        assert_eq!(copies(&m, &before), (0, 0, 1), "{zc:?}");
        assert_eq!(pair(&pair_copies_since(&pairs), &d0, &d1, true), 1);
        // And back: written there, read at home on the device.
        m.device_mut_on(&d1).unwrap().fill(9).unwrap();
        let before = m.copy_stats();
        let g = m.device().unwrap();
        let mut out = vec![0u8; 512];
        g.read_into(&mut out).unwrap();
        drop(g);
        assert_eq!(out, vec![9; 512], "{zc:?}");
        assert_eq!(copies(&m, &before), (0, 0, 1), "{zc:?}");
        assert_eq!(m.head(), Head::AtDevice);
        assert!(m.host().unwrap().iter().all(|&b| b == 9), "{zc:?}");
    }
}

#[test]
fn a_direct_copy_names_both_devices_in_the_trace() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_direct_copy_names_both_devices_in_the_trace") else {
        return;
    };
    let (d0, d1) = handles(&d0, &d1, ZeroCopy::Off);
    let m = SyncedMemory::new(256, &d0);
    m.device_mut().unwrap().fill(1).unwrap();
    let trace = std::sync::Arc::new(syncmem::report::Trace::new());
    let guard = trace.attach_device_only(&d1);
    drop(m.device_on(&d1).unwrap());
    drop(guard);
    let copies: Vec<(syncmem::Direction, String, Option<String>)> = trace
        .events()
        .into_iter()
        .filter_map(|e| match e {
            syncmem::report::TraceEvent::Copy {
                direction,
                device,
                peer,
                ..
            } => Some((direction, device, peer)),
            _ => None,
        })
        .collect();
    assert_eq!(
        copies,
        [(
            syncmem::Direction::DeviceToDevice,
            d1.label().to_string(),
            Some(d0.label().to_string())
        )]
    );
}

/// Work queued outside the crate on a guard's stream, through the native handles, comes before
/// a copy of the buffer to another device (queued on that device's stream), as it comes before
/// a copy on its own stream. The home stream is held behind a gate while the copy is queued.
#[test]
fn native_work_on_the_guard_stream_comes_before_a_copy_to_another_device() {
    #[path = "common/gate.rs"]
    mod gate;
    use opencl3::command_queue as cq;
    use opencl3::memory::ClMem;
    let _serial = serial();
    let Some((d0, d1)) = two("native_work_before_a_copy") else {
        return;
    };
    let (d0, d1) = handles(&d0, &d1, ZeroCopy::Off);
    let m = SyncedMemory::new(4096, &d0);
    m.device_mut().unwrap().fill(1).unwrap();
    let gate = {
        let g = m.device_mut().unwrap();
        let gate = gate::Gate::block(g.stream());
        let queue = g.stream().as_opencl().unwrap();
        let mem = g.buffer().as_opencl().unwrap();
        let pattern = 7u8;
        // SAFETY: a fill of the guard's 4096 bytes, queued behind the gate on the guard's own
        // stream; the pattern is copied when the command is queued.
        let event = unsafe {
            cq::enqueue_fill_buffer(
                queue.get(),
                mem.get(),
                std::ptr::from_ref(&pattern).cast(),
                1,
                0,
                4096,
                0,
                std::ptr::null(),
            )
        }
        .unwrap();
        // SAFETY: the event returned above, released once.
        unsafe { opencl3::event::release_event(event) }.unwrap();
        gate
    };
    // Queued on d1's stream, which must wait for the fill (it does not block here).
    drop(m.device_on(&d1).unwrap());
    assert!(!gate.is_open());
    gate.open();
    let got = on(&m, &d1);
    assert!(
        got.iter().all(|&b| b == 7),
        "the copy read {} before the fill",
        got[0]
    );
}

/// A home mirror left stale by a write on another device holds nothing current: when its
/// device runs short of memory it goes (the data stays with the replica).
#[test]
fn a_stale_home_mirror_goes_when_its_device_is_short_of_memory() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_stale_home_mirror_goes") else {
        return;
    };
    let (d0, d1) = handles(&d0, &d1, ZeroCopy::Off);
    d0.set_pool(syncmem::PoolConfig::default().with_memory_cap(syncmem::MemoryCap::Bytes(8192)))
        .unwrap();
    let m = SyncedMemory::new(4096, &d0);
    m.device_mut().unwrap().fill(3).unwrap();
    m.device_mut_on(&d1).unwrap().fill(4).unwrap();
    assert!(m.device_allocated());
    // 6 KiB more on d0 fits only without the stale 4 KiB.
    let other = SyncedMemory::new(6144, &d0);
    other.device_mut().unwrap().fill(0).unwrap();
    assert!(!m.device_allocated(), "the stale home mirror was kept");
    assert_eq!(m.head(), Head::Elsewhere);
    assert!(m.host().unwrap().iter().all(|&b| b == 4));
}

#[test]
fn a_write_at_home_makes_replicas_stale() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_write_at_home_makes_replicas_stale") else {
        return;
    };
    for zc in [ZeroCopy::Auto, ZeroCopy::Off] {
        let (d0, d1) = handles(&d0, &d1, zc);
        let m = filled(&d0, &pattern(256, 3));
        on(&m, &d1);
        m.host_mut().unwrap()[0] = 99;
        assert!(!m.is_current_on(&d1), "{zc:?}");
        assert_eq!(on(&m, &d1)[0], 99, "{zc:?}");
        // A home device write too.
        m.device_mut().unwrap().fill(4).unwrap();
        assert!(!m.is_current_on(&d1));
        assert_eq!(on(&m, &d1), vec![4; 256], "{zc:?}");
        // An overwrite elsewhere needs no copy there.
        let before = m.copy_stats();
        m.device_overwrite_on(&d1).unwrap().fill(5).unwrap();
        assert_eq!(copies(&m, &before), (0, 0, 0));
        // Then an overwrite at home needs nothing back.
        let before = m.copy_stats();
        m.host_overwrite().unwrap().fill(6);
        assert_eq!(copies(&m, &before), (0, 0, 0));
        assert_eq!(on(&m, &d1), vec![6; 256]);
    }
}

#[test]
fn cpu_and_opencl_replicas_go_through_the_host() {
    let _serial = serial();
    let Some(cl) = syncmem::testing::opencl_or_skip("cpu_and_opencl_replicas") else {
        return;
    };
    let cpu = Device::cpu();
    for (home, other) in [(&cpu, &cl), (&cl, &cpu)] {
        let m = SyncedMemory::new(300, home);
        m.device_mut().unwrap().fill(8).unwrap();
        let pairs = syncmem::alloc::pairs::pair_copies();
        assert_eq!(
            on(&m, other),
            vec![8; 300],
            "{} -> {}",
            home.label(),
            other.label()
        );
        let p = pair_copies_since(&pairs);
        assert_eq!(pair(&p, home, other, false), 1, "{p:?}");
        assert_eq!(pair(&p, home, other, true), 0, "{p:?}");
        m.device_mut_on(other).unwrap().fill(2).unwrap();
        assert_eq!(m.head(), Head::Elsewhere);
        assert!(m.host().unwrap().iter().all(|&b| b == 2));
    }
}

#[test]
fn a_never_written_buffer_reads_zeros_anywhere() {
    let _serial = serial();
    let Some((d0, d1)) = two("a_never_written_buffer_reads_zeros_anywhere") else {
        return;
    };
    let m = SyncedMemory::new(128, &d0);
    assert_eq!(on(&m, &d1), vec![0; 128]);
    assert_eq!(m.copy_stats().total_count(), 0);
    assert!(m.host().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn home_accessors_on_the_home_device_are_the_plain_ones() {
    let _serial = serial();
    let Some((d0, _)) = two("home_accessors_on_the_home_device_are_the_plain_ones") else {
        return;
    };
    let m = filled(&d0, &pattern(64, 4));
    assert_eq!(on(&m, &d0), pattern(64, 4));
    assert!(m.replica_devices().is_empty());
    assert!(m.is_current_on(&d0));
}
