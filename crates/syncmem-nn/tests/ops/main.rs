//! Operators: gradient checks against finite differences, cpu against each accelerator, seeded
//! fills, exact copy counts of a forward pass, in-place updates, and errors that name the
//! operator and the blob. Per-device tests run on `cpu`, on OpenCL (PoCL here) and, where a
//! driver exists, on CUDA (they print `SKIPPED` without one).

#[cfg(any(feature = "opencl", feature = "cuda"))]
mod agree;
mod checks;
mod gradients;

use syncmem::ops::{create_operator, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{Context, Device, Workspace};

// ----- helpers ---------------------------------------------------------------------------------

fn run(ws: &Workspace, ctx: &Context, def: &OperatorDef) -> syncmem::Result<()> {
    syncmem_nn::register_operators().unwrap();
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
