//! The type-erased Blob against Caffe2's blob_test.cc (its BlobTest rows),
//! plus the Rust-specific behaviour: take, shared objects and get_mut, swap, mem::take.

use std::sync::{Arc, Mutex};

use syncmem::blob::Blob;
use syncmem::Error;

#[derive(Debug, Default, PartialEq)]
struct BlobTestFoo {
    val: i32,
}

#[derive(Debug, Default)]
struct BlobTestBar;

#[test]
fn blob() {
    let mut blob = Blob::new();
    let (int_unused, _) = blob.get_or_insert_default::<i32>().unwrap();
    *int_unused = 0;
    assert!(blob.is_type::<i32>());
    assert!(!blob.is_type::<BlobTestFoo>());
    let (foo_unused, _) = blob.get_or_insert_default::<BlobTestFoo>().unwrap();
    foo_unused.val = 1;
    assert!(!blob.is_type::<i32>());
    assert!(blob.is_type::<BlobTestFoo>());
    assert_eq!(blob.get::<BlobTestFoo>().unwrap().val, 1);
}

#[test]
fn blob_new_object_flag() {
    let mut blob = Blob::new();
    assert!(blob.get_or_insert_default::<i32>().unwrap().1);
    assert!(!blob.get_or_insert_default::<i32>().unwrap().1);
    assert!(blob.get_or_insert_default::<BlobTestFoo>().unwrap().1);
    assert!(!blob.get_or_insert_default::<BlobTestFoo>().unwrap().1);
}

#[test]
fn blob_uninitialized() {
    let blob = Blob::new();
    assert!(blob.is_empty());
    assert_eq!(blob.type_name(), None);
    let e = blob.get::<i32>().unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("i32") && e.to_string().contains("empty"),
        "{e}"
    );
}

#[test]
fn blob_wrong_type() {
    let mut blob = Blob::new();
    blob.get_or_insert_default::<BlobTestFoo>().unwrap();
    assert_eq!(blob.get::<BlobTestFoo>().unwrap(), &BlobTestFoo::default());
    assert!(blob.get::<i32>().is_err());
    assert!(blob.get_mut::<i32>().is_err());
    assert!(blob.take::<i32>().is_err());
    assert!(
        blob.is_type::<BlobTestFoo>(),
        "a failed access changes nothing"
    );
}

#[test]
fn blob_reset() {
    let mut blob = Blob::new();
    let foo = blob.reset(BlobTestFoo { val: 3 });
    foo.val += 1;
    assert_eq!(blob.get::<BlobTestFoo>().unwrap().val, 4);
    blob.reset_empty();
    assert!(blob.is_empty());
    blob.reset_empty();
}

#[test]
fn blob_move() {
    let mut blob1 = Blob::new();
    let p: *const BlobTestFoo = blob1.reset(BlobTestFoo { val: 9 });
    // Move assignment: the old holder is left empty (std::mem::take), the object keeps its
    // address, and the target's previous object is dropped, not leaked (Caffe2's 2018 bug).
    let dropped = Arc::new(());
    let mut blob2 = Blob::new();
    blob2.reset(dropped.clone());
    blob2 = std::mem::take(&mut blob1);
    assert_eq!(
        Arc::strong_count(&dropped),
        1,
        "the previous object was dropped"
    );
    assert!(blob1.get::<BlobTestFoo>().is_err());
    assert!(blob1.is_empty());
    assert!(std::ptr::eq(blob2.get::<BlobTestFoo>().unwrap(), p));
    // Move construction.
    let blob3 = blob2;
    assert!(std::ptr::eq(blob3.get::<BlobTestFoo>().unwrap(), p));
}

#[test]
fn blob_share_external_pointer() {
    let foo = Arc::new(BlobTestFoo { val: 5 });
    let mut blob = Blob::new();
    let held: *const BlobTestFoo = blob.share(foo.clone());
    assert!(
        std::ptr::eq(held, Arc::as_ptr(&foo)),
        "the blob holds the caller's object"
    );
    assert!(blob.is_type::<BlobTestFoo>());
    assert!(blob.is_shared());
    assert_eq!(Arc::strong_count(&foo), 2);
    blob.reset_empty();
    assert_eq!(
        Arc::strong_count(&foo),
        1,
        "reset dropped only the blob's reference"
    );
    assert_eq!(foo.val, 5, "the object is alive");
}

#[test]
fn blob_share_external_object() {
    // Caffe2 shares a stack object; in Rust an object the blob does not own is an Arc.
    let foo = Arc::new(BlobTestFoo { val: 6 });
    let mut blob = Blob::new();
    blob.share(Arc::clone(&foo));
    assert!(std::ptr::eq(
        blob.get::<BlobTestFoo>().unwrap(),
        Arc::as_ptr(&foo)
    ));
    assert!(Arc::ptr_eq(
        &blob.get_shared::<BlobTestFoo>().unwrap(),
        &foo
    ));
    drop(blob);
    assert_eq!(Arc::strong_count(&foo), 1);
    assert_eq!(foo.val, 6);
}

#[test]
fn casting_message() {
    let mut blob = Blob::new();
    blob.get_or_insert_default::<BlobTestFoo>().unwrap();
    let e = blob.get::<BlobTestBar>().unwrap_err();
    let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
    assert!(first_line.contains("BlobTestFoo"), "{first_line}");
    assert!(first_line.contains("BlobTestBar"), "{first_line}");
}

// ----- Beyond Caffe2's tests ----------------------------------------------------------------

#[test]
fn take_moves_out_and_leaves_empty() {
    let mut blob = Blob::new();
    blob.reset(String::from("weights"));
    assert_eq!(blob.type_name(), Some(std::any::type_name::<String>()));
    assert_eq!(blob.take::<String>().unwrap(), "weights");
    assert!(blob.is_empty());
    assert!(blob.take::<String>().is_err());
}

#[test]
fn shared_object_is_read_only_while_others_hold_it() {
    let foo = Arc::new(BlobTestFoo { val: 1 });
    let mut blob = Blob::new();
    blob.share(foo.clone());
    let e = blob.get_mut::<BlobTestFoo>().unwrap_err();
    assert!(e.to_string().contains("shared with 1 other"), "{e}");
    assert!(blob.get_or_insert_default::<BlobTestFoo>().is_err());
    assert!(blob.take::<BlobTestFoo>().is_err());
    assert!(
        blob.is_type::<BlobTestFoo>(),
        "still held after the failed take"
    );
    assert!(blob.get_shared::<i32>().is_err());
    drop(foo);
    blob.get_mut::<BlobTestFoo>().unwrap().val = 2; // the last reference: mutable again
    assert_eq!(blob.take::<BlobTestFoo>().unwrap(), BlobTestFoo { val: 2 });
    // Shared mutation goes through a Mutex.
    let m = Arc::new(Mutex::new(0));
    blob.share(m.clone());
    *blob.get::<Mutex<i32>>().unwrap().lock().unwrap() = 7;
    assert_eq!(*m.lock().unwrap(), 7);
    let mut owned = Blob::new();
    owned.reset(1u8);
    assert!(
        owned.get_shared::<u8>().is_err(),
        "an owned object is not shared"
    );
}

#[test]
fn swap_exchanges_contents() {
    let (mut a, mut b) = (Blob::new(), Blob::new());
    a.reset(1i64);
    b.share(Arc::new(String::from("x")));
    a.swap(&mut b);
    assert!(a.is_shared() && a.is_type::<String>());
    assert_eq!(*b.get::<i64>().unwrap(), 1);
    let s = format!("{a:?}");
    assert!(s.contains("String") && s.contains("shared: true"), "{s}");
}

#[test]
fn blob_is_send_and_sync_across_threads() {
    let mut blob = Blob::new();
    blob.reset(vec![1u32, 2, 3]);
    let blob = Arc::new(blob);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let blob = blob.clone();
            s.spawn(move || assert_eq!(blob.get::<Vec<u32>>().unwrap().len(), 3));
        }
    });
}
