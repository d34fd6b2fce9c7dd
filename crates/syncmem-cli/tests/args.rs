//! Argument checking shared by every subcommand: device strings, negative numbers, sizes.

mod common;

use std::process::Output;

use common::{json, rejected_value, run, u};

/// Requires a usage error's exit code (2) with exactly one line on stderr and nothing on
/// stdout; returns the line.
fn one_line_error(args: &[&str]) -> String {
    let out: Output = run(args);
    assert!(out.stdout.is_empty(), "syncmem {args:?} printed to stdout");
    rejected_value(&format!("syncmem {args:?}"), &out)
}

/// A trace file path in the temporary directory that no test writes.
fn unused_out(what: &str) -> String {
    std::env::temp_dir()
        .join(format!(
            "syncmem-cli-args-{}-{what}.jsonl",
            std::process::id()
        ))
        .display()
        .to_string()
}

#[test]
fn unparsable_device_is_an_error_on_every_command() {
    let out = unused_out("device");
    let commands: [&[&str]; 5] = [
        &["bench", "--quick", "--json"],
        &["bench", "--quick"],
        &["demo", "--json"],
        &["train", "--json"],
        &["trace", "record", "--out", &out],
    ];
    for cmd in commands {
        for bad in ["bogus", "opencl:x", "cpu:3", "opencl:-1"] {
            let mut args = cmd.to_vec();
            args.extend(["--device", bad]);
            let err = one_line_error(&args);
            assert!(
                err.contains("--device") && err.contains(bad),
                "{args:?}: {err}"
            );
        }
    }
    assert!(
        !std::path::Path::new(&out).exists(),
        "trace record wrote a file"
    );
}

#[test]
fn absent_device_is_skipped_by_bench_with_a_note() {
    let v = json(&["bench", "--quick", "--json", "--device", "opencl:9"]);
    let skipped = v["skipped"].as_array().expect("skipped");
    assert_eq!(skipped.len(), 1, "{v:#}");
    let note = skipped[0].as_str().unwrap();
    assert!(note.contains("opencl:9"), "{note}");
    assert!(
        !v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"].as_str().is_some_and(|n| n.starts_with("device"))),
        "{v:#}"
    );
}

#[test]
fn negative_numbers_are_rejected_with_the_reason() {
    let out = unused_out("negative");
    let cases: [(&[&str], &str); 11] = [
        (
            &["train", "--device", "cpu", "--lr", "-1"],
            "--lr must be a positive number",
        ),
        (
            &["train", "--device", "cpu", "--lr", "-0.5"],
            "--lr must be a positive number",
        ),
        (
            &["train", "--device", "cpu", "--epochs", "-3"],
            "--epochs must be a positive integer",
        ),
        (
            &["train", "--device", "cpu", "--batch", "-1"],
            "--batch must be a positive integer",
        ),
        (
            &["train", "--device", "cpu", "--hidden", "-8"],
            "--hidden must be a positive integer",
        ),
        (
            &["train", "--device", "cpu", "--seed", "-1"],
            "--seed must be a non-negative integer",
        ),
        (
            &["demo", "--device", "cpu", "--bytes", "-1"],
            "--bytes must be a size",
        ),
        (
            &[
                "trace", "record", "--device", "cpu", "--epochs", "-2", "--out", &out,
            ],
            "--epochs must be a positive integer",
        ),
        (
            &[
                "trace", "record", "--device", "cpu", "--hidden", "-3", "--out", &out,
            ],
            "--hidden must be a positive integer",
        ),
        (
            &["trace", "replay", "none.jsonl", "--cap", "-1"],
            "--cap must be a size",
        ),
        (
            &["trace", "replay", "none.jsonl", "--host-cap", "-5"],
            "--host-cap must be a size",
        ),
    ];
    for (args, want) in cases {
        let err = one_line_error(args);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
    // Zero and garbage are refused the same way.
    for (args, want) in [
        (["train", "--lr", "0"], "--lr must be a positive number"),
        (["train", "--lr", "inf"], "--lr must be a positive number"),
        (
            ["train", "--epochs", "0"],
            "--epochs must be a positive integer",
        ),
        (
            ["train", "--batch", "x"],
            "--batch must be a positive integer",
        ),
    ] {
        let err = one_line_error(&args);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn every_size_argument_takes_units() {
    let v = json(&["demo", "--device", "cpu", "--json", "--bytes", "1MiB"]);
    assert_eq!(u(&v[0]["bytes"]), 1 << 20, "{v:#}");
    let v = json(&["demo", "--device", "cpu", "--json", "--bytes", "4k"]);
    assert_eq!(u(&v[0]["bytes"]), 4096, "{v:#}");
    let v = json(&["demo", "--device", "cpu", "--json", "--bytes", "1000"]);
    assert_eq!(u(&v[0]["bytes"]), 1000, "{v:#}");
    let err = one_line_error(&["demo", "--device", "cpu", "--bytes", "12 parsecs"]);
    assert!(err.contains("--bytes must be a size"), "{err}");
    let err = one_line_error(&["demo", "--device", "cpu", "--bytes", "0"]);
    assert!(err.contains("--bytes"), "{err}");
}
