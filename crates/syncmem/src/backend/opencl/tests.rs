//! Tests of the OpenCL backend on a real OpenCL device; each skips with a message when there
//! is none (a failure instead with `SYNCMEM_REQUIRE_OPENCL=1`).

use std::sync::Arc;

use super::error::{alloc_error, backend_error, cl_error_message, enqueue_error, unavailable};
use super::ClDevice;
use crate::backend::dispatch::RawDevice;
use crate::backend::BackendDevice;
use crate::error::{BackendKind, Error};
use crate::testing::opencl_or_skip;
use crate::Device;

fn raw(dev: &Device) -> &ClDevice {
    match &dev.shared.raw {
        RawDevice::OpenCl(d) => d,
        #[allow(unreachable_patterns)]
        _ => panic!("{} is not an OpenCL device", dev.label()),
    }
}

/// A fresh `Device` over the same OpenCL device, with counters no other test touches.
fn private_device(dev: &Device) -> Device {
    Device::from_raw(RawDevice::OpenCl(raw(dev).duplicate()))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn opencl_discovery_reports_sane_info() {
    let Some(dev) = opencl_or_skip("opencl_discovery_reports_sane_info") else {
        return;
    };
    let all = Device::all(BackendKind::OpenCl).unwrap();
    assert!(!all.is_empty());
    for (i, d) in all.iter().enumerate() {
        let info = d.info();
        assert_eq!(info.backend, BackendKind::OpenCl);
        assert_eq!(info.ordinal, i);
        assert_eq!(d.label(), format!("opencl:{i}"));
        assert!(!info.name.trim().is_empty());
        assert!(!info.vendor.trim().is_empty());
        assert!(info.max_alloc > 0);
        assert!(info.total_memory >= info.max_alloc, "{info:?}");
    }
    assert!(Device::open("opencl:0").unwrap().same(&dev));
    let e = Device::open(&format!("opencl:{}", all.len())).unwrap_err();
    assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
}

#[test]
fn opencl_round_trip_with_offsets() {
    let Some(dev) = opencl_or_skip("opencl_round_trip_with_offsets") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(4096).unwrap();
    let data = pattern(1000, 7);
    s.write(&mut buf, 0, &vec![0u8; 4096]).unwrap();
    s.write(&mut buf, 123, &data).unwrap();
    let mut back = vec![0u8; 1000];
    s.read(&buf, 123, &mut back).unwrap();
    assert_eq!(back, data);
    let mut part = vec![0xAAu8; 10];
    s.read(&buf, 118, &mut part).unwrap();
    assert_eq!(&part[..5], &[0; 5]);
    assert_eq!(&part[5..], &data[..5]);
    let mut tail = vec![0xAAu8; 3];
    s.read(&buf, 4093, &mut tail).unwrap();
    assert_eq!(tail, [0, 0, 0]);
}

#[test]
fn opencl_fill() {
    let Some(dev) = opencl_or_skip("opencl_fill") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(1000).unwrap();
    s.fill(&mut buf, 0, 1000, 0x11).unwrap();
    s.fill(&mut buf, 250, 333, 0xEE).unwrap();
    let mut back = vec![0u8; 1000];
    s.read(&buf, 0, &mut back).unwrap();
    assert!(back[..250].iter().all(|&b| b == 0x11));
    assert!(back[250..583].iter().all(|&b| b == 0xEE));
    assert!(back[583..].iter().all(|&b| b == 0x11));
}

#[test]
fn opencl_copy_within_device() {
    let Some(dev) = opencl_or_skip("opencl_copy_within_device") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let data = pattern(512, 3);
    let mut a = dev.alloc(512).unwrap();
    let mut b = dev.alloc(700).unwrap();
    s.write(&mut a, 0, &data).unwrap();
    s.fill(&mut b, 0, 700, 0).unwrap();
    s.copy(&a, 100, &mut b, 50, 400).unwrap();
    let mut back = vec![0xFFu8; 700];
    s.read(&b, 0, &mut back).unwrap();
    assert!(back[..50].iter().all(|&x| x == 0));
    assert_eq!(&back[50..450], &data[100..500]);
    assert!(back[450..].iter().all(|&x| x == 0));
}

#[test]
fn opencl_overlapping_copy_in_one_buffer() {
    let Some(dev) = opencl_or_skip("opencl_overlapping_copy_in_one_buffer") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let data = pattern(256, 9);
    let mut a = dev.alloc(256).unwrap();
    s.write(&mut a, 0, &data).unwrap();
    // copy_raw takes both buffers by `&`, like the crate's own callers may.
    s.copy_raw(&a, 0, &a, 16, 200).unwrap();
    let mut back = vec![0u8; 256];
    s.read(&a, 0, &mut back).unwrap();
    let mut expect = data.clone();
    expect.copy_within(0..200, 16);
    assert_eq!(back, expect);
    // Same offset: nothing to do.
    s.copy_raw(&a, 8, &a, 8, 100).unwrap();
    s.read(&a, 0, &mut back).unwrap();
    assert_eq!(back, expect);
}

#[test]
fn opencl_async_write_record_wait() {
    let Some(dev) = opencl_or_skip("opencl_async_write_record_wait") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let len = 1 << 20;
    let data = pattern(len, 42);
    let mut buf = dev.alloc(len).unwrap();
    // SAFETY: `data` is neither dropped nor modified before the event has completed.
    unsafe { s.write_async(&mut buf, 0, &data).unwrap() };
    let ev = s.record().unwrap();
    ev.wait().unwrap();
    assert!(ev.is_complete().unwrap());
    let mut back = vec![0u8; len];
    // SAFETY: `back` is untouched until the event below has completed.
    unsafe { s.read_async(&buf, 0, &mut back).unwrap() };
    s.record().unwrap().wait().unwrap();
    assert_eq!(back, data);
    drop(data);
}

#[test]
fn opencl_wait_for_across_streams() {
    let Some(dev) = opencl_or_skip("opencl_wait_for_across_streams") else {
        return;
    };
    let s1 = dev.new_stream().unwrap();
    let s2 = dev.new_stream().unwrap();
    let len = 4 << 20;
    let data = pattern(len, 5);
    let mut buf = dev.alloc(len).unwrap();
    let mut other = dev.alloc(len).unwrap();
    s2.fill(&mut other, 0, len, 0).unwrap();
    s2.synchronize().unwrap();
    // SAFETY: `data` outlives `s1.synchronize()` below.
    unsafe { s1.write_async(&mut buf, 0, &data).unwrap() };
    s1.fill(&mut buf, 0, 16, 0xCD).unwrap();
    let ev = s1.record().unwrap();
    s2.wait_for(&ev).unwrap();
    s2.copy(&buf, 0, &mut other, 0, len).unwrap();
    let mut back = vec![0u8; len];
    s2.read(&other, 0, &mut back).unwrap();
    assert!(back[..16].iter().all(|&b| b == 0xCD));
    assert_eq!(&back[16..], &data[16..]);
    s1.synchronize().unwrap();
}

#[test]
fn opencl_is_complete_after_synchronize() {
    let Some(dev) = opencl_or_skip("opencl_is_complete_after_synchronize") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(8 << 20).unwrap();
    s.fill(&mut buf, 0, 8 << 20, 1).unwrap();
    let ev = s.record().unwrap();
    let clone = ev.clone();
    s.synchronize().unwrap();
    assert!(ev.is_complete().unwrap());
    assert!(clone.is_complete().unwrap());
    drop(ev);
    clone.wait().unwrap();
    // The default stream works too.
    dev.synchronize().unwrap();
    assert!(dev
        .default_stream()
        .unwrap()
        .record()
        .unwrap()
        .wait()
        .is_ok());
}

#[test]
fn opencl_pinned_zeroed_writable_and_source_of_write() {
    let Some(dev) = opencl_or_skip("opencl_pinned_zeroed_writable_and_source_of_write") else {
        return;
    };
    let len = 3 * 4096 + 17;
    let mut pinned = dev.alloc_pinned(len).unwrap();
    assert_eq!(pinned.len(), len);
    assert!(pinned.as_slice().iter().all(|&b| b == 0));
    let data = pattern(len, 77);
    pinned.as_mut_slice().copy_from_slice(&data);
    assert_eq!(pinned.as_slice(), &data[..]);

    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(len).unwrap();
    s.write(&mut buf, 0, pinned.as_slice()).unwrap();
    // And as the destination of an asynchronous read.
    let mut pinned2 = dev.alloc_pinned(len).unwrap();
    // SAFETY: `pinned2` is not touched until synchronize returns.
    unsafe { s.read_async(&buf, 0, pinned2.as_mut_slice()).unwrap() };
    s.synchronize().unwrap();
    assert_eq!(pinned2.as_slice(), &data[..]);
    drop(pinned);
    drop(pinned2);
    // Many small pinned buffers, alive together and dropped in another order.
    let mut v: Vec<_> = (1..20)
        .map(|i| dev.alloc_pinned(i * 100).unwrap())
        .collect();
    for (i, p) in v.iter_mut().enumerate() {
        p.as_mut_slice().fill(i as u8);
    }
    v.reverse();
    for p in &v {
        let first = p.as_slice()[0];
        assert!(p.as_slice().iter().all(|&b| b == first));
    }
}

#[test]
fn opencl_memory_stats_track_alloc_and_free() {
    let Some(shared) = opencl_or_skip("opencl_memory_stats_track_alloc_and_free") else {
        return;
    };
    // The shared device's counters are exact-checked only where other tests cannot
    // interfere (monotonic counters); a private device gets exact checks.
    let before = shared.memory_stats();
    let b = shared.alloc(1_234_567).unwrap();
    let during = shared.memory_stats();
    assert!(during.allocs > before.allocs);
    assert!(during.in_use >= 1_234_567);
    assert!(during.peak >= 1_234_567);
    drop(b);
    assert!(shared.memory_stats().frees > before.frees);

    let dev = private_device(&shared);
    assert_eq!(dev.label(), shared.label());
    assert!(!dev.same(&shared));
    let a = dev.alloc(1000).unwrap();
    let b = dev.alloc(24).unwrap();
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (1024, 1024, 2, 0));
    drop(a);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (24, 1024, 2, 1));
    drop(b);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (0, 1024, 2, 2));

    let p = dev.alloc_pinned(4096).unwrap();
    assert_eq!(dev.pinned_stats().in_use, 4096);
    assert_eq!(dev.memory_stats().in_use, 0);
    drop(p);
    let p = dev.pinned_stats();
    assert_eq!((p.in_use, p.allocs, p.frees), (0, 1, 1));
}

#[test]
fn opencl_alloc_above_max_alloc_is_out_of_memory() {
    let Some(dev) = opencl_or_skip("opencl_alloc_above_max_alloc_is_out_of_memory") else {
        return;
    };
    let max = dev.info().max_alloc;
    let too_big = usize::try_from(max).unwrap().saturating_add(1);
    let e = dev.alloc(too_big).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // The backend itself maps clCreateBuffer's refusal to OutOfMemory as well.
    let e = raw(&dev).alloc(too_big).err().unwrap();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("opencl:0"), "{e}");
    let e = dev.alloc_pinned(too_big).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // Nothing was counted.
    let m = private_device(&dev);
    assert!(m.alloc(too_big).is_err());
    assert_eq!(m.memory_stats().allocs, 0);
}

#[test]
fn opencl_out_of_bounds_is_an_error() {
    let Some(dev) = opencl_or_skip("opencl_out_of_bounds_is_an_error") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(100).unwrap();
    let e = s.write(&mut buf, 90, &[0u8; 11]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                offset: 90,
                len: 11,
                size: 100,
                ..
            }
        ),
        "{e}"
    );
    let e = s.read(&buf, usize::MAX, &mut [0u8; 2]).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = s.fill(&mut buf, 50, 51, 0).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let mut other = dev.alloc(10).unwrap();
    let e = s.copy(&buf, 0, &mut other, 5, 6).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // A stream of another backend rejects the buffer.
    let cpu = Device::cpu().new_stream().unwrap();
    let e = cpu.write(&mut buf, 0, &[1]).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

#[test]
fn opencl_streams_on_many_threads() {
    let Some(dev) = opencl_or_skip("opencl_streams_on_many_threads") else {
        return;
    };
    std::thread::scope(|scope| {
        for t in 0..8u8 {
            let dev = dev.clone();
            scope.spawn(move || {
                let s = dev.new_stream().unwrap();
                for round in 0..10u8 {
                    let len = 1000 + usize::from(t) * 100 + usize::from(round);
                    let data = pattern(len, t ^ round);
                    let mut buf = dev.alloc(len).unwrap();
                    s.write(&mut buf, 0, &data).unwrap();
                    let mut back = vec![0u8; len];
                    s.read(&buf, 0, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
}

#[test]
fn opencl_copy_between_two_devices() {
    let Some(dev0) = opencl_or_skip("opencl_copy_between_two_devices") else {
        return;
    };
    let all = Device::all(BackendKind::OpenCl).unwrap();
    let Some(dev1) = all.get(1).cloned() else {
        eprintln!(
            "opencl_copy_between_two_devices: only {} OpenCL device(s); nothing to check \
             (run with POCL_DEVICES=\"pthread pthread\" for two)",
            all.len()
        );
        return;
    };
    assert!(!dev0.same(&dev1));
    let same_platform = Arc::ptr_eq(&raw(&dev0).ctx, &raw(&dev1).ctx);
    let s0 = dev0.new_stream().unwrap();
    let s1 = dev1.new_stream().unwrap();
    let data = pattern(10_000, 11);
    let mut a = dev0.alloc(10_000).unwrap();
    let mut b = dev1.alloc(10_000).unwrap();
    s0.write(&mut a, 0, &data).unwrap();
    s1.fill(&mut b, 0, 10_000, 0).unwrap();
    s1.synchronize().unwrap();
    let r = s0.copy(&a, 0, &mut b, 0, 10_000);
    if !same_platform {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
        eprintln!("opencl_copy_between_two_devices: devices 0 and 1 are on different platforms");
        return;
    }
    r.unwrap();
    s0.synchronize().unwrap();
    let mut back = vec![0u8; 10_000];
    s1.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // And back the other way, on device 1's stream, with offsets.
    s1.copy(&b, 10, &mut a, 20, 500).unwrap();
    s1.synchronize().unwrap();
    let mut part = vec![0u8; 500];
    s0.read(&a, 20, &mut part).unwrap();
    assert_eq!(part, &data[10..510]);
}

#[test]
fn opencl_error_mapping() {
    for code in [-4, -5, -6, -61] {
        let e = alloc_error("opencl:3", "clCreateBuffer", code, 99);
        match e {
            Error::OutOfMemory {
                device,
                requested,
                detail,
            } => {
                assert_eq!((device.as_str(), requested), ("opencl:3", 99));
                assert!(detail.contains("clCreateBuffer"), "{detail}");
            }
            e => panic!("{code}: {e}"),
        }
    }
    let e = alloc_error("opencl:0", "clCreateBuffer", -30, 1);
    assert!(matches!(e, Error::Backend { code: -30, .. }), "{e}");
    let e = backend_error("opencl:1", "clEnqueueWriteBuffer", -38);
    let text = e.to_string();
    assert!(text.contains("clEnqueueWriteBuffer"), "{text}");
    assert!(text.contains("CL_INVALID_MEM_OBJECT"), "{text}");
    assert!(text.contains("opencl:1"), "{text}");
    assert!(matches!(
        e,
        Error::Backend {
            backend: BackendKind::OpenCl,
            code: -38,
            ..
        }
    ));
    assert!(matches!(
        enqueue_error("opencl:0", "clEnqueueWriteBuffer", -4, 8),
        Error::OutOfMemory { requested: 8, .. }
    ));
    assert!(matches!(
        enqueue_error("opencl:0", "clEnqueueWriteBuffer", -5, 8),
        Error::Backend { code: -5, .. }
    ));
    assert_eq!(cl_error_message(-9999), "OpenCL error");
    assert_eq!(cl_error_message(-48), "CL_INVALID_KERNEL");
    for code in [-2000, -1001, -2001, -30] {
        match unavailable(code) {
            Error::RuntimeUnavailable {
                backend: BackendKind::OpenCl,
                reason,
            } => assert!(!reason.is_empty()),
            e => panic!("{code}: {e}"),
        }
    }
}
