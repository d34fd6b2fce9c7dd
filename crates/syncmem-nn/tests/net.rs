//! Nets: Caffe2's workspace net rules, memory planning, and the MLP training loop (copy counts
//! per step, cpu vs OpenCL determinism).

use std::sync::Arc;

use syncmem::net::memory::measure_run;
use syncmem::net::{plan_memory, Net, NetDef, NetOptions, OperatorFactory, PlanOptions};
use syncmem::ops::{Operator, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{Context, Device, Error, Result, Workspace};
use syncmem_nn::mlp::{Dataset, Mlp};
use syncmem_nn::train::{compare_planning, TrainConfig, Trainer};

// ----- small host operators for the net rules ------------------------------------------------

/// `TFill` (y = [value; 4]), `TAdd` (y = x + k, in place allowed), `TSum` (y = a + b),
/// `TFail` (always fails).
struct TestOp {
    def: OperatorDef,
}

fn read_vec(ws: &Workspace, name: &str) -> Result<Vec<f32>> {
    let blob = ws.get_blob(name)?;
    let g = blob.read();
    let v = g.get::<Tensor>()?.host::<f32>()?.to_vec();
    Ok(v)
}

fn write_vec(ws: &Workspace, ctx: &Context, name: &str, v: &[f32]) -> Result<()> {
    let t = Tensor::from_slice(&[v.len()], v, Some(ctx.device()))?;
    ws.create_blob(name)?.write().reset(t);
    Ok(())
}

fn arg(def: &OperatorDef, key: &str) -> Result<f32> {
    syncmem_nn::register_operators().unwrap();
    def.args
        .get(key)
        .and_then(|v| v.as_f64())
        .map(|v| v as f32)
        .ok_or_else(|| Error::InvalidState {
            op: "create_operator",
            buffer: def.label(),
            reason: format!("argument {key:?} is required"),
        })
}

impl Operator for TestOp {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        let d = &self.def;
        match d.op_type.as_str() {
            "TFill" => write_vec(ws, ctx, &d.outputs[0], &[arg(d, "value")?; 4]),
            "TAdd" => {
                let k = arg(d, "k")?;
                let v: Vec<f32> = read_vec(ws, &d.inputs[0])?.iter().map(|x| x + k).collect();
                write_vec(ws, ctx, &d.outputs[0], &v)
            }
            "TSum" => {
                let (a, b) = (read_vec(ws, &d.inputs[0])?, read_vec(ws, &d.inputs[1])?);
                let v: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
                write_vec(ws, ctx, &d.outputs[0], &v)
            }
            _ => Err(Error::InvalidState {
                op: "TFail",
                buffer: d.label(),
                reason: "this operator always fails".into(),
            }),
        }
    }
}

fn test_ops() -> NetOptions {
    let f: OperatorFactory = Arc::new(|def: &OperatorDef, _dev: &Device| {
        match def.op_type.as_str() {
            "TFill" | "TAdd" | "TSum" | "TFail" => {
                if def.op_type == "TAdd" {
                    arg(def, "k")?; // checked at build time
                }
                Ok(Some(
                    Box::new(TestOp { def: def.clone() }) as Box<dyn Operator>
                ))
            }
            _ => Ok(None),
        }
    });
    NetOptions::new().operators(f)
}

fn fill_net(name: &str, value: f32) -> NetDef {
    syncmem_nn::register_operators().unwrap();
    NetDef::new(name).op(OperatorDef::new("TFill", &[], &["x"]).arg("value", value))
}

fn cpu() -> Device {
    Device::cpu()
}

// ----- Caffe2 workspace net rules ------------------------------------------------------------

#[test]
fn a_net_needs_a_name() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    let e = ws
        .create_net(&fill_net("", 1.0), &cpu(), &test_ops())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
    assert!(e.to_string().contains("name"), "{e}");
    assert!(ws.nets().is_empty());
    assert!(ws.blobs().is_empty());
}

#[test]
fn no_silent_overwrite() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    let first = ws
        .create_net(&fill_net("n", 1.0), &cpu(), &test_ops())
        .unwrap();
    let e = ws
        .create_net(&fill_net("n", 2.0), &cpu(), &test_ops())
        .unwrap_err();
    assert!(
        matches!(&e, Error::AlreadyExists { kind: "net", name, .. } if name == "n"),
        "{e}"
    );
    assert!(Arc::ptr_eq(&ws.get_net("n").unwrap(), &first));
    let second = ws
        .create_net(&fill_net("n", 2.0), &cpu(), &test_ops().overwrite(true))
        .unwrap();
    assert!(!Arc::ptr_eq(&second, &first));
    ws.run_net("n").unwrap();
    assert_eq!(read_vec(&ws, "x").unwrap(), vec![2.0; 4]);
}

#[test]
fn a_failed_build_leaves_nothing_behind() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    let good = ws
        .create_net(&fill_net("good", 1.0), &cpu(), &test_ops())
        .unwrap();
    let blobs = ws.blobs();
    let bad = NetDef::new("bad")
        .op(OperatorDef::new("TFill", &[], &["y"]).arg("value", 1.0))
        .op(OperatorDef::new("NoSuchOp", &["y"], &["z"]).named("mystery"));
    let e = ws.create_net(&bad, &cpu(), &test_ops()).unwrap_err();
    match &e {
        Error::OperatorFailed {
            net,
            stage,
            index,
            op,
            error,
        } => {
            assert_eq!((net.as_str(), *stage, *index), ("bad", "build", 1));
            assert!(op.contains("NoSuchOp") && op.contains("mystery"), "{op}");
            assert!(matches!(**error, Error::NotFound { .. }), "{error}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert_eq!(ws.nets(), vec!["good".to_string()]);
    assert_eq!(ws.blobs(), blobs, "no blob of the failed net was created");

    // A failing replacement (bad argument, caught when building) keeps the old net.
    let bad_overwrite = NetDef::new("good").op(OperatorDef::new("TAdd", &["x"], &["x"]));
    let e = ws
        .create_net(&bad_overwrite, &cpu(), &test_ops().overwrite(true))
        .unwrap_err();
    assert!(e.to_string().contains("\"k\""), "{e}");
    assert!(Arc::ptr_eq(&ws.get_net("good").unwrap(), &good));
    ws.run_net("good").unwrap();
}

#[test]
fn a_failing_operator_names_the_net_and_the_operator() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    let def = fill_net("n", 1.0)
        .op(OperatorDef::new("TAdd", &["x"], &["y"]).arg("k", 1.0))
        .op(OperatorDef::new("TFail", &["y"], &["z"]).named("boom"))
        .op(OperatorDef::new("TAdd", &["y"], &["never"]).arg("k", 1.0));
    ws.create_net(&def, &cpu(), &test_ops()).unwrap();
    let e = ws.run_net("n").unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, Error::OperatorFailed { net, stage: "run", index: 2, .. } if net == "n"),
        "{text}"
    );
    for part in ["\"n\"", "#2", "TFail", "\"boom\"", "always fails"] {
        assert!(text.contains(part), "{part} missing in: {text}");
    }
    let Error::OperatorFailed { error, .. } = &e else {
        unreachable!()
    };
    assert!(
        matches!(**error, Error::InvalidState { op: "TFail", .. }),
        "{error}"
    );
    // Operators before the failure ran, the ones after did not.
    assert_eq!(read_vec(&ws, "y").unwrap(), vec![2.0; 4]);
    assert!(read_vec(&ws, "never").is_err());
}

#[test]
fn run_net_on_a_missing_net_is_an_error_naming_it() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    ws.create_net(&fill_net("present", 1.0), &cpu(), &test_ops())
        .unwrap();
    let e = ws.run_net("absent").unwrap_err();
    assert!(
        matches!(&e, Error::NotFound { kind: "net", name, .. } if name == "absent"),
        "{e}"
    );
    assert!(
        e.to_string().contains("present"),
        "lists the known nets: {e}"
    );
    assert!(ws.try_get_net("absent").is_none());
    assert!(ws.get_net("absent").is_err());
}

#[test]
fn run_net_once_builds_runs_and_discards() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    // No name needed, nothing registered.
    ws.run_net_once(&fill_net("", 3.0), &cpu(), &test_ops())
        .unwrap();
    assert!(ws.nets().is_empty());
    assert_eq!(read_vec(&ws, "x").unwrap(), vec![3.0; 4]);
    let bad = NetDef::new("once").op(OperatorDef::new("NoSuchOp", &[], &["q"]));
    let e = ws.run_net_once(&bad, &cpu(), &test_ops()).unwrap_err();
    assert!(
        matches!(e, Error::OperatorFailed { stage: "build", .. }),
        "{e}"
    );
    assert!(!ws.has_blob("q"));
    let failing = NetDef::new("once").op(OperatorDef::new("TFail", &[], &["q"]));
    let e = ws.run_net_once(&failing, &cpu(), &test_ops()).unwrap_err();
    assert!(
        matches!(e, Error::OperatorFailed { stage: "run", .. }),
        "{e}"
    );
}

#[test]
fn nets_are_listed_sorted_and_deleted() {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    for n in ["b", "c", "a"] {
        ws.create_net(&fill_net(n, 1.0), &cpu(), &test_ops())
            .unwrap();
    }
    assert_eq!(ws.nets(), vec!["a", "b", "c"]);
    assert!(ws.has_net("b"));
    assert!(ws.delete_net("b"));
    assert!(!ws.delete_net("b"));
    assert_eq!(ws.nets(), vec!["a", "c"]);
    assert!(matches!(
        ws.run_net("b"),
        Err(Error::NotFound { kind: "net", .. })
    ));
    // Creating a net creates the blobs its operators write (Caffe2's operator constructors).
    assert!(ws.has_blob("x"));
}

#[test]
fn nets_run_from_several_threads() {
    syncmem_nn::register_operators().unwrap();
    fn check<T: Send + Sync>() {}
    check::<Net>();
    check::<Workspace>();
    let ws = Arc::new(Workspace::new());
    for i in 0..4 {
        let def =
            NetDef::new(format!("n{i}"))
                .op(OperatorDef::new("TFill", &[], &[&format!("x{i}")]).arg("value", i as f32));
        ws.create_net(&def, &cpu(), &test_ops()).unwrap();
    }
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let ws = ws.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    ws.run_net(&format!("n{i}")).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for i in 0..4 {
        assert_eq!(read_vec(&ws, &format!("x{i}")).unwrap(), vec![i as f32; 4]);
    }
}

#[test]
fn net_defs_load_from_json_files() {
    syncmem_nn::register_operators().unwrap();
    let def = fill_net("from_file", 1.0)
        .op(OperatorDef::new("TAdd", &["x"], &["y"]).arg("k", 0.5))
        .with_inputs::<&str>(&[])
        .with_outputs(&["y"]);
    let path = std::env::temp_dir().join(format!("syncmem-net-{}.json", std::process::id()));
    std::fs::write(&path, def.to_json()).unwrap();
    let back = NetDef::from_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(back, def);
    let ws = Workspace::new();
    ws.run_net_once(&back, &cpu(), &test_ops()).unwrap();
    assert_eq!(read_vec(&ws, "y").unwrap(), vec![1.5; 4]);

    assert!(matches!(
        NetDef::from_file(path.with_extension("missing")),
        Err(Error::NotFound { .. })
    ));
    let e = NetDef::from_json(r#"{"name": "x", "ops": [{"inputs": []}]}"#).unwrap_err();
    assert!(e.to_string().contains("type"), "{e}");
}

// ----- memory planning -----------------------------------------------------------------------

/// A chain with an in-place step and a blob read late (a "gradient" reading a forward blob).
fn chain() -> NetDef {
    syncmem_nn::register_operators().unwrap();
    NetDef::new("chain")
        .op(OperatorDef::new("TFill", &[], &["x"]).arg("value", 1.0))
        .op(OperatorDef::new("TAdd", &["x"], &["a"]).arg("k", 1.0))
        .op(OperatorDef::new("TAdd", &["a"], &["b"]).arg("k", 2.0))
        .op(OperatorDef::new("TAdd", &["b"], &["b"]).arg("k", 10.0))
        .op(OperatorDef::new("TAdd", &["b"], &["c"]).arg("k", 3.0))
        .op(OperatorDef::new("TAdd", &["c"], &["d"]).arg("k", 4.0))
        .op(OperatorDef::new("TSum", &["d", "a"], &["e"]))
        .op(OperatorDef::new("TAdd", &["e"], &["y"]).arg("k", 0.0))
        .with_inputs::<&str>(&[])
        .with_outputs(&["x", "y"])
}

#[test]
fn planned_and_unplanned_nets_agree() {
    syncmem_nn::register_operators().unwrap();
    let plan = plan_memory(&chain(), &PlanOptions::default()).unwrap();
    assert!(plan.slots < plan.planned_blobs(), "{plan:?}");
    // In place stays in place; `a` lives until TSum reads it.
    let planned = &plan.def.ops;
    assert_eq!(planned[3].inputs, planned[3].outputs);
    assert_eq!(planned[6].inputs[1], plan.mapping["a"]);
    assert_ne!(plan.mapping["a"], plan.mapping["c"]);
    assert_ne!(plan.mapping["a"], plan.mapping["d"]);
    for plan_memory in [false, true] {
        let ws = Workspace::new();
        let net = ws
            .create_net(&chain(), &cpu(), &test_ops().plan_memory(plan_memory))
            .unwrap();
        ws.run_net("chain").unwrap();
        // x = 1, a = 2, b = 14, c = 17, d = 21, e = 23, y = 23.
        assert_eq!(read_vec(&ws, "y").unwrap(), vec![23.0; 4]);
        assert_eq!(read_vec(&ws, "x").unwrap(), vec![1.0; 4]);
        assert_eq!(net.plan().is_some(), plan_memory);
        assert_eq!(ws.has_blob("a"), !plan_memory);
        assert!(ws.has_blob(net.blob_name("a")));
    }
}

#[test]
fn errors_of_planned_nets_show_the_renamed_blobs() {
    syncmem_nn::register_operators().unwrap();
    let def = chain().op(OperatorDef::new("TFail", &["c"], &["z"]).named("late"));
    let ws = Workspace::new();
    let net = ws
        .create_net(&def, &cpu(), &test_ops().plan_memory(true))
        .unwrap();
    let e = ws.run_net("chain").unwrap_err().to_string();
    let slot = net.blob_name("c");
    assert!(slot.starts_with("__shared_"), "{slot}");
    assert!(e.contains(&format!("c -> {slot}")), "{e}");
    assert!(e.contains("TFail \"late\"") && e.contains("#8"), "{e}");
}

fn spirals() -> Dataset {
    Dataset::spirals(64, 3, 0.2, 11)
}

fn small(plan: bool) -> TrainConfig {
    TrainConfig::default()
        .with_hidden(vec![32, 32])
        .with_epochs(3)
        .with_batch(32)
        .with_lr(0.5)
        .with_seed(5)
        .with_plan(plan)
        .with_fuse(true)
}

fn host_f32(ws: &Workspace, name: &str) -> Vec<f32> {
    read_vec(ws, name).unwrap()
}

/// Trains with and without planning: the same losses, bit for bit, and the same weights.
fn planning_keeps_training_results(dev: &Device) {
    let data = spirals();
    let mut runs = Vec::new();
    for plan in [false, true] {
        let mut t = Trainer::new(dev, &data, &small(plan)).unwrap();
        let losses: Vec<u64> = (0..2)
            .map(|_| t.run_epoch().unwrap().loss.to_bits())
            .collect();
        let weights: Vec<Vec<f32>> = t
            .nets()
            .params
            .iter()
            .map(|p| host_f32(t.workspace(), p))
            .collect();
        assert_eq!(t.train_net().plan().is_some(), plan);
        runs.push((losses, weights));
    }
    assert_eq!(runs[0], runs[1]);
}

/// Trains with and without fusing FC + Relu, FCGradient + ReluGradient, the SGD updates and
/// the loss with its accuracy and gradient, and the bias gradients inside the `dW` GEMMs,
/// planned and not: the same losses, accuracies and weights, bit for bit; the fused nets run
/// eleven operators fewer and never write the pre-activations or the ReLU outputs' gradients.
fn fusion_keeps_training_results(dev: &Device) {
    let data = spirals();
    let mut runs = Vec::new();
    for (fuse, plan) in [(false, false), (true, false), (true, true)] {
        let cfg = small(plan).with_fuse(fuse);
        let mut t = Trainer::new(dev, &data, &cfg).unwrap();
        let losses: Vec<(u64, u64)> = (0..2)
            .map(|_| {
                let e = t.run_epoch().unwrap();
                (e.loss.to_bits(), e.accuracy.to_bits())
            })
            .collect();
        let weights: Vec<Vec<f32>> = t
            .nets()
            .params
            .iter()
            .map(|p| host_f32(t.workspace(), p))
            .collect();
        let net = t.train_net();
        assert_eq!(net.rewritten().is_some(), fuse);
        // The fusion of the train net, as the trainer's rewrite made it.
        let fusion = net.rewritten().map(|ran| {
            let f = syncmem_nn::fuse::fuse_net(net.def(), &[]);
            assert_eq!(&f.def, ran);
            f
        });
        let fused = fusion.as_ref().map_or(0, |f| f.fused.len());
        let fused_grads = fusion.as_ref().map_or(0, |f| f.fused_grads.len());
        assert_eq!(fused, if fuse { 2 } else { 0 });
        assert_eq!(fused_grads, if fuse { 2 } else { 0 });
        let fused_updates = fusion.as_ref().map_or(0, |f| f.fused_updates);
        assert_eq!(fused_updates, if fuse { 6 } else { 0 });
        let merged = fused_updates.saturating_sub(1);
        let fused_losses = fusion.as_ref().map_or(0, |f| f.fused_losses);
        assert_eq!(fused_losses, if fuse { 2 } else { 0 });
        let fused_bias_grads = fusion.as_ref().map_or(0, |f| f.fused_bias_grads);
        assert_eq!(fused_bias_grads, if fuse { 3 } else { 0 });
        let db_in_gemm =
            net.run_def().ops.iter().filter(|o| {
                o.op_type == "FCGradient" && o.args.get("db_in_gemm") == Some(&1.into())
            });
        assert_eq!(db_in_gemm.count(), fused_bias_grads);
        assert_eq!(
            net.run_def().ops.len() + fused + fused_grads + merged + fused_losses,
            net.def().ops.len()
        );
        for (ty, fused, unfused) in [
            ("Relu", 0, 2),
            ("ReluGradient", 0, 2),
            ("SGD", 1, 6),
            ("Accuracy", 0, 1),
            ("SoftmaxWithLossGradient", 0, 1),
        ] {
            let n = net.run_def().ops.iter().filter(|o| o.op_type == ty);
            assert_eq!(n.count(), if fuse { fused } else { unfused }, "{ty}");
        }
        for gone in ["fc1", "fc2", "relu1_grad", "relu2_grad"] {
            assert_eq!(t.workspace().has_blob(gone), !fuse && !plan, "{gone}");
        }
        runs.push((losses, weights));
    }
    assert_eq!(runs[0], runs[1], "fused vs unfused");
    assert_eq!(runs[0], runs[2], "fused and planned vs unfused");
}

/// Planning lowers the measured peak of a forward+backward+update step.
fn planning_lowers_the_peak(dev: &Device) {
    let cmp = compare_planning(dev, &spirals(), &small(true)).unwrap();
    assert!(cmp.planned_blobs > cmp.slots, "{cmp:?}");
    let (u, p) = (cmp.unplanned.tensor_peak, cmp.planned.tensor_peak);
    assert!(p.device < u.device, "planned {p:?} vs unplanned {u:?}");
    assert_eq!(cmp.saved_bytes(), u.device - p.device);
    // The intermediates of the MLP: 9 activations/gradients of [32, 32], ...; at least a third
    // of them go away.
    let mlp = Mlp::new(&[2, 32, 32, 3], 0.5).unwrap();
    let plan = plan_memory(
        &mlp.nets("m").train,
        &PlanOptions::new().with_sizes(mlp.blob_bytes(32)),
    )
    .unwrap();
    let (before, after) = plan.estimated_bytes;
    assert!(after * 3 <= before * 2, "{before} -> {after}");
}

/// Training reaches a good accuracy on the spirals.
fn training_learns_the_spirals(dev: &Device) {
    let data = Dataset::spirals(200, 3, 0.2, 1);
    let cfg = TrainConfig::default();
    let mut t = Trainer::new(dev, &data, &cfg).unwrap();
    let first = t.run_epoch().unwrap();
    for _ in 1..cfg.epochs {
        t.run_epoch().unwrap();
    }
    let (loss, acc) = t.evaluate().unwrap();
    assert!(loss < first.loss, "{loss} vs {}", first.loss);
    assert!(acc >= 0.9, "accuracy {acc}");
}

/// The measured run sees the net's intermediates.
fn measured_run_counts_intermediates(dev: &Device) {
    let mut t = Trainer::new(dev, &spirals(), &small(false)).unwrap();
    let m = t.measure_step().unwrap();
    assert!(m.tensor_peak.device > m.before.device, "{m:?}");
    let again = measure_run(t.train_net(), t.workspace()).unwrap();
    assert_eq!(
        again.tensor_peak, again.before,
        "a second step allocates nothing new"
    );
}

syncmem::for_each_device!(
    planning_keeps_training_results,
    fusion_keeps_training_results,
    planning_lowers_the_peak,
    training_learns_the_spirals,
    measured_run_counts_intermediates,
);

#[cfg(feature = "opencl")]
#[test]
fn same_seed_same_loss_curve_on_cpu_and_opencl() {
    if let Some(ocl) =
        syncmem::testing::opencl_or_skip("same_seed_same_loss_curve_on_cpu_and_opencl")
    {
        same_seed_same_loss_curve_as_cpu(&ocl);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn same_seed_same_loss_curve_on_cpu_and_cuda() {
    if let Some(cu) = syncmem::testing::cuda_or_skip("same_seed_same_loss_curve_on_cpu_and_cuda") {
        same_seed_same_loss_curve_as_cpu(&cu);
    }
}

/// Four epochs on `dev` and on `cpu` from the same seed: the same losses and accuracies, up to
/// rounding.
#[cfg(any(feature = "opencl", feature = "cuda"))]
fn same_seed_same_loss_curve_as_cpu(dev: &Device) {
    let data = spirals();
    let curve = |dev: &Device| -> Vec<(f64, f64)> {
        let mut t = Trainer::new(dev, &data, &small(true)).unwrap();
        (0..4)
            .map(|_| {
                let e = t.run_epoch().unwrap();
                (e.loss, e.accuracy)
            })
            .collect()
    };
    let (a, b) = (curve(&Device::cpu()), curve(dev));
    for (k, ((la, aa), (lb, ab))) in a.iter().zip(&b).enumerate() {
        let rel = (la - lb).abs() / la.abs().max(1e-12);
        assert!(
            rel < 1e-3,
            "epoch {k}: cpu loss {la}, {} loss {lb}",
            dev.label()
        );
        assert!((aa - ab).abs() < 0.02, "epoch {k}: accuracy {aa} vs {ab}");
    }
}
