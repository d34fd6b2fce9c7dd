//! `syncmem train --test-data FILE` and `--validation-split F`: a held-out set evaluated after
//! each epoch and at the end, on the device, never trained on: training gives the same
//! results with it as without it.

mod common;

use common::{f, json_env, u, TempPath};
use serde_json::Value;

/// A safetensors file of `n` samples with `features` features each (`x` f32) and labels
/// `i % classes` (`y` i64).
fn data_file(name: &str, n: usize, features: usize, classes: usize) -> TempPath {
    use safetensors::{tensor::TensorView, Dtype};
    let x: Vec<u8> = (0..n * features)
        .flat_map(|i| (((i * 37) % 101) as f32 / 50.0 - 1.0).to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..n)
        .flat_map(|i| ((i % classes) as i64).to_le_bytes())
        .collect();
    let bytes = safetensors::serialize(
        [
            (
                "x",
                TensorView::new(Dtype::F32, vec![n, features], &x).unwrap(),
            ),
            ("y", TensorView::new(Dtype::I64, vec![n], &y).unwrap()),
        ],
        None,
    )
    .unwrap();
    let file = TempPath::new("train-held-out", &format!("{name}.safetensors"));
    std::fs::write(&file.0, bytes).unwrap();
    file
}

/// `syncmem train` on `device` for 2 epochs with `extra` arguments, with two mirrors (every
/// transfer a copy) when `copies`.
fn train(device: &str, extra: &[&str], copies: bool) -> Value {
    let mut args = vec!["train", "--device", device, "--epochs", "2", "--json"];
    args.extend(extra);
    let env: &[(&str, &str)] = if copies {
        &[("SYNCMEM_ZERO_COPY", "off")]
    } else {
        &[]
    };
    json_env(&args, env)
}

/// With `--test-data`: the same training as without (every epoch's loss and accuracy, the
/// final ones, bit for bit), the held-out loss and accuracy after each epoch and at the end,
/// and the evaluation on the device: one 8-byte read back per held-out batch, each batch
/// uploaded once.
fn test_data_leaves_training_unchanged(device: &str) {
    // 100 samples: batches of 64 and 36.
    let test = data_file(&format!("test-{}", device.replace(':', "")), 100, 2, 3);
    for copies in [false, true] {
        let plain = train(device, &[], copies);
        let held = train(device, &["--test-data", test.arg()], copies);
        let what = format!("{device}, copies {copies}");
        assert_eq!(plain["final"], held["final"], "{what}");
        let (pe, he) = (
            plain["epochs"].as_array().unwrap(),
            held["epochs"].as_array().unwrap(),
        );
        assert_eq!(pe.len(), 2);
        for (a, b) in pe.iter().zip(he) {
            assert_eq!(a["loss"], b["loss"], "{what}");
            assert_eq!(a["accuracy"], b["accuracy"], "{what}");
            assert!(a["held_out"].is_null(), "{what}: {a}");
            let h = &b["held_out"];
            assert!(
                f(&h["loss"]).is_finite() && f(&h["loss"]) > 0.0,
                "{what}: {h}"
            );
            assert!((0.0..=1.0).contains(&f(&h["accuracy"])), "{what}: {h}");
        }
        assert!(plain["held_out"].is_null());
        let h = &held["held_out"];
        assert_eq!(h["source"], test.arg(), "{what}");
        assert_eq!(u(&h["samples"]), 100, "{what}");
        assert!(h["fraction"].is_null(), "{what}");
        // The last epoch's weights are the final ones.
        assert_eq!(h["loss"], he[1]["held_out"]["loss"], "{what}");
        assert_eq!(h["accuracy"], he[1]["held_out"]["accuracy"], "{what}");
        // The steps are untouched: the same copies per step, and no heap allocation after
        // the first (the evaluations run between epochs, outside the steps).
        for key in ["training", "max_step", "process_training"] {
            assert_eq!(
                held["transfers"][key], plain["transfers"][key],
                "{what}: {key}"
            );
        }
        assert_eq!(
            held["heap_allocations"]["max_step"], plain["heap_allocations"]["max_step"],
            "{what}"
        );
        if copies {
            // Two held-out batches, each uploaded once (x and y) and read back once (the
            // loss and accuracy, 8 bytes) after each of the 2 epochs and at the end.
            let (pt, ht) = (&plain["transfers"], &held["transfers"]);
            let dir = |t: &Value, key: &str, d: &str, what: &str| u(&t[key][d][what]);
            assert_eq!(
                dir(ht, "setup", "host_to_device", "count"),
                dir(pt, "setup", "host_to_device", "count") + 4,
                "{what}"
            );
            assert_eq!(
                dir(ht, "eval", "device_to_host", "count"),
                dir(pt, "eval", "device_to_host", "count") + 2 * 3,
                "{what}"
            );
            assert_eq!(
                dir(ht, "eval", "device_to_host", "bytes"),
                dir(pt, "eval", "device_to_host", "bytes") + 8 * 2 * 3,
                "{what}"
            );
        }
    }
}

#[test]
fn test_data_on_cpu_leaves_training_unchanged() {
    test_data_leaves_training_unchanged("cpu");
}

#[cfg(feature = "opencl")]
#[test]
fn test_data_on_opencl_leaves_training_unchanged() {
    let Some(dev) = syncmem::testing::opencl_or_skip("test data on opencl") else {
        return;
    };
    test_data_leaves_training_unchanged(dev.label());
}

/// With `--validation-split`: the held-out part is not trained on (fewer samples, fewer
/// steps), the split is the seed's (the same run twice gives the same figures), and the text
/// report shows the held-out figures.
fn validation_split_holds_out(device: &str) {
    let r = train(device, &["--validation-split", "0.2"], false);
    assert_eq!(u(&r["data"]["samples"]), 2400, "{r}");
    // 2400 / 64, rounded up.
    assert_eq!(u(&r["epochs"][0]["steps"]), 38);
    let h = &r["held_out"];
    assert_eq!(h["source"], "validation split");
    assert_eq!(u(&h["samples"]), 600);
    assert_eq!(f(&h["fraction"]), 0.2);
    assert!((0.0..=1.0).contains(&f(&h["accuracy"])), "{h}");
    let again = train(device, &["--validation-split", "0.2"], false);
    assert_eq!(again["held_out"], r["held_out"]);
    assert_eq!(again["final"], r["final"]);
    // Another seed, another split (and another run).
    let other = train(device, &["--validation-split", "0.2", "--seed", "1"], false);
    assert_ne!(other["held_out"]["loss"], r["held_out"]["loss"]);

    let out = common::ok(&[
        "train",
        "--device",
        device,
        "--epochs",
        "1",
        "--hidden",
        "8",
        "--validation-split",
        "0.25",
    ]);
    assert!(
        out.contains("held out, not trained on: 750 samples from validation split"),
        "{out}"
    );
    let epoch = out.lines().find(|l| l.starts_with("epoch")).unwrap();
    assert!(epoch.contains("held-out loss"), "{out}");
    assert!(
        out.contains("held out: accuracy") && out.contains("validation split (0.25 of the data)"),
        "{out}"
    );
}

#[test]
fn validation_split_on_cpu_holds_out_the_seeds_share() {
    validation_split_holds_out("cpu");
}

#[cfg(feature = "opencl")]
#[test]
fn validation_split_on_opencl_holds_out_the_seeds_share() {
    let Some(dev) = syncmem::testing::opencl_or_skip("validation split on opencl") else {
        return;
    };
    validation_split_holds_out(dev.label());
}

/// Held-out data that does not fit the model, or settings that cannot hold anything out, fail
/// before training with one line naming the file or the option and the sizes.
#[test]
fn bad_held_out_settings_are_refused_with_the_sizes() {
    let wide = data_file("wide", 10, 3, 3);
    let many = data_file("many-classes", 10, 2, 6);
    let base = ["train", "--device", "cpu", "--epochs", "1"];
    for (extra, needles) in [
        (
            vec!["--test-data", wide.arg()],
            vec![wide.arg(), "[10, 3]", "3 features", "(spirals) has 2"],
        ),
        (
            vec!["--test-data", many.arg()],
            vec![many.arg(), "labels up to 5", "6 classes", "has 3 classes"],
        ),
        (
            vec!["--test-data", "/nonexistent/test.safetensors"],
            vec!["/nonexistent/test.safetensors"],
        ),
        (
            vec!["--data", wide.arg(), "--validation-split", "0.01"],
            vec!["--validation-split 0.01", "10 samples", wide.arg()],
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(&extra);
        let out = common::run(&args);
        let stderr = common::refused(&format!("{extra:?}"), &out);
        assert!(out.stdout.is_empty(), "{extra:?}: trained before failing");
        for n in needles {
            assert!(stderr.contains(n), "{extra:?}: {n:?} missing from {stderr}");
        }
    }
    // Option errors: both held-out options, a fraction out of (0, 1).
    for (extra, needles) in [
        (
            vec!["--test-data", wide.arg(), "--validation-split", "0.2"],
            vec!["--test-data", "--validation-split"],
        ),
        (vec!["--validation-split", "1"], vec!["--validation-split"]),
        (vec!["--validation-split", "0"], vec!["--validation-split"]),
    ] {
        let mut args = base.to_vec();
        args.extend(&extra);
        let out = common::run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{extra:?}: {n:?} missing from {stderr}");
        }
    }
}

/// Data-parallel training evaluates the held-out set on the first device, and trains the same
/// with it as without it.
#[cfg(feature = "opencl")]
#[test]
fn test_data_with_data_parallel_training() {
    let Some((a, b)) =
        syncmem::testing::two_or_skip(syncmem::BackendKind::OpenCl, "held out, two devices")
    else {
        return;
    };
    let list = format!("{},{}", a.label(), b.label());
    let test = data_file("test-two", 100, 2, 3);
    let plain = train(&list, &[], false);
    let held = train(&list, &["--test-data", test.arg()], false);
    assert_eq!(plain["final"], held["final"]);
    assert_eq!(plain["epochs"][1]["loss"], held["epochs"][1]["loss"]);
    assert_eq!(u(&held["held_out"]["samples"]), 100);
    assert!((0.0..=1.0).contains(&f(&held["held_out"]["accuracy"])));
    assert_eq!(
        held["held_out"]["loss"],
        held["epochs"][1]["held_out"]["loss"]
    );
}
