//! Which blobs a save writes and a load fills, and the errors that name a blob.

use std::sync::Arc;

use syncmem::dtype::DType;
use syncmem::tensor::Tensor;
use syncmem::workspace::Workspace;
use syncmem::{Device, Error};

use super::{tensor_values, TempFile};

#[test]
fn string_tensor_is_an_error_naming_the_blob() {
    let file = TempFile::new("strings");
    let ws = Workspace::new();
    ws.create_blob("words")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[2], &["a".to_string(), "b".to_string()], None).unwrap());
    ws.create_tensor("x", &[1], DType::F32, None).unwrap();
    for names in [None, Some(&["words"][..]), Some(&["x", "words"][..])] {
        let e = ws.save(file.path(), names).unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("blob \"words\"") && msg.contains("String"),
            "{msg}"
        );
        // A failed save writes nothing.
        assert!(!file.path().exists());
    }
    assert_eq!(ws.save(file.path(), Some(&["x"])).unwrap(), ["x"]);
}

#[test]
fn unsaveable_tensors_are_errors_naming_the_blob() {
    let file = TempFile::new("unsaveable");
    let cases: Vec<(&str, Tensor)> = vec![
        ("uninit", Tensor::new(&Device::cpu())),
        ("untyped", {
            let mut t = Tensor::host_only();
            t.resize(&[3]).unwrap();
            t
        }),
        ("untyped_empty", {
            let mut t = Tensor::host_only();
            t.resize(&[0, 2]).unwrap();
            t
        }),
    ];
    for (name, t) in cases {
        let ws = Workspace::new();
        ws.create_blob(name).unwrap().write().reset(t);
        let e = ws.save(file.path(), None).unwrap_err();
        assert!(matches!(e, Error::InvalidState { .. }), "{name}: {e}");
        assert!(e.to_string().contains(&format!("blob {name:?}")), "{e}");
    }
    // A typed tensor that was never written saves as zeros (it reads as zeros).
    let ws = Workspace::new();
    ws.create_tensor("zeros", &[2], DType::I16, Some(&Device::cpu()))
        .unwrap();
    ws.save(file.path(), None).unwrap();
    let back = Workspace::new();
    back.load(file.path(), None, None).unwrap();
    assert_eq!(tensor_values::<i16>(&back, "zeros"), [0, 0]);
    // A bool tensor holding a byte that is not 0 or 1 is not saved.
    let ws = Workspace::new();
    let mut t = Tensor::from_slice(&[2], &[true, false], None).unwrap();
    t.host_bytes_mut().unwrap()[1] = 9;
    ws.create_blob("flags").unwrap().write().reset(t);
    let e = ws.save(file.path(), None).unwrap_err();
    assert!(e.to_string().contains("blob \"flags\""), "{e}");
    // The name the format reserves.
    let ws = Workspace::new();
    ws.create_tensor("__metadata__", &[1], DType::U8, None)
        .unwrap();
    let e = ws.save(file.path(), None).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
}

#[test]
fn save_all_includes_parent_and_forwarded_blobs() {
    let file = TempFile::new("parent");
    let parent = Arc::new(Workspace::new());
    parent
        .create_blob("p")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[2], &[1_i64, 2], None).unwrap());
    let other = Arc::new(Workspace::new());
    other
        .create_blob("o")
        .unwrap()
        .write()
        .reset(Tensor::scalar(9.5_f64, None).unwrap());
    let child = Workspace::with_parent(parent.clone());
    child
        .add_blob_mapping(&other, [("fwd", "o")], false)
        .unwrap();
    // The parent's blob under a second name: the same blob is read twice in one save.
    child
        .add_blob_mapping(&parent, [("alias", "p")], false)
        .unwrap();
    child.create_tensor("c", &[1], DType::U32, None).unwrap();
    assert_eq!(
        child.save(file.path(), None).unwrap(),
        ["alias", "c", "fwd", "p"]
    );
    let back = Workspace::new();
    back.load(file.path(), None, None).unwrap();
    assert_eq!(tensor_values::<i64>(&back, "alias"), [1, 2]);
    assert_eq!(tensor_values::<i64>(&back, "p"), [1, 2]);
    assert_eq!(tensor_values::<f64>(&back, "fwd"), [9.5]);
    back.with_tensor("fwd", |t| {
        assert_eq!(t.dims(), [] as [usize; 0]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn load_fills_the_blobs_create_blob_gives() {
    let file = TempFile::new("create-blob");
    let src = Workspace::new();
    src.create_blob("w")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[1], &[4_u16], None).unwrap());
    src.create_blob("gone")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[1], &[5_u16], None).unwrap());
    src.save(file.path(), None).unwrap();

    // A blob of the parent visible in the child is the one replaced (Caffe2's CreateBlob),
    // whatever it held.
    let parent = Arc::new(Workspace::new());
    parent
        .create_blob("w")
        .unwrap()
        .write()
        .reset(String::from("old"));
    let child = Workspace::with_parent(parent.clone());
    child.load(file.path(), None, Some(&["w"])).unwrap();
    assert!(child.local_blobs().is_empty());
    assert_eq!(tensor_values::<u16>(&parent, "w"), [4]);

    // A name forwarded to a parent blob that was removed: an error, and nothing is loaded.
    let fwd_parent = Arc::new(Workspace::new());
    fwd_parent.create_blob("gone").unwrap();
    let fwd = Workspace::with_forwarded(fwd_parent.clone(), [("gone", "gone")]).unwrap();
    fwd_parent.remove_blob("gone");
    let e = fwd.load(file.path(), None, None).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(fwd.local_blobs().is_empty());
    assert!(!fwd.has_blob("w"));
}
