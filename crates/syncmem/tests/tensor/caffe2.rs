//! Caffe2's tensor tests (blob_test.cc / blob_gpu_test.cc), typed over several element types.

use syncmem::dtype::DType;
use syncmem::tensor::{ShrinkPolicy, Tensor};
use syncmem::{Device, Error};

use super::{host_ptr, is_state, samples, storage, Sample};

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
    t.set_policy(ShrinkPolicy::default().with_keep_on_shrink(false));
    t.resize(&[1, 2, 4]).unwrap();
    assert!(!t.has_storage());
}

fn max_keep_on_shrink<T: Sample>(dev: &Device) {
    let size = T::DTYPE.size();
    let mut t =
        Tensor::new(dev).with_policy(ShrinkPolicy::default().with_max_slack_bytes(Some(32 * size)));
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

syncmem::for_each_device!(
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
);
