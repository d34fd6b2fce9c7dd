//! Saving and loading workspace tensors as safetensors files (`Workspace::save`,
//! `Workspace::load`, `workspace::io::inspect`): round trips of every element type on the `cpu`
//! device and on OpenCL, across devices, the device-to-host copy a save makes, chosen blobs,
//! corrupt and truncated files, the file written by Python's reference `safetensors`, and
//! Caffe2's blob_test.cc serialisation tests checking the *loaded* blob.

#[path = "../fixtures/interop.rs"]
mod interop;

mod blobs;
mod caffe2;
mod files;
mod round_trip;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use interop::{Elem, TABLE};
use syncmem::workspace::Workspace;
use syncmem::Device;

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
