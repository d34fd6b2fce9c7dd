//! The optimizers of an [`Mlp`](crate::mlp::Mlp): which update operator its train net ends
//! with, and the state the init net creates for it.
//!
//! | optimizer | update operator (one per parameter `p`) | state blobs (zero-filled by the init net) | default learning rate |
//! |---|---|---|---|
//! | [`Optimizer::Sgd`] | `SGD [p, p_grad] -> [p]` | none | 0.5 |
//! | [`Optimizer::Momentum`] | `MomentumSGD [p, p_grad, p_momentum] -> [p, p_momentum]`, momentum 0.9 | `p_momentum` | 0.05 |
//! | [`Optimizer::Adam`] | `Adam [p, p_grad, p_m, p_v] -> [p, p_m, p_v]`, β1 0.9, β2 0.999, ε 1e-8 | `p_m`, `p_v` | 0.01 |
//!
//! The default learning rates are those the MLP of `syncmem train` trains well with on the
//! spirals: momentum 0.9 makes each step about ten gradients long, so a tenth of SGD's rate;
//! Adam's steps are about the learning rate itself, whatever the gradient's scale, and 0.01 is
//! the usual choice for a small network (Kingma and Ba suggest 0.001 for large ones).
//!
//! ```
//! use syncmem_nn::optimizer::Optimizer;
//!
//! let adam = Optimizer::Adam;
//! assert_eq!(adam.op_type(), "Adam");
//! assert_eq!(adam.state_blobs("fc1_w"), ["fc1_w_m", "fc1_w_v"]);
//! let update = adam.update_op("fc1_w", "fc1_w_grad", 0.01);
//! assert_eq!(update.inputs, ["fc1_w", "fc1_w_grad", "fc1_w_m", "fc1_w_v"]);
//! assert_eq!("momentum".parse::<Optimizer>().unwrap(), Optimizer::Momentum);
//! ```

use std::fmt;
use std::str::FromStr;

use syncmem::ops::OperatorDef;
use syncmem::Error;

/// How the parameters are updated from their gradients (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Optimizer {
    /// Plain SGD: `p -= lr · grad` (operator `SGD`).
    #[default]
    Sgd,
    /// SGD with momentum 0.9 (operator `MomentumSGD`, Caffe2's `MomentumSGDUpdate`).
    Momentum,
    /// Adam with β1 0.9, β2 0.999, ε 1e-8 (operator `Adam`).
    Adam,
}

/// The momentum of [`Optimizer::Momentum`].
pub const MOMENTUM: f64 = 0.9;
/// β1 of [`Optimizer::Adam`].
pub const BETA1: f64 = 0.9;
/// β2 of [`Optimizer::Adam`].
pub const BETA2: f64 = 0.999;
/// ε of [`Optimizer::Adam`].
pub const EPSILON: f64 = 1e-8;

impl Optimizer {
    /// Every optimizer, in the order of the [module docs](self).
    pub const ALL: [Optimizer; 3] = [Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adam];

    /// The name `syncmem train --optimizer` takes: `sgd`, `momentum`, `adam`.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Momentum => "momentum",
            Optimizer::Adam => "adam",
        }
    }

    /// The update operator's type: `SGD`, `MomentumSGD`, `Adam`.
    pub fn op_type(self) -> &'static str {
        match self {
            Optimizer::Sgd => "SGD",
            Optimizer::Momentum => "MomentumSGD",
            Optimizer::Adam => "Adam",
        }
    }

    /// The learning rate the MLP trains well with (see the [module docs](self)): 0.5, 0.05,
    /// 0.01.
    pub fn default_lr(self) -> f32 {
        match self {
            Optimizer::Sgd => 0.5,
            Optimizer::Momentum => 0.05,
            Optimizer::Adam => 0.01,
        }
    }

    /// The suffixes of the state blobs of a parameter: none, `_momentum`, or `_m` and `_v`.
    pub fn state_suffixes(self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd => &[],
            Optimizer::Momentum => &["_momentum"],
            Optimizer::Adam => &["_m", "_v"],
        }
    }

    /// The names of the state blobs of parameter `param`.
    pub fn state_blobs(self, param: &str) -> Vec<String> {
        self.state_suffixes()
            .iter()
            .map(|s| format!("{param}{s}"))
            .collect()
    }

    /// The update of `param` from `grad` at learning rate `lr`, in place, named
    /// `{name}_{param}` (`sgd_fc1_w`, `momentum_fc1_w`, `adam_fc1_w`).
    pub fn update_op(self, param: &str, grad: &str, lr: f32) -> OperatorDef {
        let state = self.state_blobs(param);
        let mut inputs = vec![param, grad];
        inputs.extend(state.iter().map(String::as_str));
        let mut outputs = vec![param];
        outputs.extend(state.iter().map(String::as_str));
        let op = OperatorDef::new(self.op_type(), &inputs, &outputs)
            .arg("lr", f64::from(lr))
            .named(&format!("{}_{param}", self.name()));
        match self {
            Optimizer::Sgd => op,
            Optimizer::Momentum => op.arg("momentum", MOMENTUM),
            Optimizer::Adam => op
                .arg("beta1", BETA1)
                .arg("beta2", BETA2)
                .arg("epsilon", EPSILON),
        }
    }

    /// The fills of the init net that create the state of a parameter of `dims`: one
    /// `ConstantFill` 0 per state blob, on the device the init net runs on.
    pub fn state_fills(self, param: &str, dims: &[usize]) -> Vec<OperatorDef> {
        self.state_blobs(param)
            .iter()
            .map(|s| {
                OperatorDef::new("ConstantFill", &[], &[s])
                    .arg("shape", dims.to_vec())
                    .arg("value", 0.0)
                    .named(&format!("init_{s}"))
            })
            .collect()
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Optimizer {
    type Err = Error;

    /// An optimizer by its [`name`](Optimizer::name).
    ///
    /// # Errors
    /// [`Error::NotFound`] for any other name.
    fn from_str(s: &str) -> Result<Self, Error> {
        Optimizer::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| Error::NotFound {
                kind: "optimizer",
                name: s.to_string(),
                detail: " (sgd, momentum or adam)".into(),
            })
    }
}
