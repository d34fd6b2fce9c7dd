//! `syncmem inspect` against the committed fixture written by Python's `safetensors`
//! (crates/syncmem/tests/fixtures/python_written.safetensors), and on missing and corrupt files.

mod common;

use std::path::{Path, PathBuf};

use common::{ok, run as syncmem};
use serde_json::Value;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../syncmem/tests/fixtures/python_written.safetensors")
}

/// Runs `syncmem args`, requires exit status 1 and nothing on stdout, returns stderr.
fn fails(args: &[&str]) -> String {
    let out = syncmem(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "syncmem {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "syncmem {args:?} printed to stdout");
    stderr
}

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn with(what: &str, bytes: &[u8]) -> TempFile {
        let p = std::env::temp_dir().join(format!(
            "syncmem-cli-inspect-{}-{what}.safetensors",
            std::process::id()
        ));
        std::fs::write(&p, bytes).unwrap();
        TempFile(p)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// (name, dtype, shape) of every tensor of the fixture, sorted by name.
const EXPECTED: [(&str, &str, &[u64]); 19] = [
    ("bf16", "BF16", &[2, 3]),
    ("bool", "BOOL", &[2, 3]),
    ("empty_f32", "F32", &[0, 3]),
    ("empty_i64", "I64", &[2, 0]),
    ("empty_u8", "U8", &[0]),
    ("f16", "F16", &[7]),
    ("f32", "F32", &[2, 3, 4]),
    ("f64", "F64", &[5]),
    ("i16", "I16", &[2, 3]),
    ("i32", "I32", &[3, 2]),
    ("i64", "I64", &[2, 2]),
    ("i8", "I8", &[2, 2, 2]),
    ("scalar_bool", "BOOL", &[]),
    ("scalar_f32", "F32", &[]),
    ("scalar_i64", "I64", &[]),
    ("u16", "U16", &[3]),
    ("u32", "U32", &[4]),
    ("u64", "U64", &[3]),
    ("u8", "U8", &[5]),
];

fn item_size(dtype: &str) -> u64 {
    match dtype {
        "BOOL" | "U8" | "I8" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        _ => 8,
    }
}

#[test]
fn json_lists_every_tensor_of_the_fixture() {
    let path = fixture();
    let stdout = ok(&["inspect", path.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "count",
            "file",
            "file_bytes",
            "header_bytes",
            "metadata",
            "tensors",
            "total_bytes"
        ]
    );
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), EXPECTED.len());
    assert_eq!(v["count"], EXPECTED.len() as u64);
    let mut total = 0;
    for (t, (name, dtype, shape)) in tensors.iter().zip(EXPECTED) {
        let numel: u64 = shape.iter().product();
        let bytes = numel * item_size(dtype);
        total += bytes;
        assert_eq!(t["name"], name, "{t}");
        assert_eq!(t["dtype"], dtype, "{t}");
        assert_eq!(t["shape"], serde_json::json!(shape), "{t}");
        assert_eq!(t["bytes"], bytes, "{t}");
        assert_eq!(t["loadable"], true, "{t}");
    }
    assert_eq!(v["total_bytes"], total);
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    assert_eq!(v["file_bytes"], file_bytes);
    assert_eq!(
        v["header_bytes"].as_u64().unwrap() + 8 + total,
        file_bytes,
        "header + data = file"
    );
    assert_eq!(v["metadata"]["producer"], "scripts/make_fixture.py");
}

#[test]
fn table_lists_every_tensor_and_a_total() {
    let path = fixture();
    let stdout = ok(&["inspect", path.to_str().unwrap()]);
    let lines: Vec<&str> = stdout.lines().collect();
    let head: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(head, ["NAME", "DTYPE", "SHAPE", "BYTES"]);
    let mut total = 0;
    for (line, (name, dtype, shape)) in lines[1..].iter().zip(EXPECTED) {
        let bytes = shape.iter().product::<u64>() * item_size(dtype);
        total += bytes;
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        let cells: Vec<&str> = line.split("  ").filter(|c| !c.is_empty()).collect();
        let cells: Vec<&str> = cells.iter().map(|c| c.trim()).collect();
        assert_eq!(
            cells,
            [
                name,
                dtype,
                &format!("[{}]", dims.join(", ")),
                &bytes.to_string()
            ],
            "{line}"
        );
    }
    let total_line = lines[1 + EXPECTED.len()];
    assert!(
        total_line.starts_with(&format!("total: 19 tensors, {total} bytes")),
        "{total_line}"
    );
    assert!(stdout.contains("metadata: producer = scripts/make_fixture.py"));
}

#[test]
fn missing_file_is_a_readable_error() {
    let missing = std::env::temp_dir().join(format!(
        "syncmem-cli-inspect-{}-missing.safetensors",
        std::process::id()
    ));
    let stderr = fails(&["inspect", missing.to_str().unwrap()]);
    assert!(
        stderr.starts_with("syncmem: error: cannot open "),
        "{stderr}"
    );
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("No such file"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn corrupt_and_truncated_files_are_readable_errors() {
    let good = std::fs::read(fixture()).unwrap();
    let truncated = TempFile::with("truncated", &good[..good.len() - 10]);
    let stderr = fails(&["inspect", truncated.arg()]);
    assert!(
        stderr.contains(&format!("invalid safetensors file {}", truncated.arg())),
        "{stderr}"
    );
    assert!(stderr.contains("truncated?"), "{stderr}");

    let garbage = TempFile::with("garbage", b"definitely not a safetensors file");
    let stderr = fails(&["inspect", garbage.arg(), "--json"]);
    assert!(
        stderr.contains(&format!("invalid safetensors file {}", garbage.arg())),
        "{stderr}"
    );

    let mut bad_json = good.clone();
    bad_json[8] = b'#';
    let bad_json = TempFile::with("bad-json", &bad_json);
    let stderr = fails(&["inspect", bad_json.arg()]);
    assert!(stderr.contains("invalid header"), "{stderr}");
}

#[test]
fn help_documents_the_json_schema() {
    let stdout = ok(&["inspect", "--help"]);
    assert!(stdout.contains("--json"), "{stdout}");
    assert!(stdout.contains("\"total_bytes\""), "{stdout}");
}

#[test]
fn table_escapes_control_characters_in_names_and_metadata() {
    use safetensors::{tensor::TensorView, Dtype};
    let data = [0u8; 4];
    let names = [
        "two\nlines",
        "\u{1b}[31mred\u{1b}[0m",
        "tab\there",
        "bidi\u{202e}txt",
        "plain",
    ];
    let tensors: Vec<(&str, TensorView<'_>)> = names
        .iter()
        .map(|n| (*n, TensorView::new(Dtype::F32, vec![1], &data).unwrap()))
        .collect();
    let metadata = std::collections::HashMap::from([(
        "key\r\nx".to_string(),
        "value\u{7}\u{1b}]0;title\u{7}".to_string(),
    )]);
    let bytes = safetensors::serialize(tensors, Some(metadata)).unwrap();
    let file = TempFile::with("control", &bytes);

    let stdout = ok(&["inspect", file.arg()]);
    assert!(
        !stdout.chars().any(|c| c.is_control() && c != '\n'),
        "control characters reached the output:\n{stdout:?}"
    );
    assert!(!stdout.contains('\u{202e}'), "{stdout:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    // Header, one line per tensor, the total, one metadata line.
    assert_eq!(lines.len(), 1 + names.len() + 2, "{stdout}");
    let mut sorted = names;
    sorted.sort_unstable();
    for (line, name) in lines[1..].iter().zip(sorted) {
        let shown = if name == "plain" {
            name.to_string()
        } else {
            format!("{name:?}")
        };
        assert!(line.starts_with(&shown), "{line:?} should show {shown}");
    }
    let meta = lines.last().unwrap();
    assert_eq!(
        *meta,
        format!(
            "metadata: {:?} = {:?}",
            "key\r\nx", "value\u{7}\u{1b}]0;title\u{7}"
        )
    );

    // The JSON output keeps the names as they are (JSON escapes them itself).
    let v: Value = serde_json::from_str(&ok(&["inspect", file.arg(), "--json"])).unwrap();
    let listed: Vec<&str> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, sorted);
}
