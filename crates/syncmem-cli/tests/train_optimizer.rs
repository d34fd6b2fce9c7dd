//! `syncmem train --optimizer sgd|momentum|adam`: the report names the optimizer and its
//! learning rate (the optimizer's own unless `--lr` is given), the loss falls, the text
//! header says it, and an unknown optimizer is refused before any work.

mod common;

use common::{f, json, ok, rejected_value};

#[test]
fn adam_trains_with_a_falling_loss_and_says_so() {
    let r = json(&["train", "--optimizer", "adam", "--epochs", "3", "--json"]);
    assert_eq!(r["settings"]["optimizer"], "adam", "{:#}", r["settings"]);
    assert!(
        (f(&r["settings"]["lr"]) - 0.01).abs() < 1e-9,
        "{}",
        r["settings"]
    );
    let losses: Vec<f64> = r["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| f(&e["loss"]))
        .collect();
    assert_eq!(losses.len(), 3);
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the loss does not fall: {losses:?}"
    );
    assert!(f(&r["final"]["accuracy"]) > 0.9, "{}", r["final"]);
    // The state (two moments per parameter) is among the blobs, shaped like the parameters.
    let blobs = r["blobs"].as_array().unwrap();
    let dims = |name: &str| {
        blobs
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("no blob {name}"))["dims"]
            .clone()
    };
    for p in ["fc1_w", "fc1_b", "fc3_w"] {
        assert_eq!(dims(&format!("{p}_m")), dims(p), "{p}");
        assert_eq!(dims(&format!("{p}_v")), dims(p), "{p}");
    }
}

#[test]
fn each_optimizer_has_its_learning_rate_unless_one_is_given() {
    for (optimizer, lr) in [("sgd", 0.5), ("momentum", 0.05)] {
        let r = json(&[
            "train",
            "--device",
            "cpu",
            "--optimizer",
            optimizer,
            "--epochs",
            "1",
            "--json",
        ]);
        assert_eq!(r["settings"]["optimizer"], optimizer);
        assert!(
            (f(&r["settings"]["lr"]) - lr).abs() < 1e-7,
            "{}",
            r["settings"]
        );
    }
    let r = json(&[
        "train",
        "--device",
        "cpu",
        "--optimizer",
        "momentum",
        "--lr",
        "0.02",
        "--epochs",
        "1",
        "--json",
    ]);
    assert!(
        (f(&r["settings"]["lr"]) - 0.02).abs() < 1e-7,
        "{}",
        r["settings"]
    );
    // Without --optimizer: SGD, as before.
    let r = json(&["train", "--device", "cpu", "--epochs", "1", "--json"]);
    assert_eq!(r["settings"]["optimizer"], "sgd");
    let text = ok(&[
        "train",
        "--device",
        "cpu",
        "--optimizer",
        "momentum",
        "--epochs",
        "1",
    ]);
    assert!(text.contains("momentum at lr 0.05"), "{text}");
}

#[test]
fn an_unknown_optimizer_is_refused() {
    let out = common::run(&["train", "--device", "cpu", "--optimizer", "adagrad"]);
    let err = rejected_value("--optimizer adagrad", &out);
    assert!(
        err.starts_with("syncmem: error: --optimizer must be sgd, momentum or adam")
            && err.contains("adagrad"),
        "{err}"
    );
}

#[test]
fn an_offloaded_optimizer_moves_gradients_and_parameters_only() {
    let args = |offload: bool| {
        let mut a = vec!["train", "--optimizer", "adam", "--epochs", "2", "--json"];
        if offload {
            a.extend(["--offload", "optimizer"]);
        }
        json(&a)
    };
    let (on, off) = (args(false), args(true));
    assert_eq!(
        off["settings"]["offload_optimizer"], true,
        "{}",
        off["settings"]
    );
    assert_eq!(on["settings"]["offload_optimizer"], false);
    assert!(f(&off["final"]["accuracy"]) > 0.9, "{}", off["final"]);
    // Per step: the parameters go up (copied) and the gradients come down (copied, or synced
    // where the device's memory is host memory), as many bytes as the parameters hold.
    let params = 4.0 * f(&off["model"]["parameters"]);
    let per_step = &off["transfers"]["per_step"];
    let bytes = |dir: &str| f(&per_step[dir]["bytes"]);
    let up = bytes("host_to_device");
    assert!(
        up >= params && up < params + 1024.0,
        "up: {up} B a step for {params} B of parameters: {per_step}"
    );
    let on_step = &on["transfers"]["per_step"];
    let down = bytes("device_to_host") + bytes("mapped");
    let down_on = f(&on_step["device_to_host"]["bytes"]) + f(&on_step["mapped"]["bytes"]);
    assert!(
        down - down_on >= params - 1024.0,
        "down: {down} B a step against {down_on} B with the update on the device, for {params} \
         B of parameters"
    );
    let text = ok(&[
        "train",
        "--optimizer",
        "momentum",
        "--offload",
        "optimizer",
        "--epochs",
        "1",
    ]);
    assert!(text.contains("momentum at lr 0.05 on the host"), "{text}");
    let out = common::run(&["train", "--device", "cpu", "--offload", "gradients"]);
    let err = rejected_value("--offload gradients", &out);
    assert!(
        err.contains("optimizer, parameters or activations"),
        "{err}"
    );
}

#[test]
fn offloaded_parameters_end_where_kept_ones_do() {
    let args = |offload: Option<&'static str>| {
        let mut a = vec!["train", "--device", "cpu", "--epochs", "2", "--json"];
        if let Some(o) = offload {
            a.extend(["--offload", o]);
        }
        json(&a)
    };
    let kept = args(None);
    let off = args(Some("parameters"));
    assert_eq!(off["settings"]["offload_parameters"], true);
    assert_eq!(kept["settings"]["offload_parameters"], false);
    // In layer by layer: every parameter comes up each step after the first (the init net
    // left them on the device), ahead of its first reader.
    assert!(kept["parameters"].is_null(), "{}", kept["parameters"]);
    let m = &off["parameters"];
    // Three layers of the default MLP: a weight and a bias each.
    assert_eq!(f(&m["planned"]), 6.0, "{m}");
    assert!(
        f(&m["refills"]) >= 6.0 * (f(&off["transfers"]["steps"]) - 1.0),
        "{m}"
    );
    assert_eq!(
        off["final"], kept["final"],
        "the same training, bit for bit"
    );
    // The last step brought the parameters up and wrote them back (copied, or synced where
    // the device's memory is host memory).
    let params = 4.0 * f(&off["model"]["parameters"]);
    let step = &off["transfers"]["max_step"];
    let bytes = |dirs: &[&str]| dirs.iter().map(|d| f(&step[d]["bytes"])).sum::<f64>();
    assert!(
        bytes(&["host_to_device", "refilled", "mapped"]) >= params,
        "up: {step}"
    );
    assert!(
        bytes(&["device_to_host", "spilled", "mapped"]) >= params,
        "back: {step}"
    );
    let both = args(Some("optimizer,parameters"));
    assert_eq!(both["settings"]["offload_optimizer"], true);
    assert_eq!(both["settings"]["offload_parameters"], true);
}

#[test]
fn offloaded_activations_end_where_kept_ones_do() {
    let args = |offload: Option<&'static str>| {
        let mut a = vec![
            "train",
            "--device",
            "cpu",
            "--epochs",
            "2",
            "--no-plan",
            "--json",
        ];
        if let Some(o) = offload {
            a.extend(["--offload", o]);
        }
        json(&a)
    };
    let kept = args(None);
    let off = args(Some("activations"));
    assert_eq!(off["settings"]["offload_activations"], true);
    assert_eq!(kept["settings"]["offload_activations"], false);
    assert!(kept["activations"].is_null(), "{}", kept["activations"]);
    assert_eq!(
        off["final"], kept["final"],
        "the same training, bit for bit"
    );
    // Hidden 64, two layers: the first layer's output leaves the device between its forward
    // reader and its backward reader, every step.
    let a = &off["activations"];
    assert!(f(&a["planned"]) >= 1.0, "{a}");
    assert!(f(&a["offloads_per_step"]) >= 1.0, "{a}");
    assert!(f(&a["released_bytes_per_step"]) >= 64.0 * 64.0 * 4.0, "{a}");
    assert!(f(&a["refills"]) >= f(&off["transfers"]["steps"]), "{a}");
    let all = args(Some("optimizer,parameters,activations"));
    assert_eq!(all["settings"]["offload_activations"], true);
    assert_eq!(all["settings"]["offload_parameters"], true);
    let text = ok(&["train", "--offload", "activations", "--epochs", "1"]);
    assert!(
        text.contains("activations offloaded from forward to backward")
            && text.contains("activations offloaded ("),
        "{text}"
    );
}
