//! Regression test for the PoCL concurrent-discovery hazard: several threads opening
//! `opencl:0` for the first time at once must all succeed and get the same device.
//!
//! Discovery runs once per process, so this check is meaningful only as the first OpenCL
//! discovery of its process: this file holds this one test and nothing else.

#![cfg(feature = "opencl")]

use std::sync::Barrier;

use syncmem::{BackendKind, Device, Error, SyncedMemory};

const THREADS: usize = 8;

#[test]
fn concurrent_first_open_gives_one_device() {
    let start = Barrier::new(THREADS);
    let results: Vec<syncmem::Result<Device>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    Device::open("opencl:0")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("Device::open panicked"))
            .collect()
    });

    // Without an OpenCL runtime every thread must get the same clean error (and the test is a
    // skip, unless SYNCMEM_REQUIRE_OPENCL is set).
    if let Err(first) = &results[0] {
        for r in &results {
            match r {
                Err(e) => assert_eq!(e.to_string(), first.to_string(), "threads disagree"),
                Ok(d) => panic!("thread got {d:?} while another got: {first}"),
            }
        }
        assert!(
            matches!(
                first,
                Error::RuntimeUnavailable {
                    backend: BackendKind::OpenCl,
                    ..
                } | Error::NoSuchDevice { .. }
            ),
            "{first}"
        );
        // Discovery is cached: this reports the skip (or, with SYNCMEM_REQUIRE_OPENCL=1, fails).
        let later = syncmem::testing::opencl_or_skip("concurrent_first_open_gives_one_device");
        assert!(
            later.is_none(),
            "a later discovery disagrees with the first: {first}"
        );
        return;
    }

    let devices: Vec<Device> = results
        .into_iter()
        .enumerate()
        .map(|(t, r)| r.unwrap_or_else(|e| panic!("thread {t}: Device::open failed: {e}")))
        .collect();
    let first = &devices[0];
    for (t, d) in devices.iter().enumerate() {
        assert!(
            d.same(first),
            "thread {t} got another device object: {d:?} vs {first:?}"
        );
        assert_eq!(d.label(), "opencl:0");
        assert!(d.info().max_alloc > 0, "thread {t}: {:?}", d.info());
    }
    assert!(
        Device::open("opencl:0").unwrap().same(first),
        "a later open agrees"
    );
    assert_eq!(Device::all(BackendKind::OpenCl).unwrap()[0], *first);

    // The device works from every thread at once.
    std::thread::scope(|scope| {
        for (t, d) in devices.iter().enumerate() {
            scope.spawn(move || {
                let m = SyncedMemory::new(4096 + t, d);
                m.host_mut().unwrap().fill(t as u8 + 1);
                let g = m.device().unwrap();
                let mut out = vec![0u8; 4096 + t];
                g.read_into(&mut out).unwrap();
                assert!(out.iter().all(|&b| b == t as u8 + 1), "thread {t}");
            });
        }
    });
}
