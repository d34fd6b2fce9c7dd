//! A user's element-wise activation applied in the GEMM's epilogue: the code of each backend
//! (a source snippet spliced into the operator program of OpenCL and CUDA, closures over the
//! output on `cpu`), and what a GEMM asks of it ([`UserAct`]).
//!
//! The snippets are function bodies: `float sm_user_act(float x)` and
//! `float sm_user_act_grad(float g, float y)` (`g` the incoming gradient, `y` the activation's
//! output). [`EpilogueCode::prelude`] defines both (and `SM_USER_EPILOGUE`, which switches the
//! calls on in the operator sources); the program built from the prelude and the operator
//! source is kept per prelude, so one snippet is compiled once per device.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// `y = act(x)` over a run of a GEMM's output, in place.
pub(crate) type HostAct = Arc<dyn Fn(&mut [f32]) + Send + Sync>;
/// `g = act_grad(g, y)` over a run of a GEMM's output `g`, with the activation's output `y`.
pub(crate) type HostActGrad = Arc<dyn Fn(&mut [f32], &[f32]) + Send + Sync>;

/// The code of one epilogue on every backend that has it.
#[derive(Clone)]
pub(crate) struct EpilogueCode {
    /// The name, for errors.
    pub(crate) name: String,
    /// The body of `float sm_user_act(float x)` (OpenCL C and CUDA C).
    pub(crate) source: Option<String>,
    /// The body of `float sm_user_act_grad(float g, float y)`.
    pub(crate) grad_source: Option<String>,
    /// The `cpu` forward.
    pub(crate) host: Option<HostAct>,
    /// The `cpu` gradient.
    pub(crate) host_grad: Option<HostActGrad>,
    /// The preludes of OpenCL and CUDA, made on first use.
    pub(crate) preludes: [OnceLock<String>; 2],
}

/// Which prelude: the function qualifier of OpenCL C or of CUDA C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(feature = "opencl", feature = "cuda")), allow(dead_code))]
pub(crate) enum Dialect {
    /// `__attribute__((always_inline)) inline`.
    #[cfg_attr(not(feature = "opencl"), allow(dead_code))]
    OpenCl,
    /// `__device__ __forceinline__`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda,
}

impl fmt::Debug for EpilogueCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpilogueCode")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("grad_source", &self.grad_source)
            .field("host", &self.host.is_some())
            .field("host_grad", &self.host_grad.is_some())
            .finish()
    }
}

/// What a GEMM applies of an epilogue: its forward (after the bias), or its gradient (with the
/// GEMM's `mask` operand as the activation's output `y`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserAct<'e> {
    /// The epilogue.
    pub(crate) code: &'e EpilogueCode,
    /// The gradient instead of the forward.
    pub(crate) grad: bool,
}

impl PartialEq for UserAct<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.code, other.code) && self.grad == other.grad
    }
}

impl Eq for UserAct<'_> {}

impl EpilogueCode {
    fn missing(&self, device: &str, what: &str) -> Error {
        Error::Unsupported {
            device: device.to_string(),
            what: format!("the GEMM epilogue {:?} has no {what}", self.name),
        }
    }

    /// The source spliced before the operator source of `dialect`: both functions, the
    /// missing one as the identity (made once).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the epilogue has no source for what `act` applies.
    #[cfg_attr(not(any(feature = "opencl", feature = "cuda")), allow(dead_code))]
    pub(crate) fn prelude<'e>(act: UserAct<'e>, dialect: Dialect, device: &str) -> Result<&'e str> {
        let code = act.code;
        let (fwd, grad) = (code.source.as_deref(), code.grad_source.as_deref());
        match (act.grad, fwd, grad) {
            (false, None, _) => return Err(code.missing(device, "device source")),
            (true, _, None) => return Err(code.missing(device, "device source of its gradient")),
            _ => {}
        }
        let qualifier = match dialect {
            Dialect::OpenCl => "__attribute__((always_inline)) inline",
            Dialect::Cuda => "__device__ __forceinline__",
        };
        Ok(code.preludes[dialect as usize].get_or_init(|| {
            let (fwd, grad) = (fwd.unwrap_or("return x;"), grad.unwrap_or("return g;"));
            let mut p = format!(
                "#define SM_USER_EPILOGUE 1\n\
                 {qualifier} float sm_user_act(float x) {{\n{fwd}\n}}\n\
                 {qualifier} float sm_user_act_grad(float g, float y) {{\n{grad}\n}}\n"
            );
            if dialect == Dialect::OpenCl {
                // The same bodies on 16 lanes, for the register-blocked GEMMs' stores: OpenCL
                // C's operators and built-ins work on vectors, so most bodies compile as they
                // are; a program with them is tried first, one without them after
                // (`SM_USER_VECTOR`).
                p.push_str(&format!(
                    "#ifdef SM_USER_VECTOR\n\
                     {qualifier} float16 sm_user_act16(float16 x) {{\n{fwd}\n}}\n\
                     {qualifier} float16 sm_user_act_grad16(float16 g, float16 y) {{\n{grad}\n}}\n\
                     #endif\n"
                ));
            }
            p
        }))
    }

    /// The host closure of `act`, found before the GEMM runs (a missing one fails the call
    /// before anything is written).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the epilogue has no host closure for it.
    pub(crate) fn host_fn(act: UserAct<'_>) -> Result<HostFn<'_>> {
        let code = act.code;
        if act.grad {
            code.host_grad
                .as_ref()
                .map(HostFn::Grad)
                .ok_or_else(|| code.missing("cpu", "host closure of its gradient"))
        } else {
            code.host
                .as_ref()
                .map(HostFn::Act)
                .ok_or_else(|| code.missing("cpu", "host closure"))
        }
    }
}

/// The host closure a `cpu` GEMM applies.
pub(crate) enum HostFn<'e> {
    /// The activation.
    Act(&'e HostAct),
    /// The gradient, which reads the activation's output.
    Grad(&'e HostActGrad),
}

impl HostFn<'_> {
    /// Applies it to the GEMM's output `c`, with the activation's output `y` for a gradient.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for a gradient without `y`.
    pub(crate) fn apply(&self, c: &mut [f32], y: Option<&[f32]>) -> Result<()> {
        match (self, y) {
            (HostFn::Act(f), _) => f(c),
            (HostFn::Grad(f), Some(y)) => f(c, y),
            (HostFn::Grad(_), None) => {
                return Err(Error::InvalidState {
                    op: "gemm",
                    buffer: "mask".into(),
                    reason: "an activation's gradient needs the activation's output".into(),
                })
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaky() -> EpilogueCode {
        EpilogueCode {
            name: "leaky".into(),
            source: Some("return x > 0.0f ? x : 0.5f * x;".into()),
            grad_source: None,
            host: Some(Arc::new(|c: &mut [f32]| {
                c.iter_mut().for_each(|v| *v = v.max(0.0));
            })),
            host_grad: None,
            preludes: Default::default(),
        }
    }

    #[test]
    fn a_missing_part_is_an_error_naming_the_epilogue() {
        let code = leaky();
        let fwd = UserAct {
            code: &code,
            grad: false,
        };
        let p = EpilogueCode::prelude(fwd, Dialect::OpenCl, "opencl:0").unwrap();
        assert!(
            p.contains("SM_USER_EPILOGUE") && p.contains("0.5f * x") && p.contains("return g;")
        );
        let grad = UserAct { grad: true, ..fwd };
        let e = EpilogueCode::prelude(grad, Dialect::Cuda, "cuda:0").unwrap_err();
        assert!(e.to_string().contains("\"leaky\""), "{e}");
        let mut c = [-1.0f32, 2.0];
        EpilogueCode::host_fn(fwd)
            .unwrap()
            .apply(&mut c, None)
            .unwrap();
        assert_eq!(c, [0.0, 2.0]);
        assert!(EpilogueCode::host_fn(grad).is_err());
    }
}
