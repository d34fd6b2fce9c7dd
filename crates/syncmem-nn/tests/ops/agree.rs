//! The operators on `cpu` against the same operators on each accelerator: every operator,
//! and the skinny and fused `FC` shapes, on the same host inputs.

use syncmem::ops::OperatorDef;
use syncmem::{Context, Device, Workspace};

use super::*;

/// Runs `defs` on `dev` over the same host inputs; returns the named outputs.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn run_on(
    dev: &Device,
    seed: u64,
    inputs: &[(&str, Vec<usize>, Vec<f32>)],
    defs: &[OperatorDef],
    outs: &[&str],
) -> Vec<Vec<f32>> {
    let ctx = Context::with_seed(dev, seed).unwrap();
    let ws = Workspace::new();
    for (name, d, v) in inputs {
        put(&ws, dev, name, d, v);
    }
    put(
        &ws,
        dev,
        "labels",
        &[33],
        &(0..33).map(|i: i32| i * 7 % 10).collect::<Vec<_>>(),
    );
    for def in defs {
        ok(&ws, &ctx, def.clone());
    }
    outs.iter().map(|o| get(&ws, o)).collect()
}

#[cfg(feature = "opencl")]
#[test]
fn cpu_and_opencl_agree_for_every_operator() {
    if let Some(cl) = syncmem::testing::opencl_or_skip("cpu_and_opencl_agree_for_every_operator") {
        cpu_and_device_agree_for_every_operator(&cl);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cpu_and_cuda_agree_for_every_operator() {
    if let Some(cu) = syncmem::testing::cuda_or_skip("cpu_and_cuda_agree_for_every_operator") {
        cpu_and_device_agree_for_every_operator(&cu);
    }
}

/// Every operator on `dev` against `cpu`, over the same inputs and seed: close for the math,
/// bit-identical for the fills.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn cpu_and_device_agree_for_every_operator(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
    // 33 x 65 x 10 and 65 x 40: several GEMM tiles, none full.
    let (n, k, h, c) = (33, 65, 40, 10);
    let inputs = [
        ("x", vec![n, k], data(n * k, 21)),
        ("w1", vec![h, k], data(h * k, 22)),
        ("b1", vec![h], data(h, 23)),
        ("w2", vec![c, h], data(c * h, 24)),
        ("b2", vec![c], data(c, 25)),
        ("dl", vec![], vec![1.5]),
        // Several GEMM tiles in every dimension, none of them full.
        ("xb", vec![130, 70], data(130 * 70, 26)),
        ("wb", vec![150, 70], data(150 * 70, 27)),
        ("bb", vec![150], data(150, 28)),
        ("dyb", vec![130, 150], data(130 * 150, 29)),
    ];
    let op = OperatorDef::new;
    let defs = [
        op("FC", &["x", "w1", "b1"], &["h1"]),
        op("Relu", &["h1"], &["r1"]),
        op("FC", &["r1", "w2", "b2"], &["logits"]),
        op("SoftmaxWithLoss", &["logits", "labels"], &["prob", "loss"]),
        op("Accuracy", &["logits", "labels"], &["acc"]),
        op(
            "SoftmaxWithLossGradient",
            &["prob", "labels", "dl"],
            &["dlogits"],
        ),
        op(
            "FCGradient",
            &["r1", "w2", "dlogits"],
            &["dw2", "db2", "dr1"],
        ),
        op("ReluGradient", &["r1", "dr1"], &["dh1"]),
        op("FCGradient", &["x", "w1", "dh1"], &["dw1", "db1"]),
        op("SGD", &["w1", "dw1"], &["w1"]).arg("lr", 0.5),
        op("FC", &["xb", "wb", "bb"], &["yb"]),
        op("FCGradient", &["xb", "wb", "dyb"], &["dwb", "dbb", "dxb"]),
        op("ConstantFill", &[], &["k"])
            .arg("shape", vec![3, 5])
            .arg("value", 2.5),
        op("ConstantFill", &["x"], &["zeros"]),
        op("UniformFill", &[], &["u"])
            .arg("shape", vec![100])
            .arg("min", -2)
            .arg("max", 3),
        op("GaussianFill", &[], &["g"])
            .arg("shape", vec![7, 9])
            .arg("mean", 1)
            .arg("std", 2),
        op("XavierFill", &[], &["xa"]).arg("shape", vec![16, 8]),
        op("MSRAFill", &[], &["ms"]).arg("shape", vec![16, 8]),
    ];
    let outs = [
        "h1", "r1", "logits", "prob", "loss", "acc", "dlogits", "dw2", "db2", "dr1", "dh1", "dw1",
        "db1", "w1", "yb", "dwb", "dbb", "dxb", "k", "zeros", "u", "g", "xa", "ms",
    ];
    let a = run_on(&Device::cpu(), 5, &inputs, &defs, &outs);
    let b = run_on(dev, 5, &inputs, &defs, &outs);
    for ((name, x), y) in outs.iter().zip(&a).zip(&b) {
        assert_close(&format!("{name}: cpu vs {}", dev.label()), x, y, 1e-4, 1e-5);
    }
    for ((name, x), y) in outs.iter().zip(&a).zip(&b).skip(18) {
        assert_eq!(x, y, "{name}: fills are bit-identical on both devices");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn cpu_and_opencl_agree_on_skinny_and_fused_fc() {
    if let Some(cl) =
        syncmem::testing::opencl_or_skip("cpu_and_opencl_agree_on_skinny_and_fused_fc")
    {
        cpu_and_device_agree_on_skinny_and_fused_fc(&cl);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cpu_and_cuda_agree_on_skinny_and_fused_fc() {
    if let Some(cu) = syncmem::testing::cuda_or_skip("cpu_and_cuda_agree_on_skinny_and_fused_fc") {
        cpu_and_device_agree_on_skinny_and_fused_fc(&cu);
    }
}

/// `FC` (plain and with `relu = 1`) and `FCGradient` at the shapes of a small MLP's layers
/// (batch 64, 2 features, 3 classes, hidden widths around the GEMM blocks), on `dev` against
/// `cpu`; the fused `FC` equals `FC` then `Relu`, and `FCGradient` with a ReLU mask equals
/// `FCGradient` then `ReluGradient`, on the same device, bit for bit; the device's `db`, from
/// its own launch or the `dW` GEMM's (`db_in_gemm`), is the column sums of `dY` added row by
/// row in `f32`, bit for bit.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn cpu_and_device_agree_on_skinny_and_fused_fc(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
    let op = OperatorDef::new;
    // (rows N, inputs K, outputs M)
    for (n, k, m) in [
        (64, 2, 64),
        (64, 64, 3),
        (64, 300, 3),
        (64, 2, 300),
        (1, 1, 1),
        (3, 17, 33),
        (64, 256, 256),
        (70, 5, 130),
    ] {
        let inputs = [
            ("x", vec![n, k], data(n * k, 31)),
            ("w", vec![m, k], data(m * k, 32)),
            ("b", vec![m], data(m, 33)),
            ("dy", vec![n, m], data(n * m, 34)),
            ("mask", vec![n, k], data(n * k, 35)),
        ];
        let defs = [
            op("FC", &["x", "w", "b"], &["y"]),
            op("Relu", &["y"], &["r"]),
            op("FC", &["x", "w", "b"], &["fused"]).arg("relu", 1),
            op("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"]),
            op("ReluGradient", &["mask", "dx"], &["dxr"]),
            op(
                "FCGradient",
                &["x", "w", "dy", "mask"],
                &["dw2", "db2", "dxm"],
            )
            .arg("db_in_gemm", 1),
        ];
        let outs = ["y", "r", "fused", "dw", "db", "dx", "dxr", "dxm", "db2"];
        let a = run_on(&Device::cpu(), 5, &inputs, &defs, &outs);
        let b = run_on(dev, 5, &inputs, &defs, &outs);
        for ((name, x), y) in outs.iter().zip(&a).zip(&b) {
            let what = format!("{name} at N={n} K={k} M={m}: cpu vs {}", dev.label());
            assert_close(&what, x, y, 1e-4, 1e-5);
        }
        // On the device, db (a column-sum launch) and db2 (written by the dW GEMM's launch) are
        // the column sums of dY in f32, row by row, bit for bit.
        let dy = &inputs[3].2;
        let sums: Vec<f32> = (0..m)
            .map(|j| (0..n).fold(0.0f32, |s, i| s + dy[i * m + j]))
            .collect();
        for db in [&b[4], &b[8]] {
            let same = sums.iter().zip(db).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "db on {} at {n} {k} {m}", dev.label());
        }
        for (run, dev) in [(&a, "cpu"), (&b, dev.label())] {
            let (r, fused) = (&run[1], &run[2]);
            let same = r.iter().zip(fused).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same,
                "fused FC differs from FC + Relu on {dev} at {n} {k} {m}"
            );
            let (r, fused) = (&run[6], &run[7]);
            if r.len() > 8 {
                // The mask both keeps and clears values.
                assert!(r.contains(&0.0) && r.iter().any(|&v| v != 0.0));
            }
            let same = r.iter().zip(fused).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same,
                "masked FCGradient differs from FCGradient + ReluGradient on {dev} at {n} {k} {m}"
            );
        }
    }
}
