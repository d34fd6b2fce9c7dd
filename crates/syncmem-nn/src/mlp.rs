//! A multilayer perceptron classifier as nets of operators, and datasets to train it on.
//!
//! [`Mlp::nets`] builds three [`NetDef`]s from [`OperatorDef`]s:
//! - `init`: `GaussianFill` (He: `std = sqrt(2 / fan_in)`) for each weight, `ConstantFill` 0
//!   for each bias;
//! - `train`: forward (`FC`, `Relu`, ..., `FC`, `SoftmaxWithLoss`, `Accuracy`), backward
//!   (`SoftmaxWithLossGradient`, then `FCGradient` and `ReluGradient` down to the first layer,
//!   which computes no input gradient) and update (`SGD` on every parameter, in place, or with
//!   [`Mlp::with_optimizer`] `MomentumSGD` or `Adam`, whose state blobs the init net creates
//!   zero-filled: see [`crate::optimizer`]); with [`Mlp::with_activation`], another registered
//!   activation and its gradient replace `Relu` and `ReluGradient`;
//! - `eval`: the forward part only.
//!
//! Blob names: `data` (`f32 [N, features]`), `label` (`i32 [N]`), parameters `fcK_w`, `fcK_b`,
//! activations `fcK`, `reluK`, then `prob`, `loss`, `accuracy`; gradients add `_grad`; the
//! optimizer's state adds `_momentum`, or `_m` and `_v`, to the parameter's name.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use syncmem::net::NetDef;
use syncmem::ops::OperatorDef;
use syncmem::{Error, Result};

use crate::optimizer::Optimizer;

/// Name of the input blob.
pub const DATA: &str = "data";
/// Name of the label blob.
pub const LABEL: &str = "label";
/// Name of the loss blob (scalar).
pub const LOSS: &str = "loss";
/// Name of the accuracy blob (scalar).
pub const ACCURACY: &str = "accuracy";
/// Name of the `[loss, accuracy]` pair that loss fusion adds to the train and eval nets
/// ([`crate::fuse::loss::loss_scalars_name`] of [`LOSS`] and [`ACCURACY`]).
pub const LOSS_AND_ACCURACY: &str = "loss_and_accuracy";

/// A labelled dataset held on the host: `x` is `f32 [len, features]` row-major, `y` holds
/// class indices `0..classes`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Dataset {
    /// Features, row-major.
    pub x: Vec<f32>,
    /// Labels.
    pub y: Vec<i32>,
    /// Features per sample.
    pub features: usize,
    /// Number of classes (largest label + 1).
    pub classes: usize,
}

impl Dataset {
    /// Most classes a dataset may have (labels `0..MAX_CLASSES`). The classifier's output layer
    /// has one row of weights per class, so a label of a few million (a typo, a hostile file)
    /// would ask for gigabytes of weights.
    pub const MAX_CLASSES: usize = 1 << 16;

    /// A dataset from features and labels.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when `features` is 0, `x.len() != y.len() * features`, the set is
    /// empty, a label is negative or at least [`Dataset::MAX_CLASSES`], or a feature is not
    /// finite.
    pub fn new(x: Vec<f32>, y: Vec<i32>, features: usize) -> Result<Self> {
        let bad = |reason: String| Error::InvalidShape {
            what: "dataset".into(),
            shape: format!("x: {} values, y: {} labels", x.len(), y.len()),
            reason,
        };
        if features == 0 || y.is_empty() {
            return Err(bad("a dataset needs samples and features".into()));
        }
        if y.len().checked_mul(features) != Some(x.len()) {
            return Err(bad(format!(
                "x must hold {features} features per label ({} labels)",
                y.len()
            )));
        }
        if let Some(l) = y.iter().find(|&&l| l < 0) {
            return Err(bad(format!("labels must be >= 0, found {l}")));
        }
        if let Some(l) = y.iter().find(|&&l| l as usize >= Self::MAX_CLASSES) {
            return Err(bad(format!(
                "label {l} would make {} classes; at most {} are supported (labels 0 to {})",
                *l as usize + 1,
                Self::MAX_CLASSES,
                Self::MAX_CLASSES - 1
            )));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(bad("features must be finite".into()));
        }
        let classes = y.iter().copied().max().map_or(0, |m| m as usize + 1);
        Ok(Self {
            x,
            y,
            features,
            classes,
        })
    }

    /// `classes` interleaved spiral arms of `per_class` points each in 2-D (the classic
    /// CS231n spirals: radius 0 to 1, 4 radians per arm, angle noise of standard deviation
    /// `noise`), drawn from `seed`: equal seeds give equal datasets.
    pub fn spirals(per_class: usize, classes: usize, noise: f32, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = per_class * classes;
        let mut x = Vec::with_capacity(n * 2);
        let mut y = Vec::with_capacity(n);
        for c in 0..classes {
            for i in 0..per_class {
                let r = if per_class > 1 {
                    i as f32 / (per_class - 1) as f32
                } else {
                    1.0
                };
                let t = 4.0 * c as f32 + 4.0 * r + noise * normal(&mut rng);
                x.push(r * t.sin());
                x.push(r * t.cos());
                y.push(c as i32);
            }
        }
        Self {
            x,
            y,
            features: 2,
            classes,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Splits off a held-out set: the samples are shuffled by `seed`, and the last `fraction`
    /// of them (rounded to the nearest sample) is held out; returns (training, held out), each
    /// in that shuffled order, both with this set's features and classes. Equal seeds give
    /// equal splits.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when `fraction` is not strictly between 0 and 1, or when either
    /// part would have no sample.
    pub fn split_held_out(&self, fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        use rand::seq::SliceRandom;
        let n = self.len();
        let held = (fraction * n as f64).round();
        let bad = |reason: String| Error::InvalidShape {
            what: "held-out split".into(),
            shape: format!("{n} samples, fraction {fraction}"),
            reason,
        };
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(bad("the fraction must be strictly between 0 and 1".into()));
        }
        if held < 1.0 || held >= n as f64 {
            return Err(bad(format!(
                "{held} samples held out: each part needs at least one sample"
            )));
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed));
        let part = |rows: &[usize]| Dataset {
            x: rows
                .iter()
                .flat_map(|&r| &self.x[r * self.features..(r + 1) * self.features])
                .copied()
                .collect(),
            y: rows.iter().map(|&r| self.y[r]).collect(),
            features: self.features,
            classes: self.classes,
        };
        let (train, test) = order.split_at(n - held as usize);
        Ok((part(train), part(test)))
    }
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// A fully connected classifier: `widths[0]` inputs, hidden layers `widths[1..n-1]` with
/// ReLU (or another activation, [`Mlp::with_activation`]), `widths[n-1]` classes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Mlp {
    /// Layer widths, input first, classes last.
    pub widths: Vec<usize>,
    /// Learning rate of the update.
    pub lr: f32,
    /// The activation's operator type and its gradient's.
    activation: (String, String),
    /// The update of the parameters.
    optimizer: Optimizer,
}

/// The nets of an [`Mlp`] (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MlpNets {
    /// Parameter initialisation.
    pub init: NetDef,
    /// One training step: forward, backward, update.
    pub train: NetDef,
    /// Forward only: loss and accuracy.
    pub eval: NetDef,
    /// Parameter blob names (weights and biases, first layer first).
    pub params: Vec<String>,
}

impl MlpNets {
    /// Nets of an MLP made elsewhere (read from JSON files, say): they must use the blob names
    /// of [`Mlp::nets`].
    pub fn new(init: NetDef, train: NetDef, eval: NetDef, params: Vec<String>) -> Self {
        Self {
            init,
            train,
            eval,
            params,
        }
    }
}

impl Mlp {
    /// An MLP with these widths and learning rate.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] with fewer than two widths or a zero width;
    /// [`Error::InvalidState`] for a learning rate that is not finite and positive.
    pub fn new(widths: &[usize], lr: f32) -> Result<Self> {
        // Its nets use the built-in operators by name.
        crate::register_operators()?;
        if widths.len() < 2 || widths.contains(&0) {
            return Err(Error::InvalidShape {
                what: "MLP".into(),
                shape: format!("{widths:?}"),
                reason: "needs at least an input and an output width, none of them 0".into(),
            });
        }
        if !(lr.is_finite() && lr > 0.0) {
            return Err(Error::InvalidState {
                op: "Mlp::new",
                buffer: "MLP".into(),
                reason: format!("the learning rate must be finite and positive, got {lr}"),
            });
        }
        Ok(Self {
            widths: widths.to_vec(),
            lr,
            activation: ("Relu".into(), "ReluGradient".into()),
            optimizer: Optimizer::Sgd,
        })
    }

    /// The MLP with `op_type` as the activation of its hidden layers instead of `Relu`: any
    /// registered operator type ([`syncmem::ops::register_operator`]) with a gradient, which
    /// the backward pass uses. The activation takes `X` and writes `Y`; its gradient, as
    /// `ReluGradient`, takes `Y` and `dY` and writes `dX`. The blobs keep their names
    /// (`reluK`, `reluK_grad`).
    ///
    /// # Errors
    /// [`Error::NotFound`] when `op_type` is not registered; [`Error::InvalidState`] when it
    /// was registered without a gradient.
    pub fn with_activation(mut self, op_type: &str) -> Result<Self> {
        if !syncmem::ops::is_registered(op_type) {
            return Err(Error::NotFound {
                kind: "operator type",
                name: op_type.to_string(),
                detail: " (the activation of an MLP must be registered)".into(),
            });
        }
        let gradient = syncmem::ops::gradient_of(op_type).ok_or_else(|| Error::InvalidState {
            op: "Mlp::with_activation",
            buffer: format!("operator type {op_type:?}"),
            reason: "it was registered without a gradient, which the backward pass needs".into(),
        })?;
        self.activation = (op_type.to_string(), gradient.to_string());
        Ok(self)
    }

    /// The MLP with `optimizer`'s update operators instead of `SGD` (at the MLP's learning
    /// rate [`Mlp::lr`], with the optimizer's other settings: see [`crate::optimizer`]), and
    /// its state created by the init net.
    #[must_use]
    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// The optimizer ([`Optimizer::Sgd`] unless [`Mlp::with_optimizer`] set another).
    pub fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    /// The activation's operator type (`Relu` unless [`Mlp::with_activation`] set another).
    pub fn activation(&self) -> &str {
        &self.activation.0
    }

    /// Number of layers with parameters.
    pub fn layers(&self) -> usize {
        self.widths.len() - 1
    }

    /// Number of parameters (weights and biases).
    pub fn parameter_count(&self) -> usize {
        self.widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
    }

    /// The init, train and eval nets, named `{prefix}_init`, `{prefix}_train`, `{prefix}_eval`.
    pub fn nets(&self, prefix: &str) -> MlpNets {
        let (init, params, state) = self.init_net(prefix);
        let forward = self.forward_ops();
        let mut train = NetDef::new(format!("{prefix}_train"));
        train.ops = forward.clone();
        train.ops.extend(self.backward_ops());
        for p in &params {
            train
                .ops
                .push(self.optimizer.update_op(p, &grad(p), self.lr));
        }
        let mut inputs = vec![DATA.to_string(), LABEL.to_string()];
        inputs.extend(params.iter().cloned());
        let mut train_inputs = inputs.clone();
        train_inputs.extend(state);
        train.external_inputs = Some(train_inputs);
        train.external_outputs = Some(vec![LOSS.into(), ACCURACY.into()]);

        let mut eval = NetDef::new(format!("{prefix}_eval"));
        eval.ops = forward;
        eval.external_inputs = Some(inputs);
        eval.external_outputs = Some(vec![LOSS.into(), ACCURACY.into()]);
        MlpNets {
            init,
            train,
            eval,
            params,
        }
    }

    /// The init net, the parameters it fills and the optimizer's state it creates.
    fn init_net(&self, prefix: &str) -> (NetDef, Vec<String>, Vec<String>) {
        let mut init = NetDef::new(format!("{prefix}_init"));
        let (mut params, mut state, mut state_fills) = (Vec::new(), Vec::new(), Vec::new());
        for k in 1..=self.layers() {
            let (fan_in, out) = (self.widths[k - 1], self.widths[k]);
            let (w, b) = (format!("fc{k}_w"), format!("fc{k}_b"));
            init = init
                .op(OperatorDef::new("GaussianFill", &[], &[&w])
                    .arg("shape", vec![out, fan_in])
                    .arg("mean", 0.0)
                    .arg("std", (2.0 / fan_in as f64).sqrt())
                    .named(&format!("init_{w}")))
                .op(OperatorDef::new("ConstantFill", &[], &[&b])
                    .arg("shape", vec![out])
                    .arg("value", 0.0)
                    .named(&format!("init_{b}")));
            for (p, dims) in [(&w, vec![out, fan_in]), (&b, vec![out])] {
                state_fills.extend(self.optimizer.state_fills(p, &dims));
                state.extend(self.optimizer.state_blobs(p));
            }
            params.push(w);
            params.push(b);
        }
        // After the parameters' fills: they draw from the seeded generator in the same order
        // whatever the optimizer.
        init.ops.extend(state_fills);
        let mut outputs = params.clone();
        outputs.extend(state.iter().cloned());
        init.external_outputs = Some(outputs);
        (init, params, state)
    }

    /// The backward pass: the loss's gradient, then each layer's down to the first.
    fn backward_ops(&self) -> Vec<OperatorDef> {
        let layers = self.layers();
        let mut ops = vec![OperatorDef::new(
            "SoftmaxWithLossGradient",
            &["prob", LABEL],
            &[&grad(&fc(layers))],
        )
        .named("softmax_grad")];
        for k in (1..=layers).rev() {
            let input = layer_input(k);
            let (w, b) = (format!("fc{k}_w"), format!("fc{k}_b"));
            let mut outs = vec![grad(&w), grad(&b)];
            if k > 1 {
                outs.push(grad(&input));
            }
            let outs: Vec<&str> = outs.iter().map(String::as_str).collect();
            ops.push(
                OperatorDef::new("FCGradient", &[&input, &w, &grad(&fc(k))], &outs)
                    .named(&format!("fc{k}_grad")),
            );
            if k > 1 {
                ops.push(
                    OperatorDef::new(
                        &self.activation.1,
                        &[&input, &grad(&input)],
                        &[&grad(&fc(k - 1))],
                    )
                    .named(&format!("relu{}_grad", k - 1)),
                );
            }
        }
        ops
    }

    fn forward_ops(&self) -> Vec<OperatorDef> {
        let layers = self.layers();
        let mut ops = Vec::new();
        for k in 1..=layers {
            let (w, b) = (format!("fc{k}_w"), format!("fc{k}_b"));
            ops.push(
                OperatorDef::new("FC", &[&layer_input(k), &w, &b], &[&fc(k)])
                    .named(&format!("fc{k}")),
            );
            if k < layers {
                ops.push(
                    OperatorDef::new(&self.activation.0, &[&fc(k)], &[&relu(k)]).named(&relu(k)),
                );
            }
        }
        ops.push(
            OperatorDef::new("SoftmaxWithLoss", &[&fc(layers), LABEL], &["prob", LOSS])
                .named("softmax_loss"),
        );
        ops.push(OperatorDef::new("Accuracy", &["prob", LABEL], &[ACCURACY]).named("accuracy"));
        ops
    }

    /// Bytes of every blob of the train net for a batch of `batch` samples (`f32` and `i32`
    /// are 4 bytes): size hints for memory planning.
    pub fn blob_bytes(&self, batch: usize) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        let layers = self.layers();
        m.insert(DATA.to_string(), batch * self.widths[0] * 4);
        m.insert(LABEL.to_string(), batch * 4);
        for k in 1..=layers {
            let (i, o) = (self.widths[k - 1], self.widths[k]);
            for n in [format!("fc{k}_w"), grad(&format!("fc{k}_w"))] {
                m.insert(n, i * o * 4);
            }
            for n in [format!("fc{k}_b"), grad(&format!("fc{k}_b"))] {
                m.insert(n, o * 4);
            }
            m.insert(fc(k), batch * o * 4);
            m.insert(grad(&fc(k)), batch * o * 4);
            if k < layers {
                m.insert(relu(k), batch * o * 4);
                m.insert(grad(&relu(k)), batch * o * 4);
            }
        }
        m.insert("prob".into(), batch * self.widths[layers] * 4);
        m.insert(LOSS.into(), 4);
        m.insert(ACCURACY.into(), 4);
        m
    }
}

fn fc(k: usize) -> String {
    format!("fc{k}")
}

fn relu(k: usize) -> String {
    format!("relu{k}")
}

fn grad(name: &str) -> String {
    format!("{name}_grad")
}

/// The blob layer `k` (1-based) reads: the data, or the previous layer's ReLU.
fn layer_input(k: usize) -> String {
    if k == 1 {
        DATA.to_string()
    } else {
        relu(k - 1)
    }
}
