//! Broken and unusual files: corrupt, truncated, missing, permissions, element types syncmem
//! lacks. A failed load leaves the workspace unchanged.

use std::path::Path;

use syncmem::dtype::DType;
use syncmem::tensor::Tensor;
use syncmem::workspace::{io, Workspace};
use syncmem::{Device, Error};

use super::{tensor_values, TempFile};

// ----- broken files --------------------------------------------------------------------------

/// A safetensors file from a header (JSON, padded to 8 bytes) and the data after it.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
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

/// A good file: "keep" = [5, 6] and "other" = [1, 2, 3] (u8), so that a partial load would
/// show.
fn good_file() -> Vec<u8> {
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
}

/// Files broken in every way a load must catch, made from `good`, by what is wrong with them.
fn corrupt_files(good: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut flipped_header = good.to_vec();
    flipped_header[8] = b'[';
    let mut huge_header = good.to_vec();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut too_long = good.to_vec();
    too_long.extend_from_slice(&[0, 0, 0]);

    vec![
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
    ]
}

#[test]
fn corrupt_and_truncated_files_leave_the_workspace_unchanged() {
    let good = good_file();
    let cases = corrupt_files(&good);
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
