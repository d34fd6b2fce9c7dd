//! Operators: gradient checks against finite differences, cpu against each accelerator, seeded
//! fills, exact copy counts of a forward pass, in-place updates, and errors that name the
//! operator and the blob. Per-device tests run on `cpu`, on OpenCL (PoCL here) and, where a
//! driver exists, on CUDA (they print `SKIPPED` without one).

use syncmem::ops::{create_operator, registered_types, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{BackendKind, Context, Device, Error, Head, Workspace};

// ----- helpers ---------------------------------------------------------------------------------

fn run(ws: &Workspace, ctx: &Context, def: &OperatorDef) -> syncmem::Result<()> {
    create_operator(def, ctx.device())?.run(ws, ctx)
}

fn ok(ws: &Workspace, ctx: &Context, def: OperatorDef) {
    run(ws, ctx, &def).unwrap_or_else(|e| panic!("{}: {e}", def.label()));
}

/// Deterministic values in [-1, 1) (xorshift).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Stores `vals` in blob `name` as a tensor of `dev` whose newest copy is on the host.
fn put<T: syncmem::PodElement>(
    ws: &Workspace,
    dev: &Device,
    name: &str,
    dims: &[usize],
    vals: &[T],
) {
    let t = Tensor::from_slice(dims, vals, Some(dev))
        .unwrap()
        .with_label(name);
    ws.create_blob(name).unwrap().write().reset(t);
}

/// Stores `vals` in blob `name`, written straight to the device mirror (head at device).
fn put_on_device<T: syncmem::PodElement>(
    ws: &Workspace,
    dev: &Device,
    name: &str,
    dims: &[usize],
    vals: &[T],
) {
    let mut t = Tensor::new(dev).with_label(name);
    t.resize(dims).unwrap();
    t.device_overwrite::<T>().unwrap().write(vals).unwrap();
    ws.create_blob(name).unwrap().write().reset(t);
}

fn get(ws: &Workspace, name: &str) -> Vec<f32> {
    let b = ws.get_blob(name).unwrap();
    let b = b.read();
    let v = b.get::<Tensor>().unwrap().host::<f32>().unwrap().to_vec();
    v
}

fn dims(ws: &Workspace, name: &str) -> Vec<usize> {
    ws.get_blob(name)
        .unwrap()
        .read()
        .get::<Tensor>()
        .unwrap()
        .dims()
        .to_vec()
}

fn with_tensor<R>(ws: &Workspace, name: &str, f: impl FnOnce(&mut Tensor) -> R) -> R {
    let b = ws.get_blob(name).unwrap();
    let mut b = b.write();
    f(b.get_mut::<Tensor>().unwrap())
}

fn assert_close(what: &str, a: &[f32], b: &[f32], rel: f32, abs: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let tol = abs + rel * x.abs().max(y.abs());
        assert!((x - y).abs() <= tol, "{what}[{i}]: {x} vs {y} (tol {tol})");
    }
}

/// `L = sum(blob ⊙ r)` in f64.
fn dot(ws: &Workspace, blob: &str, r: &[f32]) -> f64 {
    get(ws, blob)
        .iter()
        .zip(r)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// Central finite differences of `loss` with respect to every element of blob `name`.
fn numeric_grad(ws: &Workspace, name: &str, eps: f32, mut loss: impl FnMut() -> f64) -> Vec<f32> {
    let orig = get(ws, name);
    (0..orig.len())
        .map(|i| {
            let set = |v: f32| with_tensor(ws, name, |t| t.host_mut::<f32>().unwrap()[i] = v);
            set(orig[i] + eps);
            let up = loss();
            set(orig[i] - eps);
            let down = loss();
            set(orig[i]);
            ((up - down) / (2.0 * f64::from(eps))) as f32
        })
        .collect()
}

// ----- gradient checks (per device) ------------------------------------------------------------

fn fc_gradient_matches_finite_differences(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    // Sizes that are not multiples of the 16x16 GEMM tile.
    let (n, k, m) = (5, 19, 3);
    put(&ws, dev, "x", &[n, k], &data(n * k, 1));
    put(&ws, dev, "w", &[m, k], &data(m * k, 2));
    put(&ws, dev, "b", &[m], &data(m, 3));
    let r = data(n * m, 4);
    put(&ws, dev, "dy", &[n, m], &r);
    let fc = OperatorDef::new("FC", &["x", "w", "b"], &["y"]);
    ok(&ws, &ctx, fc.clone());
    assert_eq!(dims(&ws, "y"), [n, m]);
    let grad = OperatorDef::new("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"]);
    ok(&ws, &ctx, grad);
    assert_eq!(
        (dims(&ws, "dw"), dims(&ws, "db"), dims(&ws, "dx")),
        (vec![m, k], vec![m], vec![n, k])
    );
    let mut loss = || {
        ok(&ws, &ctx, fc.clone());
        dot(&ws, "y", &r)
    };
    for (param, g) in [("x", "dx"), ("w", "dw"), ("b", "db")] {
        let num = numeric_grad(&ws, param, 1e-2, &mut loss);
        assert_close(
            &format!("d{param} on {}", dev.label()),
            &get(&ws, g),
            &num,
            1e-3,
            1e-3,
        );
    }
}

fn relu_gradient_matches_finite_differences(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    // Away from the kink at 0, so that x ± eps stays on one side.
    let x: Vec<f32> = data(40, 5)
        .iter()
        .map(|v| v + 0.1f32.copysign(*v))
        .collect();
    put(&ws, dev, "x", &[8, 5], &x);
    let r = data(40, 6);
    put(&ws, dev, "dy", &[8, 5], &r);
    let relu = OperatorDef::new("Relu", &["x"], &["y"]);
    ok(&ws, &ctx, relu.clone());
    let y = get(&ws, "y");
    assert!(y.iter().zip(&x).all(|(&y, &x)| y == x.max(0.0)));
    ok(
        &ws,
        &ctx,
        OperatorDef::new("ReluGradient", &["y", "dy"], &["dx"]),
    );
    let num = numeric_grad(&ws, "x", 1e-2, || {
        ok(&ws, &ctx, relu.clone());
        dot(&ws, "y", &r)
    });
    assert_close(
        &format!("relu dx on {}", dev.label()),
        &get(&ws, "dx"),
        &num,
        1e-3,
        1e-3,
    );

    // In place: Relu x -> x and ReluGradient dy -> dy give the same values.
    ok(&ws, &ctx, OperatorDef::new("Relu", &["x"], &["x"]));
    assert_eq!(get(&ws, "x"), y);
    ok(
        &ws,
        &ctx,
        OperatorDef::new("ReluGradient", &["y", "dy"], &["dy"]),
    );
    assert_eq!(get(&ws, "dy"), get(&ws, "dx"));
}

fn softmax_with_loss_gradient_matches_finite_differences(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    let (n, c) = (4, 7);
    let logits: Vec<f32> = data(n * c, 7).iter().map(|v| v * 3.0).collect();
    put(&ws, dev, "logits", &[n, c], &logits);
    put(&ws, dev, "labels", &[n], &[0i32, 6, 3, 3]);
    put(&ws, dev, "dloss", &[], &[0.5f32]);
    let fwd = OperatorDef::new("SoftmaxWithLoss", &["logits", "labels"], &["prob", "loss"]);
    ok(&ws, &ctx, fwd.clone());
    assert_eq!(dims(&ws, "loss"), Vec::<usize>::new());
    let prob = get(&ws, "prob");
    for row in prob.chunks(c) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
    let g = "SoftmaxWithLossGradient";
    ok(
        &ws,
        &ctx,
        OperatorDef::new(g, &["prob", "labels"], &["dlogits"]),
    );
    ok(
        &ws,
        &ctx,
        OperatorDef::new(g, &["prob", "labels", "dloss"], &["half"]),
    );
    ok(
        &ws,
        &ctx,
        OperatorDef::new(g, &["logits", "labels", "prob", "dloss"], &["caffe2"]),
    );
    let num = numeric_grad(&ws, "logits", 1e-2, || {
        ok(&ws, &ctx, fwd.clone());
        f64::from(get(&ws, "loss")[0])
    });
    let dlogits = get(&ws, "dlogits");
    assert_close(
        &format!("dlogits on {}", dev.label()),
        &dlogits,
        &num,
        1e-2,
        1e-3,
    );
    let halved: Vec<f32> = dlogits.iter().map(|v| v * 0.5).collect();
    assert_close("dLoss = 0.5", &get(&ws, "half"), &halved, 1e-6, 1e-7);
    assert_eq!(get(&ws, "caffe2"), get(&ws, "half"));

    // Numerically stable: huge logits give finite probabilities and loss.
    put(
        &ws,
        dev,
        "big",
        &[2, 3],
        &[1e4f32, 0.0, -1e4, 88.0, 89.0, 90.0],
    );
    put(&ws, dev, "l2", &[2, 1], &[2i32, 2]);
    ok(
        &ws,
        &ctx,
        OperatorDef::new("SoftmaxWithLoss", &["big", "l2"], &["p2", "loss2"]),
    );
    let loss = get(&ws, "loss2")[0];
    assert!((loss - (2e4 + (1.0 + (-1f32).exp() + (-2f32).exp()).ln()) / 2.0).abs() < 1.0);
    assert!(get(&ws, "p2").iter().all(|p| p.is_finite()));
}

fn accuracy_counts_top_k_on_the_device(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    let x = [
        0.1f32, 0.7, 0.2, 0.5, 0.3, 0.2, 0.1, 0.1, 0.8, 0.4, 0.4, 0.2,
    ];
    put(&ws, dev, "x", &[4, 3], &x);
    put(&ws, dev, "labels", &[4], &[1i32, 1, 2, 1]);
    ok(
        &ws,
        &ctx,
        OperatorDef::new("Accuracy", &["x", "labels"], &["acc"]),
    );
    // Rows: correct, second best, correct, tie for the best (counts as correct in Caffe2).
    assert_eq!(get(&ws, "acc"), [0.75]);
    ok(
        &ws,
        &ctx,
        OperatorDef::new("Accuracy", &["x", "labels"], &["acc2"]).arg("top_k", 2),
    );
    assert_eq!(get(&ws, "acc2"), [1.0]);
}

fn sgd_updates_the_parameter_in_place(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    let (w, g) = (data(37, 8), data(37, 9));
    put_on_device(&ws, dev, "w", &[37], &w);
    put_on_device(&ws, dev, "g", &[37], &g);
    ok(
        &ws,
        &ctx,
        OperatorDef::new("SGD", &["w", "g"], &["w"]).arg("lr", 0.1),
    );
    ok(
        &ws,
        &ctx,
        OperatorDef::new("SGD", &["w", "g"], &[]).arg("lr", 0.1),
    );
    with_tensor(&ws, "w", |t| {
        assert_eq!(t.head(), Some(Head::AtDevice));
        assert_eq!(
            t.copy_stats().total_count(),
            0,
            "no copy for an update on the device"
        );
    });
    let want: Vec<f32> = w
        .iter()
        .zip(&g)
        .map(|(w, g)| w - 0.1 * g - 0.1 * g)
        .collect();
    assert_close("sgd", &get(&ws, "w"), &want, 1e-6, 1e-6);
}

/// A small forward pass whose inputs already live on the device copies nothing between host
/// and device, until the scalars are read.
fn forward_pass_copies_only_the_scalars_read(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    let (n, k, h, c) = (8, 12, 10, 4);
    put_on_device(&ws, dev, "x", &[n, k], &data(n * k, 10));
    put_on_device(&ws, dev, "labels", &[n], &[0i32, 1, 2, 3, 3, 2, 1, 0]);
    for (name, dims) in [
        ("w1", vec![h, k]),
        ("b1", vec![h]),
        ("w2", vec![c, h]),
        ("b2", vec![c]),
    ] {
        let def = OperatorDef::new("GaussianFill", &[], &[name])
            .arg("shape", dims)
            .arg("std", 0.3);
        ok(&ws, &ctx, def);
    }
    let net = [
        OperatorDef::new("FC", &["x", "w1", "b1"], &["h1"]),
        OperatorDef::new("Relu", &["h1"], &["h1"]),
        OperatorDef::new("FC", &["h1", "w2", "b2"], &["logits"]),
        OperatorDef::new("SoftmaxWithLoss", &["logits", "labels"], &["prob", "loss"]),
        OperatorDef::new("Accuracy", &["prob", "labels"], &["acc"]),
    ];
    for def in &net {
        ok(&ws, &ctx, def.clone());
    }
    let all = [
        "x", "labels", "w1", "b1", "w2", "b2", "h1", "logits", "prob", "loss", "acc",
    ];
    for name in all {
        with_tensor(&ws, name, |t| {
            assert_eq!(t.copy_stats().total_count(), 0, "{name} on {}", dev.label());
            assert_eq!(t.head(), Some(Head::AtDevice), "{name}");
        });
    }
    let loss = get(&ws, "loss")[0];
    let acc = get(&ws, "acc")[0];
    assert!(loss.is_finite() && (0.0..=1.0).contains(&acc));
    for name in all {
        let reads = u64::from(name == "loss" || name == "acc");
        with_tensor(&ws, name, |t| {
            let s = t.copy_stats();
            assert_eq!(s.device_to_host.count, reads, "{name}");
            assert_eq!(s.host_to_device.count, 0, "{name}");
        });
    }
    // Labels from the host: one host-to-device copy, however many operators read them.
    put(&ws, dev, "labels", &[n], &[0i32, 1, 2, 3, 3, 2, 1, 0]);
    ok(&ws, &ctx, net[3].clone());
    ok(&ws, &ctx, net[4].clone());
    with_tensor(&ws, "labels", |t| {
        assert_eq!(t.copy_stats().host_to_device.count, 1)
    });
}

fn out_of_range_labels_are_reported(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    put(&ws, dev, "x", &[2, 3], &data(6, 11));
    put(&ws, dev, "labels", &[2], &[1i32, 3]);
    let def = OperatorDef::new("SoftmaxWithLoss", &["x", "labels"], &["p", "loss"]);
    let e = run(&ws, &ctx, &def).unwrap_err().to_string();
    assert!(
        e.contains("label 3 of row 1") && e.contains("\"labels\""),
        "{e}"
    );
    // Labels only on the device: an error on cpu (checked where they are), NaN on OpenCL and
    // CUDA (checking would need a read-back).
    put_on_device(&ws, dev, "labels", &[2], &[1i32, 3]);
    match run(&ws, &ctx, &def) {
        Err(e) => assert_eq!(dev.backend(), BackendKind::Cpu, "{e}"),
        Ok(()) => assert!(get(&ws, "loss")[0].is_nan()),
    }
}

syncmem::for_each_device!(
    fc_gradient_matches_finite_differences,
    relu_gradient_matches_finite_differences,
    softmax_with_loss_gradient_matches_finite_differences,
    accuracy_counts_top_k_on_the_device,
    sgd_updates_the_parameter_in_place,
    forward_pass_copies_only_the_scalars_read,
    out_of_range_labels_are_reported,
    errors_name_the_operator_and_the_blob,
);

// ----- errors ------------------------------------------------------------------------------------

fn errors_name_the_operator_and_the_blob(dev: &Device) {
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    let err = |def: &OperatorDef| run(&ws, &ctx, def).unwrap_err();

    let e = create_operator(&OperatorDef::new("Conv", &["x"], &["y"]).named("c1"), dev)
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(
        matches!(e, Error::NotFound { .. }) && s.contains("Conv") && s.contains("FC"),
        "{s}"
    );

    let fc = OperatorDef::new("FC", &["x", "w", "b"], &["y"]).named("fc1");
    let e = err(&fc);
    let s = e.to_string();
    assert!(
        matches!(e, Error::NotFound { .. }) && s.contains("\"x\"") && s.contains("FC \"fc1\""),
        "{s}"
    );

    put(&ws, dev, "x", &[4, 5], &data(20, 1));
    put(&ws, dev, "w", &[3, 6], &data(18, 2));
    put(&ws, dev, "b", &[3], &data(3, 3));
    let e = err(&fc);
    let s = e.to_string();
    assert!(
        matches!(e, Error::InvalidShape { .. }) && s.contains("\"w\"") && s.contains("fc1"),
        "{s}"
    );

    put(&ws, dev, "w", &[3, 5], &data(15, 2));
    put(&ws, dev, "b", &[4], &data(4, 3));
    let s = err(&fc).to_string();
    assert!(s.contains("\"b\"") && s.contains("[3]"), "{s}");

    put(&ws, dev, "b", &[3], &[1i32, 2, 3]);
    let e = err(&fc);
    let s = e.to_string();
    assert!(
        matches!(e, Error::TypeMismatch { .. }) && s.contains("\"b\"") && s.contains("i32"),
        "{s}"
    );

    ws.create_blob("b").unwrap().write().reset(7u8);
    let s = err(&fc).to_string();
    assert!(s.contains("\"b\"") && s.contains("u8"), "{s}");

    let inplace = OperatorDef::new("FC", &["x", "w", "b"], &["x"]);
    let s = err(&inplace).to_string();
    assert!(s.contains("FC") && s.contains("\"x\""), "{s}");

    put(&ws, dev, "labels", &[4], &[0.0f32; 4]);
    let sm = OperatorDef::new("SoftmaxWithLoss", &["x", "labels"], &["p", "loss"]);
    let e = err(&sm);
    let s = e.to_string();
    assert!(
        matches!(e, Error::TypeMismatch { .. })
            && s.contains("\"labels\"")
            && s.contains("SoftmaxWithLoss"),
        "{s}"
    );

    for bad in [
        OperatorDef::new("SGD", &["w", "g"], &["v"]).arg("lr", 0.1),
        OperatorDef::new("SGD", &["w", "g"], &["w"]),
        OperatorDef::new("Relu", &["x"], &["y"]).arg("alpha", 1),
        OperatorDef::new("UniformFill", &[], &["u"])
            .arg("min", 2)
            .arg("max", 1),
        OperatorDef::new("FC", &["x", "w"], &["y"]),
    ] {
        let e = create_operator(&bad, dev).err().unwrap();
        assert!(e.to_string().contains(&bad.op_type), "{e}");
    }
    assert!(registered_types().contains(&"SoftmaxWithLossGradient"));

    // A tensor of another device is refused, naming the blob.
    if dev.backend() != BackendKind::Cpu {
        put(&ws, &Device::cpu(), "xc", &[2], &[1.0f32, -1.0]);
        let s = err(&OperatorDef::new("Relu", &["xc"], &["yc"])).to_string();
        assert!(s.contains("\"xc\"") && s.contains("cpu"), "{s}");
        let cpu_op = create_operator(&OperatorDef::new("Relu", &["x"], &["y"]), &Device::cpu());
        let e = cpu_op.unwrap().run(&ws, &ctx).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    }
}

// ----- cpu against each accelerator ---------------------------------------------------------------

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

#[test]
fn fills_with_the_same_seed_are_identical_and_others_differ() {
    let fill = |dev: &Device, seed: u64| {
        let defs = [
            OperatorDef::new("UniformFill", &[], &["u"]).arg("shape", vec![50]),
            OperatorDef::new("GaussianFill", &[], &["g"]).arg("shape", vec![5, 11]),
            OperatorDef::new("ConstantFill", &[], &["i"])
                .arg("shape", vec![4])
                .arg("value", 3)
                .arg("dtype", "int32"),
        ];
        let ctx = Context::with_seed(dev, seed).unwrap();
        let ws = Workspace::new();
        for d in &defs {
            ok(&ws, &ctx, d.clone());
        }
        let ints = ws.get_blob("i").unwrap();
        let ints = ints
            .read()
            .get::<Tensor>()
            .unwrap()
            .host::<i32>()
            .unwrap()
            .to_vec();
        assert_eq!(ints, [3; 4]);
        (get(&ws, "u"), get(&ws, "g"))
    };
    let cpu = Device::cpu();
    let a = fill(&cpu, 42);
    assert_eq!(a, fill(&cpu, 42));
    assert_ne!(a, fill(&cpu, 43));
    #[cfg(feature = "opencl")]
    if let Some(cl) = syncmem::testing::opencl_or_skip("fills_with_the_same_seed_are_identical") {
        assert_eq!(a, fill(&cl, 42), "cpu and {} from seed 42", cl.label());
    }
    #[cfg(feature = "cuda")]
    if let Some(cu) = syncmem::testing::cuda_or_skip("fills_with_the_same_seed_are_identical") {
        assert_eq!(a, fill(&cu, 42), "cpu and {} from seed 42", cu.label());
    }
}

#[test]
fn operators_on_distinct_threads_share_inputs_without_deadlock() {
    let dev = Device::first_accelerator()
        .filter(|d| d.backend() == BackendKind::OpenCl)
        .unwrap_or_else(Device::cpu);
    let ws = Workspace::new();
    put(&ws, &dev, "x", &[16, 16], &data(256, 31));
    put(&ws, &dev, "w", &[16, 16], &data(256, 32));
    put(&ws, &dev, "b", &[16], &data(16, 33));
    std::thread::scope(|s| {
        for t in 0..4 {
            let (ws, dev) = (&ws, &dev);
            s.spawn(move || {
                let ctx = Context::with_seed(dev, t).unwrap();
                let y = format!("y{t}");
                for _ in 0..20 {
                    ok(ws, &ctx, OperatorDef::new("FC", &["x", "w", "b"], &[&y]));
                    // In place on a blob the other threads read too would race; each thread
                    // updates its own output instead.
                    ok(ws, &ctx, OperatorDef::new("Relu", &[&y], &[&y]));
                }
            });
        }
    });
    let y0 = get(&ws, "y0");
    for t in 1..4 {
        assert_eq!(get(&ws, &format!("y{t}")), y0);
    }
}

#[test]
fn operator_defs_round_trip_through_json() {
    let def = OperatorDef::new("FC", &["x", "w", "b"], &["y"])
        .named("fc1")
        .arg("axis", 1);
    let text = serde_json::to_string(&def).unwrap();
    assert_eq!(serde_json::from_str::<OperatorDef>(&text).unwrap(), def);
    assert_eq!(def.label(), "FC \"fc1\"");
}
