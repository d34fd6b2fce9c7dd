//! The operator registry (Caffe2's `REGISTER_CPU_OPERATOR` / `REGISTER_CUDA_OPERATOR` and
//! `REGISTER_GRADIENT`): operator types by name, each with its builder and the name of its
//! gradient operator. The registry starts empty: the operators of `syncmem-nn` (`FC`, `Relu`,
//! `SoftmaxWithLoss`, ...) are registered through the same call as a user's
//! ([`register_operator`]); [`create_operator`], JSON nets and the planner find every
//! registered type the same way.

use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use super::{Operator, OperatorDef};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::Epilogue;

/// What builds an operator of one type for a device: checks the def (arity, arguments) and
/// returns the operator, or an error naming it.
pub type OperatorBuilder =
    Arc<dyn Fn(&OperatorDef, &Device) -> Result<Box<dyn Operator>> + Send + Sync>;

/// What builds the GEMM epilogue of an element-wise operator type from a def (of the type or
/// of its gradient: the builder reads the arguments they share), for the fusion of nets.
pub type EpilogueBuilder = Arc<dyn Fn(&OperatorDef) -> Result<Epilogue> + Send + Sync>;

/// One registered operator type.
struct Entry {
    /// Registered for the life of the process: the name is kept as a `&'static str`.
    name: &'static str,
    gradient: Option<&'static str>,
    build: OperatorBuilder,
    /// Declared element-wise, with its epilogue ([`register_epilogue`]).
    epilogue: Option<EpilogueBuilder>,
}

/// Every registered type, in the order of registration.
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
            epilogue: None,
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

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| {
    RwLock::new(Registry {
        entries: Vec::new(),
    })
});

/// Registers operator type `op_type`, built by `build`, whose gradient operator (if it has
/// one) is `gradient`: from then on [`create_operator`] builds it, nets (and JSON nets) may use
/// it, and the gradient name tells a backward-pass builder (such as `syncmem-nn`'s MLP) which
/// type computes its gradient. A type is registered for the life of the process.
///
/// The builder runs when an operator of the type is created for a device (by
/// [`create_operator`], once per operator of a net when the net is built): it checks the def
/// ([`super::Args::check`]) and returns the operator, which reaches its blobs with
/// [`super::with_io`] and launches the library's kernels ([`crate::kernels::gemm`], ...) or its
/// own ([`crate::kernels::launch`]).
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
                        known_types(&r)
                    ),
                })
            }
        }
    };
    // Outside the lock: a builder may register or create operators itself.
    build(def, device)
}

/// The registered names for an error message; a hint where the built-in operators come from
/// when none is registered.
fn known_types(r: &Registry) -> String {
    if r.entries.is_empty() {
        return "none: the built-in operators (FC, Relu, SoftmaxWithLoss, ...) are registered by \
                the syncmem-nn crate's `syncmem_nn::register_operators()`"
            .into();
    }
    r.entries
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The operator types [`create_operator`] knows, in the order of registration.
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

/// Declares the registered operator type `op_type` element-wise, with the GEMM epilogue that
/// `build` makes from a def (see [`Epilogue`]): from then on a net's fusion pass (such as
/// `syncmem-nn`'s) may apply it in the store of the GEMM that computes its input, as it does
/// for the built-in `Relu`, and, when the epilogue has a gradient, fuse the gradient operator
/// registered with the type into the GEMM that computes the input gradient.
///
/// The contract the fusion relies on: an operator of the type reads one tensor `X` and writes
/// `Y[i] = act(X[i])` for every element, nothing else; its gradient operator reads `[Y, dY]`
/// and writes `dX[i] = act_grad(dY[i], Y[i])` (the form of `ReluGradient`). `build` is called
/// with the def of either (it reads the arguments they share) and returns the same epilogue
/// for equal arguments.
///
/// # Errors
/// [`Error::NotFound`] when `op_type` is not registered; [`Error::AlreadyExists`] when it was
/// declared before.
pub fn register_epilogue(
    op_type: &str,
    build: impl Fn(&OperatorDef) -> Result<Epilogue> + Send + Sync + 'static,
) -> Result<()> {
    let mut registry = REGISTRY.write();
    let Some(entry) = registry.entries.iter_mut().find(|e| e.name == op_type) else {
        return Err(Error::NotFound {
            kind: "operator type",
            name: op_type.to_string(),
            detail: " (register the operator before its epilogue)".into(),
        });
    };
    if entry.epilogue.is_some() {
        return Err(Error::AlreadyExists {
            kind: "epilogue of operator type",
            name: op_type.to_string(),
            detail: " (declared before: an epilogue is declared once)".into(),
        });
    }
    entry.epilogue = Some(Arc::new(build));
    Ok(())
}

/// The epilogue of `def` when its type was declared element-wise ([`register_epilogue`]);
/// `Ok(None)` otherwise.
///
/// # Errors
/// The error of the declared builder (a bad argument of `def`).
pub fn epilogue_of(def: &OperatorDef) -> Result<Option<Epilogue>> {
    declared(def, |e| e.name == def.op_type)
}

/// The epilogue of `def` when its type is the gradient of a type declared element-wise
/// ([`register_epilogue`]), built from `def`'s arguments; `Ok(None)` otherwise.
///
/// # Errors
/// The error of the declared builder (a bad argument of `def`).
pub fn gradient_epilogue_of(def: &OperatorDef) -> Result<Option<Epilogue>> {
    declared(def, |e| e.gradient == Some(def.op_type.as_str()))
}

/// The epilogue of the first entry that `owns` and that declared one, built from `def`.
fn declared(def: &OperatorDef, owns: impl Fn(&Entry) -> bool) -> Result<Option<Epilogue>> {
    let build = {
        let r = REGISTRY.read();
        match r.entries.iter().find(|e| owns(e) && e.epilogue.is_some()) {
            Some(e) => e.epilogue.clone(),
            None => return Ok(None),
        }
    };
    // Outside the lock, as a builder of operators.
    build.map_or(Ok(None), |b| b(def).map(Some))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let mut r = Registry {
            entries: Vec::new(),
        };
        let build: OperatorBuilder = Arc::new(|def: &OperatorDef, _: &Device| {
            Err(Error::Unsupported {
                device: "any".into(),
                what: def.op_type.clone(),
            })
        });
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
