//! `syncmem train --memory-cap`: under a cap of half the unplanned device peak, training
//! completes with the same losses as uncapped, bit for bit, spilling dirty mirrors to the host
//! and bringing them back; a cap too small for one operator's working set fails with the
//! out-of-memory error, naming the cap and the holders (no panic, no hang). On `cpu` and
//! `opencl:0`, with zero-copy and with two mirrors.
//!
//! The nets are unfused: fused, the largest operator (an FCGradient holding its input, weights,
//! incoming gradient and both gradient outputs) alone needs 57% of the unplanned peak at the
//! default size, and a buffer an operator holds is never spilled.

mod common;

use common::{json_env, run_env, u};
use serde_json::Value;

fn train(device: &str, zero_copy: &str, cap: Option<u64>) -> Value {
    let cap = cap.map(|c| c.to_string());
    let mut args = vec![
        "train",
        "--device",
        device,
        "--epochs",
        "2",
        "--no-plan",
        "--no-fuse",
        "--json",
    ];
    if let Some(c) = &cap {
        args.extend(["--memory-cap", c]);
    }
    json_env(&args, &[("SYNCMEM_ZERO_COPY", zero_copy)])
}

fn capped_training_matches(device: &str) {
    for zero_copy in ["auto", "off"] {
        let free = train(device, zero_copy, None);
        let peak = free["memory"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["label"] == device)
            .map(|m| u(&m["peak"]))
            .expect("the device's memory row");
        assert_eq!(free["memory_cap"]["cap"], Value::Null);
        assert_eq!(u(&free["memory_cap"]["spills"]), 0);
        let capped = train(device, zero_copy, Some(peak / 2));
        let what = format!(
            "{device}, zero-copy {zero_copy}, cap {} of {peak}",
            peak / 2
        );
        assert_eq!(capped["epochs"].as_array().unwrap().len(), 2, "{what}");
        for (a, b) in free["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(capped["epochs"].as_array().unwrap())
        {
            // Bit for bit: the same floats print the same.
            assert_eq!(a["loss"], b["loss"], "{what}");
            assert_eq!(a["accuracy"], b["accuracy"], "{what}");
        }
        assert_eq!(free["final"], capped["final"], "{what}");
        let m = &capped["memory_cap"];
        assert_eq!(u(&m["cap"]), peak / 2, "{what}");
        assert!(u(&m["spills"]) > 0 && u(&m["refills"]) > 0, "{what}: {m}");
        assert!(m["spills_per_step"].as_f64().unwrap() > 0.0, "{what}: {m}");
        let t = &capped["transfers"]["training"];
        assert_eq!(u(&t["spilled"]["count"]), u(&m["spills"]), "{what}: {t}");
    }
}

fn too_small_a_cap_fails_clearly(device: &str) {
    let out = run_env(
        &[
            "train",
            "--device",
            device,
            "--epochs",
            "1",
            "--memory-cap",
            "8KiB",
        ],
        &[("SYNCMEM_ZERO_COPY", "auto")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for want in [
        "out of memory",
        "cap 8.0 KiB",
        "biggest holders",
        "requested",
    ] {
        assert!(err.contains(want), "{want} missing: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn capped_training_on_cpu_matches_uncapped() {
    capped_training_matches("cpu");
    too_small_a_cap_fails_clearly("cpu");
}

#[test]
fn capped_training_on_opencl_matches_uncapped() {
    if syncmem::testing::opencl_or_skip("capped_training_on_opencl_matches_uncapped").is_none() {
        return;
    }
    capped_training_matches("opencl:0");
    too_small_a_cap_fails_clearly("opencl:0");
}
