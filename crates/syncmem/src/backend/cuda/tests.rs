//! Tests of the CUDA backend: no-driver errors (everywhere) and device tests (skipped without
//! a CUDA device).

use cudarc::driver::sys;

use super::error::NO_DRIVER;
use super::*;
use crate::error::{BackendKind, Error};
use crate::{Device, Event};

fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library; see `discover`.
    unsafe { sys::is_culib_present() }
}

#[test]
fn cuda_without_driver_is_runtime_unavailable_not_a_panic() {
    if driver_present() {
        eprintln!(
            "SKIPPED cuda_without_driver_is_runtime_unavailable_not_a_panic: libcuda is present"
        );
        return;
    }
    let first = Device::open("cuda:0");
    let second = Device::open("cuda:0");
    for r in [&first, &second] {
        match r {
            Err(Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                reason,
            }) => assert_eq!(reason, NO_DRIVER),
            other => panic!("expected RuntimeUnavailable, got {other:?}"),
        }
    }
    assert_eq!(
        first.err().map(|e| e.to_string()),
        second.err().map(|e| e.to_string())
    );
    // Discovery itself, called directly and repeatedly, never panics either.
    for _ in 0..2 {
        assert!(matches!(
            discover(),
            Err(Error::RuntimeUnavailable {
                backend: BackendKind::Cuda,
                ..
            })
        ));
    }
    assert!(Device::all(BackendKind::Cuda).is_err());
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

#[test]
fn cuda_info_and_default_stream() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_info_and_default_stream") else {
        return;
    };
    let info = dev.info();
    assert_eq!(info.backend, BackendKind::Cuda);
    assert_eq!(info.vendor, "NVIDIA");
    assert!(info.total_memory > 0);
    assert_eq!(info.max_alloc, info.total_memory);
    assert_eq!(dev.label(), "cuda:0");
    dev.synchronize().unwrap();
    assert!(Device::open("cuda:0").unwrap().same(&dev));
}

#[test]
fn cuda_round_trip() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_round_trip") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let data = pattern(100_000);
    let mut buf = dev.alloc(data.len()).unwrap();
    s.write(&mut buf, 0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read(&buf, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // Partial ranges at offsets.
    s.write(&mut buf, 1000, &[1, 2, 3, 4]).unwrap();
    let mut part = [0u8; 6];
    s.read(&buf, 999, &mut part).unwrap();
    assert_eq!(part, [data[999], 1, 2, 3, 4, data[1004]]);
    // Out-of-range requests are refused before reaching the driver.
    assert!(s.read(&buf, data.len(), &mut part).is_err());
}

#[test]
fn cuda_fill() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_fill") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(4096).unwrap();
    s.fill(&mut buf, 0, 4096, 0).unwrap();
    s.fill(&mut buf, 100, 50, 0xAB).unwrap();
    let mut back = vec![1u8; 4096];
    s.read(&buf, 0, &mut back).unwrap();
    for (i, b) in back.iter().enumerate() {
        let want = if (100..150).contains(&i) { 0xAB } else { 0 };
        assert_eq!(*b, want, "byte {i}");
    }
}

#[test]
fn cuda_copy_including_overlap() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_copy_including_overlap") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let data = pattern(1024);
    let mut a = dev.alloc(1024).unwrap();
    let mut b = dev.alloc(1024).unwrap();
    s.write(&mut a, 0, &data).unwrap();
    s.fill(&mut b, 0, 1024, 0).unwrap();
    s.copy(&a, 10, &mut b, 500, 300).unwrap();
    let mut back = vec![0u8; 1024];
    s.read(&b, 0, &mut back).unwrap();
    let mut want = vec![0u8; 1024];
    want[500..800].copy_from_slice(&data[10..310]);
    assert_eq!(back, want);

    // Overlapping ranges of one buffer (crate-internal path), both directions.
    let mut model = data.clone();
    s.copy_raw(&a, 0, &a, 3, 600).unwrap();
    model.copy_within(0..600, 3);
    s.copy_raw(&a, 300, &a, 200, 500).unwrap();
    model.copy_within(300..800, 200);
    s.read(&a, 0, &mut back).unwrap();
    assert_eq!(back, model);
}

#[test]
fn cuda_events_order_two_streams() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_events_order_two_streams") else {
        return;
    };
    let s1 = dev.new_stream().unwrap();
    let s2 = dev.new_stream().unwrap();
    let n = 8 << 20;
    let mut buf = dev.alloc(n).unwrap();
    s1.fill(&mut buf, 0, n, 0x5A).unwrap();
    let e: Event = s1.record().unwrap();
    s2.wait_for(&e).unwrap();
    let mut back = vec![0u8; n];
    s2.read(&buf, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
    e.wait().unwrap();
    assert!(e.is_complete().unwrap());
    let e2 = e.clone();
    assert!(e2.is_complete().unwrap());
    let done = s2.record().unwrap();
    s2.synchronize().unwrap();
    assert!(done.is_complete().unwrap());
}

#[test]
fn cuda_pinned_memory() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_pinned_memory") else {
        return;
    };
    let mut p = dev.alloc_pinned(1 << 16).unwrap();
    assert!(
        p.as_slice().iter().all(|&b| b == 0),
        "pinned memory is zero-filled"
    );
    let data = pattern(1 << 16);
    p.as_mut_slice().copy_from_slice(&data);
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(1 << 16).unwrap();
    // SAFETY: `p` outlives the copy: the event is waited for before `p` is touched again.
    unsafe { s.write_async(&mut buf, 0, p.as_slice()) }.unwrap();
    s.record().unwrap().wait().unwrap();
    let mut q = dev.alloc_pinned(1 << 16).unwrap();
    // SAFETY: as above.
    unsafe { s.read_async(&buf, 0, q.as_mut_slice()) }.unwrap();
    s.record().unwrap().wait().unwrap();
    assert_eq!(q.as_slice(), &data[..]);
    assert!(dev.pinned_stats().in_use >= 2 << 16);
}

#[test]
fn cuda_out_of_memory_is_typed() {
    let Some(dev) = crate::testing::cuda_or_skip("cuda_out_of_memory_is_typed") else {
        return;
    };
    let too_much = dev.info().total_memory as usize;
    let e = dev.alloc(too_much).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
}

#[test]
fn cuda_copy_between_devices() {
    let Some(dev0) = crate::testing::cuda_or_skip("cuda_copy_between_devices") else {
        return;
    };
    let all = Device::all(BackendKind::Cuda).unwrap();
    let Some(dev1) = all.get(1) else {
        eprintln!("SKIPPED cuda_copy_between_devices: fewer than two CUDA devices");
        return;
    };
    let data = pattern(10_000);
    let s0 = dev0.new_stream().unwrap();
    let s1 = dev1.new_stream().unwrap();
    let mut a = dev0.alloc(data.len()).unwrap();
    let mut b = dev1.alloc(data.len()).unwrap();
    s0.write(&mut a, 0, &data).unwrap();
    // Queued on device 1's stream, reading device 0's memory.
    s1.copy(&a, 0, &mut b, 0, data.len()).unwrap();
    s1.synchronize().unwrap();
    let mut back = vec![0u8; data.len()];
    s1.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // A host copy through a stream of the wrong device is refused, not attempted.
    let mut tmp = [0u8; 4];
    assert!(matches!(
        s0.read(&b, 0, &mut tmp),
        Err(Error::DeviceMismatch { .. })
    ));
    drop(a); // synchronizes s1, which used `a` as a peer.
}
