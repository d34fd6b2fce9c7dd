//! Gradients against finite differences, device-side accuracy and SGD, the exact copies of a
//! forward pass, and out-of-range labels, on every device.

use syncmem::ops::OperatorDef;
use syncmem::{BackendKind, Context, Device, Head, Workspace};

use super::*;

fn fc_gradient_matches_finite_differences(dev: &Device) {
    // Sizes that are not multiples of any GEMM tile or block; then the skinny shapes of a small
    // MLP: 2 features in, 3 classes out, 64-row batches (GEMMs with k = 2, n = 3, m = 3).
    for (n, k, m) in [(5, 19, 3), (64, 2, 3), (2, 40, 17)] {
        fc_gradient_matches_finite_differences_at(dev, (n, k, m));
    }
}

fn fc_gradient_matches_finite_differences_at(dev: &Device, (n, k, m): (usize, usize, usize)) {
    syncmem_nn::register_operators().unwrap();
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
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
            &format!("d{param} on {}, N={n} K={k} M={m}", dev.label()),
            &get(&ws, g),
            &num,
            1e-3,
            1e-3,
        );
    }
}

fn relu_gradient_matches_finite_differences(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
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
            syncmem::testing::assert_syncs(dev, &t.copy_stats(), 0, reads, name);
        });
    }
    // Labels from the host: one upload (a copy, or a zero-copy sync), however many operators
    // read them.
    put(&ws, dev, "labels", &[n], &[0i32, 1, 2, 3, 3, 2, 1, 0]);
    ok(&ws, &ctx, net[3].clone());
    ok(&ws, &ctx, net[4].clone());
    with_tensor(&ws, "labels", |t| {
        syncmem::testing::assert_syncs(dev, &t.copy_stats(), 1, 0, "labels");
    });
}

fn out_of_range_labels_are_reported(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
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
);
