//! Inputs a hostile user gives the command: endless files, huge epoch counts, huge tensor
//! names, huge labels, absurd trace sizes. Each is a one-line error (or, for a long name, a
//! readable table), never a panic, an abort or an exhausted machine. The runs that would have
//! allocated without bound run under an address-space limit (`ulimit -v`), so that a
//! regression fails at once.

#![cfg(unix)]

mod common;

use common::{ok, refused, rejected_value, run_limited, TempPath};

/// The address-space limit of the runs below (MiB): far more than they need.
const LIMIT_MIB: u64 = 4096;

#[test]
fn trace_replay_of_an_endless_file_is_an_error() {
    let out = run_limited(&["trace", "replay", "/dev/zero"], LIMIT_MIB);
    let stderr = refused("trace replay /dev/zero", &out);
    for needle in ["/dev/zero", "line 1", "longer than 1048576 bytes"] {
        assert!(stderr.contains(needle), "{needle:?} missing from {stderr}");
    }
}

#[test]
fn huge_epoch_counts_are_errors() {
    for epochs in ["18446744073709551615", "4294967296", "1000001"] {
        for command in [&["train"][..], &["trace", "record"][..]] {
            let mut args = command.to_vec();
            args.extend(["--device", "cpu", "--epochs", epochs]);
            let out = run_limited(&args, LIMIT_MIB);
            let stderr = rejected_value(&format!("{args:?}"), &out);
            for needle in ["--epochs", "1000000", epochs] {
                assert!(
                    stderr.contains(needle),
                    "{args:?}: {needle:?} missing from {stderr}"
                );
            }
        }
    }
}

#[test]
fn inspect_cuts_long_names_in_the_table_only() {
    use safetensors::{tensor::TensorView, Dtype};
    let long = "n".repeat(70_000);
    let data = [0u8; 4];
    let bytes = safetensors::serialize(
        [
            (
                long.as_str(),
                TensorView::new(Dtype::F32, vec![1], &data).unwrap(),
            ),
            (
                "short",
                TensorView::new(Dtype::F32, vec![1], &data).unwrap(),
            ),
        ],
        None,
    )
    .unwrap();
    let file = TempPath::new("hostile", "long-name.safetensors");
    std::fs::write(&file.0, bytes).unwrap();

    let stdout = ok(&["inspect", file.arg()]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    let row = lines[1];
    let cut = format!("{}…", "n".repeat(79));
    assert!(row.starts_with(&cut), "{row}");
    assert!(row.chars().count() < 120, "{row}");
    assert!(lines[2].starts_with("short "), "{}", lines[2]);

    let v: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", file.arg(), "--json"])).unwrap();
    assert_eq!(v["tensors"][0]["name"].as_str(), Some(long.as_str()));
}

#[test]
fn a_huge_label_is_an_error_naming_it() {
    use safetensors::{tensor::TensorView, Dtype};
    let x: Vec<u8> = [0.1_f32, 0.2, 0.3, 0.4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let y: Vec<u8> = [0_i32, 11_141_122]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = safetensors::serialize(
        [
            ("x", TensorView::new(Dtype::F32, vec![2, 2], &x).unwrap()),
            ("y", TensorView::new(Dtype::I32, vec![2], &y).unwrap()),
        ],
        None,
    )
    .unwrap();
    let file = TempPath::new("hostile", "huge-label.safetensors");
    std::fs::write(&file.0, bytes).unwrap();
    let out = run_limited(
        &["train", "--device", "cpu", "--data", file.arg()],
        LIMIT_MIB,
    );
    let stderr = refused("a huge label", &out);
    assert!(out.stdout.is_empty(), "trained before refusing");
    for needle in [file.arg(), "label 11141122", "11141123 classes", "65536"] {
        assert!(stderr.contains(needle), "{needle:?} missing from {stderr}");
    }
}

#[test]
fn trace_sizes_that_would_overflow_are_errors() {
    let huge = usize::MAX / 2 + 1;
    let line = |id: u64| {
        format!("{{\"op\":\"alloc\",\"id\":{id},\"size\":{huge},\"stream\":1,\"device\":\"d\"}}\n")
    };
    let file = TempPath::new("hostile", "huge-sizes.jsonl");
    std::fs::write(&file.0, format!("{}{}", line(0), line(1))).unwrap();
    let out = run_limited(&["trace", "replay", file.arg()], LIMIT_MIB);
    let stderr = refused("huge trace sizes", &out);
    for needle in [file.arg(), "line 1", &huge.to_string(), "limit"] {
        assert!(stderr.contains(needle), "{needle:?} missing from {stderr}");
    }
}
