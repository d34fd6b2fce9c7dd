//! The operator registry (Caffe2's `REGISTER_CPU_OPERATOR` / `REGISTER_CUDA_OPERATOR` and
//! `REGISTER_GRADIENT`): operator types by name, each with its builder and the name of its
//! gradient operator. The built-in operators are registered through the same call as the
//! user's ([`register_operator`]), when the registry is first used; [`create_operator`], JSON
//! nets, the planner and the training loop find every registered type the same way.

use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use super::{fc, fill, loss, relu, sgd, Operator, OperatorDef};
use crate::device::Device;
use crate::error::{Error, Result};

/// What builds an operator of one type for a device: checks the def (arity, arguments) and
/// returns the operator, or an error naming it.
pub type OperatorBuilder =
    Arc<dyn Fn(&OperatorDef, &Device) -> Result<Box<dyn Operator>> + Send + Sync>;

/// One registered operator type.
struct Entry {
    /// Registered for the life of the process: the name is kept as a `&'static str`.
    name: &'static str,
    gradient: Option<&'static str>,
    build: OperatorBuilder,
}

/// Every registered type, in the order of registration (the built-in ones first).
struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// The one path every registration takes, built-in or not: [`Registry::check`], then the
    /// entry (names that live as long as the process: the registry is never freed).
    fn register(
        &mut self,
        name: &'static str,
        gradient: Option<&'static str>,
        build: OperatorBuilder,
    ) -> Result<()> {
        self.check(name, gradient)?;
        self.entries.push(Entry {
            name,
            gradient,
            build,
        });
        Ok(())
    }

    /// Checks a registration: a valid name and gradient name, a type not registered yet.
    fn check(&self, name: &str, gradient: Option<&str>) -> Result<()> {
        let bad = |reason: &str| Error::InvalidState {
            op: "register_operator",
            buffer: format!("operator type {name:?}"),
            reason: reason.to_string(),
        };
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(bad("an operator type is a non-empty name without spaces"));
        }
        if gradient.is_some_and(|g| g.is_empty() || g.chars().any(char::is_whitespace)) {
            return Err(bad("a gradient's type is a non-empty name without spaces"));
        }
        if self.entries.iter().any(|e| e.name == name) {
            return Err(Error::AlreadyExists {
                kind: "operator type",
                name: name.to_string(),
                detail: " (registered before: a type is registered once)".into(),
            });
        }
        Ok(())
    }
}

type BuiltIn = (
    &'static str,
    Option<&'static str>,
    fn(&OperatorDef, &Device) -> Result<Box<dyn Operator>>,
);

/// The built-in operator types, their gradients and builders.
const BUILT_IN: [BuiltIn; 13] = [
    ("ConstantFill", None, fill::build_constant),
    ("UniformFill", None, fill::build_uniform),
    ("GaussianFill", None, fill::build_gaussian),
    ("XavierFill", None, fill::build_xavier),
    ("MSRAFill", None, fill::build_msra),
    ("FC", Some("FCGradient"), fc::build_fc),
    ("FCGradient", None, fc::build_fc_gradient),
    ("Relu", Some("ReluGradient"), relu::build_relu),
    ("ReluGradient", None, relu::build_relu_gradient),
    (
        "SoftmaxWithLoss",
        Some("SoftmaxWithLossGradient"),
        loss::build_softmax_with_loss,
    ),
    (
        "SoftmaxWithLossGradient",
        None,
        loss::build_softmax_with_loss_gradient,
    ),
    ("Accuracy", None, loss::build_accuracy),
    ("SGD", None, sgd::build_sgd),
];

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| {
    let mut r = Registry {
        entries: Vec::new(),
    };
    for (name, gradient, build) in BUILT_IN {
        // Distinct, well-formed names: cannot fail (checked by a test).
        let _ = r.register(name, gradient, Arc::new(build));
    }
    RwLock::new(r)
});

/// Registers operator type `op_type`, built by `build`, whose gradient operator (if it has
/// one) is `gradient`: from then on [`create_operator`] builds it, nets (and JSON nets) may use
/// it, and [`crate::net::mlp::Mlp::with_activation`] builds the backward pass of an activation
/// with its gradient's type. A type is registered for the life of the process.
///
/// The builder runs when an operator of the type is created for a device (by
/// [`create_operator`], once per operator of a net when the net is built): it checks the def
/// ([`super::Args::check`]) and returns the operator, which reaches its blobs with
/// [`super::with_io`] and launches its kernels with [`crate::kernels::launch`].
///
/// # Errors
/// [`Error::AlreadyExists`] when `op_type` is registered already (built-in or not);
/// [`Error::InvalidState`] for an empty name or a name with spaces.
pub fn register_operator(
    op_type: &str,
    gradient: Option<&str>,
    build: impl Fn(&OperatorDef, &Device) -> Result<Box<dyn Operator>> + Send + Sync + 'static,
) -> Result<()> {
    let mut registry = REGISTRY.write();
    registry.check(op_type, gradient)?;
    // Checked first, so that only registered names are kept for the process's lifetime.
    let keep = |s: &str| -> &'static str { Box::leak(Box::<str>::from(s)) };
    registry.register(keep(op_type), gradient.map(keep), Arc::new(build))
}

/// Builds the operator `def` for `device`.
///
/// # Errors
/// [`Error::NotFound`] for an unknown operator type (the message lists the known ones);
/// [`Error::InvalidState`] for a wrong number of inputs or outputs, an unknown argument, or an
/// argument of the wrong kind. Every message names the operator.
pub fn create_operator(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let build = {
        let r = REGISTRY.read();
        match r.entries.iter().find(|e| e.name == def.op_type) {
            Some(e) => e.build.clone(),
            None => {
                return Err(Error::NotFound {
                    kind: "operator type",
                    name: def.op_type.clone(),
                    detail: format!(
                        "{} (known types: {})",
                        def.name
                            .as_ref()
                            .map(|n| format!(" for operator {n:?}"))
                            .unwrap_or_default(),
                        r.entries
                            .iter()
                            .map(|e| e.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
            }
        }
    };
    // Outside the lock: a builder may register or create operators itself.
    build(def, device)
}

/// The operator types [`create_operator`] knows, built-in first, in the order of
/// registration.
pub fn registered_types() -> Vec<&'static str> {
    REGISTRY.read().entries.iter().map(|e| e.name).collect()
}

/// True when `op_type` is registered.
pub fn is_registered(op_type: &str) -> bool {
    REGISTRY.read().entries.iter().any(|e| e.name == op_type)
}

/// The type of the gradient operator registered with `op_type` (`Some("ReluGradient")` for
/// `Relu`); `None` for an unknown type or one without a gradient.
pub fn gradient_of(op_type: &str) -> Option<&'static str> {
    REGISTRY
        .read()
        .entries
        .iter()
        .find(|e| e.name == op_type)
        .and_then(|e| e.gradient)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_types_are_registered_through_the_same_path() {
        let mut r = Registry {
            entries: Vec::new(),
        };
        for (name, gradient, build) in BUILT_IN {
            r.register(name, gradient, Arc::new(build)).unwrap();
        }
        let names: Vec<&str> = r.entries.iter().map(|e| e.name).collect();
        assert_eq!(names, BUILT_IN.map(|b| b.0));
        for name in names {
            assert!(registered_types().contains(&name), "{name}");
        }
        assert_eq!(gradient_of("Relu"), Some("ReluGradient"));
        assert_eq!(gradient_of("FC"), Some("FCGradient"));
        assert_eq!(gradient_of("SGD"), None);
        assert_eq!(gradient_of("NoSuchType"), None);
        // Every gradient named is itself registered.
        for (_, gradient, _) in BUILT_IN {
            if let Some(g) = gradient {
                assert!(is_registered(g), "{g}");
            }
        }
    }

    #[test]
    fn names_are_checked() {
        let mut r = Registry {
            entries: Vec::new(),
        };
        let build: OperatorBuilder = Arc::new(relu::build_relu);
        for bad in ["", "Leaky Relu"] {
            let e = r.register(bad, None, build.clone()).unwrap_err();
            assert!(matches!(e, Error::InvalidState { .. }), "{e}");
        }
        let e = r.register("X", Some(""), build.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidState { .. }), "{e}");
        r.register("X", None, build.clone()).unwrap();
        let e = r.register("X", None, build).unwrap_err();
        assert!(
            matches!(&e, Error::AlreadyExists { name, .. } if name == "X"),
            "{e}"
        );
    }
}
