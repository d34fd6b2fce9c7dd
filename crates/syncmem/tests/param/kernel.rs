//! The kernels on their own: any length, too-short buffers, many threads.

use syncmem::kernels::{self, Float};
use syncmem::{Device, Error, SyncedMemory};

use super::{blob, make_live, math_runs_on, uniform, Side};

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

typed! {
    kernel_reductions_any_length => kernel_reductions_any_length_f32, kernel_reductions_any_length_f64;
}

syncmem::for_each_device!(
    kernel_reductions_any_length_f32,
    kernel_reductions_any_length_f64,
    kernel_rejects_too_short_buffers,
    kernel_many_threads_share_the_cache,
);
