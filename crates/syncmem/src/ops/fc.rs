//! `FC` and `FCGradient` (Caffe2's fully connected operator).
//!
//! `X` is viewed as `[N, K]` by flattening its dims before `axis` into `N` and the rest into
//! `K`; `W` as `[M, K]` around `axis_w`. `Y = X·Wᵀ + b` has `X`'s dims before `axis`, then `M`.
//! The gradient computes `dW = dYᵀ·X` (dims of `W`), `db = Σ_rows dY` (`[M]`) and, with a third
//! output, `dX = dY·W` (dims of `X`).

use super::access::{shape_error, Backend, In, Out};
use super::args::Args;
use super::io::{in_what, out_what, Blobs};
use super::{cpu, Operator, OperatorDef};
use crate::context::Context;
use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::workspace::Workspace;

struct Fc {
    def: OperatorDef,
    device: Device,
    axis: i64,
    axis_w: i64,
    gradient: bool,
}

fn build(def: &OperatorDef, device: &Device, gradient: bool) -> Result<Box<dyn Operator>> {
    let outputs = if gradient { (2, 3) } else { (1, 1) };
    let args = Args::check(def, (3, 3), outputs, &["axis", "axis_w"])?;
    Ok(Box::new(Fc {
        def: def.clone(),
        device: device.clone(),
        axis: args.i64_or("axis", 1)?,
        axis_w: args.i64_or("axis_w", 1)?,
        gradient,
    }))
}

pub(crate) fn build_fc(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    build(def, device, false)
}

pub(crate) fn build_fc_gradient(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    build(def, device, true)
}

/// `(canonical axis, outer, inner)` of `t` around `axis` (negative counts from the end).
pub(crate) fn split(
    t: &Tensor,
    axis: i64,
    arg: &str,
    what: String,
) -> Result<(usize, usize, usize)> {
    let dims = t.dims();
    let nd = dims.len() as i64;
    let a = if axis < 0 { axis + nd } else { axis };
    if !(0..nd).contains(&a) {
        return Err(shape_error(
            what,
            dims,
            format!("{arg} {axis} is out of range for {nd} dimension(s)"),
        ));
    }
    let a = a as usize;
    let outer = dims[..a].iter().product();
    let inner = dims[a..].iter().product();
    Ok((a, outer, inner))
}

impl Operator for Fc {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        let backend = Backend::for_run(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[])?;
        let mut locked = blobs.lock();
        let mut io = locked.io(ctx.device())?;
        let def = io.def();
        let (x, w) = (io.input(0)?, io.input(1)?);
        let (ax, n, k) = split(x, self.axis, "axis", in_what(def, 0))?;
        let (_, m, kw) = split(w, self.axis_w, "axis_w", in_what(def, 1))?;
        if kw != k {
            return Err(shape_error(
                in_what(def, 1),
                w.dims(),
                format!(
                    "W has {kw} columns (dims from axis_w {}) but X ({:?}) has {k} (dims from \
                     axis {})",
                    self.axis_w,
                    x.dims(),
                    self.axis
                ),
            ));
        }
        if self.gradient {
            return self.gradient(&backend, ctx, &mut io, (n, m, k));
        }
        let b = io.input(2)?;
        if b.dims() != [m] {
            return Err(shape_error(
                in_what(def, 2),
                b.dims(),
                format!("the bias must have dims [{m}] (the rows of W)"),
            ));
        }
        let mut y_dims = x.dims()[..ax].to_vec();
        y_dims.push(m);
        let xi = In::<f32>::open(x, in_what(def, 0))?;
        let wi = In::<f32>::open(w, in_what(def, 1))?;
        let bi = In::<f32>::open(b, in_what(def, 2))?;
        let mut y = Out::<f32>::overwrite(io.output(0)?, &y_dims, out_what(def, 0))?;
        match backend {
            Backend::Cpu => {
                let yc = y.cpu()?;
                if m > 0 {
                    let bc = bi.cpu()?;
                    yc.chunks_exact_mut(m).for_each(|r| r.copy_from_slice(bc));
                }
                cpu::gemm((false, true), (n, m, k), xi.cpu()?, wi.cpu()?, 1.0, yc)
            }
            #[cfg(feature = "opencl")]
            Backend::OpenCl(kern) => kern.gemm(
                super::opencl::queue(ctx)?,
                (false, true),
                (n, m, k),
                xi.mem()?,
                wi.mem()?,
                y.mem()?,
                Some(bi.mem()?),
            ),
            #[cfg(feature = "cuda")]
            Backend::Cuda(kern) => kern.gemm(
                super::cuda::stream(ctx)?,
                (false, true),
                (n, m, k),
                xi.cuda()?,
                wi.cuda()?,
                y.cuda()?,
                Some(bi.cuda()?),
            ),
        }
    }
}

impl Fc {
    #[cfg_attr(
        not(any(feature = "opencl", feature = "cuda")),
        allow(unused_variables)
    )]
    fn gradient(
        &self,
        backend: &Backend,
        ctx: &Context,
        io: &mut super::io::Io<'_>,
        (n, m, k): (usize, usize, usize),
    ) -> Result<()> {
        let def = io.def();
        let (x, w, dy) = (io.input(0)?, io.input(1)?, io.input(2)?);
        if dy.numel() != n.checked_mul(m) {
            return Err(shape_error(
                in_what(def, 2),
                dy.dims(),
                format!(
                    "dY must hold N x M = {n} x {m} elements (X {:?}, W {:?})",
                    x.dims(),
                    w.dims()
                ),
            ));
        }
        let xi = In::<f32>::open(x, in_what(def, 0))?;
        let wi = In::<f32>::open(w, in_what(def, 1))?;
        let dyi = In::<f32>::open(dy, in_what(def, 2))?;
        let mut dw = Out::<f32>::overwrite(io.output(0)?, w.dims(), out_what(def, 0))?;
        let mut db = Out::<f32>::overwrite(io.output(1)?, &[m], out_what(def, 1))?;
        let mut dx = match def.outputs.len() {
            3 => Some(Out::<f32>::overwrite(
                io.output(2)?,
                x.dims(),
                out_what(def, 2),
            )?),
            _ => None,
        };
        match backend {
            Backend::Cpu => {
                let (xc, wc, dyc) = (xi.cpu()?, wi.cpu()?, dyi.cpu()?);
                cpu::gemm((true, false), (m, k, n), dyc, xc, 0.0, dw.cpu()?)?;
                cpu::col_sum(n, m, dyc, db.cpu()?);
                if let Some(dx) = &mut dx {
                    cpu::gemm((false, false), (n, k, m), dyc, wc, 0.0, dx.cpu()?)?;
                }
                Ok(())
            }
            #[cfg(feature = "opencl")]
            Backend::OpenCl(kern) => {
                let q = super::opencl::queue(ctx)?;
                let (xm, wm, dym) = (xi.mem()?, wi.mem()?, dyi.mem()?);
                kern.gemm(q, (true, false), (m, k, n), dym, xm, dw.mem()?, None)?;
                kern.col_sum(q, n, m, dym, db.mem()?)?;
                if let Some(dx) = &dx {
                    kern.gemm(q, (false, false), (n, k, m), dym, wm, dx.mem()?, None)?;
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(kern) => {
                let s = super::cuda::stream(ctx)?;
                let (xs, ws, dys) = (xi.cuda()?, wi.cuda()?, dyi.cuda()?);
                kern.gemm(s, (true, false), (m, k, n), dys, xs, dw.cuda()?, None)?;
                kern.col_sum(s, n, m, dys, db.cuda()?)?;
                if let Some(dx) = &dx {
                    kern.gemm(s, (false, false), (n, k, m), dys, ws, dx.cuda()?, None)?;
                }
                Ok(())
            }
        }
    }
}
