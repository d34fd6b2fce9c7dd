//! ParamBlob against Caffe's test_blob.cpp (BlobSimpleTest, BlobMathTest) for f32 and f64, the
//! kernels on their own, and one test per fixed Caffe pitfall. Each test runs on the `cpu`
//! device, on OpenCL and on CUDA where present. The CUDA kernels (NVRTC) are compile-checked only:
//! on a machine without a GPU the CUDA variants print SKIPPED; on a GPU machine without
//! `libnvrtc` the math must say RuntimeUnavailable (or Unsupported) rather than panic.

use rand::{rngs::StdRng, Rng, SeedableRng};
use syncmem::kernels::{self, Float};
use syncmem::param::ParamBlob;
use syncmem::{BackendKind, Device, Error, Head, SyncedMemory};

/// Caffe's BlobMathTest epsilon (relative).
const EPS: f64 = 1e-6;

/// `n` values uniform in [-3, 3], from a fixed seed.
fn uniform<T: Float>(n: usize, seed: u64) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| T::from_f64(rng.random_range(-3.0..=3.0)))
        .collect()
}

fn assert_near<T: Float>(got: T, expected: f64, what: &str) {
    let g = got.to_f64();
    assert!(
        (g - expected).abs() <= EPS * expected.abs(),
        "{what}: got {g}, expected {expected} (relative error {:e})",
        (g - expected).abs() / expected.abs()
    );
}

/// False when `dev` cannot run kernels (CUDA without `libnvrtc`), after checking that it says
/// so with an error rather than a panic.
fn math_runs_on(dev: &Device) -> bool {
    if dev.backend() != BackendKind::Cuda {
        return true;
    }
    let m = SyncedMemory::new(8, dev);
    m.device_mut().unwrap().fill(0).unwrap();
    let r = kernels::asum::<f32>(2, &m.device().unwrap());
    match r {
        Ok(v) => {
            assert_eq!(v, 0.0);
            true
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::RuntimeUnavailable { .. } | Error::Unsupported { .. }
                ),
                "{e}"
            );
            eprintln!("NOTE {}: device math unavailable on CUDA: {e}", dev.label());
            false
        }
    }
}

/// Where to put a buffer's head before an operation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    /// `host_mut()`: head at host (Caffe's CPU device in BlobMathTest).
    Host,
    /// `device_mut()`: head at device (Caffe's GPU device in BlobMathTest).
    Device,
}

fn make_live(m: &SyncedMemory, side: Side) {
    match side {
        Side::Host => drop(m.host_mut().unwrap()),
        Side::Device => drop(m.device_mut().unwrap()),
    }
    let want = if side == Side::Host {
        Head::AtHost
    } else {
        Head::AtDevice
    };
    assert_eq!(m.head(), want);
}

fn blob<T: Float>(name: &str, shape: &[usize], dev: &Device) -> ParamBlob<T> {
    ParamBlob::with_shape(name, shape, dev).unwrap()
}

macro_rules! typed {
    ($($generic:ident => $f32:ident, $f64:ident;)*) => {
        $(
            fn $f32(dev: &Device) { $generic::<f32>(dev) }
            fn $f64(dev: &Device) { $generic::<f64>(dev) }
        )*
    };
}

// The test modules come after the helpers and the macro above, which they use.
mod kernel;
mod math;
mod pitfalls;
mod simple;
