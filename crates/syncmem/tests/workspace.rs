//! Caffe2's workspace_test.cc, plus rename, listing, forwarding checks and threads.

use std::sync::Arc;

use syncmem::workspace::Workspace;
use syncmem::Error;

#[derive(Default)]
struct WorkspaceTestFoo;

#[test]
fn blob_access() {
    let ws = Workspace::new();
    assert!(!ws.has_blob("nonexisting"));
    assert!(matches!(
        ws.get_blob("nonexisting"),
        Err(Error::NotFound { .. })
    ));
    assert!(ws.try_get_blob("newblob").is_none());
    let b = ws.create_blob("newblob").unwrap();
    assert!(ws.has_blob("newblob"));
    assert!(ws.try_get_blob("newblob").is_some());
    assert!(!ws.has_blob("nonexisting"));
    b.write().get_or_insert_default::<i32>().unwrap();
    assert!(b.read().is_type::<i32>());
    assert!(!b.read().is_type::<WorkspaceTestFoo>());
    assert!(b.read().get::<i32>().is_ok());
    // Creating again keeps the content.
    let again = ws.create_blob("newblob").unwrap();
    assert!(Arc::ptr_eq(&b, &again));
    assert!(again.read().is_type::<i32>());
    let local = ws.create_local_blob("newblob").unwrap();
    assert!(Arc::ptr_eq(&b, &local));
    assert!(local.read().is_type::<i32>());
    assert!(!ws.remove_blob("nonexisting"));
    assert!(ws.remove_blob("newblob"));
    assert!(!ws.has_blob("newblob"));
}

#[test]
fn missing_blob_error_names_it() {
    let e = Workspace::new().get_blob("weights").unwrap_err();
    assert!(e.to_string().contains("\"weights\""), "{e}");
}

#[test]
fn sharing() {
    let parent = Arc::new(Workspace::new());
    let pa = parent.create_blob("a").unwrap();
    let child = Workspace::with_parent(parent.clone());
    assert!(child.has_blob("a"));
    assert!(Arc::ptr_eq(&child.get_blob("a").unwrap(), &pa));
    child.create_blob("b").unwrap();
    assert!(!parent.has_blob("b"));
    let pb = parent.create_blob("b").unwrap();
    assert!(!Arc::ptr_eq(&child.get_blob("b").unwrap(), &pb));
    // CreateBlob returns the parent's blob, CreateLocalBlob hides it.
    assert!(Arc::ptr_eq(&child.create_blob("a").unwrap(), &pa));
    let ca = child.create_local_blob("a").unwrap();
    assert!(!Arc::ptr_eq(&ca, &pa));
    assert!(Arc::ptr_eq(&child.get_blob("a").unwrap(), &ca));
}

#[test]
fn blob_mapping() {
    let parent = Arc::new(Workspace::new());
    parent.create_blob("a").unwrap();
    let child = Workspace::with_forwarded(parent.clone(), [("inner_a", "a")]).unwrap();
    assert!(!child.has_blob("a"));
    assert!(child.has_blob("inner_a"));
    assert!(child.try_get_blob("inner_a").is_some());
    let ws = Arc::new(Workspace::new());
    ws.create_blob("b").unwrap();
    child
        .add_blob_mapping(&ws, [("inner_b", "b")], false)
        .unwrap();
    assert!(!child.has_blob("b"));
    assert!(child.has_blob("inner_b"));
    assert!(child.try_get_blob("inner_b").is_some());
}

#[test]
fn forwarding_checks_targets_and_redefinitions() {
    let parent = Arc::new(Workspace::new());
    parent.create_blob("a").unwrap();
    parent.create_blob("b").unwrap();
    assert!(matches!(
        Workspace::with_forwarded(parent.clone(), [("x", "missing")]),
        Err(Error::NotFound { .. })
    ));
    let child = Workspace::with_forwarded(parent.clone(), [("x", "a")]).unwrap();
    // The same mapping again is fine; another target is a redefinition.
    child
        .add_blob_mapping(&parent, [("x", "a")], false)
        .unwrap();
    let e = child
        .add_blob_mapping(&parent, [("x", "b")], false)
        .unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    // A visible local name: error without skip, skipped with it.
    child.create_local_blob("y").unwrap();
    assert!(child
        .add_blob_mapping(&parent, [("y", "b")], false)
        .is_err());
    child.add_blob_mapping(&parent, [("y", "b")], true).unwrap();
    assert!(!child.is_forwarded("y"));
    // A failed call adds nothing.
    assert!(child
        .add_blob_mapping(&parent, [("z", "b"), ("w", "missing")], false)
        .is_err());
    assert!(!child.has_blob("z"));
}

#[test]
fn pitfall_create_on_dangling_forward_is_an_error() {
    let parent = Arc::new(Workspace::new());
    parent.create_blob("a").unwrap();
    let child = Workspace::with_forwarded(parent.clone(), [("inner", "a")]).unwrap();
    assert!(parent.remove_blob("a"));
    assert!(!child.has_blob("inner"));
    let e = child.create_blob("inner").unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("\"a\""), "{e}");
}

#[test]
fn pitfall_blobs_lists_each_name_once() {
    let parent = Arc::new(Workspace::new());
    parent.create_blob("a").unwrap();
    parent.create_blob("p").unwrap();
    let child = Workspace::with_parent(parent.clone());
    child.create_local_blob("a").unwrap();
    child.create_blob("c").unwrap();
    assert_eq!(child.blobs(), vec!["a", "c", "p"]);
    assert_eq!(child.local_blobs(), vec!["a", "c"]);
}

#[test]
fn rename_keeps_the_blob_and_checks_names() {
    let parent = Arc::new(Workspace::new());
    parent.create_blob("taken").unwrap();
    let ws = Workspace::with_parent(parent);
    let b = ws.create_blob("old").unwrap();
    b.write().reset(5_u8);
    let r = ws.rename_blob("old", "new").unwrap();
    assert!(Arc::ptr_eq(&b, &r));
    assert!(!ws.has_blob("old"));
    assert_eq!(*ws.get_blob("new").unwrap().read().get::<u8>().unwrap(), 5);
    let e = ws.rename_blob("missing", "x").unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let e = ws.rename_blob("new", "taken").unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    assert!(e.to_string().contains("taken"), "{e}");
    // Only local blobs can be renamed.
    assert!(ws.rename_blob("taken", "mine").is_err());
}

#[test]
fn removing_a_blob_keeps_it_alive_for_holders() {
    let ws = Workspace::new();
    let b = ws.create_blob("x").unwrap();
    b.write().reset(String::from("held"));
    assert!(ws.remove_blob("x"));
    assert_eq!(b.read().get::<String>().unwrap(), "held");
}

#[test]
fn distinct_blobs_in_parallel_same_blob_protected() {
    let ws = Arc::new(Workspace::new());
    let counter = ws.create_blob("counter").unwrap();
    counter.write().reset(0_u64);
    std::thread::scope(|s| {
        for t in 0..8 {
            let ws = ws.clone();
            s.spawn(move || {
                let mine = ws.create_blob(&format!("t{t}")).unwrap();
                for i in 0..1000_u64 {
                    mine.write().reset(i);
                    let shared = ws.get_blob("counter").unwrap();
                    let mut g = shared.write();
                    *g.get_mut::<u64>().unwrap() += 1;
                }
                assert_eq!(*mine.read().get::<u64>().unwrap(), 999);
            });
        }
    });
    assert_eq!(*counter.read().get::<u64>().unwrap(), 8000);
    assert_eq!(ws.local_blobs().len(), 9);
}

#[test]
fn copy_forwarded_makes_local_deep_copies() {
    let parent = Arc::new(Workspace::new());
    parent
        .create_blob("w")
        .unwrap()
        .write()
        .reset(vec![1.0_f32, 2.0]);
    parent
        .create_blob("s")
        .unwrap()
        .write()
        .reset(String::from("x"));
    let child = Workspace::with_forwarded(parent.clone(), [("w", "w"), ("s", "s")]).unwrap();
    // Wrong type: error naming both types, mapping kept.
    let e = child
        .copy_forwarded::<Vec<f32>, _>(&["s"], |v| Ok(v.clone()))
        .unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    assert!(child.is_forwarded("s"));
    child
        .copy_forwarded::<Vec<f32>, _>(&["w", "not-forwarded"], |v| Ok(v.clone()))
        .unwrap();
    assert!(!child.is_forwarded("w"));
    assert_eq!(child.local_blobs(), vec!["w"]);
    child
        .get_blob("w")
        .unwrap()
        .write()
        .get_mut::<Vec<f32>>()
        .unwrap()[0] = 9.0;
    assert_eq!(
        parent
            .get_blob("w")
            .unwrap()
            .read()
            .get::<Vec<f32>>()
            .unwrap()[0],
        1.0
    );
}
