//! A closed stdout (`syncmem ... | head` after `head` exits) is a normal end: exit code 0 and
//! nothing on stderr, for every command and both output styles.

#![cfg(unix)]

mod common;

use std::path::PathBuf;

use common::{ok, run_into_closed_stdout, TempPath};

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../syncmem/tests/fixtures/python_written.safetensors")
        .display()
        .to_string()
}

#[test]
fn closed_stdout_is_a_normal_end() {
    let trace = TempPath::new("pipe", "trace.jsonl");
    ok(&[
        "trace",
        "record",
        "--device",
        "cpu",
        "--out",
        trace.arg(),
        "--json",
    ]);
    let out2 = TempPath::new("pipe", "trace2.jsonl");
    let inspect = fixture();
    let commands: Vec<Vec<&str>> = vec![
        vec!["devices"],
        vec!["demo", "--device", "cpu", "--bytes", "4096"],
        vec!["inspect", &inspect],
        vec!["train", "--device", "cpu", "--epochs", "1"],
        vec!["bench", "--quick", "--device", "cpu"],
        vec!["trace", "record", "--device", "cpu", "--out", out2.arg()],
        vec!["trace", "replay", trace.arg()],
    ];
    for cmd in commands {
        for json in [false, true] {
            let mut args = cmd.clone();
            if json {
                args.push("--json");
            }
            let out = run_into_closed_stdout(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "syncmem {args:?}:\n{stderr}");
            assert!(stderr.is_empty(), "syncmem {args:?}:\n{stderr}");
        }
    }
}
