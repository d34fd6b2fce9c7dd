//! `syncmem train --optimizer`: its parser, and the learning rate each optimizer defaults to.

use syncmem_nn::train::{Optimizer, TrainConfig};

/// `--optimizer`'s value: `sgd`, `momentum` or `adam` (any case).
pub fn parse(s: &str) -> Result<Optimizer, String> {
    s.trim()
        .to_ascii_lowercase()
        .parse::<Optimizer>()
        .map_err(|_| format!("must be sgd, momentum or adam, got {s:?}"))
}

/// What `--offload` keeps on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// The optimizer's state, and its update.
    Optimizer,
}

/// `--offload`'s value: `optimizer` (any case).
pub fn parse_offload(s: &str) -> Result<Offload, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "optimizer" => Ok(Offload::Optimizer),
        "parameters" | "activations" => Err(format!(
            "{s:?} is not offloaded (yet): only the optimizer is (--offload optimizer)"
        )),
        _ => Err(format!("must be optimizer, got {s:?}")),
    }
}

/// `cfg` with `optimizer` at `lr`, or at the optimizer's default learning rate.
pub(super) fn with_optimizer(
    cfg: TrainConfig,
    optimizer: Optimizer,
    lr: Option<f32>,
) -> TrainConfig {
    cfg.with_optimizer(optimizer)
        .with_lr(lr.unwrap_or(optimizer.default_lr()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_optimizer_trains_at_its_own_rate_unless_one_is_given() {
        let cfg = with_optimizer(TrainConfig::default(), Optimizer::Adam, None);
        assert_eq!((cfg.optimizer, cfg.lr), (Optimizer::Adam, 0.01));
        let cfg = with_optimizer(TrainConfig::default(), Optimizer::Momentum, Some(0.2));
        assert_eq!((cfg.optimizer, cfg.lr), (Optimizer::Momentum, 0.2));
        let cfg = with_optimizer(TrainConfig::default(), Optimizer::Sgd, None);
        assert_eq!(cfg, TrainConfig::default());
        assert_eq!(parse(" Adam"), Ok(Optimizer::Adam));
        assert!(parse("adagrad").unwrap_err().contains("\"adagrad\""));
        assert_eq!(parse_offload(" Optimizer"), Ok(Offload::Optimizer));
        assert!(parse_offload("parameters")
            .unwrap_err()
            .contains("not offloaded"));
        assert!(parse_offload("gpu").unwrap_err().contains("\"gpu\""));
    }
}
