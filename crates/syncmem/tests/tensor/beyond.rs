//! Beyond Caffe2's tests: extend, reserve, shrink, copies (across devices too, with their
//! counts), swap, bool validation.

use syncmem::dtype::DType;
use syncmem::tensor::{ShrinkPolicy, Tensor};
use syncmem::{Device, Error, Head};

use super::{is_state, storage};

// ----- Beyond Caffe2's tests -------------------------------------------------------------------

fn extend_amortised(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[1, 4]).unwrap();
    t.host_mut::<f32>().unwrap().fill(0.0);
    let (mut reallocs, mut cap) = (0, t.capacity_bytes());
    for row in 1..2000usize {
        t.extend(1, 40).unwrap();
        if t.capacity_bytes() != cap {
            reallocs += 1;
            cap = t.capacity_bytes();
        }
        let mut g = t.host_mut::<f32>().unwrap();
        let s = &mut *g;
        s[row * 4..].fill(row as f32);
    }
    assert_eq!(t.dims(), &[2000, 4]);
    assert!(
        (10..=30).contains(&reallocs),
        "{reallocs} reallocations for 1999 extends"
    );
    let g = t.host::<f32>().unwrap();
    assert!((0..2000).all(|r| g[r * 4..r * 4 + 4].iter().all(|&v| v == r as f32)));
    drop(g);
    // Growth 0%: every extend beyond the capacity reallocates, exactly to the new size.
    let mut z = Tensor::from_slice(&[2], &[1i32, 2], Some(dev)).unwrap();
    z.extend(1, 0).unwrap();
    assert_eq!(z.capacity_bytes(), 12);
    assert_eq!(
        &*z.host::<i32>().unwrap(),
        &[1, 2, 0],
        "kept, new element zero"
    );
    // Without storage, extend is a resize.
    let mut e = Tensor::new(dev);
    e.resize(&[3, 2]).unwrap();
    e.extend(2, 50).unwrap();
    assert_eq!((e.dims(), e.has_storage()), (&[5, 2][..], false));
    assert!(is_state(&Tensor::new(dev).extend(1, 10).unwrap_err()));
}

fn extend_keeps_device_data(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[4, 2]).unwrap();
    t.device_overwrite::<i32>()
        .unwrap()
        .write(&[1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    t.extend(2, 50).unwrap(); // 6 rows > 4: reallocates device to device
    assert_eq!((t.dims(), t.capacity_bytes()), (&[6, 2][..], 6 * 2 * 4));
    assert_eq!(t.head(), Some(Head::AtDevice), "no host round trip");
    syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 0, "extend");
    let want = [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0];
    assert_eq!(t.device::<i32>().unwrap().to_vec().unwrap(), want);
    assert_eq!(&*t.host::<i32>().unwrap(), &want);
    syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 1, "host read");
}

fn reserve_keeps_data(dev: &Device) {
    let mut t = Tensor::from_slice(&[2, 3], &[1u16, 2, 3, 4, 5, 6], Some(dev)).unwrap();
    t.set_policy(
        ShrinkPolicy::default()
            .with_keep_on_shrink(false)
            .with_max_slack_bytes(Some(0)),
    );
    t.reserve(&[10, 3]).unwrap();
    assert!(t.is_reserved());
    assert_eq!((t.dims(), t.capacity_bytes()), (&[2, 3][..], 60));
    assert_eq!(&*t.host::<u16>().unwrap(), &[1, 2, 3, 4, 5, 6]);
    let s = storage(&t);
    t.reserve(&[4, 3]).unwrap(); // smaller: nothing
    t.resize(&[1, 3]).unwrap(); // reserved: kept despite the policy
    t.resize(&[10, 3]).unwrap();
    assert_eq!(storage(&t), s);
    assert_eq!(&t.host::<u16>().unwrap()[..6], &[1, 2, 3, 4, 5, 6]);
    t.free_memory();
    assert!(!t.is_reserved());
    assert!(is_state(&Tensor::new(dev).reserve(&[4]).unwrap_err()));
}

fn shrink_keeps_memory(dev: &Device) {
    let mut t = Tensor::from_slice(&[5, 2], &[0i64, 1, 2, 3, 4, 5, 6, 7, 8, 9], Some(dev)).unwrap();
    let s = storage(&t);
    t.shrink(3).unwrap();
    assert_eq!(
        (t.dims(), t.numel(), storage(&t)),
        (&[3, 2][..], Some(6), s)
    );
    assert_eq!(&*t.host::<i64>().unwrap(), &[0, 1, 2, 3, 4, 5]);
    assert!(is_state(&t.shrink(4).unwrap_err()));
    t.shrink(0).unwrap();
    assert!(t.host::<i64>().unwrap().is_empty());
    let mut scalar = Tensor::scalar(1.0f32, Some(dev)).unwrap();
    assert!(is_state(&scalar.shrink(0).unwrap_err()));
}

fn copy_from_same_device(dev: &Device) {
    let vals: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let mut src = Tensor::new(dev);
    src.resize(&[16, 16]).unwrap();
    src.device_overwrite::<f32>().unwrap().write(&vals).unwrap();
    let before = syncmem::stats().copies.device_to_device;
    let mut dst = Tensor::new(dev);
    dst.copy_from(&src).unwrap();
    // Head at device on the same device: one device-to-device copy, no host round trip.
    assert_eq!(
        (dst.head(), src.head()),
        (Some(Head::AtDevice), Some(Head::AtDevice))
    );
    assert_eq!(
        src.copy_stats().total_count() + dst.copy_stats().total_count(),
        0
    );
    let after = syncmem::stats().copies.device_to_device;
    assert!(after.count > before.count && after.bytes >= before.bytes + 1024);
    assert_eq!(dst.dims(), &[16, 16]);
    assert_eq!(dst.device::<f32>().unwrap().to_vec().unwrap(), vals);
    // Head at host: through the host, no bus copy.
    let a = Tensor::from_slice(&[3], &[1u8, 2, 3], Some(dev)).unwrap();
    let mut b = Tensor::new(dev);
    b.copy_from(&a).unwrap();
    assert_eq!(b.head(), Some(Head::AtHost));
    assert_eq!(
        a.copy_stats().total_count() + b.copy_stats().total_count(),
        0
    );
    assert_eq!(&*b.host::<u8>().unwrap(), &[1, 2, 3]);
    // Copying from a tensor that shares the storage is a no-op (and does not deadlock).
    let mut c = Tensor::new(dev);
    c.resize(&[3]).unwrap();
    c.share_data(&a).unwrap();
    c.copy_from(&a).unwrap();
    assert_eq!(&*c.host::<u8>().unwrap(), &[1, 2, 3]);
}

fn pinned_host_applies_to_storage_now_and_later(dev: &Device) {
    let mut t = Tensor::with_shape(&[256], DType::F32, Some(dev)).unwrap();
    assert!(!t.pinned_host());
    t.set_pinned_host(true);
    assert!(t.pinned_host());
    let before = dev.pinned_stats().allocs;
    t.host_mut::<f32>().unwrap().fill(1.5);
    assert!(
        dev.pinned_stats().allocs > before,
        "the host mirror is pinned"
    );
    assert!(t.synced().unwrap().pinned_host());
    // Storage made later (a resize past the capacity) and deep copies keep the setting.
    t.resize(&[4096]).unwrap();
    t.host_mut::<f32>().unwrap().fill(2.5);
    assert!(t.synced().unwrap().pinned_host());
    let c = t.clone_deep().unwrap();
    assert!(c.pinned_host() && c.synced().unwrap().pinned_host());
    t.set_pinned_host(false);
    assert!(!t.synced().unwrap().pinned_host());
}

fn swap_exchanges_everything_but_label(dev: &Device) {
    let mut a = Tensor::from_slice(&[2], &[1.0f64, 2.0], Some(dev))
        .unwrap()
        .with_label("a");
    let mut b = Tensor::host_only().with_label("b");
    b.resize(&[3]).unwrap();
    a.swap(&mut b);
    assert_eq!(
        (a.label(), a.dims(), a.dtype(), a.target()),
        ("a", &[3][..], None, None)
    );
    assert_eq!((b.label(), b.dims()), ("b", &[2][..]));
    assert!(b.target().unwrap().same(dev));
    assert_eq!(&*b.host::<f64>().unwrap(), &[1.0, 2.0]);
}

fn bool_bytes_are_validated(dev: &Device) {
    let mut t = Tensor::from_slice(&[4], &[0u8, 1, 2, 1], Some(dev)).unwrap();
    // Reinterpreting a 2 as bool would be undefined behaviour: an error instead.
    let e = t.host_mut::<bool>().unwrap_err();
    assert!(e.to_string().contains("bool"), "{e}");
    assert_eq!(t.dtype(), Some(DType::Bool));
    assert!(t.host::<bool>().is_err());
    assert!(t.device::<bool>().unwrap().to_vec().is_err());
    // An overwrite view zeroes invalid bytes.
    t.host_overwrite::<bool>().unwrap()[3] = true;
    assert_eq!(&*t.host::<bool>().unwrap(), &[false, false, false, true]);
    t.device_mut::<bool>().unwrap().fill_zero().unwrap();
    assert_eq!(&*t.host::<bool>().unwrap(), &[false; 4]);
}

fn string_tensor_has_no_device_view(dev: &Device) {
    let mut t = Tensor::from_slice(&[2], &["a".to_string(), "b".into()], Some(dev)).unwrap();
    assert!(matches!(
        t.device::<String>(),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        t.device_mut::<String>(),
        Err(Error::Unsupported { .. })
    ));
    assert!(is_state(&t.host_bytes().unwrap_err()));
    assert_eq!(t.head(), None);
    assert_eq!(&*t.host::<String>().unwrap(), &["a", "b"]);
    // String -> f32 cannot reuse the storage: a fresh, zeroed one.
    assert_eq!(&*t.host_mut::<f32>().unwrap(), &[0.0, 0.0]);
}

// ----- Copies across devices, with their counts -------------------------------------------------

#[test]
fn copy_from_across_devices() {
    let cpu = Device::cpu();
    let Some(cl) = syncmem::testing::opencl_or_skip("copy_from_across_devices") else {
        return;
    };
    let vals: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    // cpu (head at host) -> opencl: a host copy now, one host-to-device copy when used there.
    let a = Tensor::from_slice(&[10, 100], &vals, Some(&cpu)).unwrap();
    let mut b = Tensor::new(&cl);
    b.copy_from(&a).unwrap();
    assert_eq!((b.head(), b.dims()), (Some(Head::AtHost), &[10, 100][..]));
    assert_eq!(
        a.copy_stats().total_count() + b.copy_stats().total_count(),
        0
    );
    assert_eq!(b.device::<f32>().unwrap().to_vec().unwrap(), vals);
    syncmem::testing::assert_syncs(&cl, &b.copy_stats(), 1, 0, "b on the device");
    // opencl (head at device) -> cpu: exactly one device-to-host copy, from the source.
    let mut c = Tensor::new(&cl);
    c.resize(&[1000]).unwrap();
    c.device_overwrite::<f32>().unwrap().write(&vals).unwrap();
    let mut d = Tensor::new(&cpu);
    d.copy_from(&c).unwrap();
    syncmem::testing::assert_syncs(&cl, &c.copy_stats(), 0, 1, "c read for the copy");
    assert_eq!(
        (c.head(), d.head()),
        (Some(Head::Synced), Some(Head::AtHost))
    );
    assert_eq!(&*d.host::<f32>().unwrap(), &vals[..]);
    assert_eq!(d.copy_stats().total_count(), 0);
    // opencl -> opencl (head at device): device to device, no host round trip.
    let mut e = Tensor::new(&cl);
    e.resize(&[1000]).unwrap();
    e.device_overwrite::<f32>().unwrap().write(&vals).unwrap();
    let before = syncmem::stats().copies.device_to_device.count;
    let mut f = Tensor::new(&cl);
    f.copy_from(&e).unwrap();
    assert!(syncmem::stats().copies.device_to_device.count > before);
    assert_eq!(
        (e.head(), f.head()),
        (Some(Head::AtDevice), Some(Head::AtDevice))
    );
    assert_eq!(
        e.copy_stats().total_count() + f.copy_stats().total_count(),
        0
    );
    assert_eq!(&*f.host::<f32>().unwrap(), &vals[..]);
    syncmem::testing::assert_syncs(&cl, &f.copy_stats(), 0, 1, "f on the host");
    // opencl -> host-only and back.
    let mut h = Tensor::host_only();
    h.copy_from(&f).unwrap();
    let mut g = Tensor::new(&cl);
    g.copy_from(&h).unwrap();
    assert_eq!(g.device::<f32>().unwrap().to_vec().unwrap(), vals);
    // f was already synced: no new transfer.
    syncmem::testing::assert_syncs(&cl, &f.copy_stats(), 0, 1, "f after the copy back");
}

syncmem::for_each_device!(
    extend_amortised,
    extend_keeps_device_data,
    reserve_keeps_data,
    shrink_keeps_memory,
    copy_from_same_device,
    pinned_host_applies_to_storage_now_and_later,
    swap_exchanges_everything_but_label,
    bool_bytes_are_validated,
    string_tensor_has_no_device_view,
);
