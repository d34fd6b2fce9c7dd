//! One test per pitfall of the originals, fixed on purpose.

use syncmem::dtype::DType;
use syncmem::tensor::{dims_from_i64, Tensor};
use syncmem::{Device, Error, Head};

use super::{is_state, samples, storage};

// ----- Pitfalls of the originals, fixed on purpose -----------------------------------------

/// Caffe2's `ShareData` sets the meta before its checks: a failed call changed the type.
fn pitfall_share_data_checks_before_changing_dtype(dev: &Device) {
    let src = Tensor::from_slice(&[6], &[1.0f32; 6], Some(dev)).unwrap();
    let mut t = Tensor::from_slice(&[5], &[7i32; 5], Some(dev)).unwrap();
    let s = storage(&t);
    let e = t.share_data(&src).unwrap_err();
    assert!(
        e.to_string().contains("6") && e.to_string().contains("5"),
        "{e}"
    );
    let unset = Tensor::new(dev);
    assert!(is_state(&t.share_data(&unset).unwrap_err()));
    let mut no_data = Tensor::new(dev);
    no_data.resize(&[5]).unwrap();
    assert!(is_state(&t.share_data(&no_data).unwrap_err()));
    let mut other_dev = Tensor::host_only();
    other_dev.resize(&[5]).unwrap();
    other_dev.set_dtype(DType::F64).unwrap();
    assert!(matches!(
        t.share_data(&other_dev),
        Err(Error::DeviceMismatch { .. })
    ));
    assert_eq!(
        (t.dtype(), storage(&t)),
        (Some(DType::I32), s),
        "nothing changed"
    );
    assert_eq!(&*t.host::<i32>().unwrap(), &[7; 5]);
}

/// BVLC/caffe#5439: after sharing, the capacity stayed the old buffer's, so a reshape within
/// it wrote past the shared buffer. Here the capacity comes with the storage.
fn pitfall_no_stale_capacity_after_share(dev: &Device) {
    let src = Tensor::from_slice(&[10], &[1.0f32; 10], Some(dev)).unwrap();
    let mut t = Tensor::new(dev);
    t.resize(&[100]).unwrap();
    drop(t.host_mut::<f64>().unwrap()); // 800 bytes
    t.resize(&[10]).unwrap(); // keep on shrink: still 800
    assert_eq!(t.capacity_bytes(), 800);
    t.share_data(&src).unwrap();
    assert_eq!(t.capacity_bytes(), 40, "capacity of the shared storage");
    t.resize(&[5]).unwrap(); // within 40 bytes: still shared
    assert!(t.shares_storage_with(&src));
    t.resize(&[50]).unwrap(); // 200 bytes > 40: must detach, not write past src's buffer
    assert!(!t.shares_storage_with(&src));
    t.host_mut::<f32>().unwrap().fill(9.0);
    assert_eq!(&*src.host::<f32>().unwrap(), &[1.0; 10]);
}

/// Caffe2's same-context copy constructor shares the buffer. `Tensor` has no `Clone`
/// (checked at compile time below); `clone_deep` copies.
fn pitfall_copy_constructor_is_not_shallow(dev: &Device) {
    trait NotClone {
        const IS_CLONE: bool = false;
    }
    impl<T> NotClone for T {}
    struct Probe<T>(std::marker::PhantomData<T>);
    #[allow(dead_code)]
    impl<T: Clone> Probe<T> {
        const IS_CLONE: bool = true;
    }
    const {
        assert!(
            !<Probe<Tensor>>::IS_CLONE,
            "Tensor must not implement Clone"
        )
    };

    let mut src = Tensor::from_slice(&[4], &[1i16, 2, 3, 4], Some(dev)).unwrap();
    let clone = src.clone_deep().unwrap();
    assert!(!clone.shares_storage_with(&src) && !clone.shares_data());
    src.host_mut::<i16>().unwrap()[0] = 100;
    src.device_mut::<i16>()
        .unwrap()
        .write(&[9, 9, 9, 9])
        .unwrap();
    assert_eq!(&*clone.host::<i16>().unwrap(), &[1, 2, 3, 4]);
    assert!(clone.target().unwrap().same(dev));
    // A clone of a device-resident tensor is made on the device.
    let c2 = src.clone_deep().unwrap();
    assert_eq!(c2.head(), Some(Head::AtDevice));
    assert_eq!(c2.device::<i16>().unwrap().to_vec().unwrap(), vec![9; 4]);
}

/// Caffe2's `CopyFrom` sets the meta before `Resize` and `raw_mutable_data()`: with an
/// unchanged element count the old, smaller buffer comes back and the copy overruns it.
fn pitfall_copy_from_across_types_reallocates(dev: &Device) {
    let src = Tensor::from_slice(&[10], &samples::<f64>(10), Some(dev)).unwrap();
    let mut t = Tensor::from_slice(&[10], &[0i32; 10], Some(dev)).unwrap();
    assert_eq!(t.capacity_bytes(), 40);
    t.copy_from(&src).unwrap();
    assert_eq!((t.dtype(), t.capacity_bytes()), (Some(DType::F64), 80));
    assert_eq!(&*t.host::<f64>().unwrap(), &samples::<f64>(10)[..]);
}

/// Caffe2's `shares_data_` is never cleared; here it follows the storage.
fn pitfall_shares_data_cleared_on_detach(dev: &Device) {
    let a = Tensor::from_slice(&[3], &[1u32, 2, 3], Some(dev)).unwrap();
    let mut b = Tensor::new(dev);
    b.resize(&[3]).unwrap();
    b.share_data(&a).unwrap();
    assert!(a.shares_data() && b.shares_data());
    b.free_memory();
    assert!(!a.shares_data() && !b.shares_data());
}

#[test]
fn pitfall_negative_or_too_large_shrink_rejected() {
    let mut t = Tensor::from_slice(&[3, 2], &[1u8; 6], None).unwrap();
    let e = t.shrink(4).unwrap_err();
    assert!(
        e.to_string().contains('4') && e.to_string().contains('3'),
        "{e}"
    );
    assert_eq!((t.dims(), t.numel()), (&[3, 2][..], Some(6)), "unchanged");
    // Negative values cannot reach shrink (usize); Caffe2-style int64 dims are checked.
    assert!(is_state(&dims_from_i64(&[3, -1]).unwrap_err()));
    assert_eq!(dims_from_i64(&[3, 0]).unwrap(), vec![3, 0]);
}

#[test]
fn pitfall_resize_rejects_overflowing_dims() {
    let mut t = Tensor::from_slice(&[2], &[1.0f64, 2.0], None).unwrap();
    for dims in [
        &[usize::MAX, 2][..],
        &[1 << 40, 1 << 40],
        &[usize::MAX / 4],   // elements fit, bytes (x8) do not
        &[0, usize::MAX, 2], // 0 elements, but the other dims overflow
    ] {
        let e = t.resize(dims).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { .. }), "{dims:?}: {e}");
        assert_eq!(t.dims(), &[2], "{dims:?}: unchanged");
    }
    assert_eq!(&*t.host::<f64>().unwrap(), &[1.0, 2.0]);
    let mut u = Tensor::host_only();
    assert!(
        u.reshape(&[2]).is_err(),
        "reshape of an uninitialised tensor"
    );
    assert!(matches!(
        u.set_dtype(DType::F32),
        Err(Error::InvalidState { .. })
    ));
}

#[test]
fn pitfall_resize_like_and_reserve_reject_unset_state() {
    let mut t = Tensor::host_only();
    assert!(is_state(&t.resize_like(&Tensor::host_only()).unwrap_err()));
    assert!(!t.is_initialized(), "Caffe2 would have made it a scalar");
    t.resize(&[4]).unwrap();
    assert!(
        is_state(&t.reserve(&[8]).unwrap_err()),
        "no type: Caffe2 silently did nothing"
    );
}

syncmem::for_each_device!(
    pitfall_share_data_checks_before_changing_dtype,
    pitfall_no_stale_capacity_after_share,
    pitfall_copy_constructor_is_not_shallow,
    pitfall_copy_from_across_types_reallocates,
    pitfall_shares_data_cleared_on_detach,
);
