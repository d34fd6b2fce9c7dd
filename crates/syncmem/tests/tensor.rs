//! Tensor against Caffe2's tensor tests (blob_test.cc / blob_gpu_test.cc),
//! typed over several element types, on the `cpu` device and on OpenCL; then extend, reserve,
//! shrink, copies across devices with their copy counts, and one test per fixed pitfall.

mod common;

use syncmem::dtype::{DType, Element, PodElement};
use syncmem::tensor::{dims_from_i64, ShrinkPolicy, Tensor};
use syncmem::{Device, Error, Head};

/// Element types the typed tests run over, with a value per index.
trait Sample: PodElement {
    fn at(i: usize) -> Self;
}
macro_rules! sample_int {
    ($($t:ty),*) => {$( impl Sample for $t { fn at(i: usize) -> Self { (i % 100) as $t } } )*};
}
sample_int!(u8, i8, i32, i64);
impl Sample for f32 {
    fn at(i: usize) -> Self {
        i as f32 * 0.5
    }
}
impl Sample for f64 {
    fn at(i: usize) -> Self {
        i as f64 * 0.25
    }
}
impl Sample for half::f16 {
    fn at(i: usize) -> Self {
        half::f16::from_f32((i % 1000) as f32)
    }
}
impl Sample for bool {
    fn at(i: usize) -> Self {
        i % 3 == 1
    }
}

/// Runs a generic test for each sample type (Caffe2 types over char, int and float).
macro_rules! typed {
    ($f:ident, $dev:expr) => {{
        $f::<u8>($dev);
        $f::<i8>($dev);
        $f::<i32>($dev);
        $f::<i64>($dev);
        $f::<f32>($dev);
        $f::<f64>($dev);
        $f::<half::f16>($dev);
        $f::<bool>($dev);
    }};
}

fn samples<T: Sample>(n: usize) -> Vec<T> {
    (0..n).map(T::at).collect()
}

/// Address of the storage (stable while the storage is alive).
fn storage(t: &Tensor) -> usize {
    t.synced().map_or(0, |m| m as *const _ as usize)
}

fn host_ptr<T: Element>(t: &Tensor) -> usize {
    t.host::<T>().unwrap().as_ptr() as usize
}

fn is_state(e: &Error) -> bool {
    matches!(e, Error::InvalidState { .. } | Error::TypeMismatch { .. })
}

// ----- Caffe2: TensorNonTypedTest / TensorCPUTest / TensorGPUTest ------------------------------

fn tensor_change_type(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[2, 3, 5]).unwrap();
    let p = t.host_mut::<i32>().unwrap().as_ptr() as usize;
    assert_eq!(t.dtype(), Some(DType::I32));
    let s = storage(&t);
    // Same byte size: same memory, reinterpreted.
    assert_eq!(t.host_mut::<f32>().unwrap().as_ptr() as usize, p);
    assert_eq!(t.dtype(), Some(DType::F32));
    // Smaller: same memory.
    assert_eq!(t.host_mut::<half::f16>().unwrap().as_ptr() as usize, p);
    assert_eq!(t.dtype(), Some(DType::F16));
    // The device side reuses the storage too.
    drop(t.device_mut::<i16>().unwrap());
    assert_eq!(storage(&t), s);
    // Shared so that the old memory stays alive; a bigger type needs new memory.
    let mut other = Tensor::new(dev);
    other.resize(&[2, 3, 5]).unwrap();
    other.share_data(&t).unwrap();
    let q = t.host_mut::<f64>().unwrap().as_ptr() as usize;
    assert_ne!(q, p);
    assert_eq!(t.dtype(), Some(DType::F64));
    assert!(!t.shares_storage_with(&other));
    assert_eq!(storage(&other), s, "the other tensor keeps the old storage");
}

fn initialized_empty<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev);
    assert_eq!((t.ndim(), t.numel()), (0, None));
    t.resize(&[2, 3, 5]).unwrap();
    assert_eq!(
        (t.ndim(), t.dims(), t.numel()),
        (3, &[2, 3, 5][..], Some(30))
    );
    assert_eq!(t.host_mut::<T>().unwrap().len(), 30);
    assert_eq!(t.host::<T>().unwrap().len(), 30);
    assert!(t.device::<T>().unwrap().buffer().is_some());
}

fn initialized_non_empty<T: Sample>(dev: &Device) {
    let mut t = Tensor::with_shape(&[2, 3, 5], T::DTYPE, Some(dev)).unwrap();
    assert_eq!(t.dims(), &[2, 3, 5]);
    assert_eq!(t.host_mut::<T>().unwrap().len(), 30);
    t.resize(&[7, 11, 13, 17]).unwrap();
    assert_eq!((t.ndim(), t.dims()), (4, &[7, 11, 13, 17][..]));
    assert_eq!(t.host_mut::<T>().unwrap().len(), 7 * 11 * 13 * 17);
    assert_eq!(t.device::<T>().unwrap().len(), 7 * 11 * 13 * 17);
}

fn initialized_zero_dim<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[2, 0, 5]).unwrap();
    assert_eq!(t.dims(), &[2, 0, 5]);
    assert!(t.host_mut::<T>().unwrap().is_empty());
    assert!(t.host::<T>().unwrap().is_empty());
    assert!(t.device::<T>().unwrap().to_vec().unwrap().is_empty());
    assert!(t.device_mut::<T>().unwrap().is_empty());
    assert_eq!(t.capacity_bytes(), 0, "size 0 allocates nothing");
}

fn resize_zero_dim<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[2, 3, 5]).unwrap();
    drop(t.host_mut::<T>().unwrap());
    t.resize(&[7, 0, 13]).unwrap();
    assert_eq!((t.numel(), t.dims()), (Some(0), &[7, 0, 13][..]));
    assert!(t.host_mut::<T>().unwrap().is_empty());
    assert!(t.host::<T>().unwrap().is_empty());
    assert!(t.device::<T>().unwrap().is_empty());
}

fn initialized_scalar<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev);
    t.resize(&[]).unwrap();
    assert_eq!((t.ndim(), t.numel()), (0, Some(1)));
    assert_eq!(t.host_mut::<T>().unwrap().len(), 1);
    assert_eq!(t.host::<T>().unwrap().len(), 1);
    let s = Tensor::scalar(T::at(1), Some(dev)).unwrap();
    assert_eq!(s.device::<T>().unwrap().to_vec().unwrap(), vec![T::at(1)]);
}

fn share_data<T: Sample>(dev: &Device) {
    let mut a = Tensor::new(dev);
    let mut b = Tensor::new(dev);
    a.resize(&[2, 3, 5]).unwrap();
    b.resize(&[2, 3, 5]).unwrap();
    drop(a.host_mut::<T>().unwrap());
    b.share_data(&a).unwrap();
    assert_eq!(host_ptr::<T>(&a), host_ptr::<T>(&b));
    assert!(a.shares_data() && b.shares_data());
    a.host_mut::<T>()
        .unwrap()
        .copy_from_slice(&samples::<T>(30));
    assert_eq!(&*b.host::<T>().unwrap(), &samples::<T>(30)[..]);
    // Written on the device through one, read on the device through the other.
    a.device_mut::<T>()
        .unwrap()
        .write(&samples::<T>(31)[1..])
        .unwrap();
    assert_eq!(
        b.device::<T>().unwrap().to_vec().unwrap(),
        &samples::<T>(31)[1..]
    );
}

fn share_data_raw_pointer<T: Sample>(dev: &Device) {
    let mut buf = samples::<T>(30);
    let mut t = Tensor::new(dev);
    t.resize(&[2, 3, 5]).unwrap();
    // SAFETY: `buf` outlives `t` and is not touched until `t` is dropped.
    unsafe { t.adopt_raw(buf.as_mut_ptr(), buf.len()).unwrap() };
    assert_eq!(t.dtype(), Some(T::DTYPE));
    assert!(t.shares_data());
    assert_eq!(host_ptr::<T>(&t), buf.as_ptr() as usize, "no copy");
    assert_eq!(t.device::<T>().unwrap().to_vec().unwrap(), samples::<T>(30));
    t.host_mut::<T>().unwrap()[0] = T::at(2);
    drop(t);
    assert_eq!(buf[0], T::at(2), "writes went to the adopted memory");
    // Owned form: the vector moves in.
    let v = samples::<T>(30);
    let mut o = Tensor::new(dev);
    o.resize(&[30]).unwrap();
    o.adopt(v.into_boxed_slice()).unwrap();
    assert_eq!(&*o.host::<T>().unwrap(), &samples::<T>(30)[..]);
}

fn cannot_share_data_when_shape_not_set(dev: &Device) {
    let mut buf = [0f32; 4];
    let mut t = Tensor::new(dev);
    // SAFETY: the call fails before adopting anything.
    let e = unsafe { t.adopt_raw(buf.as_mut_ptr(), 4) }.unwrap_err();
    assert!(is_state(&e), "{e}");
    assert!(is_state(&t.adopt(vec![1u8; 4]).unwrap_err()));
    assert_eq!(t.dtype(), None);
}

fn share_data_different_shapes<T: Sample>(dev: &Device) {
    let mut a = Tensor::from_slice(&[2, 3, 5], &samples::<T>(30), Some(dev)).unwrap();
    let mut b = Tensor::new(dev);
    b.resize(&[30]).unwrap();
    b.share_data(&a).unwrap();
    assert_eq!((b.ndim(), b.dim(0).unwrap()), (1, 30));
    assert_eq!(a.dims(), &[2, 3, 5]);
    assert_eq!(host_ptr::<T>(&a), host_ptr::<T>(&b));
    a.host_mut::<T>().unwrap()[29] = T::at(7);
    assert_eq!(b.host::<T>().unwrap()[29], T::at(7));
}

fn no_longer_shares_after_resize<T: Sample>(dev: &Device) {
    let mut a = Tensor::from_slice(&[2, 3, 5], &samples::<T>(30), Some(dev)).unwrap();
    let mut b = Tensor::new(dev);
    b.resize(&[2, 3, 5]).unwrap();
    b.share_data(&a).unwrap();
    let old = host_ptr::<T>(&a);
    a.resize(&[7, 3, 5]).unwrap();
    assert_eq!(host_ptr::<T>(&b), old);
    assert_ne!(a.host_mut::<T>().unwrap().as_ptr() as usize, old);
    assert!(!a.shares_data() && !b.shares_data());
    assert_eq!(&*b.host::<T>().unwrap(), &samples::<T>(30)[..]);
}

fn no_longer_shares_after_free_memory<T: Sample>(dev: &Device) {
    let mut a = Tensor::from_slice(&[2, 3, 5], &samples::<T>(30), Some(dev)).unwrap();
    let mut b = Tensor::new(dev);
    b.resize(&[2, 3, 5]).unwrap();
    b.share_data(&a).unwrap();
    let old = host_ptr::<T>(&a);
    a.free_memory();
    assert_eq!((a.dims(), a.dtype()), (&[2, 3, 5][..], Some(T::DTYPE)));
    assert_eq!(host_ptr::<T>(&b), old);
    assert_ne!(a.host_mut::<T>().unwrap().as_ptr() as usize, old);
    assert!(!b.shares_data());
}

fn keep_on_shrink<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev).with_policy(ShrinkPolicy::default());
    t.resize(&[2, 3, 5]).unwrap();
    drop(t.host_mut::<T>().unwrap());
    t.resize(&[3, 4, 6]).unwrap();
    let p = t.host_mut::<T>().unwrap().as_ptr() as usize;
    t.resize(&[1, 2, 4]).unwrap();
    assert_eq!(t.host_mut::<T>().unwrap().as_ptr() as usize, p);
    t.resize(&[3, 0, 6]).unwrap();
    t.resize(&[2, 3, 5]).unwrap();
    assert_eq!(t.host_mut::<T>().unwrap().as_ptr() as usize, p);
    assert_eq!(t.capacity_bytes(), 72 * T::DTYPE.size());
    // keep_on_shrink off: a shrink frees.
    t.set_policy(ShrinkPolicy {
        keep_on_shrink: false,
        max_slack_bytes: None,
    });
    t.resize(&[1, 2, 4]).unwrap();
    assert!(!t.has_storage());
}

fn max_keep_on_shrink<T: Sample>(dev: &Device) {
    let size = T::DTYPE.size();
    let mut t = Tensor::new(dev).with_policy(ShrinkPolicy {
        keep_on_shrink: true,
        max_slack_bytes: Some(32 * size),
    });
    t.resize(&[1, 8, 8]).unwrap();
    let p = t.host_mut::<T>().unwrap().as_ptr() as usize;
    t.resize(&[1, 7, 8]).unwrap(); // slack 8 elements
    assert_eq!(t.host_mut::<T>().unwrap().as_ptr() as usize, p);
    t.resize(&[1, 1, 8]).unwrap(); // slack 56 elements > 32
    assert!(!t.has_storage());
    assert_eq!(t.host_mut::<T>().unwrap().len(), 8);
    assert_eq!(t.capacity_bytes(), 8 * size);
}

fn cannot_access_raw_data_when_empty(dev: &Device) {
    let t = Tensor::new(dev);
    assert_eq!(t.ndim(), 0);
    assert!(is_state(&t.host_bytes().unwrap_err()));
}

fn cannot_access_data_when_empty<T: Sample>(dev: &Device) {
    let mut t = Tensor::new(dev);
    assert!(is_state(&t.host::<T>().unwrap_err()));
    assert!(is_state(&t.device::<T>().unwrap_err()));
    assert!(is_state(&t.host_mut::<T>().unwrap_err()));
    // Shape but never written: lazy allocation, so no data to read yet.
    t.resize(&[3]).unwrap();
    assert!(is_state(&t.host::<T>().unwrap_err()));
}

// ----- Caffe2: TensorTest (untyped) -------------------------------------------------------------

#[test]
fn tensor_non_fundamental_type() {
    let mut t = Tensor::host_only();
    t.resize(&[2, 3, 4]).unwrap();
    let g = t.host_mut::<String>().unwrap();
    assert_eq!(g.len(), 24);
    assert!(g.iter().all(String::is_empty));
    drop(g);
    // Adopted strings move in, no copy; the tensor drops them.
    let words: Vec<String> = (0..24).map(|i| i.to_string()).collect();
    let first = words[0].as_ptr() as usize;
    t.adopt(words).unwrap();
    assert!(t.shares_data());
    assert_eq!(t.host::<String>().unwrap()[0].as_ptr() as usize, first);
    assert_eq!(t.host::<String>().unwrap()[23], "23");
}

#[test]
fn tensor_non_fundamental_type_copy() {
    let mut t = Tensor::new(&Device::cpu());
    t.resize(&[2, 3, 4]).unwrap();
    t.host_mut::<String>()
        .unwrap()
        .iter_mut()
        .for_each(|s| *s = "filled".into());
    let clone = t.clone_deep().unwrap();
    let mut copy = Tensor::host_only();
    copy.copy_from(&t).unwrap();
    assert!(clone
        .host::<String>()
        .unwrap()
        .iter()
        .all(|s| s == "filled"));
    t.host_mut::<String>().unwrap()[0] = "changed".into();
    for c in [&clone, &copy] {
        assert!(
            c.host::<String>().unwrap().iter().all(|s| s == "filled"),
            "deep copy"
        );
    }
    assert_eq!(clone.dims(), &[2, 3, 4]);
}

#[test]
fn tensor_64bit_dimension() {
    let big = 1usize << 31;
    let mut t = Tensor::new(&Device::cpu());
    t.resize(&[big]).unwrap();
    assert_eq!(
        (t.ndim(), t.dim(0).unwrap(), t.numel()),
        (1, big, Some(big))
    );
    // The type without the 2 GiB allocation (allocation is lazy; the allocation part is skipped).
    t.set_dtype(DType::U8).unwrap();
    assert_eq!((t.nbytes(), t.itemsize()), (big, Some(1)));
    assert!(!t.synced().unwrap().host_allocated());
    t.resize(&[big, 100]).unwrap();
    assert_eq!(
        (t.ndim(), t.dims(), t.numel()),
        (2, &[big, 100][..], Some(big * 100))
    );
    assert_eq!(t.nbytes(), big * 100);
}

#[test]
fn cannot_cast_down_large_dims() {
    let mut t = Tensor::host_only();
    t.resize(&[1 << 31]).unwrap();
    assert_eq!(t.dim(0).unwrap(), 1 << 31);
    assert!(matches!(t.dim32(0), Err(Error::SizeOverflow { .. })));
    t.resize(&[i32::MAX as usize, i32::MAX as usize - 1])
        .unwrap();
    assert!(
        t.dim32(0).is_err(),
        "i32::MAX itself is rejected, as in Caffe2"
    );
    assert_eq!(t.dim32(1).unwrap(), i32::MAX - 1);
    assert!(matches!(t.dim32(2), Err(Error::OutOfBounds { .. })));
}

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
    assert_eq!(t.copy_stats().total_count(), 0);
    let want = [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0];
    assert_eq!(t.device::<i32>().unwrap().to_vec().unwrap(), want);
    assert_eq!(&*t.host::<i32>().unwrap(), &want);
    assert_eq!(t.copy_stats().device_to_host.count, 1);
}

fn reserve_keeps_data(dev: &Device) {
    let mut t = Tensor::from_slice(&[2, 3], &[1u16, 2, 3, 4, 5, 6], Some(dev)).unwrap();
    t.set_policy(ShrinkPolicy {
        keep_on_shrink: false,
        max_slack_bytes: Some(0),
    });
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

macro_rules! typed_tests {
    ($($name:ident => $f:ident),* $(,)?) => {$( fn $name(dev: &Device) { typed!($f, dev) } )*};
}
typed_tests! {
    typed_initialized_empty => initialized_empty,
    typed_initialized_non_empty => initialized_non_empty,
    typed_initialized_zero_dim => initialized_zero_dim,
    typed_resize_zero_dim => resize_zero_dim,
    typed_initialized_scalar => initialized_scalar,
    typed_share_data => share_data,
    typed_share_data_raw_pointer => share_data_raw_pointer,
    typed_share_data_different_shapes => share_data_different_shapes,
    typed_no_longer_shares_after_resize => no_longer_shares_after_resize,
    typed_no_longer_shares_after_free_memory => no_longer_shares_after_free_memory,
    typed_keep_on_shrink => keep_on_shrink,
    typed_max_keep_on_shrink => max_keep_on_shrink,
    typed_cannot_access_data_when_empty => cannot_access_data_when_empty,
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
    assert_eq!(b.copy_stats().host_to_device.count, 1);
    // opencl (head at device) -> cpu: exactly one device-to-host copy, from the source.
    let mut c = Tensor::new(&cl);
    c.resize(&[1000]).unwrap();
    c.device_overwrite::<f32>().unwrap().write(&vals).unwrap();
    let mut d = Tensor::new(&cpu);
    d.copy_from(&c).unwrap();
    let s = c.copy_stats();
    assert_eq!((s.device_to_host.count, s.host_to_device.count), (1, 0));
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
    assert_eq!(f.copy_stats().device_to_host.count, 1);
    // opencl -> host-only and back.
    let mut h = Tensor::host_only();
    h.copy_from(&f).unwrap();
    let mut g = Tensor::new(&cl);
    g.copy_from(&h).unwrap();
    assert_eq!(g.device::<f32>().unwrap().to_vec().unwrap(), vals);
    assert_eq!(
        f.copy_stats().total_count(),
        1,
        "f was already synced: no new copy"
    );
}

// ----- Queries and messages ----------------------------------------------------------------------

#[test]
fn dims_queries() {
    let t = Tensor::with_shape(&[2, 3, 5, 7], DType::F32, None).unwrap();
    assert_eq!(t.size_from_dim(1), 105);
    assert_eq!(t.size_from_dim(9), 1);
    assert_eq!(t.size_to_dim(2).unwrap(), 6);
    assert_eq!(t.size_to_dim(4).unwrap(), 210);
    assert!(t.size_to_dim(5).is_err());
    assert_eq!(t.size_between_dims(0, 3).unwrap(), 15);
    assert_eq!(t.size_between_dims(3, 0).unwrap(), 15);
    assert!(t.size_between_dims(1, 4).is_err() && t.size_between_dims(4, 1).is_err());
    assert_eq!(t.canonical_axis_index(-1).unwrap(), 3);
    assert_eq!(t.canonical_axis_index(-4).unwrap(), 0);
    assert!(t.canonical_axis_index(4).is_err() && t.canonical_axis_index(-5).is_err());
    assert!(matches!(t.dim(4), Err(Error::OutOfBounds { .. })));
    assert_eq!((t.nbytes(), t.itemsize()), (840, Some(4)));
    assert_eq!(Tensor::host_only().nbytes(), 0);
}

#[test]
fn type_mismatch_names_both_types() {
    let t = Tensor::from_slice(&[2], &[1i32, 2], None).unwrap();
    let e = t.host::<f32>().unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("f32") && msg.contains("i32"), "{msg}");
    let e = Tensor::from_slice(&[3], &[1u8, 2], None).unwrap_err();
    assert!(matches!(e, Error::SizeMismatch { .. }), "{e}");
}

#[test]
fn reshape_keeps_count_and_storage() {
    let mut t = Tensor::from_slice(&[2, 3], &[1u8, 2, 3, 4, 5, 6], None).unwrap();
    let s = storage(&t);
    t.reshape(&[3, 2]).unwrap();
    assert_eq!((t.dims(), storage(&t)), (&[3, 2][..], s));
    let e = t.reshape(&[4, 2]).unwrap_err();
    assert!(e.to_string().contains("resize"), "{e}");
    assert!(t.reshape(&[]).is_err(), "a scalar needs size 1");
}

#[test]
fn adopt_bytes_checks_alignment_and_length() {
    struct Words(Vec<u32>);
    impl AsMut<[u8]> for Words {
        fn as_mut(&mut self) -> &mut [u8] {
            bytemuck::cast_slice_mut(&mut self.0)
        }
    }
    struct Skewed(Vec<u32>);
    impl AsMut<[u8]> for Skewed {
        fn as_mut(&mut self) -> &mut [u8] {
            &mut bytemuck::cast_slice_mut(&mut self.0)[1..9]
        }
    }
    let mut t = Tensor::new(&Device::cpu());
    t.resize(&[2]).unwrap();
    let short = t.adopt_bytes(DType::F32, vec![0u8; 7]).unwrap_err();
    assert!(matches!(short, Error::SizeMismatch { .. }), "{short}");
    assert!(is_state(
        &t.adopt_bytes(DType::F32, Skewed(vec![0; 3])).unwrap_err()
    ));
    assert!(is_state(
        &t.adopt_bytes(DType::String, vec![0u8; 48]).unwrap_err()
    ));
    assert_eq!(t.dtype(), None, "failed adoptions change nothing");
    t.adopt_bytes(DType::F32, Words(vec![1.0f32.to_bits(), 2.0f32.to_bits()]))
        .unwrap();
    assert_eq!(&*t.host::<f32>().unwrap(), &[1.0, 2.0]);
    assert_eq!(t.device::<f32>().unwrap().to_vec().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn debug_output() {
    let mut t = Tensor::new(&Device::cpu()).with_label("w");
    assert!(t.debug_string().contains("uninitialised"));
    t.resize(&[2, 3]).unwrap();
    drop(t.host_mut::<f32>().unwrap());
    let s = t.debug_string();
    assert!(
        s.contains("w") && s.contains("f32") && s.contains("[2, 3]") && s.contains("24"),
        "{s}"
    );
    assert!(format!("{t:?}").contains("F32"));
}

per_device!(
    tensor_change_type,
    typed_initialized_empty,
    typed_initialized_non_empty,
    typed_initialized_zero_dim,
    typed_resize_zero_dim,
    typed_initialized_scalar,
    typed_share_data,
    typed_share_data_raw_pointer,
    cannot_share_data_when_shape_not_set,
    typed_share_data_different_shapes,
    typed_no_longer_shares_after_resize,
    typed_no_longer_shares_after_free_memory,
    typed_keep_on_shrink,
    typed_max_keep_on_shrink,
    cannot_access_raw_data_when_empty,
    typed_cannot_access_data_when_empty,
    extend_amortised,
    extend_keeps_device_data,
    reserve_keeps_data,
    shrink_keeps_memory,
    copy_from_same_device,
    swap_exchanges_everything_but_label,
    bool_bytes_are_validated,
    string_tensor_has_no_device_view,
    pitfall_share_data_checks_before_changing_dtype,
    pitfall_no_stale_capacity_after_share,
    pitfall_copy_constructor_is_not_shallow,
    pitfall_copy_from_across_types_reallocates,
    pitfall_shares_data_cleared_on_detach,
);
