//! Saving and loading workspace tensors as safetensors files (`Workspace::save`,
//! `Workspace::load`, `workspace::io::inspect`): round trips of every element type on the `cpu`
//! device and on OpenCL, across devices, the device-to-host copy a save makes, chosen blobs,
//! corrupt and truncated files, the file written by Python's reference `safetensors`, and
//! Caffe2's blob_test.cc serialisation tests checking the *loaded* blob.

mod common;

#[path = "fixtures/interop.rs"]
mod interop;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use interop::{Elem, Spec, TABLE};
use syncmem::dtype::DType;
use syncmem::tensor::Tensor;
use syncmem::workspace::{io, Workspace};
use syncmem::{Device, Error, Head};

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(what: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!(
            "syncmem-serialize-{}-{n}-{what}.safetensors",
            std::process::id()
        )))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn shown(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python_written.safetensors")
}

/// A workspace holding the interop table on `dev`; every other tensor is written on the device.
fn table_workspace(dev: &Device) -> Workspace {
    let ws = Workspace::new();
    for (k, spec) in TABLE.iter().enumerate() {
        let t = spec.make(Some(dev), k % 2 == 0).unwrap();
        ws.create_blob(spec.name).unwrap().write().reset(t);
    }
    ws
}

fn check_table(ws: &Workspace, device: Option<&Device>) {
    let mut names: Vec<&str> = TABLE.iter().map(|s| s.name).collect();
    names.sort_unstable();
    assert_eq!(ws.tensor_blobs(), names);
    for spec in TABLE {
        ws.with_tensor(spec.name, |t| {
            assert_eq!(
                t.target().map(Device::label),
                device.map(Device::label),
                "{}",
                spec.name
            );
            assert_eq!(t.label(), spec.name);
            spec.check(t);
            Ok(())
        })
        .unwrap();
    }
}

fn tensor_values<T: Elem>(ws: &Workspace, name: &str) -> Vec<T> {
    ws.with_tensor(name, |t| Ok(t.host::<T>()?.to_vec()))
        .unwrap()
}

/// The devices to load onto besides the one saved from: host only, `cpu`, and the first OpenCL
/// device when one is present.
fn other_devices() -> Vec<Option<Device>> {
    let mut v = vec![None, Some(Device::cpu())];
    v.extend(first_opencl().map(Some));
    v
}

#[cfg(feature = "opencl")]
fn first_opencl() -> Option<Device> {
    Device::all(syncmem::BackendKind::OpenCl)
        .ok()
        .and_then(|all| all.into_iter().next())
}

#[cfg(not(feature = "opencl"))]
fn first_opencl() -> Option<Device> {
    None
}

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
            assert!(!t.synced().unwrap().host_allocated());
            assert_eq!(t.copy_stats().device_to_host.count, 0);
            assert_eq!(t.host::<f32>()?.to_vec(), [1.5, 2.5, 3.5]);
            assert_eq!(t.copy_stats().device_to_host.count, 1);
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
        assert_eq!(t.copy_stats().device_to_host.count, 0);
        Ok(())
    })
    .unwrap();
    ws.save(file.path(), None).unwrap();
    ws.with_tensor("d", |t| {
        assert_eq!(t.copy_stats().device_to_host.count, 1);
        assert_eq!(t.head(), Some(Head::Synced));
        Ok(())
    })
    .unwrap();
    // Both sides are current now: a second save copies nothing.
    ws.save(file.path(), None).unwrap();
    ws.with_tensor("d", |t| {
        assert_eq!(t.copy_stats().device_to_host.count, 1);
        assert_eq!(t.copy_stats().host_to_device.count, 0);
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

per_device!(
    round_trip_every_dtype,
    load_onto_other_devices,
    load_places_the_head,
    save_reads_newest_data_from_device,
    save_chosen_blobs,
    load_chosen_tensors,
    python_fixture,
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

// ----- broken files --------------------------------------------------------------------------

/// A safetensors file from a header (JSON, padded to 8 bytes) and the data after it.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend_from_slice(data);
    out
}

/// A workspace with "keep" = [1, 2] (f32) and a non-tensor blob.
fn keep_workspace() -> Workspace {
    let ws = Workspace::new();
    ws.create_blob("keep")
        .unwrap()
        .write()
        .reset(Tensor::from_slice(&[2], &[1.0_f32, 2.0], Some(&Device::cpu())).unwrap());
    ws.create_blob("note").unwrap().write().reset(7_u8);
    ws
}

fn assert_unchanged(ws: &Workspace) {
    assert_eq!(ws.local_blobs(), ["keep", "note"]);
    assert_eq!(tensor_values::<f32>(ws, "keep"), [1.0, 2.0]);
    assert_eq!(*ws.get_blob("note").unwrap().read().get::<u8>().unwrap(), 7);
}

#[test]
fn corrupt_and_truncated_files_leave_the_workspace_unchanged() {
    // A good file: "keep" = [5, 6] and "other" = [1, 2, 3] (u8), so that a partial load would show.
    let good = {
        let file = TempFile::new("good");
        let src = Workspace::new();
        src.create_blob("keep")
            .unwrap()
            .write()
            .reset(Tensor::from_slice(&[2], &[5.0_f32, 6.0], None).unwrap());
        src.create_blob("other")
            .unwrap()
            .write()
            .reset(Tensor::from_slice(&[3], &[1_u8, 2, 3], None).unwrap());
        src.save(file.path(), None).unwrap();
        std::fs::read(file.path()).unwrap()
    };
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut flipped_header = good.clone();
    flipped_header[8] = b'[';
    let mut huge_header = good.clone();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut too_long = good.clone();
    too_long.extend_from_slice(&[0, 0, 0]);

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("garbage", b"this is not a safetensors file at all".to_vec()),
        ("cut in the length", good[..5].to_vec()),
        ("cut in the header", good[..8 + header_len / 2].to_vec()),
        ("cut in the data", good[..good.len() - 3].to_vec()),
        ("trailing bytes", too_long),
        ("header not JSON", flipped_header),
        ("huge header length", huge_header),
        (
            "offsets do not match the shape",
            raw_file(
                r#"{"keep":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "offsets overlap",
            raw_file(
                r#"{"keep":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"z":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
                &[0; 3],
            ),
        ),
        (
            // "keep" is valid and is built first; the bad bool comes after it.
            "bool byte 2",
            raw_file(
                r#"{"keep":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z_flags":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]}}"#,
                &[0, 0, 160, 64, 0, 0, 192, 64, 1, 2, 0],
            ),
        ),
    ];
    for (what, bytes) in cases {
        let file = TempFile::new("corrupt");
        std::fs::write(file.path(), &bytes).unwrap();
        for device in [None, Some(Device::cpu())] {
            let ws = keep_workspace();
            let e = ws.load(file.path(), device.as_ref(), None).unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "{what}: {e}");
            assert!(e.to_string().contains(&file.shown()), "{what}: {e}");
            assert_unchanged(&ws);
        }
        // inspect reads the header only: it catches all but the bad bool byte.
        if what != "bool byte 2" {
            let e = io::inspect(file.path()).unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "inspect, {what}: {e}");
            assert!(e.to_string().contains(&file.shown()), "{what}: {e}");
        }
    }
    // The good file loads, replacing "keep" and adding "other".
    let file = TempFile::new("good-again");
    std::fs::write(file.path(), &good).unwrap();
    let ws = keep_workspace();
    assert_eq!(ws.load(file.path(), None, None).unwrap(), ["keep", "other"]);
    assert_eq!(tensor_values::<f32>(&ws, "keep"), [5.0, 6.0]);
    assert_eq!(tensor_values::<u8>(&ws, "other"), [1, 2, 3]);
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let file = TempFile::new("never-written");
    let ws = keep_workspace();
    let e = ws.load(file.path(), None, None).unwrap_err();
    match &e {
        Error::Io { error, .. } => assert_eq!(error.kind(), std::io::ErrorKind::NotFound),
        other => panic!("expected Error::Io, got {other:?}"),
    }
    assert!(e.to_string().contains(&file.shown()), "{e}");
    assert_unchanged(&ws);
    let e = io::inspect(file.path()).unwrap_err();
    assert!(matches!(e, Error::Io { .. }) && e.to_string().contains(&file.shown()));
    // Saving into a directory that does not exist.
    let dir = std::env::temp_dir().join(format!("syncmem-no-such-dir-{}", std::process::id()));
    let e = ws.save(dir.join("x.safetensors"), None).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

/// The safetensors crate writes through a temporary file of mode 0600: the saved file has the
/// permissions of a file created plainly (the umask's), or keeps those of the file it replaces.
#[cfg(unix)]
#[test]
fn saved_files_get_ordinary_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let plain = TempFile::new("plain");
    std::fs::write(plain.path(), b"x").unwrap();
    let ws = keep_workspace();
    let file = TempFile::new("mode");
    ws.save(file.path(), None).unwrap();
    assert_eq!(mode(file.path()), mode(plain.path()));
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o640)).unwrap();
    ws.save(file.path(), None).unwrap();
    assert_eq!(mode(file.path()), 0o640);
    // A directory cannot be replaced by the file.
    let dir = TempFile::new("dir");
    std::fs::create_dir(dir.path()).unwrap();
    let e = ws.save(dir.path(), None).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    std::fs::remove_dir(dir.path()).unwrap();
}

#[test]
fn element_types_syncmem_lacks_cannot_be_loaded() {
    let file = TempFile::new("c64");
    std::fs::write(
        file.path(),
        raw_file(
            r#"{"c":{"dtype":"C64","shape":[1],"data_offsets":[0,8]},"f":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[8,10]}}"#,
            &[0; 10],
        ),
    )
    .unwrap();
    let ws = keep_workspace();
    let e = ws.load(file.path(), None, None).unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("\"c\"") && msg.contains("C64") && msg.contains(&file.shown()),
        "{msg}"
    );
    assert_unchanged(&ws);
    // Listed by inspect all the same.
    let info = io::inspect(file.path()).unwrap();
    let listed: Vec<(&str, &str, Option<DType>)> = info
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype.as_str(), t.element))
        .collect();
    assert_eq!(listed, [("c", "C64", None), ("f", "F8_E4M3", None)]);
}

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
