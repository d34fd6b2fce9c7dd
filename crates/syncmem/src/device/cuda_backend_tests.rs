//! Tests of the CUDA backend: no-driver errors (everywhere) and device tests (skipped without
//! a CUDA device).

use cudarc::driver::sys;

use crate::backend::cuda::NO_DRIVER;
use crate::backend::cuda::*;
use crate::error::{BackendKind, Error};
use crate::Device;

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
