//! ParamBlob against Caffe's test_blob.cpp (BlobSimpleTest, BlobMathTest) for f32 and f64, the
//! kernels on their own, and one test per fixed Caffe pitfall. Each test runs on the `cpu`
//! device, on OpenCL and on CUDA where present. The CUDA kernels (NVRTC) are compile-checked only:
//! on a machine without a GPU the CUDA variants print SKIPPED; on a GPU machine without
//! `libnvrtc` the math must say RuntimeUnavailable (or Unsupported) rather than panic.

mod common;

use rand::{rngs::StdRng, Rng, SeedableRng};
use syncmem::kernels::{self, Float};
use syncmem::param::{ParamBlob, ProtoShape, MAX_AXES};
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

// ----- BlobSimpleTest ---------------------------------------------------------------------------

fn simple_initialization<T: Float>(dev: &Device) {
    let empty = ParamBlob::<T>::new("empty", dev);
    let b = blob::<T>("preshaped", &[2, 3, 4, 5], dev);
    assert_eq!(b.num().unwrap(), 2);
    assert_eq!(b.channels().unwrap(), 3);
    assert_eq!(b.height().unwrap(), 4);
    assert_eq!(b.width().unwrap(), 5);
    assert_eq!(b.count(), 120);
    assert_eq!(empty.num_axes(), 0);
    assert_eq!(empty.count(), 0);
    assert_eq!(empty.capacity(), 0);
    assert!(!b.data().host_allocated() && !b.data().device_allocated());
}

fn simple_pointers_cpu_gpu<T: Float>(dev: &Device) {
    let b = blob::<T>("preshaped", &[2, 3, 4, 5], dev);
    let bytes = 120 * std::mem::size_of::<T>();
    assert_eq!(b.data().device().unwrap().buffer().len(), bytes);
    assert_eq!(b.data().host().unwrap().len(), bytes);
    assert_eq!(b.data().device_mut().unwrap().buffer().len(), bytes);
    assert_eq!(b.data().host_mut().unwrap().len(), bytes);
    assert_eq!(b.diff().device().unwrap().buffer().len(), bytes);
    assert_eq!(b.diff().host().unwrap().len(), bytes);
}

fn simple_reshape<T: Float>(dev: &Device) {
    let mut b = ParamBlob::<T>::new("empty", dev);
    b.reshape(&[2, 3, 4, 5]).unwrap();
    assert_eq!(
        [b.num(), b.channels(), b.height(), b.width()].map(Result::unwrap),
        [2, 3, 4, 5]
    );
    assert_eq!(b.count(), 120);
    assert_eq!(b.shape_string(), "2 3 4 5 (120)");
}

fn simple_reshape_zero<T: Float>(dev: &Device) {
    let mut b = blob::<T>("preshaped", &[2, 3, 4, 5], dev);
    b.reshape(&[0, 5]).unwrap();
    assert_eq!(b.count(), 0);
    assert_eq!(b.shape(), &[0, 5]);
}

fn simple_legacy_blob_proto_shape_equals<T: Float>(dev: &Device) {
    let legacy = |num, channels, height, width| ProtoShape::Legacy {
        num,
        channels,
        height,
        width,
    };
    let mut b = blob::<T>("b", &[3, 2], dev);
    assert!(b.shape_equals(&legacy(1, 1, 3, 2)));
    assert!(!b.shape_equals(&legacy(0, 1, 3, 2)));
    assert!(!b.shape_equals(&legacy(3, 1, 3, 2)));
    b.reshape(&[1, 3, 2]).unwrap();
    assert!(b.shape_equals(&legacy(1, 1, 3, 2)));
    b.reshape(&[2, 3, 2]).unwrap();
    assert!(!b.shape_equals(&legacy(1, 1, 3, 2)));
    assert!(b.shape_equals(&ProtoShape::Dims(vec![2, 3, 2])));
    b.reshape(&[1, 1, 1, 3, 2]).unwrap();
    assert!(
        !b.shape_equals(&legacy(1, 1, 3, 2)),
        "5 axes never equal a legacy shape"
    );
}

// ----- BlobMathTest -----------------------------------------------------------------------------

/// Caffe's TestSumOfSquares and TestAsum in one flow: `sumsq` (squared) or `asum`.
fn reduction_flow<T: Float>(dev: &Device, squared: bool, side: Side) {
    let reduce = |b: &ParamBlob<T>, diff: bool| match (squared, diff) {
        (true, false) => b.sumsq_data(),
        (true, true) => b.sumsq_diff(),
        (false, false) => b.asum_data(),
        (false, true) => b.asum_diff(),
    };
    let mut b = blob::<T>("math", &[2, 3, 4, 5], dev);
    assert_eq!(reduce(&b, false).unwrap(), T::ZERO);
    assert_eq!(reduce(&b, true).unwrap(), T::ZERO);
    assert_eq!(b.data().head(), Head::Uninitialized);
    let vals = uniform::<T>(b.count(), 1701);
    b.host_data_mut(|d| d.copy_from_slice(&vals)).unwrap();
    let expected: f64 = vals
        .iter()
        .map(|v| {
            let v = v.to_f64();
            if squared {
                v * v
            } else {
                v.abs()
            }
        })
        .sum();
    make_live(b.data(), side);
    let before = b.data().copy_stats();
    assert_near(reduce(&b, false).unwrap(), expected, "data");
    if side == Side::Device {
        let d = b.data().copy_stats().since(&before);
        assert_eq!(d.total_count(), 0, "reduced on the device: no copy ({d:?})");
        assert_eq!(b.data().head(), Head::AtDevice);
    }
    assert_eq!(reduce(&b, true).unwrap(), T::ZERO);
    // diff = 7 * data, on the host; then the diff's head goes to the side under test.
    let data = b.data_to_vec().unwrap();
    b.host_diff_mut(|g| {
        for (g, &d) in g.iter_mut().zip(&data) {
            *g = T::from_f64(7.0) * d;
        }
    })
    .unwrap();
    make_live(b.diff(), side);
    assert_near(reduce(&b, false).unwrap(), expected, "data after diff");
    let k = if squared { 49.0 } else { 7.0 };
    assert_near(reduce(&b, true).unwrap(), k * expected, "diff");
}

fn math_sum_of_squares<T: Float>(dev: &Device) {
    if math_runs_on(dev) {
        reduction_flow::<T>(dev, true, Side::Host);
        reduction_flow::<T>(dev, true, Side::Device);
    }
}

fn math_asum<T: Float>(dev: &Device) {
    if math_runs_on(dev) {
        reduction_flow::<T>(dev, false, Side::Host);
        reduction_flow::<T>(dev, false, Side::Device);
    }
}

fn scale_flow<T: Float>(dev: &Device, side: Side) {
    let mut b = blob::<T>("scale", &[2, 3, 4, 5], dev);
    assert_eq!(b.asum_data().unwrap(), T::ZERO);
    assert_eq!(b.asum_diff().unwrap(), T::ZERO);
    b.scale_data(T::from_f64(3.0)).unwrap();
    assert_eq!(b.data().head(), Head::Uninitialized, "scale of nothing");
    let vals = uniform::<T>(b.count(), 42);
    b.host_data_mut(|d| d.copy_from_slice(&vals)).unwrap();
    let asum_before = b.asum_data().unwrap().to_f64();
    make_live(b.data(), side);
    let before = b.data().copy_stats();
    b.scale_data(T::from_f64(3.0)).unwrap();
    if side == Side::Device {
        assert_eq!(b.data().copy_stats().since(&before).total_count(), 0);
        assert_eq!(b.data().head(), Head::AtDevice);
    }
    assert_near(b.asum_data().unwrap(), 3.0 * asum_before, "scaled data");
    assert_eq!(b.asum_diff().unwrap(), T::ZERO);
    let data = b.data_to_vec().unwrap();
    b.host_diff_mut(|g| {
        for (g, &d) in g.iter_mut().zip(&data) {
            *g = T::from_f64(7.0) * d;
        }
    })
    .unwrap();
    let asum_diff = b.asum_diff().unwrap().to_f64();
    assert_near(b.asum_data().unwrap(), 3.0 * asum_before, "data");
    assert_near(T::from_f64(asum_diff), 21.0 * asum_before, "diff");
    make_live(b.diff(), side);
    b.scale_diff(T::from_f64(3.0)).unwrap();
    assert_near(b.asum_data().unwrap(), 3.0 * asum_before, "data unchanged");
    assert_near(b.asum_diff().unwrap(), 3.0 * asum_diff, "scaled diff");
}

fn math_scale_data<T: Float>(dev: &Device) {
    if math_runs_on(dev) {
        scale_flow::<T>(dev, Side::Host);
        scale_flow::<T>(dev, Side::Device);
    }
}

/// The reduction at `Synced` runs on the device too (as in Caffe), and a value that only the
/// device holds is what it reads.
fn math_runs_where_the_head_is<T: Float>(dev: &Device) {
    if !math_runs_on(dev) {
        return;
    }
    let b = blob::<T>("where", &[10], dev);
    let bytes: Vec<u8> = [T::from_f64(-2.0); 10]
        .iter()
        .flat_map(|v| bytemuck::bytes_of(v).to_vec())
        .collect();
    b.data()
        .device_mut()
        .unwrap()
        .write_from(0, &bytes)
        .unwrap();
    let before = b.data().copy_stats();
    assert_eq!(b.asum_data().unwrap().to_f64(), 20.0);
    assert_eq!(b.sumsq_data().unwrap().to_f64(), 40.0);
    assert_eq!(b.data().copy_stats().since(&before).total_count(), 0);
    assert!(!b.data().host_allocated(), "host never touched");
    drop(b.data().host().unwrap()); // one copy device -> host, head synced
    assert_eq!(b.data().head(), Head::Synced);
    let before = b.data().copy_stats();
    assert_eq!(b.asum_data().unwrap().to_f64(), 20.0);
    assert_eq!(b.data().copy_stats().since(&before).total_count(), 0);
    assert_eq!(
        b.data().head(),
        Head::Synced,
        "a read leaves synced data synced"
    );
}

fn update_flow<T: Float>(dev: &Device, side: Side) {
    let mut b = blob::<T>("update", &[3, 7, 11], dev);
    let (x, g) = (uniform::<T>(b.count(), 7), uniform::<T>(b.count(), 8));
    b.host_data_mut(|d| d.copy_from_slice(&x)).unwrap();
    b.host_diff_mut(|d| d.copy_from_slice(&g)).unwrap();
    make_live(b.data(), side);
    make_live(b.diff(), side);
    let before = b.data().copy_stats();
    b.update().unwrap();
    let want = if side == Side::Host {
        Head::AtHost
    } else {
        Head::AtDevice
    };
    assert_eq!(b.data().head(), want);
    assert_eq!(b.data().copy_stats().since(&before).total_count(), 0);
    let got = b.data_to_vec().unwrap();
    for i in 0..got.len() {
        assert_eq!(got[i], x[i] - g[i], "element {i}");
    }
}

fn math_update_on_host_and_device<T: Float>(dev: &Device) {
    if math_runs_on(dev) {
        update_flow::<T>(dev, Side::Host);
        update_flow::<T>(dev, Side::Device);
    }
}

fn math_copy_from<T: Float>(dev: &Device) {
    let mut src = blob::<T>("src", &[4, 5], dev);
    let vals = uniform::<T>(20, 3);
    src.host_data_mut(|d| d.copy_from_slice(&vals)).unwrap();
    let mut dst = blob::<T>("dst", &[20], dev);
    let e = dst.copy_from(&src, false, false).unwrap_err();
    assert!(
        matches!(&e, Error::SizeMismatch { what, .. } if what.contains("different sizes")),
        "{e}"
    );
    dst.copy_from(&src, false, true).unwrap();
    assert_eq!(dst.shape(), &[4, 5]);
    assert_eq!(dst.data_to_vec().unwrap(), vals);
    // Device to device when the source's head is at the device: no copy on either buffer.
    make_live(src.data(), Side::Device);
    let (s0, d0) = (src.data().copy_stats(), dst.data().copy_stats());
    dst.copy_from(&src, false, false).unwrap();
    assert_eq!(src.data().copy_stats().since(&s0).total_count(), 0);
    assert_eq!(dst.data().copy_stats().since(&d0).total_count(), 0);
    assert_eq!(dst.data().head(), Head::AtDevice);
    assert_eq!(dst.data_to_vec().unwrap(), vals);
    // The diff: an uninitialized source copies zeros and stays uninitialized.
    dst.host_diff_mut(|g| g.fill(T::from_f64(5.0))).unwrap();
    dst.copy_from(&src, true, false).unwrap();
    assert_eq!(src.diff().head(), Head::Uninitialized);
    assert!(dst.diff_to_vec().unwrap().iter().all(|&v| v == T::ZERO));
    // Onto a shared buffer: nothing to do.
    dst.share_data(&src).unwrap();
    dst.copy_from(&src, false, false).unwrap();
}

fn math_integer_blob_is_not_implemented(dev: &Device) {
    let mut b = ParamBlob::<i32>::with_shape("ints", &[2, 2], dev).unwrap();
    b.host_data_mut(|d| d.copy_from_slice(&[1, -2, 3, -4]))
        .unwrap();
    assert_eq!(b.data_at(&[1, 1]).unwrap(), -4);
    for e in [
        b.asum_data().unwrap_err(),
        b.sumsq_diff().unwrap_err(),
        b.scale_data(2).unwrap_err(),
        b.update().unwrap_err(),
    ] {
        assert!(
            matches!(&e, Error::Unsupported { what, .. } if what.contains("i32") && what.contains("ints")),
            "{e}"
        );
    }
    let u = ParamBlob::<u32>::with_shape("uints", &[3], dev).unwrap();
    assert!(matches!(u.asum_diff(), Err(Error::Unsupported { .. })));
}

// ----- The kernels on their own -----------------------------------------------------------------

fn kernel_reductions_any_length<T: Float>(dev: &Device) {
    if !math_runs_on(dev) {
        return;
    }
    for n in [0usize, 1, 3, 255, 256, 257, 1000, 4097, 70_001] {
        let vals = uniform::<T>(n, n as u64);
        let m = SyncedMemory::with_elements(n + 3, std::mem::size_of::<T>(), Some(dev)).unwrap();
        m.host_mut()
            .unwrap()
            .as_mut_slice_of::<T>()
            .unwrap()
            .iter_mut()
            .zip(vals.iter().chain([T::from_f64(100.0); 3].iter()))
            .for_each(|(d, &v)| *d = v);
        let g = m.device().unwrap();
        let asum: f64 = vals.iter().map(|v| v.to_f64().abs()).sum();
        let sumsq: f64 = vals.iter().map(|v| v.to_f64() * v.to_f64()).sum();
        let (a, s) = (
            kernels::asum::<T>(n, &g).unwrap(),
            kernels::sumsq::<T>(n, &g).unwrap(),
        );
        // Long f32 sums carry more rounding than Caffe's 120 elements; scale the bound.
        let tol = if std::mem::size_of::<T>() == 4 {
            1e-5
        } else {
            1e-12
        };
        assert!(
            (a.to_f64() - asum).abs() <= tol * asum.max(1.0),
            "asum n={n}"
        );
        assert!(
            (s.to_f64() - sumsq).abs() <= tol * sumsq.max(1.0),
            "sumsq n={n}"
        );
        drop(g);
        // The trailing elements are not touched by scale and axpy of n.
        let y = SyncedMemory::with_elements(n + 3, std::mem::size_of::<T>(), Some(dev)).unwrap();
        y.host_mut()
            .unwrap()
            .as_mut_slice_of::<T>()
            .unwrap()
            .fill(T::from_f64(1.0));
        kernels::scale::<T>(n, T::from_f64(2.0), &mut y.device_mut().unwrap()).unwrap();
        kernels::axpy::<T>(
            n,
            T::from_f64(0.5),
            &m.device().unwrap(),
            &mut y.device_mut().unwrap(),
        )
        .unwrap();
        let h = y.host().unwrap();
        let out = h.as_slice_of::<T>().unwrap();
        for i in 0..n {
            assert_eq!(
                out[i],
                T::from_f64(2.0) + T::from_f64(0.5) * vals[i],
                "n={n} i={i}"
            );
        }
        assert!(
            out[n..].iter().all(|&v| v == T::from_f64(1.0)),
            "n={n}: tail touched"
        );
    }
}

fn kernel_rejects_too_short_buffers(dev: &Device) {
    let m = SyncedMemory::new(16, dev);
    m.device_mut().unwrap().fill(0).unwrap();
    let e = kernels::asum::<f32>(5, &m.device().unwrap()).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
}

fn kernel_many_threads_share_the_cache(dev: &Device) {
    if !math_runs_on(dev) {
        return;
    }
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                let mut b = blob::<f32>("threads", &[1000], dev);
                b.host_data_mut(|d| d.fill(t as f32)).unwrap();
                make_live(b.data(), Side::Device);
                for _ in 0..20 {
                    assert_eq!(b.asum_data().unwrap(), 1000.0 * t as f32);
                }
            });
        }
    });
}

// ----- One test per fixed pitfall ----------------------------------------------------------------

fn pitfall_offset_rejects_one_past_the_end(dev: &Device) {
    let b = blob::<f32>("b", &[2, 3, 4, 5], dev);
    assert_eq!(b.offset(1, 2, 3, 4).unwrap(), 119);
    for (n, c, h, w) in [(2, 0, 0, 0), (0, 3, 0, 0), (0, 0, 4, 0), (0, 0, 0, 5)] {
        let e = b.offset(n, c, h, w).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { len: 1, .. }), "{e}");
    }
    assert_eq!(b.offset_of(&[1, 2]).unwrap(), (3 + 2) * 20);
    assert!(b.offset_of(&[1, 3]).is_err());
    assert!(b.offset_of(&[0, 0, 0, 0, 0]).is_err());
}

fn pitfall_reshape_zero_gives_usable_buffers(dev: &Device) {
    // Caffe #3625: a blob first reshaped to count 0 had null buffers.
    let b = blob::<f32>("zero", &[0, 5], dev);
    assert_eq!(b.count(), 0);
    assert!(b.data().host().unwrap().is_empty());
    assert!(b.diff().device().unwrap().buffer().is_empty());
    assert!(b.data_to_vec().unwrap().is_empty());
    assert_eq!(b.asum_data().unwrap(), 0.0);
    let mut b = b;
    b.update().unwrap();
    b.scale_diff(2.0).unwrap();
    b.reshape(&[2, 2]).unwrap();
    assert_eq!(b.data_to_vec().unwrap(), vec![0.0; 4]);
}

fn pitfall_share_data_updates_capacity(dev: &Device) {
    // Caffe #5439: capacity_ stayed stale after ShareData.
    let mut owner = blob::<f32>("owner", &[10], dev);
    owner.host_data_mut(|d| d.fill(1.0)).unwrap();
    let mut b = blob::<f32>("b", &[20], dev);
    b.reshape(&[10]).unwrap();
    assert_eq!(b.capacity(), 20);
    b.share_data(&owner).unwrap();
    assert_eq!(b.capacity(), 10, "the shared buffer holds 10");
    b.reshape(&[5]).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(b.data(), owner.data()),
        "within capacity: still shared"
    );
    // Caffe would keep writing 15 elements into owner's 10-element buffer here.
    b.reshape(&[15]).unwrap();
    assert!(
        !std::sync::Arc::ptr_eq(b.data(), owner.data()),
        "beyond: detached"
    );
    assert_eq!(b.data().len(), 15 * 4);
    assert_eq!(b.data().head(), Head::Uninitialized);
    assert_eq!(
        owner.data_to_vec().unwrap(),
        vec![1.0; 10],
        "owner untouched"
    );
}

fn pitfall_share_diff_updates_capacity(dev: &Device) {
    let owner = blob::<f64>("owner", &[3], dev);
    let mut b = blob::<f64>("b", &[9], dev);
    b.reshape(&[3]).unwrap();
    b.share_diff(&owner).unwrap();
    assert_eq!(b.capacity(), 3);
    assert!(std::sync::Arc::ptr_eq(b.diff(), owner.diff()));
}

fn pitfall_share_requires_equal_count(dev: &Device) {
    let owner = blob::<f32>("owner", &[2, 3], dev);
    let mut b = blob::<f32>("b", &[7], dev);
    let e = b.share_data(&owner).unwrap_err();
    assert!(
        matches!(&e, Error::SizeMismatch { what, .. } if what.contains("owner") && what.contains("b has 7")),
        "{e}"
    );
    assert!(!std::sync::Arc::ptr_eq(b.data(), owner.data()));
    let mut same_count = blob::<f32>("c", &[6], dev);
    same_count.share_data(&owner).unwrap(); // shapes may differ
    assert_eq!(same_count.shape(), &[6]);
}

fn pitfall_capacity_only_grows_and_growth_replaces_both(dev: &Device) {
    let mut b = blob::<f32>("b", &[4], dev);
    b.host_data_mut(|d| d.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    let (data, diff) = (b.data().clone(), b.diff().clone());
    b.reshape(&[2]).unwrap(); // shrink keeps the buffers (Caffe #4910, by design)
    b.reshape(&[3]).unwrap(); // regrow within capacity: the old bytes, not zeros
    assert!(std::sync::Arc::ptr_eq(b.data(), &data));
    assert_eq!(b.data_to_vec().unwrap(), vec![1.0, 2.0, 3.0]);
    b.reshape(&[5]).unwrap(); // beyond capacity: both new, uninitialized
    assert!(!std::sync::Arc::ptr_eq(b.data(), &data) && !std::sync::Arc::ptr_eq(b.diff(), &diff));
    assert_eq!(b.data().head(), Head::Uninitialized);
    assert_eq!(b.diff().head(), Head::Uninitialized);
    assert_eq!(b.data_to_vec().unwrap(), vec![0.0; 5]);
}

fn pitfall_update_on_uninitialized_is_an_error(dev: &Device) {
    let mut b = blob::<f32>("fresh", &[3], dev);
    let e = b.update().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidState { reason, .. } if reason.contains("fresh")),
        "{e}"
    );
}

fn pitfall_bad_shapes_are_errors_and_change_nothing(dev: &Device) {
    let mut b = blob::<f32>("b", &[2, 3], dev);
    let e = b.reshape(&[1; MAX_AXES + 1]).unwrap_err();
    assert!(matches!(e, Error::InvalidShape { .. }), "{e}");
    b.reshape(&[1; MAX_AXES]).unwrap();
    b.reshape(&[2, 3]).unwrap();
    let e = b.reshape(&[usize::MAX, 2]).unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    let e = b.reshape(&[usize::MAX / 2]).unwrap_err(); // elements fit, bytes do not
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    assert_eq!((b.shape(), b.count()), (&[2, 3][..], 6), "unchanged");
    b.reshape(&[]).unwrap();
    assert_eq!(b.count(), 1, "the empty shape is a scalar");
}

fn pitfall_axis_errors_name_the_shape(dev: &Device) {
    let b = blob::<f32>("b", &[2, 3, 4], dev);
    assert_eq!(b.canonical_axis_index(-1).unwrap(), 2);
    assert_eq!(b.shape_at(-3).unwrap(), 2);
    assert_eq!(b.count_range(1, 3).unwrap(), 12);
    assert_eq!(b.count_range(2, 2).unwrap(), 1);
    assert_eq!(b.count_from(1).unwrap(), 12);
    for e in [
        b.canonical_axis_index(3).unwrap_err(),
        b.canonical_axis_index(-4).unwrap_err(),
        b.count_range(2, 1).unwrap_err(),
        b.count_range(0, 4).unwrap_err(),
    ] {
        assert!(e.to_string().contains("2 3 4 (24)"), "{e}");
    }
    let five = blob::<f32>("five", &[1, 2, 3, 4, 5], dev);
    assert!(five.num().is_err(), "legacy accessors need at most 4 axes");
    assert_eq!(b.legacy_shape(-4).unwrap(), 1);
    assert!(b.legacy_shape(4).is_err());
}

macro_rules! typed {
    ($($generic:ident => $f32:ident, $f64:ident;)*) => {
        $(
            fn $f32(dev: &Device) { $generic::<f32>(dev) }
            fn $f64(dev: &Device) { $generic::<f64>(dev) }
        )*
    };
}

typed! {
    simple_initialization => simple_initialization_f32, simple_initialization_f64;
    simple_pointers_cpu_gpu => simple_pointers_cpu_gpu_f32, simple_pointers_cpu_gpu_f64;
    simple_reshape => simple_reshape_f32, simple_reshape_f64;
    simple_reshape_zero => simple_reshape_zero_f32, simple_reshape_zero_f64;
    simple_legacy_blob_proto_shape_equals =>
        simple_legacy_blob_proto_shape_equals_f32, simple_legacy_blob_proto_shape_equals_f64;
    math_sum_of_squares => math_sum_of_squares_f32, math_sum_of_squares_f64;
    math_asum => math_asum_f32, math_asum_f64;
    math_scale_data => math_scale_data_f32, math_scale_data_f64;
    math_runs_where_the_head_is => math_runs_where_the_head_is_f32, math_runs_where_the_head_is_f64;
    math_update_on_host_and_device =>
        math_update_on_host_and_device_f32, math_update_on_host_and_device_f64;
    math_copy_from => math_copy_from_f32, math_copy_from_f64;
    kernel_reductions_any_length => kernel_reductions_any_length_f32, kernel_reductions_any_length_f64;
}

per_device!(
    simple_initialization_f32,
    simple_initialization_f64,
    simple_pointers_cpu_gpu_f32,
    simple_pointers_cpu_gpu_f64,
    simple_reshape_f32,
    simple_reshape_f64,
    simple_reshape_zero_f32,
    simple_reshape_zero_f64,
    simple_legacy_blob_proto_shape_equals_f32,
    simple_legacy_blob_proto_shape_equals_f64,
    math_sum_of_squares_f32,
    math_sum_of_squares_f64,
    math_asum_f32,
    math_asum_f64,
    math_scale_data_f32,
    math_scale_data_f64,
    math_runs_where_the_head_is_f32,
    math_runs_where_the_head_is_f64,
    math_update_on_host_and_device_f32,
    math_update_on_host_and_device_f64,
    math_copy_from_f32,
    math_copy_from_f64,
    math_integer_blob_is_not_implemented,
    kernel_reductions_any_length_f32,
    kernel_reductions_any_length_f64,
    kernel_rejects_too_short_buffers,
    kernel_many_threads_share_the_cache,
    pitfall_offset_rejects_one_past_the_end,
    pitfall_reshape_zero_gives_usable_buffers,
    pitfall_share_data_updates_capacity,
    pitfall_share_diff_updates_capacity,
    pitfall_share_requires_equal_count,
    pitfall_capacity_only_grows_and_growth_replaces_both,
    pitfall_update_on_uninitialized_is_an_error,
    pitfall_bad_shapes_are_errors_and_change_nothing,
    pitfall_axis_errors_name_the_shape,
);
