//! [`Epilogue`]: a user's element-wise activation that [`gemm`](super::gemm) applies as it
//! stores each result ([`Gemm::activation`](super::Gemm::activation)), and its gradient, which
//! the `dX` GEMM of a fully connected layer's gradient applies the same way
//! ([`Gemm::activation_grad`](super::Gemm::activation_grad)).

use std::fmt;
use std::sync::Arc;

use crate::backend::epilogue::{EpilogueCode, UserAct};

/// A user's element-wise activation `y = act(x)` for the GEMM's epilogue, with (optionally)
/// its gradient `dx = act_grad(dy, y)` computed from the activation's **output** `y` (as
/// ReLU's, LeakyReLU's with a positive slope, the sigmoid's, tanh's).
///
/// Each backend has its own code, given once:
///
/// | backend | code |
/// |---|---|
/// | `opencl:N`, `cuda:N` | [`Epilogue::with_source`]: the body of `float sm_user_act(float x)`; [`Epilogue::with_gradient_source`]: the body of `float sm_user_act_grad(float g, float y)`. The same text is compiled as OpenCL C and as CUDA C (NVRTC), spliced before the operator kernels; the program is built once per device and body. On OpenCL the bodies are also compiled on `float16` (OpenCL C's operators and built-ins work on vectors), for the GEMMs that store 16 columns at once; a body that does not compile so (an `if` on the value) runs lane by lane there, slower (the driver may print the first build's errors) |
/// | `cpu` | [`Epilogue::with_host`]: a closure over a run of the GEMM's output, in place; [`Epilogue::with_host_gradient`]: one over a run of the gradient with the matching run of `y` |
///
/// A GEMM asked for a part the epilogue lacks on its device returns
/// [`Error::Unsupported`](crate::Error::Unsupported) naming the epilogue. The net's fusion of
/// a user's operator (`syncmem-nn`'s `fuse`, from a declaration made with
/// [`crate::ops::register_epilogue`]) uses only an epilogue complete for what it fuses
/// ([`Epilogue::fuses`], [`Epilogue::fuses_gradient`]), so that a fused net runs on every
/// backend.
///
/// ```
/// use syncmem::kernels::Epilogue;
///
/// let alpha = 0.01f32;
/// let leaky = Epilogue::new("leaky_relu")
///     .with_source(&format!("return x > 0.0f ? x : {alpha:?}f * x;"))
///     .with_gradient_source(&format!("return y > 0.0f ? g : {alpha:?}f * g;"))
///     .with_host(move |c| c.iter_mut().for_each(|v| *v = if *v > 0.0 { *v } else { alpha * *v }))
///     .with_host_gradient(move |g, y| {
///         g.iter_mut().zip(y).for_each(|(g, &y)| *g = if y > 0.0 { *g } else { alpha * *g })
///     });
/// assert!(leaky.fuses() && leaky.fuses_gradient());
/// ```
#[derive(Clone)]
pub struct Epilogue {
    code: Arc<EpilogueCode>,
}

impl Epilogue {
    /// An epilogue named `name` (for errors), with no code yet.
    pub fn new(name: &str) -> Self {
        Self {
            code: Arc::new(EpilogueCode {
                name: name.to_string(),
                source: None,
                grad_source: None,
                host: None,
                host_grad: None,
                preludes: Default::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut EpilogueCode)) -> Self {
        let code = Arc::make_mut(&mut self.code);
        f(code);
        code.preludes = Default::default();
        self
    }

    /// The body of `float sm_user_act(float x)` in C (OpenCL C and CUDA C), e.g.
    /// `return x > 0.0f ? x : 0.01f * x;`.
    pub fn with_source(self, body: &str) -> Self {
        self.edit(|c| c.source = Some(body.to_string()))
    }

    /// The body of `float sm_user_act_grad(float g, float y)` in C: the input gradient from
    /// the output gradient `g` and the activation's output `y`.
    pub fn with_gradient_source(self, body: &str) -> Self {
        self.edit(|c| c.grad_source = Some(body.to_string()))
    }

    /// The activation on `cpu`: applied in place to runs of the GEMM's output.
    pub fn with_host(self, f: impl Fn(&mut [f32]) + Send + Sync + 'static) -> Self {
        self.edit(|c| c.host = Some(Arc::new(f)))
    }

    /// The gradient on `cpu`: `g[i] = act_grad(g[i], y[i])` over runs of the GEMM's output `g`
    /// and the matching elements `y` of the activation's output.
    pub fn with_host_gradient(
        self,
        f: impl Fn(&mut [f32], &[f32]) + Send + Sync + 'static,
    ) -> Self {
        self.edit(|c| c.host_grad = Some(Arc::new(f)))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.code.name
    }

    /// True when the activation has code for every backend (a device source and a host
    /// closure): what fusing it into a net's GEMM needs.
    pub fn fuses(&self) -> bool {
        self.code.source.is_some() && self.code.host.is_some()
    }

    /// True when the gradient has code for every backend.
    pub fn fuses_gradient(&self) -> bool {
        self.code.grad_source.is_some() && self.code.host_grad.is_some()
    }

    pub(crate) fn act(&self, grad: bool) -> UserAct<'_> {
        UserAct {
            code: &self.code,
            grad,
        }
    }
}

impl fmt::Debug for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epilogue")
            .field("name", &self.code.name)
            .field("fuses", &self.fuses())
            .field("fuses_gradient", &self.fuses_gradient())
            .finish()
    }
}
