//! A thread never waits for a guard it holds itself: an access that conflicts with a guard of
//! the same thread (on the same buffer, or through another tensor sharing the storage) returns
//! `Error::Busy` naming both sides, where it used to wait forever. Guards of other threads are
//! still waited for.

use std::sync::mpsc;
use std::thread;

use syncmem::tensor::Tensor;
use syncmem::{Device, Error, SyncedMemory};

/// Asserts a `Busy` error whose message names all of `names`.
fn busy<T>(r: syncmem::Result<T>, names: &[&str]) {
    match r {
        Err(e @ Error::Busy { .. }) => {
            let text = e.to_string();
            for n in names {
                assert!(text.contains(n), "{n:?} missing from: {text}");
            }
            assert!(text.contains("deadlock"), "{text}");
        }
        Err(e) => panic!("expected Busy naming {names:?}, got the error {e}"),
        Ok(_) => panic!("expected Busy naming {names:?}, got a guard"),
    }
}

fn synced_memory_never_waits_for_its_own_thread(dev: &Device) {
    let m = SyncedMemory::new(64, dev).with_label("weights");
    m.host_mut().unwrap().fill(1);

    // A read guard held: every write access (and every exclusive operation) is refused.
    let r = m.host().unwrap();
    busy(m.host_mut(), &["weights", "read guard"]);
    busy(m.host_overwrite(), &["weights"]);
    busy(m.device_mut(), &["weights"]);
    busy(m.device_overwrite(), &["weights"]);
    busy(m.set_host_data(vec![0u8; 64]), &["weights"]);
    busy(m.take_device_data(), &["weights"]);
    // Reads share the lock.
    assert_eq!(m.host().unwrap()[0], 1);
    drop(m.device().unwrap());
    drop(r);

    // A write guard held: reads are refused too.
    let w = m.device_mut().unwrap();
    busy(m.host(), &["weights", "write guard"]);
    busy(m.device(), &["weights", "write guard"]);
    busy(m.host_mut(), &["weights", "write guard"]);
    busy(m.prefetch_to_host(None), &["weights"]);
    busy(m.prefetch_to_device(None), &["weights"]);
    // The try_ forms are unchanged.
    assert!(matches!(m.try_host(), Err(Error::Busy { .. })));
    drop(w);

    // Every guard is gone: everything works again, on this thread and on another.
    m.host_mut().unwrap().fill(2);
    let r = m.device().unwrap();
    drop(r);
    thread::scope(|s| {
        s.spawn(|| m.host_mut().unwrap().fill(3));
    });
    assert_eq!(m.host().unwrap()[0], 3);
}

/// A guard of another thread is waited for, as before: the blocking access returns once the
/// other thread drops it.
fn guards_of_other_threads_are_waited_for(dev: &Device) {
    let m = SyncedMemory::new(64, dev).with_label("shared");
    let (taken, wait_taken) = mpsc::channel();
    let (release, wait_release) = mpsc::channel::<()>();
    thread::scope(|s| {
        let m = &m;
        s.spawn(move || {
            let mut w = m.host_mut().unwrap();
            w.fill(5);
            taken.send(()).unwrap();
            wait_release.recv().unwrap();
            w.fill(6);
        });
        wait_taken.recv().unwrap();
        // The other thread holds the write guard: this is not Busy, it waits.
        assert!(matches!(m.try_host(), Err(Error::Busy { .. })));
        release.send(()).unwrap();
        assert_eq!(m.host().unwrap()[0], 6);
    });
}

/// The case of the report: a write view of a tensor while this thread holds a view of another
/// tensor that shares its storage.
fn tensors_sharing_storage_name_both_tensors(dev: &Device) {
    let mut w = Tensor::from_slice(&[4], &[1.0f32; 4], Some(dev))
        .unwrap()
        .with_label("w");
    let mut alias = Tensor::new(dev).with_label("w_alias");
    alias.resize(&[4]).unwrap();
    alias.share_data(&w).unwrap();

    let view = w.host::<f32>().unwrap();
    for e in [
        alias.host_mut::<f32>().map(drop),
        alias.host_overwrite::<f32>().map(drop),
        alias.device_mut::<f32>().map(drop),
        alias.host_bytes_mut().map(drop),
    ] {
        busy(e, &["tensor w_alias", "tensor w", "read guard"]);
    }
    assert_eq!(alias.host::<f32>().unwrap()[0], 1.0, "views share");
    drop(view);

    let mut dview = alias.device_mut::<f32>().unwrap();
    dview.write(&[2.0; 4]).unwrap();
    busy(
        w.host::<f32>().map(drop),
        &["tensor w ", "tensor w_alias", "write guard"],
    );
    busy(
        w.device::<f32>().map(drop),
        &["tensor w ", "tensor w_alias"],
    );
    busy(w.host_bytes().map(drop), &["tensor w ", "tensor w_alias"]);
    drop(dview);
    assert_eq!(&*w.host::<f32>().unwrap(), &[2.0; 4]);
    w.host_mut::<f32>().unwrap()[0] = 3.0;
    assert_eq!(alias.host::<f32>().unwrap()[0], 3.0);

    // copy_from into a tensor whose storage this thread reads through another tensor.
    let src = Tensor::from_slice(&[4], &[9.0f32; 4], Some(dev))
        .unwrap()
        .with_label("src");
    let view = alias.host::<f32>().unwrap();
    busy(w.copy_from(&src), &["tensor w ", "tensor w_alias"]);
    drop(view);
    w.copy_from(&src).unwrap();
    assert_eq!(alias.host::<f32>().unwrap()[0], 9.0);
}

/// `String` tensors share storage too.
fn string_tensors_sharing_storage(dev: &Device) {
    let names = ["a".to_string(), "b".to_string()];
    let mut t = Tensor::from_slice(&[2], &names, Some(dev))
        .unwrap()
        .with_label("names");
    let mut alias = Tensor::new(dev).with_label("names_alias");
    alias.resize(&[2]).unwrap();
    alias.share_data(&t).unwrap();
    let view = t.host::<String>().unwrap();
    busy(
        alias.host_mut::<String>().map(drop),
        &["tensor names_alias", "tensor names", "read"],
    );
    assert_eq!(alias.host::<String>().unwrap()[1], "b");
    drop(view);
    let mut w = alias.host_mut::<String>().unwrap();
    w[0] = "c".into();
    busy(
        t.host::<String>().map(drop),
        &["tensor names ", "tensor names_alias", "write"],
    );
    drop(w);
    assert_eq!(t.host_mut::<String>().unwrap()[0], "c");
}

/// Tensor names longer than what a record keeps are cut, not lost.
fn long_tensor_names_are_cut(dev: &Device) {
    let long = format!("layer/{}", "x".repeat(200));
    let mut t = Tensor::from_slice(&[1], &[1i32], Some(dev))
        .unwrap()
        .with_label(&long);
    let mut alias = Tensor::new(dev).with_label("alias");
    alias.resize(&[1]).unwrap();
    alias.share_data(&t).unwrap();
    let view = alias.host::<i32>().unwrap();
    let e = t.host_mut::<i32>().map(drop).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&long),
        "the tensor asked for is named in full: {text}"
    );
    assert!(text.contains("tensor alias"), "{text}");
    drop(view);
    let view = t.host::<i32>().unwrap();
    let e = alias.host_mut::<i32>().map(drop).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("tensor layer/xxx") && text.contains('…'),
        "{text}"
    );
    drop(view);
}

syncmem::for_each_device!(
    synced_memory_never_waits_for_its_own_thread,
    guards_of_other_threads_are_waited_for,
    tensors_sharing_storage_name_both_tensors,
    string_tensors_sharing_storage,
    long_tensor_names_are_cut,
);
