//! Operators registered from outside the crate (this test crate uses the public API only):
//! built by `create_operator`, used by JSON nets, planned and fused like the built-in ones;
//! a type registered twice is an error; an MLP's activation needs a registered gradient.

use std::sync::LazyLock;

use syncmem::device::{Grid, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::net::{NetDef, NetOptions, PlanOptions};
use syncmem::ops::{self, Args, Operator, OperatorDef};
use syncmem::{Context, DType, Device, Error, Result, Tensor, Workspace};
use syncmem_nn::mlp::{Dataset, Mlp};
use syncmem_nn::train::{TrainConfig, Trainer};

/// `y[..n] = s * x[..n]`.
static SCALE: LazyLock<UserKernel> = LazyLock::new(|| {
    UserKernel::new("test_scale")
        .with_opencl(
            "__kernel void test_scale(const __global float* x, __global float* y, uint n, \
             float s) { size_t i = get_global_id(0); if (i < n) y[i] = s * x[i]; }",
        )
        .with_host(|a| {
            let (x, y, s) = (a.input::<f32>(0)?, a.output::<f32>(1)?, a.f32(3)?);
            let n = a.u32(2)? as usize;
            y.iter_mut().zip(x).take(n).for_each(|(y, x)| *y = s * x);
            Ok(())
        })
});

/// `TestScale`: `Y = scale · X` (argument `scale`, default 2).
struct TestScale {
    def: OperatorDef,
    scale: f32,
}

impl Operator for TestScale {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        ops::with_io(ws, &self.def, ctx.device(), &[], |io| {
            let x = io.input(0)?;
            let n = x.numel().unwrap_or(0);
            let y = io.output(0)?;
            y.resize(x.dims())?;
            y.set_dtype(DType::F32)?;
            let args = [
                Arg::read(x),
                Arg::overwrite(y),
                (n as u32).into(),
                self.scale.into(),
            ];
            // SAFETY: test_scale touches elements 0..n of x and y, which both hold n floats.
            unsafe { kernels::launch(&SCALE, ctx.stream(), Grid::for_elements(n, 64), &args) }
        })
    }
}

fn build_test_scale(def: &OperatorDef, _: &Device) -> Result<Box<dyn Operator>> {
    let scale = Args::check(def, (1, 1), (1, 1), &["scale"])?.f32_or("scale", 2.0)?;
    Ok(Box::new(TestScale {
        def: def.clone(),
        scale,
    }))
}

static REGISTERED: LazyLock<()> = LazyLock::new(|| {
    ops::register_operator("TestScale", None, build_test_scale).unwrap();
});

fn devices() -> Vec<Device> {
    let mut v = vec![Device::cpu()];
    v.extend(syncmem::testing::opencl_or_skip(
        "registered operators on opencl",
    ));
    v
}

/// A JSON net mixing the registered type with built-in ones, planned and fused: the same
/// results as the plain net, on every device.
#[test]
fn registered_operators_run_in_json_nets_planned_and_fused() {
    syncmem_nn::register_operators().unwrap();
    LazyLock::force(&REGISTERED);
    assert!(ops::registered_types().contains(&"TestScale"));
    assert!(ops::is_registered("TestScale"));
    let def = NetDef::from_json(
        r#"{"name": "chain", "ops": [
            {"type": "TestScale", "inputs": ["x"], "outputs": ["a"], "args": {"scale": -1.0}},
            {"type": "Relu", "inputs": ["a"], "outputs": ["b"]},
            {"type": "TestScale", "inputs": ["b"], "outputs": ["c"]},
            {"type": "TestScale", "inputs": ["c"], "outputs": ["y"], "args": {"scale": 0.5}}
        ], "external_inputs": ["x"], "external_outputs": ["y"]}"#,
    )
    .unwrap();
    let xs: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
    let want: Vec<f32> = xs.iter().map(|&v| (-v).max(0.0)).collect();
    for dev in devices() {
        for (plan, fuse) in [(false, false), (true, true)] {
            let ws = Workspace::new();
            ws.feed("x", Tensor::from_slice(&[10, 10], &xs, Some(&dev)).unwrap())
                .unwrap();
            let mut opts = NetOptions::new().rewrite(syncmem_nn::fuse::Fuse::when(fuse));
            if plan {
                opts = opts.with_plan(PlanOptions::default());
            }
            let net = ws.create_net(&def, &dev, &opts).unwrap();
            if plan {
                // a and c do not overlap: they share a slot, as with built-in operators.
                let p = net.plan().unwrap();
                assert_eq!(p.mapping["a"], p.mapping["c"], "{:?}", p.mapping);
            }
            ws.run_net("chain").unwrap();
            assert_eq!(
                ws.fetch::<f32>("y").unwrap(),
                want,
                "{} plan {plan}",
                dev.label()
            );
        }
    }
    // create_operator builds it; a bad argument is an error naming it.
    let bad = OperatorDef::new("TestScale", &["x"], &["y"]).arg("nope", 1);
    let e = ops::create_operator(&bad, &Device::cpu()).err().unwrap();
    assert!(e.to_string().contains("TestScale"), "{e}");
}

#[test]
fn a_type_is_registered_once() {
    syncmem_nn::register_operators().unwrap();
    ops::register_operator("TestOnce", None, build_test_scale).unwrap();
    for name in ["TestOnce", "Relu", "SGD"] {
        let e = ops::register_operator(name, None, build_test_scale).unwrap_err();
        assert!(
            matches!(&e, Error::AlreadyExists { kind: "operator type", name: n, .. } if n == name),
            "{e}"
        );
    }
    let e = ops::register_operator("Test Spaces", None, build_test_scale).unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
}

#[test]
fn an_activation_needs_a_registered_gradient() {
    let mlp = Mlp::new(&[2, 8, 3], 0.5).unwrap();
    assert_eq!(mlp.activation(), "Relu");
    let e = mlp.clone().with_activation("NoSuchActivation").unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    ops::register_operator("TestNoGradient", None, build_test_scale).unwrap();
    let e = mlp.clone().with_activation("TestNoGradient").unwrap_err();
    assert!(e.to_string().contains("without a gradient"), "{e}");
    ops::register_operator("TestAct", Some("TestActGradient"), build_test_scale).unwrap();
    assert_eq!(ops::gradient_of("TestAct"), Some("TestActGradient"));
    let nets = mlp.with_activation("TestAct").unwrap().nets("m");
    let types: Vec<&str> = nets.train.ops.iter().map(|o| o.op_type.as_str()).collect();
    assert!(
        types.contains(&"TestAct") && types.contains(&"TestActGradient"),
        "{types:?}"
    );
    assert!(
        !types.contains(&"Relu") && !types.contains(&"ReluGradient"),
        "{types:?}"
    );
}

#[test]
fn a_trainer_with_nets_of_its_own_checks_the_widths() {
    let data = Dataset::spirals(16, 3, 0.2, 1);
    let mut cfg = TrainConfig::default();
    cfg.batch = 16;
    let mlp = Mlp::new(&[2, 8, 4], 0.5).unwrap();
    let nets = mlp.nets("m");
    let e = Trainer::with_nets(&Device::cpu(), &data, &cfg, mlp, nets)
        .err()
        .unwrap();
    assert!(matches!(e, Error::InvalidShape { .. }), "{e}");
    // The same nets, the right widths: one step trains as Trainer::new does.
    let mlp = Mlp::new(&[2, 8, 3], 0.5).unwrap();
    let mut a =
        Trainer::with_nets(&Device::cpu(), &data, &cfg, mlp.clone(), mlp.nets("mlp")).unwrap();
    cfg.hidden = vec![8];
    let mut b = Trainer::new(&Device::cpu(), &data, &cfg).unwrap();
    assert_eq!(a.step(0).unwrap(), b.step(0).unwrap());
}
