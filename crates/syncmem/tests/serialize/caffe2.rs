//! Caffe2's blob_test.cc serialisation tests, checking the *loaded* blob.

use syncmem::tensor::Tensor;
use syncmem::workspace::{io, Workspace};
use syncmem::Device;

use super::TempFile;
use crate::interop::Elem;

// ----- Caffe2 blob_test.cc, checking the loaded blob ---------------------------------------

/// TensorTest.TensorSerialization_<T>: a 2x3 tensor 0..5 in blob "test", saved, loaded into a
/// new workspace; the *loaded* blob holds a tensor of T with dims (2, 3) and values 0..5.
/// (Caffe2's test read the values back from the original blob.)
fn tensor_serialization<T: Elem>(dev: &Device) {
    let file = TempFile::new("caffe2");
    let ws = Workspace::new();
    ws.create_tensor("test", &[2, 3], T::DTYPE, Some(dev))
        .unwrap();
    let values: Vec<T> = (0..6).map(T::from_index).collect();
    ws.with_tensor_mut("test", |t| {
        t.host_mut::<T>()?.copy_from_slice(&values);
        Ok(())
    })
    .unwrap();
    assert_eq!(ws.save(file.path(), Some(&["test"])).unwrap(), ["test"]);

    let info = io::inspect(file.path()).unwrap();
    assert_eq!(info.tensors.len(), 1);
    assert_eq!(info.tensors[0].name, "test");
    assert_eq!(info.tensors[0].element, Some(T::DTYPE));
    assert_eq!(info.tensors[0].nbytes, 6 * T::DTYPE.size());

    let new_ws = Workspace::new();
    new_ws.load(file.path(), Some(dev), None).unwrap();
    let new_blob = new_ws.get_blob("test").unwrap();
    let guard = new_blob.read();
    let loaded = guard.get::<Tensor>().unwrap();
    assert_eq!(loaded.dtype(), Some(T::DTYPE));
    assert_eq!(loaded.ndim(), 2);
    assert_eq!(loaded.dims(), [2, 3]);
    assert_eq!(loaded.host::<T>().unwrap().to_vec(), values);
    assert_eq!(loaded.device::<T>().unwrap().to_vec().unwrap(), values);
}

/// EmptyTensorTest.TensorSerialization_<T>: a 0x3 tensor typed through a write; the loaded
/// blob holds a tensor of T with dims (0, 3).
fn empty_tensor_serialization<T: Elem>(dev: &Device) {
    let file = TempFile::new("caffe2-empty");
    let ws = Workspace::new();
    let mut t = Tensor::new(dev);
    t.resize(&[0, 3]).unwrap();
    assert!(t.host_mut::<T>().unwrap().is_empty());
    ws.create_blob("test").unwrap().write().reset(t);
    ws.save(file.path(), None).unwrap();
    let info = io::inspect(file.path()).unwrap();
    assert_eq!(info.tensors[0].shape, [0, 3]);
    assert_eq!(info.tensors[0].nbytes, 0);

    let new_ws = Workspace::new();
    new_ws.load(file.path(), Some(dev), None).unwrap();
    new_ws
        .with_tensor("test", |t| {
            assert_eq!(t.dtype(), Some(T::DTYPE));
            assert_eq!(t.dims(), [0, 3]);
            assert_eq!(t.numel(), Some(0));
            assert!(t.host::<T>()?.is_empty());
            Ok(())
        })
        .unwrap();
}

macro_rules! caffe2_typed {
    ($($t:ty => $full:ident, $empty:ident;)*) => {$(
        fn $full(dev: &Device) {
            tensor_serialization::<$t>(dev)
        }
        fn $empty(dev: &Device) {
            empty_tensor_serialization::<$t>(dev)
        }
    )*};
}

caffe2_typed! {
    bool => tensor_serialization_bool, empty_tensor_serialization_bool;
    f64 => tensor_serialization_double, empty_tensor_serialization_double;
    f32 => tensor_serialization_float, empty_tensor_serialization_float;
    i32 => tensor_serialization_int, empty_tensor_serialization_int;
    i8 => tensor_serialization_int8, empty_tensor_serialization_int8;
    i16 => tensor_serialization_int16, empty_tensor_serialization_int16;
    u8 => tensor_serialization_uint8, empty_tensor_serialization_uint8;
    u16 => tensor_serialization_uint16, empty_tensor_serialization_uint16;
    i64 => tensor_serialization_int64, empty_tensor_serialization_int64;
}

/// TensorTest.float16: 3,000,000 f16 values with bits i % 10000, in one piece; the loaded
/// tensor has dims (N) and the same bits.
fn float16(dev: &Device) {
    const N: usize = 3_000_000;
    let file = TempFile::new("float16");
    let bits = |i: usize| (i % 10000) as u16;
    let values: Vec<half::f16> = (0..N).map(|i| half::f16::from_bits(bits(i))).collect();
    let ws = Workspace::new();
    ws.create_blob("test")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[N], &values, Some(dev)).unwrap());
    ws.save(file.path(), None).unwrap();
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().len() as usize,
        8 + io::inspect(file.path()).unwrap().header_bytes as usize + 2 * N
    );
    let new_ws = Workspace::new();
    new_ws.load(file.path(), Some(dev), None).unwrap();
    new_ws
        .with_tensor("test", |t| {
            assert_eq!(t.dims(), [N]);
            let host = t.host::<half::f16>()?;
            assert!(host.iter().enumerate().all(|(i, v)| v.to_bits() == bits(i)));
            Ok(())
        })
        .unwrap();
}

syncmem::for_each_device!(
    tensor_serialization_bool,
    tensor_serialization_double,
    tensor_serialization_float,
    tensor_serialization_int,
    tensor_serialization_int8,
    tensor_serialization_int16,
    tensor_serialization_uint8,
    tensor_serialization_uint16,
    tensor_serialization_int64,
    empty_tensor_serialization_bool,
    empty_tensor_serialization_double,
    empty_tensor_serialization_float,
    empty_tensor_serialization_int,
    empty_tensor_serialization_int8,
    empty_tensor_serialization_int16,
    empty_tensor_serialization_uint8,
    empty_tensor_serialization_uint16,
    empty_tensor_serialization_int64,
    float16,
);
