//! An operator of your own: `LeakyRelu` and its gradient, defined outside syncmem with a
//! kernel in OpenCL C, one in CUDA C and a host closure for `cpu` (`custom_operator/`),
//! through the same public API the built-in operators of this crate use (`syncmem::ops`,
//! `syncmem::kernels`), registered with their GEMM epilogue (so that the trainer's fusion
//! applies `LeakyRelu` in the `FC`s' GEMMs and its gradient in the `FCGradient`s', as it does
//! `Relu`), then used to train the MLP of `syncmem train` from JSON nets, with `LeakyRelu` in
//! place of `Relu`. Every step is checked against a plain host reference: the loss within
//! 1e-5, and the weights after the update.
//!
//! ```sh
//! cargo run -p syncmem-nn --example custom_operator             # first accelerator, else cpu
//! cargo run -p syncmem-nn --example custom_operator -- cpu      # or opencl:0, cuda:0
//! ```

#[path = "custom_operator/leaky_relu.rs"]
mod leaky_relu;

use syncmem::net::NetDef;
use syncmem::{Device, Workspace};
use syncmem_nn::mlp::{Dataset, Mlp, MlpNets};
use syncmem_nn::train::{TrainConfig, Trainer};

/// The device named by the first argument (`cpu`, `opencl:0`, `cuda:0`), else the first
/// accelerator (an OpenCL device, else a CUDA one), else the cpu.
fn pick_device() -> syncmem::Result<Device> {
    match std::env::args().nth(1) {
        Some(spec) => Device::open(&spec),
        None => Ok(Device::first_accelerator().unwrap_or_else(Device::cpu)),
    }
}

/// Hidden width, as `syncmem train`.
const HIDDEN: usize = 64;
/// Largest difference allowed between the device's loss (and weights) and the reference's.
const TOLERANCE: f64 = 1e-5;

type Failure = Box<dyn std::error::Error>;

fn main() -> Result<(), Failure> {
    let dev = pick_device()?;
    leaky_relu::register()?;
    println!(
        "registered operators: {}",
        syncmem::ops::registered_types().join(", ")
    );

    // The MLP of `syncmem train` (2 -> 64 -> 64 -> 3 on 3 spirals), with LeakyRelu: the
    // registry knows its gradient, so the backward pass is built with LeakyReluGradient.
    let data = Dataset::spirals(1000, 3, 0.2, 0);
    let cfg = TrainConfig::default();
    let mlp = Mlp::new(&[data.features, HIDDEN, HIDDEN, data.classes], cfg.lr)?
        .with_activation("LeakyRelu")?;
    let nets = json_round_trip(&mlp.nets("mlp"))?;
    let types: Vec<&str> = nets.train.ops.iter().map(|o| o.op_type.as_str()).collect();
    println!("train net from JSON: {}", types.join(", "));
    if !types.contains(&"LeakyRelu") || !types.contains(&"LeakyReluGradient") {
        return Err("the train net does not use LeakyRelu".into());
    }

    let mut trainer = Trainer::with_nets(&dev, &data, &cfg, mlp.clone(), nets)?;
    check_fused(&trainer)?;
    let reference = Reference {
        lr: f64::from(cfg.lr),
        alpha: f64::from(leaky_relu::ALPHA),
    };
    let params = trainer.nets().params.clone();
    let mut expected: Option<Vec<Vec<f32>>> = None;
    let (mut worst_loss, mut worst_weight) = (0.0f64, 0.0f64);
    let epochs = 2;
    for epoch in 1..=epochs {
        let (mut sum, mut count) = (0.0f64, 0usize);
        for step in 0..trainer.batch_count() {
            let ws = trainer.workspace();
            let before = fetch_all(ws, &params)?;
            if let Some(want) = &expected {
                worst_weight = worst_weight.max(check_weights(&params, &before, want, step)?);
            }
            let (loss, _accuracy) = trainer.step(step)?;
            let ws = trainer.workspace();
            let x = ws.fetch::<f32>("data")?;
            let y = ws.fetch::<i32>("label")?;
            let (ref_loss, after) = reference.step(&mlp.widths, &before, &x, &y);
            let diff = (f64::from(loss) - ref_loss).abs();
            worst_loss = worst_loss.max(diff);
            if diff > TOLERANCE {
                return Err(format!(
                    "epoch {epoch} step {step}: loss {loss} on {}, reference {ref_loss}",
                    dev.label()
                )
                .into());
            }
            expected = Some(after);
            sum += f64::from(loss);
            count += 1;
        }
        println!(
            "epoch {epoch}/{epochs}: mean loss {:.4} over {count} steps on {}",
            sum / count as f64,
            dev.label()
        );
    }
    let last = fetch_all(trainer.workspace(), &params)?;
    if let Some(want) = &expected {
        worst_weight = worst_weight.max(check_weights(&params, &last, want, usize::MAX)?);
    }
    let (loss, accuracy) = trainer.evaluate()?;
    println!(
        "final: loss {loss:.4}, accuracy {:.1}%; largest difference from the host reference: \
         loss {worst_loss:.2e}, weights {worst_weight:.2e} (tolerance {TOLERANCE:.0e})",
        accuracy * 100.0
    );
    if accuracy < 0.5 {
        return Err(format!("the model did not learn: accuracy {accuracy}").into());
    }
    Ok(())
}

/// The trainer's fusion applies LeakyRelu and its gradient in the GEMMs (its epilogue): the
/// net that runs has neither.
fn check_fused(trainer: &Trainer) -> Result<(), Failure> {
    let ran = trainer.train_net().run_def();
    let ran: Vec<&str> = ran.ops.iter().map(|o| o.op_type.as_str()).collect();
    println!("train net as it runs (fused): {}", ran.join(", "));
    if ran.iter().any(|t| t.starts_with("LeakyRelu")) {
        return Err("LeakyRelu was not fused into the FC GEMMs".into());
    }
    Ok(())
}

/// The nets written to JSON files and read back, as a user who edits them would.
fn json_round_trip(nets: &MlpNets) -> Result<MlpNets, Failure> {
    let dir = std::env::temp_dir().join(format!("syncmem-custom-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut read = Vec::new();
    for def in [&nets.init, &nets.train, &nets.eval] {
        let path = dir.join(format!("{}.json", def.name));
        std::fs::write(&path, def.to_json())?;
        read.push(NetDef::from_file(&path)?);
    }
    std::fs::remove_dir_all(&dir)?;
    let [init, train, eval]: [NetDef; 3] = read.try_into().map_err(|_| "three nets")?;
    Ok(MlpNets::new(init, train, eval, nets.params.clone()))
}

fn fetch_all(ws: &Workspace, names: &[String]) -> syncmem::Result<Vec<Vec<f32>>> {
    names.iter().map(|n| ws.fetch::<f32>(n)).collect()
}

/// The largest difference between the weights and the reference's; an error beyond the
/// tolerance.
fn check_weights(
    names: &[String],
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    step: usize,
) -> Result<f64, Failure> {
    let mut worst = 0.0f64;
    for ((name, g), w) in names.iter().zip(got).zip(want) {
        for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
            let d = (f64::from(a) - f64::from(b)).abs();
            if d > TOLERANCE {
                return Err(format!(
                    "before step {step}: {name}[{i}] is {a}, the reference's update gives {b}"
                )
                .into());
            }
            worst = worst.max(d);
        }
    }
    Ok(worst)
}

/// The same step on the host, in `f64`: forward with LeakyRelu, softmax cross-entropy,
/// backward, SGD.
struct Reference {
    lr: f64,
    alpha: f64,
}

impl Reference {
    /// The loss of `params` (`w1, b1, w2, b2, ...`, `W[out, in]`) on the batch, and the
    /// parameters after one SGD step.
    fn step(
        &self,
        widths: &[usize],
        params: &[Vec<f32>],
        x: &[f32],
        labels: &[i32],
    ) -> (f64, Vec<Vec<f32>>) {
        let n = labels.len();
        let layers = widths.len() - 1;
        let w = |k: usize| &params[2 * k];
        let b = |k: usize| &params[2 * k + 1];
        // Forward: acts[0] = x, acts[k + 1] = activation(acts[k] · W_kᵀ + b_k).
        let mut acts: Vec<Vec<f64>> = vec![x.iter().map(|&v| f64::from(v)).collect()];
        for k in 0..layers {
            let (i_w, o_w) = (widths[k], widths[k + 1]);
            let a = &acts[k];
            let mut z = vec![0.0; n * o_w];
            for r in 0..n {
                for o in 0..o_w {
                    let mut s = f64::from(b(k)[o]);
                    for i in 0..i_w {
                        s += a[r * i_w + i] * f64::from(w(k)[o * i_w + i]);
                    }
                    z[r * o_w + o] = if k + 1 < layers && s <= 0.0 {
                        self.alpha * s
                    } else {
                        s
                    };
                }
            }
            acts.push(z);
        }
        // Softmax cross-entropy and its gradient (p - onehot) / n.
        let classes = widths[layers];
        let mut loss = 0.0;
        let mut dz = vec![0.0; n * classes];
        for r in 0..n {
            let row = &acts[layers][r * classes..(r + 1) * classes];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            let l = labels[r] as usize;
            loss += s.ln() - (row[l] - m);
            for c in 0..classes {
                let p = (row[c] - m).exp() / s;
                dz[r * classes + c] = (p - if c == l { 1.0 } else { 0.0 }) / n as f64;
            }
        }
        // Backward and SGD, last layer first.
        let mut out: Vec<Vec<f32>> = params.to_vec();
        for k in (0..layers).rev() {
            let (i_w, o_w) = (widths[k], widths[k + 1]);
            let a = &acts[k];
            let mut da = vec![0.0; n * i_w];
            for o in 0..o_w {
                let mut db = 0.0;
                for r in 0..n {
                    db += dz[r * o_w + o];
                }
                out[2 * k + 1][o] = (f64::from(b(k)[o]) - self.lr * db) as f32;
                for i in 0..i_w {
                    let mut dw = 0.0;
                    for r in 0..n {
                        dw += dz[r * o_w + o] * a[r * i_w + i];
                        da[r * i_w + i] += dz[r * o_w + o] * f64::from(w(k)[o * i_w + i]);
                    }
                    out[2 * k][o * i_w + i] = (f64::from(w(k)[o * i_w + i]) - self.lr * dw) as f32;
                }
            }
            if k > 0 {
                // Through LeakyRelu, from its output (the sign of its input for alpha > 0).
                dz = da
                    .iter()
                    .zip(a)
                    .map(|(&g, &y)| if y > 0.0 { g } else { self.alpha * g })
                    .collect();
            }
        }
        (loss / n as f64, out)
    }
}
