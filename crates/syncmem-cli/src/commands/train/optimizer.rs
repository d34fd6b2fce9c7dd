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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offload {
    /// The optimizer's state, and its update.
    pub optimizer: bool,
    /// The parameters, between steps.
    pub parameters: bool,
}

/// `--offload`'s value: `optimizer`, `parameters`, or both, separated by commas (any case).
pub fn parse_offload(s: &str) -> Result<Offload, String> {
    let mut o = Offload::default();
    for part in s.split(',') {
        match part.trim().to_ascii_lowercase().as_str() {
            "optimizer" => o.optimizer = true,
            "parameters" => o.parameters = true,
            "activations" => {
                return Err(format!(
                    "{part:?} is not offloaded (yet): the optimizer and the parameters are \
                     (--offload optimizer,parameters)"
                ))
            }
            _ => return Err(format!("must be optimizer or parameters, got {part:?}")),
        }
    }
    Ok(o)
}

/// What the header says after the optimizer of `cfg` about what is offloaded.
pub(super) fn offload_note(cfg: &TrainConfig) -> &'static str {
    match (cfg.offload_optimizer, cfg.offload_parameters) {
        (true, true) => " on the host, parameters offloaded between steps",
        (true, false) => " on the host",
        (false, true) => ", parameters offloaded between steps",
        (false, false) => "",
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
        let optimizer = Offload {
            optimizer: true,
            parameters: false,
        };
        assert_eq!(parse_offload(" Optimizer"), Ok(optimizer));
        let both = Offload {
            optimizer: true,
            parameters: true,
        };
        assert_eq!(parse_offload("parameters, optimizer"), Ok(both));
        assert!(parse_offload("activations")
            .unwrap_err()
            .contains("not offloaded"));
        assert!(parse_offload("optimizer,gpu")
            .unwrap_err()
            .contains("\"gpu\""));
    }
}
