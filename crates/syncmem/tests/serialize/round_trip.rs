//! Round trips of every element type, across devices, the device-to-host copy a save makes,
//! chosen blobs and tensors, and the file written by Python's reference `safetensors`.

use syncmem::dtype::DType;
use syncmem::tensor::Tensor;
use syncmem::workspace::{io, Workspace};
use syncmem::{Device, Error, Head};

use super::{check_table, fixture, other_devices, table_workspace, tensor_values, TempFile};
use crate::interop::{Spec, TABLE};

// ----- round trips ---------------------------------------------------------------------------

fn round_trip_every_dtype(dev: &Device) {
    let file = TempFile::new("round-trip");
    let ws = table_workspace(dev);
    let saved = ws.save(file.path(), None).unwrap();
    assert_eq!(saved.len(), TABLE.len());
    let loaded = Workspace::new();
    let names = loaded.load(file.path(), Some(dev), None).unwrap();
    assert_eq!(names, saved);
    check_table(&loaded, Some(dev));
    // What the file says, read without loading.
    let info = io::inspect(file.path()).unwrap();
    assert_eq!(info.tensors.len(), TABLE.len());
    for spec in TABLE {
        let ft = info.tensors.iter().find(|t| t.name == spec.name).unwrap();
        assert_eq!(ft.element, Some(spec.dtype), "{}", spec.name);
        assert_eq!(ft.shape, spec.shape, "{}", spec.name);
        assert_eq!(ft.nbytes, spec.numel() * spec.dtype.size(), "{}", spec.name);
    }
    assert_eq!(
        info.total_bytes(),
        TABLE
            .iter()
            .map(|s| (s.numel() * s.dtype.size()) as u64)
            .sum::<u64>()
    );
}

fn load_onto_other_devices(dev: &Device) {
    let file = TempFile::new("cross-device");
    table_workspace(dev).save(file.path(), None).unwrap();
    for target in other_devices() {
        let ws = Workspace::new();
        ws.load(file.path(), target.as_ref(), None).unwrap();
        check_table(&ws, target.as_ref());
    }
}

fn load_places_the_head(dev: &Device) {
    let file = TempFile::new("head");
    let ws = Workspace::new();
    ws.create_blob("x")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[3], &[1.5_f32, 2.5, 3.5], Some(dev)).unwrap());
    ws.save(file.path(), None).unwrap();

    // Onto a device: written straight into device memory, no host mirror yet.
    let on_dev = Workspace::new();
    on_dev.load(file.path(), Some(dev), None).unwrap();
    on_dev
        .with_tensor("x", |t| {
            assert_eq!(t.head(), Some(Head::AtDevice));
            if dev.zero_copy_protocol().is_none() {
                assert!(!t.synced().unwrap().host_allocated());
            }
            syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 0, "after load");
            assert_eq!(t.host::<f32>()?.to_vec(), [1.5, 2.5, 3.5]);
            syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 1, "host read");
            Ok(())
        })
        .unwrap();

    // Host only.
    let on_host = Workspace::new();
    on_host.load(file.path(), None, None).unwrap();
    on_host
        .with_tensor("x", |t| {
            assert_eq!(t.head(), Some(Head::AtHost));
            assert!(t.target().is_none());
            assert_eq!(t.host::<f32>()?.to_vec(), [1.5, 2.5, 3.5]);
            Ok(())
        })
        .unwrap();
}

/// A tensor whose newest data is on the device is copied to the host exactly once.
fn save_reads_newest_data_from_device(dev: &Device) {
    let file = TempFile::new("device-head");
    let ws = Workspace::new();
    ws.create_tensor("d", &[2, 3], DType::I32, Some(dev))
        .unwrap();
    ws.with_tensor_mut("d", |t| {
        t.host_mut::<i32>()?.fill(-1); // a stale host mirror that must not be saved
        t.device_overwrite::<i32>()?
            .write(&[10, 11, 12, 13, 14, 15])?;
        assert_eq!(t.head(), Some(Head::AtDevice));
        syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 0, "before save");
        Ok(())
    })
    .unwrap();
    ws.save(file.path(), None).unwrap();
    ws.with_tensor("d", |t| {
        syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 1, "after save");
        assert_eq!(t.head(), Some(Head::Synced));
        Ok(())
    })
    .unwrap();
    // Both sides are current now: a second save transfers nothing.
    ws.save(file.path(), None).unwrap();
    ws.with_tensor("d", |t| {
        syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, 1, "second save");
        Ok(())
    })
    .unwrap();
    let back = Workspace::new();
    back.load(file.path(), None, None).unwrap();
    assert_eq!(tensor_values::<i32>(&back, "d"), [10, 11, 12, 13, 14, 15]);
}

fn save_chosen_blobs(dev: &Device) {
    let file = TempFile::new("chosen");
    let ws = Workspace::new();
    for (name, v) in [("a", 1.0_f32), ("b", 2.0), ("c", 3.0)] {
        ws.create_blob(name)
            .unwrap()
            .write()
            .reset(Tensor::from_slice(&[2], &[v, -v], Some(dev)).unwrap());
    }
    ws.create_blob("n").unwrap().write().reset(5_i32);
    ws.create_blob("e").unwrap();

    assert_eq!(ws.save(file.path(), Some(&["c", "a"])).unwrap(), ["a", "c"]);
    let names: Vec<String> = io::inspect(file.path())
        .unwrap()
        .tensors
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["a", "c"]);
    let before = std::fs::read(file.path()).unwrap();

    // Named non-tensors, missing names and repeated names are errors naming the blob; the
    // file from the last good save is left as it was.
    for (list, blob) in [(&["a", "n"][..], "n"), (&["e"][..], "e")] {
        let e = ws.save(file.path(), Some(list)).unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
        assert!(e.to_string().contains(&format!("blob {blob:?}")), "{e}");
    }
    let e = ws.save(file.path(), Some(&["a", "zz"])).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }) && e.to_string().contains("\"zz\""));
    let e = ws.save(file.path(), Some(&["a", "b", "a"])).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }) && e.to_string().contains("\"a\""));
    assert_eq!(std::fs::read(file.path()).unwrap(), before);

    // Saving all skips what is not a tensor.
    assert_eq!(ws.save(file.path(), None).unwrap(), ["a", "b", "c"]);
    let back = Workspace::new();
    assert_eq!(
        back.load(file.path(), Some(dev), None).unwrap(),
        ["a", "b", "c"]
    );
    assert_eq!(tensor_values::<f32>(&back, "b"), [2.0, -2.0]);
}

fn load_chosen_tensors(dev: &Device) {
    let ws = Workspace::new();
    let names = ws
        .load(fixture(), Some(dev), Some(&["f32", "bool", "f32"]))
        .unwrap();
    assert_eq!(names, ["bool", "f32"]);
    assert_eq!(ws.local_blobs(), ["bool", "f32"]);
    let e = ws
        .load(fixture(), Some(dev), Some(&["u8", "nope"]))
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("\"nope\"") && msg.contains("python_written.safetensors"),
        "{msg}"
    );
    // Nothing of the failed load went in.
    assert_eq!(ws.local_blobs(), ["bool", "f32"]);
}

/// The file written by Python's `safetensors` (scripts/make_fixture.py), every value checked.
fn python_fixture(dev: &Device) {
    let ws = Workspace::new();
    let names = ws.load(fixture(), Some(dev), None).unwrap();
    assert_eq!(names.len(), TABLE.len());
    check_table(&ws, Some(dev));
    let info = io::inspect(fixture()).unwrap();
    assert_eq!(
        info.metadata.get("producer").map(String::as_str),
        Some("scripts/make_fixture.py")
    );
    // Saved again by syncmem and reloaded, it is still the same table.
    let file = TempFile::new("python-resaved");
    ws.save(file.path(), None).unwrap();
    let again = Workspace::new();
    again.load(file.path(), None, None).unwrap();
    check_table(&again, None);
}

#[cfg(feature = "opencl")]
#[test]
fn cpu_saved_loads_onto_opencl_and_back() {
    let Some(cl) = syncmem::testing::opencl_or_skip("cpu_saved_loads_onto_opencl_and_back") else {
        return;
    };
    let file = TempFile::new("cpu-to-opencl");
    table_workspace(&Device::cpu())
        .save(file.path(), None)
        .unwrap();
    let on_cl = Workspace::new();
    on_cl.load(file.path(), Some(&cl), None).unwrap();
    check_table(&on_cl, Some(&cl));
    // And the OpenCL tensors saved again load onto the cpu device.
    let again = TempFile::new("opencl-to-cpu");
    on_cl.save(again.path(), None).unwrap();
    let on_cpu = Workspace::new();
    on_cpu
        .load(again.path(), Some(&Device::cpu()), None)
        .unwrap();
    check_table(&on_cpu, Some(&Device::cpu()));
}

#[test]
fn table_specs_are_consistent() {
    // Guards the shared table itself: names unique, every element type present.
    let mut names: Vec<&str> = TABLE.iter().map(|s: &Spec| s.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), TABLE.len());
    for d in DType::ALL.into_iter().filter(|d| d.is_pod()) {
        assert!(TABLE.iter().any(|s| s.dtype == d), "{d} missing");
    }
    assert!(TABLE.iter().any(|s| s.shape.is_empty()));
    assert!(TABLE.iter().any(|s| s.numel() == 0));
}

syncmem::for_each_device!(
    round_trip_every_dtype,
    load_onto_other_devices,
    load_places_the_head,
    save_reads_newest_data_from_device,
    save_chosen_blobs,
    load_chosen_tensors,
    python_fixture,
);
