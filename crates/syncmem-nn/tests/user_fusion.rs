//! A user's element-wise operator fuses into the GEMM like the built-in `Relu`: the
//! `custom_operator` example's `LeakyRelu`, declared with its epilogue, is applied in the `FC`'s
//! store and its gradient in the `FCGradient`'s, with the results of the unfused net bit for
//! bit, on `cpu`, OpenCL and CUDA (skipped with a message where there is no GPU); the same
//! operators registered without an epilogue are not fused.

use std::sync::LazyLock;

use syncmem::kernels::{self, Epilogue, Gemm};
use syncmem::net::{NetDef, NetOptions};
use syncmem::ops::OperatorDef;
use syncmem::{Device, Error, SyncedMemory, Tensor, Workspace};
use syncmem_nn::mlp::{Dataset, Mlp};
use syncmem_nn::train::{TrainConfig, Trainer};

#[path = "../examples/custom_operator/leaky_relu.rs"]
#[allow(dead_code)]
mod leaky_relu;

/// `LeakyRelu` with its epilogue, and `PlainLeakyRelu`: the same operators, no epilogue.
static REGISTERED: LazyLock<()> = LazyLock::new(|| {
    syncmem_nn::register_operators().unwrap();
    leaky_relu::register().unwrap();
    leaky_relu::register_as("PlainLeakyRelu", "PlainLeakyReluGradient").unwrap();
});

fn devices() -> Vec<Device> {
    let mut devs = vec![Device::cpu()];
    devs.extend(syncmem::testing::opencl_or_skip("user_fusion"));
    devs.extend(syncmem::testing::cuda_or_skip("user_fusion"));
    devs
}

/// Losses and accuracies (as bits) of two epochs, and the weights after them.
type Run = (Vec<(u64, u64)>, Vec<Vec<f32>>);

/// Trains the MLP with activation `act`, fused or not; the run and the net that ran.
fn train(dev: &Device, act: &str, fuse: bool) -> (Run, NetDef) {
    let data = Dataset::spirals(64, 3, 0.2, 11);
    let cfg = TrainConfig::default()
        .with_hidden(vec![32, 32])
        .with_batch(32)
        .with_lr(0.5)
        .with_seed(5)
        .with_fuse(fuse);
    let widths = [data.features, 32, 32, data.classes];
    let mlp = Mlp::new(&widths, cfg.lr)
        .unwrap()
        .with_activation(act)
        .unwrap();
    let nets = mlp.nets("mlp");
    let mut t = Trainer::with_nets(dev, &data, &cfg, mlp, nets).unwrap();
    let losses = (0..2)
        .map(|_| {
            let e = t.run_epoch().unwrap();
            (e.loss.to_bits(), e.accuracy.to_bits())
        })
        .collect();
    let weights = t
        .nets()
        .params
        .iter()
        .map(|p| t.workspace().fetch::<f32>(p).unwrap())
        .collect();
    let ran = t.train_net().run_def().clone();
    ((losses, weights), ran)
}

fn count(def: &NetDef, ty: &str, arg: Option<(&str, &str)>) -> usize {
    let has = |o: &OperatorDef| arg.is_none_or(|(k, v)| o.args.get(k) == Some(&v.into()));
    def.ops.iter().filter(|o| o.op_type == ty && has(o)).count()
}

/// Training with `LeakyRelu` fused reaches the unfused losses and weights bit for bit; the
/// fused net runs no `LeakyRelu` or `LeakyReluGradient`: its two `FC`s apply the activation,
/// its two `FCGradient`s the gradient.
#[test]
fn a_declared_user_activation_fuses_and_trains_as_unfused() {
    LazyLock::force(&REGISTERED);
    for dev in devices() {
        let label = dev.label().to_string();
        let (unfused, plain) = train(&dev, "LeakyRelu", false);
        let (fused, ran) = train(&dev, "LeakyRelu", true);
        assert_eq!(count(&plain, "LeakyRelu", None), 2, "{label}");
        assert_eq!(count(&ran, "LeakyRelu", None), 0, "{label}");
        assert_eq!(count(&ran, "LeakyReluGradient", None), 0, "{label}");
        let fc = count(&ran, "FC", Some(("activation", "LeakyRelu")));
        assert_eq!(fc, 2, "{label}");
        let grad = count(
            &ran,
            "FCGradient",
            Some(("activation", "LeakyReluGradient")),
        );
        assert_eq!(grad, 2, "{label}");
        assert_eq!(fused, unfused, "{label}: fused vs unfused");
        // Not the built-in Relu's run: the activation did apply.
        let (relu, _) = train(&dev, "Relu", true);
        assert_ne!(fused.0, relu.0, "{label}");
    }
}

/// The same operators without a declared epilogue are left as they are, with the same
/// results as the declared ones unfused.
#[test]
fn a_user_operator_without_an_epilogue_is_not_fused() {
    LazyLock::force(&REGISTERED);
    let dev = Device::cpu();
    let (run, ran) = train(&dev, "PlainLeakyRelu", true);
    assert_eq!(count(&ran, "PlainLeakyRelu", None), 2);
    assert_eq!(count(&ran, "PlainLeakyReluGradient", None), 2);
    assert_eq!(count(&ran, "FC", Some(("activation", "PlainLeakyRelu"))), 0);
    let (unfused, _) = train(&dev, "LeakyRelu", false);
    assert_eq!(run, unfused);
}

/// An `FC` + `LeakyRelu` with its own slope (`activation_args`) gives the unfused net's output
/// bit for bit on every device, and slopes do not share a program.
#[test]
fn the_activation_keeps_its_arguments() {
    LazyLock::force(&REGISTERED);
    let (n, k, m) = (37, 19, 45);
    let xs: Vec<f32> = (0..n * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let ws_: Vec<f32> = (0..m * k)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let bs: Vec<f32> = (0..m).map(|i| i as f32 * 0.01 - 0.2).collect();
    for dev in devices() {
        let mut outs = Vec::new();
        for (alpha, fuse) in [(0.2f32, false), (0.2, true), (0.5, true)] {
            let def = NetDef::new("fc_leaky")
                .op(OperatorDef::new("FC", &["x", "w", "b"], &["h"]))
                .op(OperatorDef::new("LeakyRelu", &["h"], &["y"]).arg("alpha", alpha))
                .with_inputs(&["x", "w", "b"])
                .with_outputs(&["y"]);
            let ws = Workspace::new();
            let inputs: [(&str, &[usize], &[f32]); 3] =
                [("x", &[n, k], &xs), ("w", &[m, k], &ws_), ("b", &[m], &bs)];
            for (name, dims, v) in inputs {
                ws.feed(name, Tensor::from_slice(dims, v, Some(&dev)).unwrap())
                    .unwrap();
            }
            let opts = NetOptions::new().rewrite(syncmem_nn::fuse::Fuse::when(fuse));
            let net = ws.create_net(&def, &dev, &opts).unwrap();
            assert_eq!(net.run_def().ops.len(), if fuse { 1 } else { 2 });
            ws.run_net("fc_leaky").unwrap();
            outs.push(ws.fetch::<f32>("y").unwrap());
        }
        let label = dev.label();
        assert!(
            outs[0].iter().any(|&v| v < 0.0),
            "{label}: a negative output"
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&outs[1]), bits(&outs[0]), "{label}: fused vs unfused");
        assert_ne!(outs[2], outs[1], "{label}: another slope, another result");
    }
}

/// A GEMM asked for an epilogue part that has no code on its device is an error naming the
/// epilogue.
#[test]
fn a_missing_part_is_an_error() {
    let dev = Device::cpu();
    let one = |v: f32| -> SyncedMemory {
        let s = SyncedMemory::new(4, &dev);
        s.host_mut().unwrap().copy_from_slice(&v.to_ne_bytes());
        s
    };
    let (a, b, c, y) = (one(2.0), one(-3.0), one(7.0), one(1.0));
    let only_source = Epilogue::new("only_source").with_source("return x;");
    assert!(!only_source.fuses() && !only_source.fuses_gradient());
    {
        let (a, b, y) = (
            a.device().unwrap(),
            b.device().unwrap(),
            y.device().unwrap(),
        );
        let mut c = c.device_overwrite().unwrap();
        let s = dev.default_stream().unwrap();
        let g = Gemm::new((1, 1, 1), &a, &b, &mut c).activation(Some(&only_source));
        let e = kernels::gemm(&s, g).unwrap_err();
        assert!(matches!(&e, Error::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("only_source"), "{e}");
        let g = Gemm::new((1, 1, 1), &a, &b, &mut c).activation_grad(Some((&only_source, &y)));
        assert!(kernels::gemm(&s, g).is_err());
        // With the host closure: applied.
        let neg = only_source.with_host(|c| c.iter_mut().for_each(|v| *v = -*v));
        let g = Gemm::new((1, 1, 1), &a, &b, &mut c).activation(Some(&neg));
        kernels::gemm(&s, g).unwrap();
    }
    assert_eq!(c.host().unwrap()[..], 6.0f32.to_ne_bytes());
}

/// A body that does not compile on OpenCL vectors (an `if` on the value) runs lane by lane:
/// the same results as its host closure on `cpu`, bit for bit.
#[test]
fn a_body_without_vector_form_runs_lane_by_lane() {
    let Some(cl) = syncmem::testing::opencl_or_skip("a_body_without_vector_form_runs_lane_by_lane")
    else {
        return;
    };
    let half = Epilogue::new("branchy")
        .with_source("if (x > 1.0f) { return x; } return 0.5f * x;")
        .with_host(|c| {
            c.iter_mut()
                .for_each(|v| *v = if *v > 1.0 { *v } else { 0.5 * *v })
        });
    let (m, n, k) = (19, 48, 5);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 9) as f32 * 0.25 - 1.0)
        .collect();
    let mut outs = Vec::new();
    for dev in [Device::cpu(), cl] {
        let mem = |v: &[f32]| {
            let s = SyncedMemory::new(4 * v.len(), &dev);
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
            s.host_mut().unwrap().copy_from_slice(&bytes);
            s
        };
        let (am, bm, cm) = (mem(&a), mem(&b), SyncedMemory::new(4 * m * n, &dev));
        {
            let (a, b) = (am.device().unwrap(), bm.device().unwrap());
            let mut c = cm.device_overwrite().unwrap();
            let g = Gemm::new((m, n, k), &a, &b, &mut c).activation(Some(&half));
            kernels::gemm(&dev.default_stream().unwrap(), g).unwrap();
        }
        outs.push(cm.host().unwrap().to_vec());
    }
    assert_eq!(outs[0], outs[1], "cpu vs opencl");
    let v: Vec<f32> = outs[0]
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        v.iter().any(|&x| x > 1.0) && v.iter().any(|&x| x < 0.0),
        "{v:?}"
    );
}
