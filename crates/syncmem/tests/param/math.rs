//! Caffe's BlobMathTest: reductions, scale, update and copies, run where the head is.

use syncmem::kernels::Float;
use syncmem::param::ParamBlob;
use syncmem::{Device, Error, Head};

use super::{assert_near, blob, make_live, math_runs_on, uniform, Side};

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
    let s = b.data().copy_stats().since(&before);
    assert_eq!((s.total_count(), s.mapped.count), (0, 0), "no transfer");
    // The host side was never made current (with zero-copy it is allocated with the device's).
    assert_eq!(b.data().head(), Head::AtDevice, "host never touched");
    drop(b.data().host().unwrap()); // one transfer device -> host, head synced
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

typed! {
    math_sum_of_squares => math_sum_of_squares_f32, math_sum_of_squares_f64;
    math_asum => math_asum_f32, math_asum_f64;
    math_scale_data => math_scale_data_f32, math_scale_data_f64;
    math_runs_where_the_head_is => math_runs_where_the_head_is_f32, math_runs_where_the_head_is_f64;
    math_update_on_host_and_device =>
        math_update_on_host_and_device_f32, math_update_on_host_and_device_f64;
    math_copy_from => math_copy_from_f32, math_copy_from_f64;
}

syncmem::for_each_device!(
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
);
