//! `syncmem train --snapshot FILE` and the memory summary of `syncmem train`: the file is a
//! memory snapshot whose allocated blocks name the blobs they hold; the summary's figures are
//! in the JSON report and in the human one.

mod common;

use common::{json as train_json, ok, run as syncmem, u, TempPath};
use serde_json::Value;

/// A temporary file of this test.
fn temp(name: &str) -> TempPath {
    TempPath::new("snapshot", &format!("{name}.json"))
}

/// Trains one epoch on `device` with `--snapshot`; checks the file against the report.
fn snapshot_names_blobs(device: &str) {
    let file = temp(&device.replace(':', "-"));
    let r = train_json(&[
        "train",
        "--device",
        device,
        "--epochs",
        "1",
        "--json",
        "--snapshot",
        file.arg(),
    ]);
    let text = std::fs::read_to_string(&file.0).expect("the snapshot file");
    let snap: Value = serde_json::from_str(&text).expect("the snapshot is JSON");
    assert_eq!(snap["device"], device);
    let step = u(&snap["step"]);
    assert!((1..=u(&r["transfers"]["steps"])).contains(&step), "{step}");
    let pools = snap["pools"].as_array().expect("pools");
    let dev_pool = pools
        .iter()
        .find(|p| p["label"] == device)
        .unwrap_or_else(|| panic!("no {device} pool in {text}"));
    // The host pool holds host mirrors, where the buffers keep two (not with zero-copy).
    if !common::zero_copy_by_default(device) {
        assert!(pools.iter().any(|p| p["label"] == "host"), "the host pool");
    }
    // Every segment is tiled by its blocks, and the segments add up to the pool's reserve.
    let segments = dev_pool["segments"].as_array().unwrap();
    let mut reserved = 0;
    for s in segments {
        let blocks = s["blocks"].as_array().unwrap();
        let tiled: u64 = blocks.iter().map(|b| u(&b["size"])).sum();
        assert_eq!(tiled, u(&s["size"]));
        reserved += u(&s["size"]);
    }
    assert_eq!(reserved, u(&dev_pool["stats"]["reserved"]["current"]));
    // Allocated blocks name the blobs of the report.
    let blobs: Vec<&str> = r["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    let named: Vec<&str> = segments
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap())
        .filter(|b| b["state"] == "allocated")
        .filter_map(|b| b["owner"].as_str())
        .filter(|o| blobs.contains(o))
        .collect();
    for p in ["fc1_w", "fc2_w", "fc3_w"] {
        assert!(named.contains(&p), "{p} not among {named:?}");
    }
    // The peak the snapshot was taken at: what the pool held then is at most its peak.
    let summary = &r["memory_summary"];
    assert!(
        u(&dev_pool["stats"]["allocated"]["current"]) <= u(&summary["allocated"]["all"]["peak"])
    );
}

#[test]
fn train_snapshot_on_cpu_names_blobs() {
    snapshot_names_blobs("cpu");
}

#[test]
fn train_snapshot_on_opencl_names_blobs() {
    if syncmem::testing::opencl_or_skip("train_snapshot_on_opencl").is_some() {
        snapshot_names_blobs("opencl:0");
    }
}

#[test]
fn the_json_report_has_the_memory_summary() {
    let r = train_json(&["train", "--device", "cpu", "--epochs", "1", "--json"]);
    let s = &r["memory_summary"];
    assert_eq!(s["label"], "cpu");
    assert_eq!(s["kind"], "caching");
    for key in ["allocated", "requested", "reserved", "inactive_split"] {
        for class in ["all", "small", "large"] {
            let g = &s[key][class];
            assert!(u(&g["peak"]) >= u(&g["current"]), "{key}.{class}: {g}");
            assert_eq!(
                u(&g["allocated"]) - u(&g["freed"]),
                u(&g["current"]),
                "{key}.{class}: {g}"
            );
        }
        let current = |c: &str| u(&s[key][c]["current"]);
        assert_eq!(current("all"), current("small") + current("large"), "{key}");
    }
    assert!(u(&s["allocated"]["all"]["current"]) > 0);
    assert!(u(&s["reserved"]["all"]["current"]) >= u(&s["allocated"]["all"]["current"]));
    assert!(u(&s["allocations"]) >= u(&s["frees"]));
}

#[test]
fn the_human_report_prints_the_summary_with_its_legend() {
    let out = ok(&["train", "--device", "cpu", "--epochs", "1"]);
    assert!(
        out.contains("memory summary of pool cpu (caching)"),
        "{out}"
    );
    for row in [
        "| allocated bytes",
        "| requested bytes",
        "| reserved bytes",
        "| inactive split bytes",
        "|   small blocks",
        "|   large blocks",
    ] {
        assert!(out.contains(row), "{row}: {out}");
    }
    for legend in [
        "  current, peak",
        "  allocated, freed",
        "  inactive split bytes",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(legend)),
            "{legend}: {out}"
        );
    }
}

#[test]
fn snapshot_to_a_missing_directory_fails_before_training() {
    let path = std::env::temp_dir()
        .join(format!("syncmem-no-such-dir-{}", std::process::id()))
        .join("s.json");
    let out = syncmem(&[
        "train",
        "--device",
        "cpu",
        "--snapshot",
        path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "trained before failing");
    assert!(stderr.contains("--snapshot"), "{stderr}");
}
