//! Errors that name the operator and the blob, cpu against each accelerator, seeded fills,
//! threads, and operator definitions as JSON.

use syncmem::ops::{create_operator, registered_types, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{BackendKind, Context, Device, Error, Workspace};

use super::*;

// ----- errors ------------------------------------------------------------------------------------

fn errors_name_the_operator_and_the_blob(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
    let ctx = Context::with_seed(dev, 1).unwrap();
    let ws = Workspace::new();
    fc_errors_name_the_blob(dev, &ctx, &ws);
    bad_definitions_are_refused(dev, &ctx, &ws);
    other_devices_are_read_through_replicas(dev, &ctx, &ws);
}

/// An unknown type, then an `FC` whose inputs are missing, of the wrong shape, of the wrong
/// type, not tensors, or written in place; labels of the wrong type.
fn fc_errors_name_the_blob(dev: &Device, ctx: &Context, ws: &Workspace) {
    let err = |def: &OperatorDef| run(ws, ctx, def).unwrap_err();
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

    put(ws, dev, "x", &[4, 5], &data(20, 1));
    put(ws, dev, "w", &[3, 6], &data(18, 2));
    put(ws, dev, "b", &[3], &data(3, 3));
    let e = err(&fc);
    let s = e.to_string();
    assert!(
        matches!(e, Error::InvalidShape { .. }) && s.contains("\"w\"") && s.contains("fc1"),
        "{s}"
    );

    put(ws, dev, "w", &[3, 5], &data(15, 2));
    put(ws, dev, "b", &[4], &data(4, 3));
    let s = err(&fc).to_string();
    assert!(s.contains("\"b\"") && s.contains("[3]"), "{s}");

    put(ws, dev, "b", &[3], &[1i32, 2, 3]);
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

    put(ws, dev, "labels", &[4], &[0.0f32; 4]);
    let sm = OperatorDef::new("SoftmaxWithLoss", &["x", "labels"], &["p", "loss"]);
    let e = err(&sm);
    let s = e.to_string();
    assert!(
        matches!(e, Error::TypeMismatch { .. })
            && s.contains("\"labels\"")
            && s.contains("SoftmaxWithLoss"),
        "{s}"
    );
}

/// Definitions no builder accepts, and a ReLU mask whose dims are not X's.
fn bad_definitions_are_refused(dev: &Device, ctx: &Context, ws: &Workspace) {
    let err = |def: &OperatorDef| run(ws, ctx, def).unwrap_err();
    for bad in [
        OperatorDef::new("SGD", &["w", "g"], &["v"]).arg("lr", 0.1),
        OperatorDef::new("SGD", &["w", "g"], &["w"]),
        OperatorDef::new("Relu", &["x"], &["y"]).arg("alpha", 1),
        OperatorDef::new("UniformFill", &[], &["u"])
            .arg("min", 2)
            .arg("max", 1),
        OperatorDef::new("FC", &["x", "w"], &["y"]),
        // A ReLU mask without the dX it applies to.
        OperatorDef::new("FCGradient", &["x", "w", "dy", "m"], &["dw", "db"]),
    ] {
        let e = create_operator(&bad, dev).err().unwrap();
        assert!(e.to_string().contains(&bad.op_type), "{e}");
    }
    // A ReLU mask whose dims are not X's.
    put(ws, dev, "dy3", &[4, 3], &data(12, 4));
    put(ws, dev, "m", &[5, 4], &data(20, 5));
    let masked = OperatorDef::new("FCGradient", &["x", "w", "dy3", "m"], &["dw", "db", "dx"]);
    let e = err(&masked);
    let s = e.to_string();
    assert!(
        matches!(e, Error::InvalidShape { .. }) && s.contains("\"m\"") && s.contains("[4, 5]"),
        "{s}"
    );
    assert!(registered_types().contains(&"SoftmaxWithLossGradient"));
}

/// A tensor of another device is read through a replica on the operator's device; a host-only
/// tensor is refused.
fn other_devices_are_read_through_replicas(dev: &Device, ctx: &Context, ws: &Workspace) {
    let err = |def: &OperatorDef| run(ws, ctx, def).unwrap_err();
    if dev.backend() != BackendKind::Cpu {
        let cpu = Device::cpu();
        put(ws, &cpu, "xc", &[2], &[1.0f32, -1.0]);
        let relu = create_operator(&OperatorDef::new("Relu", &["xc"], &["yc"]), dev).unwrap();
        relu.run(ws, ctx).unwrap();
        assert_eq!(ws.fetch::<f32>("yc").unwrap(), [1.0, 0.0]);
        let blob = ws.get_blob("xc").unwrap();
        let guard = blob.read();
        let m = guard.get::<Tensor>().unwrap().synced().unwrap();
        assert!(m.is_current_on(dev) && m.target().unwrap().same(&cpu));
        drop(guard);
        // A host-only tensor is still refused, naming the blob.
        ws.feed(
            "xh",
            Tensor::from_slice(&[2], &[1.0f32, 2.0], None).unwrap(),
        )
        .unwrap();
        let s = err(&OperatorDef::new("Relu", &["xh"], &["yh"])).to_string();
        assert!(s.contains("\"xh\"") && s.contains("host only"), "{s}");
    }
}

/// One `SGD` over several (parameter, gradient) pairs (one launch on a device, plus one per
/// large parameter on OpenCL) updates each parameter bit for bit as one `SGD` per pair does;
/// bad pair lists are refused.
fn multi_parameter_sgd_equals_one_sgd_per_parameter(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
    let ctx = Context::with_seed(dev, 1).unwrap();
    let sizes = [1usize, 3, 64, 4096, 257, 20000, 2, 17];
    let run_with = |merged: bool, pairs: usize| -> Vec<Vec<f32>> {
        let ws = Workspace::new();
        for (i, &n) in sizes[..pairs].iter().enumerate() {
            put(&ws, dev, &format!("p{i}"), &[n], &data(n, 40 + i as u64));
            put(&ws, dev, &format!("g{i}"), &[n], &data(n, 60 + i as u64));
        }
        let names: Vec<(String, String)> = (0..pairs)
            .map(|i| (format!("p{i}"), format!("g{i}")))
            .collect();
        if merged {
            let inputs: Vec<&str> = names
                .iter()
                .flat_map(|(p, g)| [p.as_str(), g.as_str()])
                .collect();
            ok(
                &ws,
                &ctx,
                OperatorDef::new("SGD", &inputs, &[]).arg("lr", 0.37),
            );
        } else {
            for (p, g) in &names {
                ok(
                    &ws,
                    &ctx,
                    OperatorDef::new("SGD", &[p, g], &[p]).arg("lr", 0.37),
                );
            }
        }
        names.iter().map(|(p, _)| get(&ws, p)).collect()
    };
    for pairs in [2, 5, sizes.len()] {
        let (a, b) = (run_with(false, pairs), run_with(true, pairs));
        for (x, y) in a.iter().zip(&b) {
            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same && x.len() == y.len(),
                "{pairs} pairs on {}",
                dev.label()
            );
        }
    }
    for bad in [
        OperatorDef::new("SGD", &["a", "ga", "b"], &[]).arg("lr", 0.1),
        OperatorDef::new("SGD", &["a", "ga", "b", "gb"], &["a"]).arg("lr", 0.1),
        OperatorDef::new("SGD", &["a", "ga", "b", "gb"], &["a", "gb"]).arg("lr", 0.1),
    ] {
        let e = create_operator(&bad, dev).err().unwrap();
        assert!(e.to_string().contains("SGD"), "{e}");
    }
    // A gradient that is another pair's parameter would be read and written at once.
    let ws = Workspace::new();
    put(&ws, dev, "a", &[2], &[1.0f32, 2.0]);
    put(&ws, dev, "b", &[2], &[1.0f32, 2.0]);
    let e = run(
        &ws,
        &ctx,
        &OperatorDef::new("SGD", &["a", "b", "b", "a"], &[]).arg("lr", 0.1),
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"b\""), "{e}");
}

/// `SoftmaxWithLoss` with `accuracy_top_k` and `gradient = 1` writes, in one pass, what
/// `SoftmaxWithLoss`, `Accuracy` and `SoftmaxWithLossGradient` write, bit for bit, and with
/// `scalars = 1` the loss and the accuracy again side by side; a wrong output count or
/// `scalars` without the accuracy is refused.
fn fused_loss_equals_the_three_operators(dev: &Device) {
    syncmem_nn::register_operators().unwrap();
    let ctx = Context::with_seed(dev, 1).unwrap();
    for (rows, cols, top_k) in [(33, 10, 1), (33, 10, 3), (1, 1, 1), (33, 3, 2)] {
        let ws = Workspace::new();
        put(&ws, dev, "x", &[rows, cols], &data(rows * cols, 7));
        let labels: Vec<i32> = (0..rows as i32).map(|i| i * 7 % cols as i32).collect();
        put(&ws, dev, "l", &[rows], &labels);
        let sm = |outs: &[&str]| OperatorDef::new("SoftmaxWithLoss", &["x", "l"], outs);
        ok(&ws, &ctx, sm(&["p", "loss"]));
        ok(
            &ws,
            &ctx,
            OperatorDef::new("Accuracy", &["p", "l"], &["acc"]).arg("top_k", top_k),
        );
        ok(
            &ws,
            &ctx,
            OperatorDef::new("SoftmaxWithLossGradient", &["p", "l"], &["dx"]),
        );
        let fused = sm(&["p2", "loss2", "acc2", "dx2"])
            .arg("accuracy_top_k", top_k)
            .arg("gradient", 1);
        ok(&ws, &ctx, fused);
        for (a, b) in [
            ("p", "p2"),
            ("loss", "loss2"),
            ("acc", "acc2"),
            ("dx", "dx2"),
        ] {
            let (x, y) = (get(&ws, a), get(&ws, b));
            let same =
                x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same,
                "{a} vs {b} at {rows}x{cols} top {top_k} on {}",
                dev.label()
            );
        }
        // Only one of the two.
        ok(&ws, &ctx, sm(&["p3", "loss3", "dx3"]).arg("gradient", 1));
        ok(
            &ws,
            &ctx,
            sm(&["p4", "loss4", "acc4"]).arg("accuracy_top_k", top_k),
        );
        assert_eq!(get(&ws, "dx"), get(&ws, "dx3"));
        assert_eq!(get(&ws, "acc"), get(&ws, "acc4"));
        loss_scalars_are_the_pair(dev, &ctx, &ws, top_k);
        assert_eq!(get(&ws, "dx5"), get(&ws, "dx"));
    }
    fused_loss_definitions_are_checked(dev);
}

/// With `scalars = 1` (with and without the gradient) the last output is `[loss, accuracy]`,
/// bit for bit the values the separate operators wrote in `ws`.
fn loss_scalars_are_the_pair(dev: &Device, ctx: &Context, ws: &Workspace, top_k: i64) {
    let sm = |outs: &[&str]| OperatorDef::new("SoftmaxWithLoss", &["x", "l"], outs);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want = bits(vec![get(ws, "loss")[0], get(ws, "acc")[0]]);
    for (outs, gradient) in [
        (&["p5", "loss5", "acc5", "dx5", "both5"][..], true),
        (&["p6", "loss6", "acc6", "both6"][..], false),
    ] {
        let mut def = sm(outs).arg("accuracy_top_k", top_k).arg("scalars", 1);
        if gradient {
            def = def.arg("gradient", 1);
        }
        ok(ws, ctx, def);
        let both = outs[outs.len() - 1];
        assert_eq!(bits(get(ws, both)), want, "{both} on {}", dev.label());
        let prefix = &both[4..];
        assert_eq!(get(ws, &format!("loss{prefix}")), get(ws, "loss"));
        assert_eq!(get(ws, &format!("acc{prefix}")), get(ws, "acc"));
    }
}

/// A wrong output count, or `scalars` without the accuracy, is refused.
fn fused_loss_definitions_are_checked(dev: &Device) {
    for bad in [
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss", "a"]),
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss"]).arg("gradient", 1),
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss", "a"])
            .arg("accuracy_top_k", 0),
        // The pair needs the accuracy, and an output of its own.
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss", "s"]).arg("scalars", 1),
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss", "a"])
            .arg("accuracy_top_k", 1)
            .arg("scalars", 1),
        OperatorDef::new("SoftmaxWithLoss", &["x", "l"], &["p", "loss", "a", "s"])
            .arg("accuracy_top_k", 1)
            .arg("scalars", 2),
    ] {
        let e = create_operator(&bad, dev).err().unwrap();
        assert!(e.to_string().contains("SoftmaxWithLoss"), "{e}");
    }
}

syncmem::for_each_device!(
    errors_name_the_operator_and_the_blob,
    multi_parameter_sgd_equals_one_sgd_per_parameter,
    fused_loss_equals_the_three_operators
);

#[test]
fn fills_with_the_same_seed_are_identical_and_others_differ() {
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
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
    syncmem_nn::register_operators().unwrap();
    let def = OperatorDef::new("FC", &["x", "w", "b"], &["y"])
        .named("fc1")
        .arg("axis", 1);
    let text = serde_json::to_string(&def).unwrap();
    assert_eq!(serde_json::from_str::<OperatorDef>(&text).unwrap(), def);
    assert_eq!(def.label(), "FC \"fc1\"");
}
