//! The update operators with state, `MomentumSGD` and `Adam`: their kernels against a host
//! reference in `f64` over several steps, on `cpu`, on OpenCL (PoCL here) and, where a driver
//! exists, on CUDA (each prints `SKIPPED` without its device; `SYNCMEM_REQUIRE_OPENCL=1` makes
//! a missing OpenCL device a failure); bad arguments and bad state are typed errors naming the
//! operator; the CUDA C sources compile with NVRTC.

use syncmem::ops::{create_operator, OperatorDef};
use syncmem::{Context, Device, Error, Tensor, Workspace};

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

fn put(ws: &Workspace, dev: &Device, name: &str, dims: &[usize], vals: &[f32]) {
    let t = Tensor::from_slice(dims, vals, Some(dev))
        .unwrap()
        .with_label(name);
    ws.create_blob(name).unwrap().write().reset(t);
}

fn get(ws: &Workspace, name: &str) -> Vec<f32> {
    let b = ws.get_blob(name).unwrap();
    let b = b.read();
    let v = b.get::<Tensor>().unwrap().host::<f32>().unwrap().to_vec();
    v
}

fn build(def: &OperatorDef, dev: &Device) -> syncmem::Result<Box<dyn syncmem::ops::Operator>> {
    syncmem_nn::register_operators().unwrap();
    create_operator(def, dev)
}

/// Parameters of several sizes: a few elements, one that no work-group size divides, and one
/// larger than a launch's grid (262144 threads), which the kernels' loops cover.
const SIZES: [usize; 3] = [7, 1000, 300_001];

/// The host reference of one optimizer: its state per parameter, and one step in `f64`.
trait Reference {
    /// State tensors per parameter.
    const STATES: usize;
    /// The update's operator type.
    const TYPE: &'static str;
    /// The operator's arguments.
    fn args(&self, def: OperatorDef) -> OperatorDef;
    /// One step (number `t`, from 1) of `p` and its states from `g`.
    fn step(&self, t: i32, p: &mut [f64], g: &[f64], states: &mut [Vec<f64>]);
}

struct Momentum {
    lr: f64,
    mu: f64,
    nesterov: bool,
}

impl Reference for Momentum {
    const STATES: usize = 1;
    const TYPE: &'static str = "MomentumSGD";

    fn args(&self, def: OperatorDef) -> OperatorDef {
        def.arg("lr", self.lr)
            .arg("momentum", self.mu)
            .arg("nesterov", i32::from(self.nesterov))
    }

    fn step(&self, _t: i32, p: &mut [f64], g: &[f64], states: &mut [Vec<f64>]) {
        let m = &mut states[0];
        for i in 0..p.len() {
            let mn = self.mu * m[i] + self.lr * g[i];
            p[i] -= if self.nesterov {
                (1.0 + self.mu) * mn - self.mu * m[i]
            } else {
                mn
            };
            m[i] = mn;
        }
    }
}

struct Adam {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
}

impl Reference for Adam {
    const STATES: usize = 2;
    const TYPE: &'static str = "Adam";

    fn args(&self, def: OperatorDef) -> OperatorDef {
        def.arg("lr", self.lr)
            .arg("beta1", self.b1)
            .arg("beta2", self.b2)
            .arg("epsilon", self.eps)
    }

    fn step(&self, t: i32, p: &mut [f64], g: &[f64], states: &mut [Vec<f64>]) {
        let correction = (1.0 - self.b2.powi(t)).sqrt() / (1.0 - self.b1.powi(t));
        let (m, v) = states.split_at_mut(1);
        let (m, v) = (&mut m[0], &mut v[0]);
        for i in 0..p.len() {
            m[i] = self.b1 * m[i] + (1.0 - self.b1) * g[i];
            v[i] = self.b2 * v[i] + (1.0 - self.b2) * g[i] * g[i];
            p[i] -= self.lr * correction * m[i] / (v[i].sqrt() + self.eps);
        }
    }
}

fn state_name(p: &str, s: usize) -> String {
    format!("{p}_s{s}")
}

/// Three steps of `r` on `dev`: one operator over the first two parameters (two groups,
/// outputs listed) and one over the third (outputs omitted), each step with new gradients;
/// every parameter and state is checked against the reference after each step.
fn steps_agree<R: Reference>(dev: &Device, r: &R, what: &str) {
    let ctx = Context::with_seed(dev, 0).unwrap();
    let ws = Workspace::new();
    let names: Vec<String> = (0..SIZES.len()).map(|k| format!("p{k}")).collect();
    let mut want_p: Vec<Vec<f64>> = Vec::new();
    let mut want_s: Vec<Vec<Vec<f64>>> = Vec::new();
    for (k, (p, &n)) in names.iter().zip(&SIZES).enumerate() {
        let init = data(n, 10 + k as u64);
        put(&ws, dev, p, &[n], &init);
        // States start from values of their own, not only from zero.
        let mut states = Vec::new();
        for s in 0..R::STATES {
            let v: Vec<f32> = data(n, 20 + k as u64 + s as u64)
                .iter()
                .map(|x| if s == 1 { x * x } else { 0.1 * x })
                .collect();
            put(&ws, dev, &state_name(p, s), &[n], &v);
            states.push(v.iter().map(|&x| f64::from(x)).collect());
        }
        want_p.push(init.iter().map(|&x| f64::from(x)).collect());
        want_s.push(states);
    }
    let group = |p: &str| {
        let mut inputs = vec![p.to_string(), format!("{p}_grad")];
        let states: Vec<String> = (0..R::STATES).map(|s| state_name(p, s)).collect();
        inputs.extend(states.iter().cloned());
        let mut outputs = vec![p.to_string()];
        outputs.extend(states);
        (inputs, outputs)
    };
    let (mut ins, mut outs) = group(&names[0]);
    let (i1, o1) = group(&names[1]);
    ins.extend(i1);
    outs.extend(o1);
    let two = r.args(OperatorDef::new(R::TYPE, &strs(&ins), &strs(&outs)));
    let (i2, _) = group(&names[2]);
    let one = r.args(OperatorDef::new(R::TYPE, &strs(&i2), &[]));
    let ops = [build(&two, dev).unwrap(), build(&one, dev).unwrap()];
    for t in 1..=3 {
        for (k, (p, &n)) in names.iter().zip(&SIZES).enumerate() {
            let g = data(n, 100 * t as u64 + k as u64);
            put(&ws, dev, &format!("{p}_grad"), &[n], &g);
            let g: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
            r.step(t, &mut want_p[k], &g, &mut want_s[k]);
        }
        for op in &ops {
            op.run(&ws, &ctx).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        for (k, p) in names.iter().enumerate() {
            close(&format!("{what} step {t} {p}"), &get(&ws, p), &want_p[k]);
            for (s, want) in want_s[k].iter().enumerate() {
                let name = state_name(p, s);
                close(&format!("{what} step {t} {name}"), &get(&ws, &name), want);
            }
        }
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let tol = 2e-6 + 2e-5 * b.abs();
        assert!(
            (f64::from(a) - b).abs() <= tol,
            "{what}[{i}]: {a} against the reference's {b}"
        );
    }
}

fn every_update_agrees_with_the_reference(dev: &Device) {
    for nesterov in [false, true] {
        let r = Momentum {
            lr: 0.1,
            mu: 0.9,
            nesterov,
        };
        steps_agree(
            dev,
            &r,
            &format!("MomentumSGD nesterov={nesterov} on {}", dev.label()),
        );
    }
    let r = Adam {
        lr: 0.01,
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
    };
    steps_agree(dev, &r, &format!("Adam on {}", dev.label()));
    // Other settings: no first moment, a quick second one, a large epsilon.
    let r = Adam {
        lr: 0.5,
        b1: 0.0,
        b2: 0.5,
        eps: 0.1,
    };
    steps_agree(dev, &r, &format!("Adam (0, 0.5, 0.1) on {}", dev.label()));
}

#[test]
fn cpu_updates_agree_with_the_reference() {
    every_update_agrees_with_the_reference(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn opencl_updates_agree_with_the_reference() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("opencl_updates_agree_with_the_reference") {
        every_update_agrees_with_the_reference(&dev);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_updates_agree_with_the_reference() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("cuda_updates_agree_with_the_reference") {
        every_update_agrees_with_the_reference(&dev);
    }
}

/// The error of building `def`, which must fail.
fn build_error(def: &OperatorDef) -> Error {
    match build(def, &Device::cpu()) {
        Err(e) => e,
        Ok(_) => panic!("{} was built", def.label()),
    }
}

#[test]
fn bad_arguments_are_typed_errors_naming_the_operator() {
    let m = |lr: f64| {
        OperatorDef::new("MomentumSGD", &["p", "g", "m"], &["p", "m"])
            .arg("lr", lr)
            .named("upd")
    };
    let a = |lr: f64| {
        OperatorDef::new("Adam", &["p", "g", "m", "v"], &[])
            .arg("lr", lr)
            .named("upd")
    };
    let cases = [
        (m(-0.1), "\"lr\" must be at least 0"),
        (
            m(0.1).arg("momentum", 1.0),
            "\"momentum\" must be in [0, 1)",
        ),
        (
            m(0.1).arg("momentum", -0.5),
            "\"momentum\" must be in [0, 1)",
        ),
        (m(0.1).arg("nesterov", 2), "\"nesterov\" must be 0 or 1"),
        (
            OperatorDef::new("MomentumSGD", &["p", "g", "m"], &[]),
            "\"lr\" is required",
        ),
        (a(-1.0), "\"lr\" must be at least 0"),
        (a(0.01).arg("beta1", 1.0), "\"beta1\" must be in [0, 1)"),
        (a(0.01).arg("beta1", -0.1), "\"beta1\" must be in [0, 1)"),
        (a(0.01).arg("beta2", 1.5), "\"beta2\" must be in [0, 1)"),
        (a(0.01).arg("epsilon", 0.0), "\"epsilon\" must be above 0"),
        (a(0.01).arg("amsgrad", 1), "unknown argument \"amsgrad\""),
        (
            OperatorDef::new("Adam", &["p", "g", "m", "v", "q"], &[]).arg("lr", 0.1),
            "a multiple of 4 inputs",
        ),
        (
            OperatorDef::new("Adam", &["p", "g", "m", "v"], &["p"]).arg("lr", 0.1),
            "list none or all 3",
        ),
        (
            OperatorDef::new("MomentumSGD", &["p", "g", "m"], &["p", "g"]).arg("lr", 0.1),
            "output 1 must be \"m\"",
        ),
    ];
    for (def, want) in cases {
        let e = build_error(&def);
        let text = e.to_string();
        assert!(
            matches!(e, Error::InvalidState { .. }),
            "{}: {text}",
            def.label()
        );
        assert!(text.contains(&def.op_type), "names the operator: {text}");
        assert!(text.contains(want), "{text} (wanted {want:?})");
    }
}

#[test]
fn bad_state_is_a_typed_error_naming_the_operator_and_the_blob() {
    let dev = Device::cpu();
    let ctx = Context::with_seed(&dev, 0).unwrap();
    let ws = Workspace::new();
    put(&ws, &dev, "p", &[4], &[1.0; 4]);
    put(&ws, &dev, "g", &[4], &[1.0; 4]);
    put(&ws, &dev, "m", &[3], &[0.0; 3]);
    let def = OperatorDef::new("Adam", &["p", "g", "m", "v"], &[])
        .arg("lr", 0.1)
        .named("adam_p");
    let op = build(&def, &dev).unwrap();
    // No `v`: the init net creates the state.
    match op.run(&ws, &ctx) {
        Err(e @ Error::NotFound { .. }) => {
            let text = e.to_string();
            assert!(text.contains("\"v\"") && text.contains("adam_p"), "{text}");
        }
        other => panic!("a missing state: {other:?}"),
    }
    // A state of other dims than the parameter's.
    put(&ws, &dev, "v", &[4], &[0.0; 4]);
    match op.run(&ws, &ctx) {
        Err(e @ Error::InvalidShape { .. }) => {
            let text = e.to_string();
            assert!(text.contains("\"m\"") && text.contains("adam_p"), "{text}");
        }
        other => panic!("a state of dims [3]: {other:?}"),
    }
    // Nothing was written.
    assert_eq!(get(&ws, "p"), [1.0; 4]);
    assert_eq!(get(&ws, "v"), [0.0; 4]);
}

/// The CUDA C of `file`, compiled to PTX by NVRTC (no GPU needed): `entry` with `params`
/// parameters, and no fused multiply-add (the host's update, which an offloaded optimizer
/// runs, rounds each product and sum on its own).
#[cfg(feature = "cuda")]
fn compiles(test: &str, source: &str, entry: &str, params: usize) {
    if !syncmem::testing::nvrtc_or_skip(test) {
        return;
    }
    let ptx = cudarc::nvrtc::compile_ptx(source)
        .unwrap_or_else(|e| panic!("{test}: {e:?}"))
        .to_src();
    let start = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("{test}: no entry {entry} in\n{ptx}"));
    let list = &ptx[start..start + ptx[start..].find(')').unwrap()];
    assert_eq!(list.matches(".param").count(), params, "{list}");
    assert!(
        !ptx.contains("fma."),
        "{test}: a fused multiply-add in\n{ptx}"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn momentum_sgd_source_compiles_with_nvrtc() {
    compiles(
        "momentum_sgd_source_compiles_with_nvrtc",
        include_str!("../src/ops/optim/momentum.cu"),
        "momentum_sgd_update",
        7,
    );
}

#[cfg(feature = "cuda")]
#[test]
fn adam_source_compiles_with_nvrtc() {
    compiles(
        "adam_source_compiles_with_nvrtc",
        include_str!("../src/ops/optim/adam.cu"),
        "adam_update",
        8,
    );
}
