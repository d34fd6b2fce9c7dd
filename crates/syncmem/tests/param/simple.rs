//! Caffe's BlobSimpleTest.

use syncmem::kernels::Float;
use syncmem::param::{ParamBlob, ProtoShape};
use syncmem::Device;

use super::blob;

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

typed! {
    simple_initialization => simple_initialization_f32, simple_initialization_f64;
    simple_pointers_cpu_gpu => simple_pointers_cpu_gpu_f32, simple_pointers_cpu_gpu_f64;
    simple_reshape => simple_reshape_f32, simple_reshape_f64;
    simple_reshape_zero => simple_reshape_zero_f32, simple_reshape_zero_f64;
    simple_legacy_blob_proto_shape_equals =>
        simple_legacy_blob_proto_shape_equals_f32, simple_legacy_blob_proto_shape_equals_f64;
}

syncmem::for_each_device!(
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
);
