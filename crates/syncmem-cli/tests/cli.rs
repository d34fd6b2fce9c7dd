//! Runs the built `syncmem` binary.

mod common;

use common::{fails, json, json_env, ok, zero_copy_by_default};

/// Caffe's table: (call, copy, head after) for steps 1-9.
const EXPECTED: [(&str, &str, &str); 9] = [
    ("gpu_data", "host_to_device", "synced"),
    ("cpu_data", "none", "synced"),
    ("mutable_gpu_data", "none", "device"),
    ("mutable_gpu_data", "none", "device"),
    ("cpu_data", "device_to_host", "synced"),
    ("gpu_data", "none", "synced"),
    ("mutable_cpu_data", "none", "host"),
    ("mutable_gpu_data", "host_to_device", "device"),
    ("mutable_cpu_data", "device_to_host", "host"),
];

/// Runs `demo --json` on `device` with a buffer of `bytes` and checks Caffe's table.
fn check_demo(device: &str, bytes: u64) {
    // Two mirrors: Caffe's copies. Zero-copy (the default where the device shares host
    // memory): the same heads, a zero-copy sync where Caffe copies.
    check_demo_with(device, bytes, "off");
    check_demo_with(device, bytes, "auto");
}

fn check_demo_with(device: &str, bytes: u64, zero_copy: &str) {
    let n = bytes.to_string();
    let args = ["demo", "--device", device, "--json", "--bytes", &n];
    let v = json_env(&args, &[("SYNCMEM_ZERO_COPY", zero_copy)]);
    let shared = zero_copy == "auto" && zero_copy_by_default(device);
    let steps = v.as_array().expect("a JSON array");
    assert_eq!(steps.len(), 9, "{v:#}");
    for (i, (s, (call, copy, head))) in steps.iter().zip(EXPECTED).enumerate() {
        let copy = if shared && copy != "none" {
            "mapped"
        } else {
            copy
        };
        let obj = s.as_object().expect("an object per step");
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["bytes", "call", "copy", "head", "step"],
            "step {}",
            i + 1
        );
        assert_eq!(s["step"], i as u64 + 1, "{s}");
        assert_eq!(s["call"], call, "{device} step {}: {s}", i + 1);
        assert_eq!(s["copy"], copy, "{device} step {}: {s}", i + 1);
        assert_eq!(s["head"], head, "{device} step {}: {s}", i + 1);
        let want = if copy == "none" { 0 } else { bytes };
        assert_eq!(s["bytes"], want, "{device} step {}: {s}", i + 1);
    }
}

#[test]
fn devices_json_lists_the_cpu() {
    let v = json(&["devices", "--json"]);
    let list = v.as_array().expect("a JSON array");
    let cpu = list
        .iter()
        .find(|e| e["label"] == "cpu")
        .unwrap_or_else(|| panic!("no cpu entry: {v:#}"));
    assert_eq!(cpu["backend"], "cpu");
    assert_eq!(cpu["host_unified"], true);
    assert!(cpu["total_memory"].as_u64().is_some_and(|m| m > 0), "{cpu}");
    // The cpu has no allocation limit of its own: null, not a sentinel number.
    assert!(cpu["max_alloc"].is_null(), "{cpu}");
    for e in list {
        let backend = e["backend"]
            .as_str()
            .expect("every entry names its backend");
        assert!(["cpu", "opencl", "cuda"].contains(&backend), "{e}");
        if e.get("error").is_some() {
            assert!(e["error"].is_string() && e["compiled"].is_boolean(), "{e}");
            assert!(e.get("label").is_none(), "{e}");
        } else {
            for key in ["label", "name", "vendor"] {
                assert!(e[key].is_string(), "{key} in {e}");
            }
            // Sizes are real byte counts or null, never a "no limit" or "unknown" sentinel.
            for key in ["total_memory", "max_alloc"] {
                assert!(
                    e[key].is_null()
                        || e[key]
                            .as_u64()
                            .is_some_and(|n| n > 0 && n < i64::MAX as u64),
                    "{key} in {e}"
                );
            }
        }
    }
    // Every backend appears, with devices or with an error.
    for b in ["cpu", "opencl", "cuda"] {
        assert!(list.iter().any(|e| e["backend"] == b), "{b} missing: {v:#}");
    }
    if syncmem::testing::opencl_or_skip("devices_json_lists_opencl").is_some() {
        assert!(
            list.iter().any(|e| e["label"] == "opencl:0"),
            "opencl:0 missing: {v:#}"
        );
    }
}

#[test]
fn devices_table_names_every_backend() {
    let out = ok(&["devices"]);
    assert!(out.starts_with("BACKEND"), "{out}");
    for b in ["cpu", "opencl", "cuda"] {
        assert!(out.lines().any(|l| l.starts_with(b)), "{b} missing:\n{out}");
    }
}

#[test]
fn demo_on_cpu_follows_caffes_table() {
    check_demo("cpu", 12_345);
    check_demo("cpu", 1);
}

#[test]
fn demo_on_opencl_follows_caffes_table() {
    if syncmem::testing::opencl_or_skip("demo_on_opencl_follows_caffes_table").is_none() {
        return;
    }
    check_demo("opencl:0", 100_003);
}

#[test]
fn demo_on_cuda_follows_caffes_table() {
    if syncmem::testing::cuda_or_skip("demo_on_cuda_follows_caffes_table").is_none() {
        return;
    }
    check_demo("cuda:0", 100_003);
}

#[test]
fn demo_human_output() {
    let out = ok(&["demo", "--device", "cpu", "--bytes", "4096"]);
    assert!(out.starts_with("syncmem demo on cpu"), "{out}");
    for want in [
        "mutable_gpu_data",
        "zero-copy (in-place)",
        "mapped",
        "this buffer: 0 copies (0 B), 4 zero-copy syncs (16.0 KiB)",
        "synced",
        "copies",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
}

#[test]
fn demo_default_device_is_an_accelerator_or_a_clear_error() {
    let accel = syncmem::Device::first_accelerator();
    if syncmem::testing::opencl_or_skip("demo_default_device").is_some() {
        assert!(accel.is_some());
    }
    match accel {
        Some(d) => {
            let out = ok(&["demo", "--bytes", "4096"]);
            let first = out.lines().next().unwrap_or_default();
            assert!(first.contains(d.label()), "{out}");
        }
        None => {
            let err = fails(&["demo"]);
            assert!(
                err.contains("only the CPU") && err.contains("--device cpu"),
                "{err}"
            );
        }
    }
}

#[test]
fn bad_device_string_is_a_readable_error() {
    let err = fails(&["demo", "--device", "tpu:0"]);
    assert!(err.contains("tpu:0") && err.contains("opencl:N"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let err = fails(&["demo", "--device", "cpu:7"]);
    assert!(err.contains("cpu:7"), "{err}");
}

#[test]
fn zero_bytes_is_refused() {
    let err = fails(&["demo", "--device", "cpu", "--bytes", "0"]);
    assert!(err.contains("--bytes"), "{err}");
}

#[test]
fn help_texts_exist() {
    for args in [&["--help"][..], &["devices", "--help"], &["demo", "--help"]] {
        let out = ok(args);
        assert!(out.contains("Usage"), "{args:?}:\n{out}");
    }
    assert!(ok(&["devices", "--help"]).contains("\"error\""));
    assert!(ok(&["demo", "--help"]).contains("\"head\""));
}
