//! `Relu` (`Y = max(X, 0)`, in place allowed) and `ReluGradient` (`dX = dY · [Y > 0]`, in
//! place on `dY` allowed).

use super::access::{shape_error, Backend, In, Out};
use super::args::Args;
use super::io::{in_what, out_what, Blobs};
use super::{cpu, Operator, OperatorDef};
use crate::context::Context;
use crate::device::Device;
use crate::error::Result;
use crate::workspace::Workspace;

struct Relu {
    def: OperatorDef,
    device: Device,
}

struct ReluGradient {
    def: OperatorDef,
    device: Device,
}

pub(crate) fn build_relu(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    Args::check(def, (1, 1), (1, 1), &[])?;
    Ok(Box::new(Relu {
        def: def.clone(),
        device: device.clone(),
    }))
}

pub(crate) fn build_relu_gradient(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    Args::check(def, (2, 2), (1, 1), &[])?;
    Ok(Box::new(ReluGradient {
        def: def.clone(),
        device: device.clone(),
    }))
}

impl Operator for Relu {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        let backend = Backend::for_run(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[(0, 0)])?;
        let mut locked = blobs.lock();
        let mut io = locked.io(ctx.device())?;
        let def = io.def();
        if io.in_place(0).is_some() {
            let mut y = Out::<f32>::in_place(io.output(0)?, out_what(def, 0))?;
            return match backend {
                Backend::Cpu => {
                    cpu::relu_in_place(y.cpu()?);
                    Ok(())
                }
                #[cfg(feature = "opencl")]
                Backend::OpenCl(k) => {
                    let m = y.mem()?;
                    k.relu(super::opencl::queue(ctx)?, y.len(), m, m)
                }
                #[cfg(feature = "cuda")]
                Backend::Cuda(k) => {
                    let m = y.cuda()?;
                    k.relu(super::cuda::stream(ctx)?, y.len(), m, m)
                }
            };
        }
        let x = io.input(0)?;
        let xi = In::<f32>::open(x, in_what(def, 0))?;
        let mut y = Out::<f32>::overwrite(io.output(0)?, x.dims(), out_what(def, 0))?;
        match backend {
            Backend::Cpu => {
                cpu::relu(xi.cpu()?, y.cpu()?);
                Ok(())
            }
            #[cfg(feature = "opencl")]
            Backend::OpenCl(k) => k.relu(super::opencl::queue(ctx)?, y.len(), xi.mem()?, y.mem()?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(k) => k.relu(super::cuda::stream(ctx)?, y.len(), xi.cuda()?, y.cuda()?),
        }
    }
}

impl Operator for ReluGradient {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        let backend = Backend::for_run(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[(1, 0)])?;
        let mut locked = blobs.lock();
        let mut io = locked.io(ctx.device())?;
        let def = io.def();
        let y = io.input(0)?;
        let yi = In::<f32>::open(y, in_what(def, 0))?;
        if io.in_place(1).is_some() {
            let dx_t = io.output(0)?;
            if dx_t.dims() != y.dims() {
                return Err(shape_error(
                    in_what(def, 1),
                    dx_t.dims(),
                    format!("dY must have the dims of Y {:?}", y.dims()),
                ));
            }
            let mut dx = Out::<f32>::in_place(dx_t, out_what(def, 0))?;
            return match backend {
                Backend::Cpu => {
                    cpu::relu_grad_in_place(yi.cpu()?, dx.cpu()?);
                    Ok(())
                }
                #[cfg(feature = "opencl")]
                Backend::OpenCl(k) => {
                    let m = dx.mem()?;
                    k.relu_grad(super::opencl::queue(ctx)?, dx.len(), yi.mem()?, m, m)
                }
                #[cfg(feature = "cuda")]
                Backend::Cuda(k) => {
                    let m = dx.cuda()?;
                    k.relu_grad(super::cuda::stream(ctx)?, dx.len(), yi.cuda()?, m, m)
                }
            };
        }
        let dy = io.input(1)?;
        if dy.dims() != y.dims() {
            return Err(shape_error(
                in_what(def, 1),
                dy.dims(),
                format!("dY must have the dims of Y {:?}", y.dims()),
            ));
        }
        let dyi = In::<f32>::open(dy, in_what(def, 1))?;
        let mut dx = Out::<f32>::overwrite(io.output(0)?, y.dims(), out_what(def, 0))?;
        match backend {
            Backend::Cpu => {
                cpu::relu_grad(yi.cpu()?, dyi.cpu()?, dx.cpu()?);
                Ok(())
            }
            #[cfg(feature = "opencl")]
            Backend::OpenCl(k) => k.relu_grad(
                super::opencl::queue(ctx)?,
                dx.len(),
                yi.mem()?,
                dyi.mem()?,
                dx.mem()?,
            ),
            #[cfg(feature = "cuda")]
            Backend::Cuda(k) => k.relu_grad(
                super::cuda::stream(ctx)?,
                dx.len(),
                yi.cuda()?,
                dyi.cuda()?,
                dx.cuda()?,
            ),
        }
    }
}
