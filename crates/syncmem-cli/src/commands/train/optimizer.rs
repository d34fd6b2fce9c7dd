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
    /// The activations, between forward and backward.
    pub activations: bool,
}

/// `--offload`'s value: `optimizer`, `parameters`, `activations`, or several, separated by
/// commas (any case).
pub fn parse_offload(s: &str) -> Result<Offload, String> {
    let mut o = Offload::default();
    for part in s.split(',') {
        match part.trim().to_ascii_lowercase().as_str() {
            "optimizer" => o.optimizer = true,
            "parameters" => o.parameters = true,
            "activations" => o.activations = true,
            _ => {
                return Err(format!(
                    "must be optimizer, parameters or activations, got {part:?}"
                ))
            }
        }
    }
    Ok(o)
}

/// `cfg` keeping on the host what `offload` says (nothing when `None`).
pub(super) fn with_offload(cfg: TrainConfig, offload: Option<Offload>) -> TrainConfig {
    let o = offload.unwrap_or_default();
    cfg.with_offload_optimizer(o.optimizer)
        .with_offload_parameters(o.parameters)
        .with_offload_activations(o.activations)
}

/// What the header says after the optimizer of `cfg` about what is offloaded.
pub(super) fn offload_note(cfg: &TrainConfig) -> String {
    let mut note = String::new();
    if cfg.offload_optimizer {
        note.push_str(" on the host");
    }
    for (yes, what) in [
        (cfg.offload_parameters, "parameters offloaded between steps"),
        (
            cfg.offload_activations,
            "activations offloaded from forward to backward",
        ),
    ] {
        if yes {
            note.push_str(", ");
            note.push_str(what);
        }
    }
    note
}

/// What the header says of memory planning under `cfg`.
pub(super) fn planning_note(cfg: &TrainConfig) -> &'static str {
    match (cfg.plan, cfg.offload_activations) {
        (true, true) => "on for evaluation (the training net drops dead values instead)",
        (true, false) => "on",
        (false, _) => "off",
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
            ..Offload::default()
        };
        assert_eq!(parse_offload(" Optimizer"), Ok(optimizer));
        let both = Offload {
            optimizer: true,
            parameters: true,
            activations: false,
        };
        assert_eq!(parse_offload("parameters, optimizer"), Ok(both));
        let all = parse_offload("activations,Parameters,optimizer").unwrap();
        let cfg = with_offload(TrainConfig::default(), Some(all));
        assert!(cfg.offload_optimizer && cfg.offload_parameters && cfg.offload_activations);
        assert_eq!(
            offload_note(&cfg),
            " on the host, parameters offloaded between steps, activations offloaded from \
             forward to backward"
        );
        let none = with_offload(TrainConfig::default(), None);
        assert_eq!(none, TrainConfig::default());
        assert_eq!(offload_note(&none), "");
        assert!(parse_offload("optimizer,gpu")
            .unwrap_err()
            .contains("\"gpu\""));
    }
}
