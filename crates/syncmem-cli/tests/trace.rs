//! Runs `syncmem trace record` and `syncmem trace replay`, and `SYNCMEM_TRACE`.

mod common;

use std::path::PathBuf;

use common::{fails, json, run_env as syncmem, u, zero_copy_by_default};
use serde_json::Value;

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncmem-cli-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records a one-epoch run on `device`, checks the file and the summary, replays the file
/// without and with a cap, and checks the comparison.
fn record_and_replay(device: &str) {
    let dir = scratch(&device.replace(':', "-"));
    let file = dir.join("run.jsonl");
    let f = file.to_str().unwrap();
    let r = json(&[
        "trace", "record", "--device", device, "--epochs", "1", "--hidden", "24", "--out", f,
        "--json",
    ]);
    assert_eq!(r["device"], device);
    assert_eq!(r["file"], f);
    assert_eq!(r["hidden"], 24);
    let s = &r["summary"];
    let text = std::fs::read_to_string(&file).unwrap();
    check_trace_file(&text, s, device);
    let devices = check_recorded_traffic(&r, device);
    check_replay(f, s, device, devices.len());
    check_capped_replay(f, device);
    check_replay_table(f, device);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The file: one JSON event per line, as many as the summary `s` says, each in time order.
fn check_trace_file(text: &str, s: &Value, device: &str) {
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len() as u64, u(&s["events"]));
    let count = |op: &str| lines.iter().filter(|l| l["op"] == op).count() as u64;
    assert_eq!(count("alloc"), u(&s["allocs"]));
    assert_eq!(count("free"), u(&s["frees"]));
    // The hidden layers are 24 wide: the second layer's f32 weights are 24 x 24.
    assert!(
        lines
            .iter()
            .any(|l| l["op"] == "alloc" && l["device"] == device && u(&l["size"]) == 24 * 24 * 4),
        "no 24 x 24 weights"
    );
    // Copies, zero-copy syncs, spills and refills: each a `copy` line of its direction.
    assert_eq!(
        count("copy"),
        [
            "host_to_device",
            "device_to_host",
            "device_to_device",
            "mapped",
            "spilled",
            "refilled"
        ]
        .iter()
        .map(|d| u(&s["copies"][d]["count"]))
        .sum::<u64>()
    );
    assert_eq!(count("segment_alloc"), u(&s["segment_allocs"]));
    assert_eq!(count("segment_free"), u(&s["segment_frees"]));
    assert!(u(&s["segment_allocs"]) > 0, "{s}");
    assert_eq!(
        count("alloc")
            + count("free")
            + count("segment_alloc")
            + count("segment_free")
            + count("copy")
            + count("evict")
            + count("oom")
            + count("plan"),
        lines.len() as u64
    );
    // The planned train net's plan: one line naming its slots.
    assert!(count("plan") >= 1, "no plan line");
    // Every line has its time, in order; training steps are marked.
    let times: Vec<u64> = lines.iter().map(|l| u(&l["t_us"])).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(lines.iter().any(|l| l["step"] == 1), "no step marked");
    let copy_bytes: u64 = lines
        .iter()
        .filter(|l| l["op"] == "copy" && l["direction"] == "host_to_device")
        .map(|l| u(&l["bytes"]))
        .sum();
    assert_eq!(copy_bytes, u(&s["copies"]["host_to_device"]["bytes"]));
    assert!(lines
        .iter()
        .filter(|l| l["op"] == "copy")
        .all(|l| l["device"] == device));
    // Blocks name their owners: the weights of the second layer are `fc2_w`.
    assert!(
        lines
            .iter()
            .any(|l| l["op"] == "alloc" && l["owner"] == "fc2_w"),
        "no block owned by fc2_w"
    );
}

/// What the run of `record` `r` moved and allocated; returns the devices its trace covers.
fn check_recorded_traffic<'a>(r: &'a Value, device: &str) -> Vec<&'a str> {
    let s = &r["summary"];
    // The run uploads its data and parameters and reads back the loss each step (copies, or
    // zero-copy syncs where the device shares host memory); everything it allocates it frees.
    let moved = |d: &str| u(&s["copies"][d]["count"]);
    if zero_copy_by_default(device) {
        assert!(moved("mapped") > 0, "{s}");
        assert_eq!(moved("host_to_device") + moved("device_to_host"), 0, "{s}");
    } else {
        assert!(moved("host_to_device") > 0, "{s}");
        assert!(moved("device_to_host") > 0, "{s}");
    }
    assert!(u(&s["allocs"]) > 0);
    assert_eq!(u(&s["allocs"]), u(&s["frees"]), "{s}");
    let devices: Vec<&str> = r["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    // Host mirrors come from the host pool, where a buffer keeps two (with zero-copy, the
    // training allocates none at all).
    assert!(devices.contains(&device), "{devices:?}");
    assert_eq!(
        devices.contains(&"host"),
        !zero_copy_by_default(device),
        "{devices:?}"
    );
    let per_device: u64 = r["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| u(&d["summary"]["events"]))
        .sum();
    assert_eq!(per_device, u(&s["events"]));
    devices
}

/// Replays the file `f` on every pool kind: the same allocations as recorded (summary `s`) on
/// each, the `none` pool holding exactly what was asked for, the caching pool reusing blocks.
fn check_replay(f: &str, s: &Value, device: &str, recorded_devices: usize) {
    let v = json(&["trace", "replay", f, "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3 * (recorded_devices + 1), "{v:#}");
    let row = |kind: &str, dev: &str| -> &Value {
        rows.iter()
            .find(|r| r["kind"] == kind && r["device"] == dev)
            .unwrap_or_else(|| panic!("no row {kind} {dev}: {v:#}"))
    };
    for kind in ["caching", "binned", "none"] {
        let t = row(kind, "total");
        assert_eq!(u(&t["allocations"]), u(&s["allocs"]), "{kind}");
        for r in rows.iter().filter(|r| r["kind"] == kind) {
            assert!(u(&r["peak_reserved"]) >= u(&r["peak_allocated"]), "{r}");
            assert_eq!(u(&r["ooms"]), 0, "{r}");
            // What the program asked for does not depend on the pool.
            let none = row("none", r["device"].as_str().unwrap());
            assert_eq!(u(&r["peak_requested"]), u(&none["peak_requested"]), "{r}");
            let ratio = r["reserved_per_requested"].as_f64().unwrap();
            let want = u(&r["peak_reserved"]) as f64 / u(&r["peak_requested"]) as f64;
            assert!((ratio - want).abs() < 1e-9, "{r}");
            let overhead = r["overhead"].as_f64().unwrap();
            assert!(ratio >= overhead, "rounding only adds: {r}");
        }
    }
    let none = row("none", device);
    assert_eq!(u(&none["cache_hits"]), 0);
    assert_eq!(u(&none["peak_reserved"]), u(&none["peak_allocated"]));
    assert_eq!(u(&none["peak_reserved"]), u(&none["peak_requested"]));
    assert_eq!(none["reserved_per_requested"].as_f64(), Some(1.0));
    let caching = row("caching", device);
    assert!(u(&caching["cache_hits"]) > 0, "{caching}");
    assert!(u(&caching["backend_calls"]) < u(&none["backend_calls"]));
}

/// Under a 4 KiB cap per device pool, the device runs out of memory; the host (where the run
/// used host mirrors at all) does not.
fn check_capped_replay(f: &str, device: &str) {
    let v = json(&[
        "trace", "replay", f, "--pool", "binned", "--cap", "4KiB", "--json",
    ]);
    assert_eq!(u(&v["cap"]), 4096);
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["kind"] == "binned"));
    let dev_row = rows.iter().find(|r| r["device"] == device).unwrap();
    assert!(u(&dev_row["ooms"]) > 0, "{dev_row}");
    assert!(u(&dev_row["peak_reserved"]) <= 4096, "{dev_row}");
    if let Some(host_row) = rows.iter().find(|r| r["device"] == "host") {
        assert_eq!(u(&host_row["ooms"]), 0);
    }
}

/// The text table of a replay, with its legend.
fn check_replay_table(f: &str, device: &str) {
    let out = common::run(&["trace", "replay", f]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "peak reserved",
        "peak requested",
        "reserved/",
        "requested",
        "allocated",
        "backend calls",
        "OOMs",
        "caching",
        "binned",
        "none",
        "reserved/requested: peak reserved / peak requested",
        "reserved/allocated: peak reserved / peak allocated",
        device,
    ] {
        assert!(text.contains(needle), "missing {needle:?}:\n{text}");
    }
}

#[test]
fn record_and_replay_on_cpu() {
    record_and_replay("cpu");
}

#[cfg(feature = "opencl")]
#[test]
fn record_and_replay_on_opencl() {
    let Some(dev) = syncmem::testing::opencl_or_skip("record_and_replay_on_opencl") else {
        return;
    };
    record_and_replay(dev.label());
}

#[test]
fn replay_of_a_bad_file_fails_clearly() {
    let dir = scratch("bad");
    let missing = dir.join("missing.jsonl");
    let err = fails(&["trace", "replay", missing.to_str().unwrap()]);
    assert!(
        err.contains("cannot open") && err.contains("missing.jsonl"),
        "{err}"
    );

    let garbage = dir.join("garbage.jsonl");
    std::fs::write(
        &garbage,
        "{\"op\":\"alloc\",\"id\":0,\"size\":8,\"stream\":0,\"device\":\"cpu\"}\nnot json\n",
    )
    .unwrap();
    let err = fails(&["trace", "replay", garbage.to_str().unwrap()]);
    assert!(
        err.contains("invalid trace file") && err.contains("line 2"),
        "{err}"
    );

    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let err = fails(&["trace", "replay", empty.to_str().unwrap()]);
    assert!(err.contains("no events"), "{err}");

    // A free of a block never allocated.
    let unknown = dir.join("unknown.jsonl");
    std::fs::write(&unknown, "{\"op\":\"free\",\"id\":7,\"device\":\"cpu\"}\n").unwrap();
    let err = fails(&["trace", "replay", unknown.to_str().unwrap()]);
    assert!(err.contains("unknown block 7"), "{err}");

    let err = fails(&[
        "trace",
        "replay",
        garbage.to_str().unwrap(),
        "--pool",
        "lru",
    ]);
    assert!(err.contains("--pool") && err.contains("lru"), "{err}");
    let err = fails(&[
        "trace",
        "replay",
        garbage.to_str().unwrap(),
        "--cap",
        "12 parsecs",
    ]);
    assert!(err.contains("--cap"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn old_format_file_replays() {
    let dir = scratch("old");
    let file = dir.join("old.jsonl");
    std::fs::write(
        &file,
        "{\"op\":\"alloc\",\"id\":0,\"size\":1000,\"stream\":1,\"device\":\"opencl:0\"}\n\
         {\"op\":\"free\",\"id\":0,\"device\":\"opencl:0\"}\n",
    )
    .unwrap();
    let v = json(&[
        "trace",
        "replay",
        file.to_str().unwrap(),
        "--pool",
        "none",
        "--json",
    ]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v:#}");
    assert_eq!(rows[0]["device"], "opencl:0");
    assert_eq!(u(&rows[0]["allocations"]), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn syncmem_trace_records_any_command() {
    let dir = scratch("env");
    let file = dir.join("demo.jsonl");
    let out = syncmem(
        &["demo", "--device", "cpu", "--json", "--bytes", "4099"],
        &[("SYNCMEM_TRACE", &file)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("events written to"), "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    let copies: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["op"] == "copy")
        .collect();
    // Caffe's sequence syncs the buffer up and back down: without a copy on the cpu device,
    // whose buffers share the host's memory.
    let syncs = copies
        .iter()
        .filter(|c| c["direction"] == "mapped" && u(&c["bytes"]) == 4099 && c["device"] == "cpu")
        .count();
    assert_eq!((syncs, copies.len()), (4, 4), "{copies:?}");
    // With two mirrors, copies up and down.
    let file = dir.join("demo-copies.jsonl");
    let out = syncmem(
        &["demo", "--device", "cpu", "--json", "--bytes", "4099"],
        &[
            ("SYNCMEM_TRACE", file.as_os_str()),
            ("SYNCMEM_ZERO_COPY", std::ffi::OsStr::new("off")),
        ],
    );
    assert!(out.status.success());
    let text = std::fs::read_to_string(&file).unwrap();
    let copies: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["op"] == "copy")
        .collect();
    for dir in ["host_to_device", "device_to_host"] {
        assert!(
            copies
                .iter()
                .any(|c| c["direction"] == dir && u(&c["bytes"]) == 4099 && c["device"] == "cpu"),
            "{dir}: {copies:?}"
        );
    }
    // An unwritable path fails before the command runs.
    let bad = dir.join("no-such-dir").join("t.jsonl");
    let out = syncmem(&["devices"], &[("SYNCMEM_TRACE", &bad)]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SYNCMEM_TRACE") && stderr.contains("cannot create"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
