//! `LeakyRelu` (`Y = X > 0 ? X : alpha · X`) and `LeakyReluGradient` (`dX = Y > 0 ? dY :
//! alpha · dY`), operators defined outside syncmem with its public API only: one kernel each,
//! as OpenCL C (`leaky_relu.cl`), CUDA C (`leaky_relu.cu`, compile-checked by NVRTC in CI)
//! and a host closure for the `cpu` device; [`register`] adds both types to the registry and
//! declares them element-wise with a GEMM epilogue ([`epilogue`]), so that nets fuse them into
//! the `FC` before them as they fuse `Relu`.
//! Argument `alpha` (default [`ALPHA`]); `f32` tensors of any shape; not in place.

use std::sync::LazyLock;

use syncmem::device::{Grid, UserKernel};
use syncmem::kernels::{self, Arg, Epilogue};
use syncmem::ops::{self, Args, Operator, OperatorDef};
use syncmem::{Context, DType, Device, Error, Result, Tensor, Workspace};

/// The slope for negative inputs when the def gives none (Caffe2's default).
pub const ALPHA: f32 = 0.01;

/// Threads per block, and most blocks of a launch (the kernels loop over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: usize = 1024;

/// `leaky_relu(x, y, n, alpha)`.
pub static FORWARD: LazyLock<UserKernel> = LazyLock::new(|| {
    UserKernel::new("leaky_relu")
        .with_opencl(include_str!("leaky_relu.cl"))
        .with_cuda(include_str!("leaky_relu.cu"))
        .with_host(|a| {
            let (x, y) = (a.input::<f32>(0)?, a.output::<f32>(1)?);
            let (n, alpha) = (a.u32(2)? as usize, a.f32(3)?);
            for (y, &x) in y.iter_mut().zip(x).take(n) {
                *y = if x > 0.0 { x } else { alpha * x };
            }
            Ok(())
        })
});

/// `leaky_relu_grad(y, dy, dx, n, alpha)`.
pub static BACKWARD: LazyLock<UserKernel> = LazyLock::new(|| {
    UserKernel::new("leaky_relu_grad")
        .with_opencl(include_str!("leaky_relu.cl"))
        .with_cuda(include_str!("leaky_relu.cu"))
        .with_host(|a| {
            let (y, dy, dx) = (a.input::<f32>(0)?, a.input::<f32>(1)?, a.output::<f32>(2)?);
            let (n, alpha) = (a.u32(3)? as usize, a.f32(4)?);
            for ((dx, &g), &y) in dx.iter_mut().zip(dy).zip(y).take(n) {
                *dx = if y > 0.0 { g } else { alpha * g };
            }
            Ok(())
        })
});

/// Registers `LeakyRelu` (whose gradient is `LeakyReluGradient`) and `LeakyReluGradient`, and
/// declares them element-wise with their GEMM epilogue ([`epilogue`]): the net's fusion pass
/// then applies `LeakyRelu` in the store of the `FC` before it, and its gradient in the store of
/// the `FCGradient` before that, as it does for the built-in `Relu`.
///
/// # Errors
/// [`Error::AlreadyExists`] when they are registered already.
pub fn register() -> Result<()> {
    register_as("LeakyRelu", "LeakyReluGradient")?;
    ops::register_epilogue("LeakyRelu", |def| {
        let alpha = Args::check(def, (0, 2), (0, 1), &["alpha"])?.f32_or("alpha", ALPHA)?;
        Ok(epilogue(alpha))
    })
}

/// Registers the operators under other names, without declaring an epilogue: nothing fuses
/// them (what the example did before epilogues existed).
///
/// # Errors
/// [`Error::AlreadyExists`] when they are registered already.
pub fn register_as(forward: &str, backward: &str) -> Result<()> {
    ops::register_operator(forward, Some(backward), build_forward)?;
    ops::register_operator(backward, None, build_backward)
}

/// `LeakyRelu` as a GEMM epilogue: the same select as the kernels above, as a C body (OpenCL
/// and CUDA, `alpha` written into the source: one program per slope) and as host closures.
pub fn epilogue(alpha: f32) -> Epilogue {
    Epilogue::new("LeakyRelu")
        .with_source(&format!("return x > 0.0f ? x : {alpha:?}f * x;"))
        .with_gradient_source(&format!("return y > 0.0f ? g : {alpha:?}f * g;"))
        .with_host(move |y| {
            for v in y {
                *v = if *v > 0.0 { *v } else { alpha * *v };
            }
        })
        .with_host_gradient(move |g, y| {
            for (g, &y) in g.iter_mut().zip(y) {
                *g = if y > 0.0 { *g } else { alpha * *g };
            }
        })
}

struct LeakyRelu {
    def: OperatorDef,
    alpha: f32,
}

struct LeakyReluGradient {
    def: OperatorDef,
    alpha: f32,
}

fn build_forward(def: &OperatorDef, _: &Device) -> Result<Box<dyn Operator>> {
    let alpha = Args::check(def, (1, 1), (1, 1), &["alpha"])?.f32_or("alpha", ALPHA)?;
    Ok(Box::new(LeakyRelu {
        def: def.clone(),
        alpha,
    }))
}

fn build_backward(def: &OperatorDef, _: &Device) -> Result<Box<dyn Operator>> {
    let alpha = Args::check(def, (2, 2), (1, 1), &["alpha"])?.f32_or("alpha", ALPHA)?;
    Ok(Box::new(LeakyReluGradient {
        def: def.clone(),
        alpha,
    }))
}

/// The elements of `t`, which must be `f32`, as the kernels' `uint n`.
fn elements(t: &Tensor, def: &OperatorDef) -> Result<u32> {
    if t.dtype() != Some(DType::F32) {
        return Err(Error::TypeMismatch {
            what: format!("tensor {:?} of operator {}", t.label(), def.label()),
            stored: t.dtype().map_or("no type".into(), |d| d.to_string()),
            requested: DType::F32.to_string(),
        });
    }
    let n = t.numel().unwrap_or(0);
    u32::try_from(n).map_err(|_| Error::InvalidShape {
        what: format!("tensor {:?} of operator {}", t.label(), def.label()),
        shape: format!("{:?}", t.dims()),
        reason: "more elements than the kernels' 32-bit count".into(),
    })
}

fn grid(n: u32) -> Grid {
    Grid::for_elements((n as usize).min(THREADS as usize * MAX_BLOCKS), THREADS)
}

impl Operator for LeakyRelu {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        ops::with_io(ws, &self.def, ctx.device(), &[], |io| {
            let x = io.input(0)?;
            let n = elements(x, &self.def)?;
            let y = io.output(0)?;
            y.resize(x.dims())?;
            y.set_dtype(DType::F32)?;
            let args = [Arg::read(x), Arg::overwrite(y), n.into(), self.alpha.into()];
            // SAFETY: leaky_relu reads x[i] and writes y[i] for i < n only; x holds n floats,
            // and y was just sized to x's dims as f32.
            unsafe { kernels::launch(&FORWARD, ctx.stream(), grid(n), &args) }
        })
    }
}

impl Operator for LeakyReluGradient {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        ops::with_io(ws, &self.def, ctx.device(), &[], |io| {
            let (y, dy) = (io.input(0)?, io.input(1)?);
            let n = elements(y, &self.def)?;
            if dy.dims() != y.dims() || elements(dy, &self.def)? != n {
                return Err(Error::InvalidShape {
                    what: format!(
                        "input 1 ({:?}) of operator {}",
                        dy.label(),
                        self.def.label()
                    ),
                    shape: format!("{:?}", dy.dims()),
                    reason: format!("dY must have the dims of Y {:?}", y.dims()),
                });
            }
            let dx = io.output(0)?;
            dx.resize(y.dims())?;
            dx.set_dtype(DType::F32)?;
            let args = [
                Arg::read(y),
                Arg::read(dy),
                Arg::overwrite(dx),
                n.into(),
                self.alpha.into(),
            ];
            // SAFETY: leaky_relu_grad reads y[i], dy[i] and writes dx[i] for i < n only; y and
            // dy hold n floats (checked above), dx was just sized to y's dims as f32.
            unsafe { kernels::launch(&BACKWARD, ctx.stream(), grid(n), &args) }
        })
    }
}
