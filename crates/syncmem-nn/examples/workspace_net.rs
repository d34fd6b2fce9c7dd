//! A workspace with a net (Caffe2 style): parameters made by an init net, a predict net run on
//! the device, the parameters saved to a safetensors file and loaded into a fresh workspace
//! that gives the same predictions.
//!
//! ```sh
//! cargo run -p syncmem-nn --example workspace_net             # first accelerator, else cpu
//! cargo run -p syncmem-nn --example workspace_net -- cpu      # or opencl:0, cuda:0
//! ```
//!
//! Blobs are named; `Workspace::feed` puts a tensor in one and `Workspace::fetch` copies one
//! out (Caffe2's `FeedBlob` and `FetchBlob`). Nets are lists of operators run in order on the
//! blobs of their workspace; the data stays on the device between operators.

use syncmem::net::{NetDef, NetOptions};
use syncmem::ops::OperatorDef;
use syncmem::{Device, Tensor, Workspace};

/// The device named by the first argument (`cpu`, `opencl:0`, `cuda:0`), else the first
/// accelerator (an OpenCL device, else a CUDA one), else the cpu (host memory standing in for
/// device memory).
fn pick_device() -> syncmem::Result<Device> {
    match std::env::args().nth(1) {
        Some(spec) => Device::open(&spec),
        None => Ok(Device::first_accelerator().unwrap_or_else(Device::cpu)),
    }
}

/// Inputs per sample.
const IN: usize = 3;
/// Hidden units.
const HIDDEN: usize = 8;
/// Outputs per sample.
const OUT: usize = 2;

/// Fills the parameters: weights from a Gaussian, biases with a constant.
fn init_net() -> NetDef {
    NetDef::new("init")
        .op(OperatorDef::new("GaussianFill", &[], &["fc1_w"])
            .arg("shape", vec![HIDDEN, IN])
            .arg("std", 0.5))
        .op(OperatorDef::new("ConstantFill", &[], &["fc1_b"])
            .arg("shape", vec![HIDDEN])
            .arg("value", 0.1))
        .op(OperatorDef::new("GaussianFill", &[], &["fc2_w"])
            .arg("shape", vec![OUT, HIDDEN])
            .arg("std", 0.5))
        .op(OperatorDef::new("ConstantFill", &[], &["fc2_b"])
            .arg("shape", vec![OUT])
            .arg("value", 0.0))
}

/// `y = fc2(relu(fc1(x)))`.
fn predict_net() -> NetDef {
    NetDef::new("predict")
        .op(OperatorDef::new("FC", &["x", "fc1_w", "fc1_b"], &["h"]))
        .op(OperatorDef::new("Relu", &["h"], &["h"]))
        .op(OperatorDef::new("FC", &["h", "fc2_w", "fc2_b"], &["y"]))
}

const PARAMS: [&str; 4] = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"];

/// Feeds a batch of 4 samples, runs the predict net and fetches `y`.
fn predict(ws: &Workspace, dev: &Device) -> syncmem::Result<Vec<f32>> {
    let x: Vec<f32> = (0..4 * IN).map(|i| i as f32 / 10.0 - 0.5).collect();
    ws.feed("x", Tensor::from_slice(&[4, IN], &x, Some(dev))?)?;
    ws.run_net("predict")?;
    ws.fetch::<f32>("y")
}

fn main() -> syncmem::Result<()> {
    // The operators of the nets (fills, FC, Relu) are syncmem-nn's built-in ones.
    syncmem_nn::register_operators()?;
    let dev = pick_device()?;
    println!("device {dev}: {}", dev.info().name);

    let ws = Workspace::new();
    ws.run_net_once(&init_net(), &dev, &NetOptions::new().seed(7))?;
    ws.create_net(&predict_net(), &dev, &NetOptions::new())?;
    let y = predict(&ws, &dev)?;
    println!("predictions: {y:?}");
    assert_eq!(y.len(), 4 * OUT);

    // The parameters to a safetensors file (readable by Python's safetensors, and by
    // `syncmem inspect`).
    let path = std::env::temp_dir().join(format!(
        "syncmem-example-{}.safetensors",
        std::process::id()
    ));
    let saved = ws.save(&path, Some(&PARAMS))?;
    println!("saved {} to {}", saved.join(", "), path.display());

    // A fresh workspace: load the parameters onto the device, build the same net, predict.
    let fresh = Workspace::new();
    let loaded = fresh.load(&path, Some(&dev), None);
    std::fs::remove_file(&path).ok();
    println!("loaded {} into a fresh workspace", loaded?.join(", "));
    fresh.create_net(&predict_net(), &dev, &NetOptions::new())?;
    let again = predict(&fresh, &dev)?;
    println!("predictions: {again:?}");
    assert_eq!(y, again, "the loaded parameters predict the same");

    // One blob in detail: shape, element type, where its newest data is.
    fresh.with_tensor("fc1_w", |t| {
        println!(
            "fc1_w: dims {:?}, {}, head {}",
            t.dims(),
            t.dtype().map_or("no type", |d| d.name()),
            t.head().map_or("none", |h| h.as_str())
        );
        Ok(())
    })?;
    Ok(())
}
