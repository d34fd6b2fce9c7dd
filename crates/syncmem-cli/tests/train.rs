//! Runs `syncmem train` and checks its JSON report.

mod common;

use common::{f, json as train_json, json_env, run as syncmem, u, zero_copy_by_default, TempPath};
use serde_json::Value;

/// The checks every report must pass: shape of the JSON, copies per step, heads, planning.
/// `shared`: the run's buffers share memory with the host (zero-copy): every transfer is a
/// zero-copy sync, no byte is copied.
fn check_report(r: &Value, device: &str, epochs: usize, shared: bool) {
    assert_eq!(r["device"], device);
    assert_eq!(r["data"]["source"], "spirals");
    assert_eq!(u(&r["data"]["samples"]), 3000);
    assert_eq!(r["model"]["widths"], serde_json::json!([2, 64, 64, 3]));
    let rows = r["epochs"].as_array().expect("epochs array");
    assert_eq!(rows.len(), epochs);
    for (k, e) in rows.iter().enumerate() {
        assert_eq!(u(&e["epoch"]) as usize, k + 1);
        assert!(f(&e["loss"]).is_finite() && f(&e["loss"]) > 0.0, "{e}");
        assert!((0.0..=1.0).contains(&f(&e["accuracy"])), "{e}");
        assert!(f(&e["seconds"]) >= 0.0);
        assert_eq!(u(&e["steps"]), 47); // 3000 / 64, rounded up
    }
    assert!((0.0..=1.0).contains(&f(&r["final"]["accuracy"])));
    assert!(
        f(&rows[epochs - 1]["loss"]) < f(&rows[0]["loss"]),
        "the loss goes down"
    );

    check_transfers(&r["transfers"], epochs, shared);
    check_blobs_and_planning(r, device);
}

/// Copies during setup and the steps: only the loss and the accuracy come back each step.
fn check_transfers(t: &Value, epochs: usize, shared: bool) {
    assert_eq!(u(&t["steps"]) as usize, 47 * epochs);
    for key in ["training", "max_step"] {
        assert_eq!(u(&t[key]["host_to_device"]["count"]), 0, "{key}: {t}");
        assert_eq!(u(&t[key]["device_to_device"]["count"]), 0, "{key}: {t}");
    }
    // The loss and the accuracy come back each step, side by side: one 8-byte copy, or one
    // zero-copy sync and not a byte copied (in setup either: the batches are uploaded by
    // syncs).
    let back = if shared { "mapped" } else { "device_to_host" };
    assert_eq!(u(&t["per_step"][back]["count"]), 1, "{t}");
    assert_eq!(u(&t["per_step"][back]["bytes"]), 8, "{t}");
    assert_eq!(u(&t["max_step"][back]["count"]), 1, "{t}");
    let up = if shared { "mapped" } else { "host_to_device" };
    assert!(
        u(&t["setup"][up]["count"]) > 0,
        "batches uploaded once: {t}"
    );
    if shared {
        for key in ["setup", "training"] {
            for dir in ["host_to_device", "device_to_host", "device_to_device"] {
                assert_eq!(u(&t[key][dir]["bytes"]), 0, "{key} {dir}: {t}");
            }
        }
    }
    // Every transfer of the process during the steps, operators included: only the two
    // scalars.
    let steps = u(&t["steps"]);
    let pt = &t["process_training"];
    assert_eq!(u(&pt["host_to_device"]["count"]), 0, "{t}");
    assert_eq!(u(&pt["device_to_device"]["count"]), 0, "{t}");
    assert_eq!(u(&pt[back]["count"]), steps, "{t}");
    assert_eq!(u(&pt[back]["bytes"]), 8 * steps, "{t}");
}

/// Where the blobs live, how planning shared their buffers, the device's memory row.
fn check_blobs_and_planning(r: &Value, device: &str) {
    let blobs = r["blobs"].as_array().expect("blobs array");
    let blob = |name: &str| {
        blobs
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("no blob {name} in {blobs:?}"))
    };
    for p in ["fc1_w", "fc1_b", "fc2_w", "fc2_b", "fc3_w", "fc3_b"] {
        assert_eq!(blob(p)["head"], "device", "{p}");
        assert_eq!(blob(p)["device"], true);
    }
    assert_eq!(blob("loss")["dims"], serde_json::json!([]));
    assert_eq!(blob("loss_and_accuracy")["head"], "synced");
    assert_eq!(blob("loss_and_accuracy")["dims"], serde_json::json!([2]));
    // Planning on: the intermediates live in shared slots.
    assert!(blobs.iter().any(|b| b["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("__shared_"))));
    assert!(!blobs.iter().any(|b| b["name"] == "fc1"));

    let p = &r["planning"];
    assert_eq!(p["enabled"], true);
    assert!(u(&p["planned_peak"]) < u(&p["unplanned_peak"]), "{p}");
    assert_eq!(
        u(&p["saved"]),
        u(&p["unplanned_peak"]) - u(&p["planned_peak"])
    );
    assert!(u(&p["slots"]) < u(&p["planned_blobs"]), "{p}");
    let shared = p["shared"].as_object().expect("shared buffers");
    assert_eq!(shared.len() as u64, u(&p["slots"]));
    // FC + Relu fused: the first intermediate written is the first ReLU's output.
    assert!(shared["__shared_0"]
        .as_array()
        .is_some_and(|v| v.len() > 1 && v[0] == "relu1"));
    let mem = r["memory"].as_array().expect("memory array");
    let dev_mem = mem
        .iter()
        .find(|m| m["label"] == device)
        .expect("memory row of the device");
    assert!(u(&dev_mem["peak"]) > 0);
}

#[test]
fn train_on_cpu_reports_json() {
    let r = train_json(&["train", "--device", "cpu", "--epochs", "2", "--json"]);
    check_report(&r, "cpu", 2, zero_copy_by_default("cpu"));
    assert!(r["note"].is_null());
    // No heap allocation after the first step, the threads of the `cpu` backend included
    // (their start-up allocations happen before the team's first job, not in a later step).
    let heap = &r["heap_allocations"];
    assert_eq!(u(&heap["max_step"]), 0, "{heap}");
    assert_eq!(r["settings"]["plan"], true);
    // Two mirrors: the same run with copies.
    let args = ["train", "--device", "cpu", "--epochs", "2", "--json"];
    let off = json_env(&args, &[("SYNCMEM_ZERO_COPY", "off")]);
    check_report(&off, "cpu", 2, false);
    assert_eq!(off["final"], r["final"], "the same results either way");
}

#[test]
fn the_text_report_counts_zero_copy_syncs_as_syncs() {
    let out = common::ok(&["train", "--device", "cpu", "--epochs", "1", "--hidden", "8"]);
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("zero-copy syncs"))
        .collect();
    assert!(!lines.is_empty(), "no transfer lines in {out}");
    for line in lines {
        let (copies, syncs) = line.split_once("zero-copy syncs").unwrap();
        assert!(copies.contains("copies"), "{line}");
        // "zero-copy syncs N syncs BYTES": a sync copies no byte, so it is not called a copy.
        assert!(
            syncs.contains(" syncs ") && !syncs.contains("copies"),
            "{line}"
        );
    }
}

#[cfg(feature = "opencl")]
#[test]
fn train_on_opencl_reports_json() {
    let Some(dev) = syncmem::testing::opencl_or_skip("train_on_opencl_reports_json") else {
        return;
    };
    let label = dev.label().to_string();
    let r = train_json(&["train", "--device", &label, "--epochs", "2", "--json"]);
    check_report(&r, &label, 2, zero_copy_by_default(&label));
    let args = ["train", "--device", &label, "--epochs", "2", "--json"];
    let off = json_env(&args, &[("SYNCMEM_ZERO_COPY", "off")]);
    check_report(&off, &label, 2, false);
    assert_eq!(off["final"], r["final"], "the same results either way");
}

#[cfg(feature = "opencl")]
#[test]
fn train_on_two_opencl_devices_reaches_the_one_device_loss() {
    let Some((a, b)) =
        syncmem::testing::two_or_skip(syncmem::BackendKind::OpenCl, "train on two devices")
    else {
        return;
    };
    let list = format!("{},{}", a.label(), b.label());
    let args = |d: &str| -> Vec<String> {
        ["train", "--device", d, "--epochs", "3", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let run = |d: &str| {
        let a = args(d);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        common::json(&a)
    };
    let two = run(&list);
    let one = run(a.label());
    assert_eq!(two["devices"], serde_json::json!([a.label(), b.label()]));
    assert_eq!(one["devices"], serde_json::json!([a.label()]));
    let (l2, l1) = (f(&two["final"]["loss"]), f(&one["final"]["loss"]));
    assert!((l2 - l1).abs() < 1e-4, "{l2} vs {l1}");
    // Parameters out and gradients back every step, per pair.
    let pairs = two["device_pairs"].as_array().expect("device_pairs");
    for (from, to) in [(a.label(), b.label()), (b.label(), a.label())] {
        let row = pairs
            .iter()
            .find(|p| p["from"] == from && p["to"] == to)
            .unwrap_or_else(|| panic!("{from} -> {to} missing: {pairs:?}"));
        assert_eq!(f(&row["count_per_step"]), 6.0, "{row}");
        assert!(f(&row["bytes_per_step"]) > 0.0, "{row}");
    }
    assert!(one["device_pairs"].as_array().is_some_and(Vec::is_empty));
}

#[test]
fn a_missing_device_of_a_list_is_named() {
    let stderr = common::fails(&["train", "--device", "cpu,opencl:7", "--epochs", "1"]);
    assert!(stderr.contains("opencl:7"), "{stderr}");
    let stderr = common::fails(&["train", "--device", "cpu,cpu", "--epochs", "1"]);
    assert!(stderr.contains("listed twice"), "{stderr}");
}

#[test]
fn no_plan_keeps_every_blob() {
    let r = train_json(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--no-plan",
        "--json",
    ]);
    assert_eq!(r["settings"]["plan"], false);
    assert_eq!(r["planning"]["enabled"], false);
    let blobs = r["blobs"].as_array().unwrap();
    assert!(blobs.iter().any(|b| b["name"] == "relu1"));
    assert!(!blobs.iter().any(|b| b["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("__shared_"))));
}

/// FC + Relu and FCGradient + ReluGradient are fused by default (no pre-activation blob, no
/// gradient of a ReLU output); `--no-fuse` writes `fc1`, `fc2`, `relu1_grad` and `relu2_grad`
/// again, and the results are the same bit for bit.
#[test]
fn no_fuse_writes_the_pre_activations_with_the_same_results() {
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--device", "cpu", "--epochs", "2", "--no-plan"];
        args.extend(extra);
        args.push("--json");
        train_json(&args)
    };
    let (fused, unfused) = (run(&[]), run(&["--no-fuse"]));
    assert_eq!(fused["settings"]["fuse"], true);
    assert_eq!(unfused["settings"]["fuse"], false);
    let has = |r: &Value, name: &str| {
        r["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["name"] == name)
    };
    for pre in ["fc1", "fc2", "relu1_grad", "relu2_grad"] {
        assert!(!has(&fused, pre) && has(&unfused, pre), "{pre}");
    }
    assert!(has(&fused, "fc3"), "the last FC feeds no Relu");
    for key in ["loss", "accuracy"] {
        assert_eq!(fused["final"][key], unfused["final"][key], "{key}");
    }
}

#[test]
fn trains_on_a_safetensors_file() {
    use safetensors::{tensor::TensorView, Dtype};
    // Two separable classes on a line: x < 0 is class 0, x > 0 class 1.
    let n = 200usize;
    let x: Vec<f32> = (0..n)
        .flat_map(|i| {
            let v = (i as f32 - n as f32 / 2.0 + 0.5) / n as f32;
            [v, 0.5 * v]
        })
        .collect();
    let y: Vec<i64> = (0..n).map(|i| i64::from(i >= n / 2)).collect();
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes = safetensors::serialize(
        [
            ("x", TensorView::new(Dtype::F32, vec![n, 2], &xb).unwrap()),
            ("y", TensorView::new(Dtype::I64, vec![n], &yb).unwrap()),
        ],
        None,
    )
    .unwrap();
    let path =
        std::env::temp_dir().join(format!("syncmem-train-{}.safetensors", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let p = path.to_str().unwrap();
    let r = train_json(&[
        "train", "--device", "cpu", "--data", p, "--epochs", "3", "--batch", "50", "--json",
    ]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(r["data"]["source"], p);
    assert_eq!(u(&r["data"]["samples"]), n as u64);
    assert_eq!(r["model"]["widths"], serde_json::json!([2, 64, 64, 2]));
    assert_eq!(r["epochs"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_input_fails_with_a_message() {
    for (args, needle) in [
        (
            vec![
                "train",
                "--device",
                "cpu",
                "--data",
                "/nonexistent.safetensors",
            ],
            "nonexistent",
        ),
        (vec!["train", "--device", "cpu", "--batch", "0"], "--batch"),
        (vec!["train", "--device", "nope:0"], "nope"),
        (vec!["train", "--device", "cpu", "--lr=0"], "--lr"),
    ] {
        let out = syncmem(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// A temporary file of this test.
fn temp(name: &str) -> TempPath {
    TempPath::new("train", &format!("{name}.safetensors"))
}

#[test]
fn save_writes_the_parameters_for_inspect() {
    let file = temp("weights");
    let r = train_json(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--hidden",
        "16",
        "--save",
        file.arg(),
        "--json",
    ]);
    let params = ["fc1_b", "fc1_w", "fc2_b", "fc2_w", "fc3_b", "fc3_w"];
    assert_eq!(r["saved"]["file"], file.arg(), "{r:#}");
    assert_eq!(r["saved"]["tensors"], serde_json::json!(params), "{r:#}");
    // The report shows the parameters where training left them, on the device.
    let blobs = r["blobs"].as_array().unwrap();
    let w = blobs.iter().find(|b| b["name"] == "fc1_w").unwrap();
    assert_eq!(w["head"], "device", "{w}");

    let v = train_json(&["inspect", file.arg(), "--json"]);
    let tensors = v["tensors"].as_array().expect("tensors");
    let names: Vec<&str> = tensors
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, params);
    let widths = [2, 16, 16, 3];
    for t in tensors {
        assert_eq!(t["dtype"], "F32", "{t}");
        let name = t["name"].as_str().unwrap();
        let k: usize = name[2..3].parse().unwrap();
        let want = if name.ends_with('w') {
            serde_json::json!([widths[k], widths[k - 1]])
        } else {
            serde_json::json!([widths[k]])
        };
        assert_eq!(t["shape"], want, "{t}");
    }
    // The values are the trained ones: finite, and not the zeros the biases start from.
    let ws = syncmem::Workspace::new();
    ws.load(&file.0, None, None).unwrap();
    let b: Vec<f32> = ws.fetch("fc1_b").unwrap();
    assert!(b.iter().all(|x| x.is_finite()), "{b:?}");
    assert!(b.iter().any(|&x| x != 0.0), "{b:?}");

    // The text report says where the parameters went.
    let out = common::ok(&[
        "train",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--hidden",
        "4",
        "--save",
        file.arg(),
    ]);
    assert!(
        out.contains(&format!("saved 6 parameter tensors to {}", file.arg())),
        "{out}"
    );
}

#[test]
fn save_to_a_missing_directory_fails_before_training() {
    let path = std::env::temp_dir()
        .join(format!("syncmem-no-such-dir-{}", std::process::id()))
        .join("w.safetensors");
    let out = syncmem(&["train", "--device", "cpu", "--save", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "trained before failing");
    assert!(stderr.contains("--save"), "{stderr}");
}

/// Writes a safetensors file of `tensors` (name, dtype, shape, little-endian bytes).
fn data_file(what: &str, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) -> TempPath {
    use safetensors::tensor::TensorView;
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let file = temp(what);
    std::fs::write(&file.0, safetensors::serialize(views, None).unwrap()).unwrap();
    file
}

#[test]
fn data_file_errors_are_clear() {
    use safetensors::Dtype::{F32, F64, I32, I64};
    let x = |n: usize, d: usize| (F32, vec![n, d], vec![0u8; 4 * n * d]);
    let y = |n: usize| (I64, vec![n], vec![0u8; 8 * n]);
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
        &'a [&'a str],
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "no-x",
            vec![
                ("y", y(4).0, y(4).1, y(4).2),
                ("z", F32, vec![1], vec![0; 4]),
            ],
            &["tensor \"x\"", "missing", "y, z"],
        ),
        (
            "no-y",
            vec![("x", x(4, 2).0, x(4, 2).1, x(4, 2).2)],
            &["tensor \"y\"", "missing", "the file has: x"],
        ),
        (
            "x-f64",
            vec![
                ("x", F64, vec![4, 2], vec![0; 64]),
                ("y", y(4).0, y(4).1, y(4).2),
            ],
            &["x must be f32 [N, D]", "F64 [4, 2]"],
        ),
        (
            "x-1d",
            vec![
                ("x", F32, vec![8], vec![0; 32]),
                ("y", y(4).0, y(4).1, y(4).2),
            ],
            &["x must be f32 [N, D]", "F32 [8]"],
        ),
        (
            "y-f32",
            vec![
                ("x", x(4, 2).0, x(4, 2).1, x(4, 2).2),
                ("y", F32, vec![4], vec![0; 16]),
            ],
            &["y must be i32 or i64", "F32"],
        ),
        (
            "y-short",
            vec![
                ("x", x(4, 2).0, x(4, 2).1, x(4, 2).2),
                ("y", I32, vec![3], vec![0; 12]),
            ],
            &["y must be [N] with N = 4", "[3]"],
        ),
        (
            "y-too-big",
            vec![
                ("x", x(1, 2).0, x(1, 2).1, x(1, 2).2),
                ("y", I64, vec![1], (1_i64 << 40).to_le_bytes().to_vec()),
            ],
            &["label 1099511627776", "i32"],
        ),
    ];
    for (what, tensors, needles) in cases {
        let file = data_file(what, &tensors);
        let out = syncmem(&["train", "--device", "cpu", "--data", file.arg()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.contains(file.arg()), "{what}: {stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{what}: {n:?} missing from {stderr}");
        }
    }
}
