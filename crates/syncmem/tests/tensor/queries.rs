//! Queries and messages.

use syncmem::dtype::DType;
use syncmem::tensor::Tensor;
use syncmem::{Device, Error};

use super::{is_state, storage};

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
