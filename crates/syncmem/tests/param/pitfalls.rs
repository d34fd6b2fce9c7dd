//! One test per fixed Caffe pitfall.

use syncmem::param::MAX_AXES;
use syncmem::{Device, Error, Head};

use super::blob;

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

syncmem::for_each_device!(
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
