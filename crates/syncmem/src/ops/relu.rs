//! `Relu` (`Y = max(X, 0)`, in place allowed) and `ReluGradient` (`dX = dY · [Y > 0]`, in
//! place on `dY` allowed).

use super::access::{check_context, shape_error, In, Out, What};
use super::args::Args;
use super::io::Blobs;
use super::{Operator, OperatorDef};
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
        check_context(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[(0, 0)])?;
        let mut locked = blobs.lock();
        let dev = ctx.device();
        let mut io = locked.io(dev)?;
        let def = io.def();
        if io.in_place(0).is_some() {
            let y = Out::<f32>::in_place(io.output(0)?, dev, What::output(def, 0))?;
            return ctx.kernels().relu(y.len(), y.buffer(), y.buffer());
        }
        let x = io.input(0)?;
        let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
        let y = Out::<f32>::overwrite(io.output(0)?, x.dims(), dev)?;
        ctx.kernels().relu(y.len(), xi.buffer(), y.buffer())
    }
}

impl Operator for ReluGradient {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[(1, 0)])?;
        let mut locked = blobs.lock();
        let dev = ctx.device();
        let mut io = locked.io(dev)?;
        let def = io.def();
        let y = io.input(0)?;
        let yi = In::<f32>::open(y, dev, What::input(def, 0))?;
        if io.in_place(1).is_some() {
            let dx_t = io.output(0)?;
            if dx_t.dims() != y.dims() {
                return Err(shape_error(
                    What::input(def, 1),
                    dx_t.dims(),
                    format!("dY must have the dims of Y {:?}", y.dims()),
                ));
            }
            let dx = Out::<f32>::in_place(dx_t, dev, What::output(def, 0))?;
            let n = dx.len();
            return ctx
                .kernels()
                .relu_grad(n, yi.buffer(), dx.buffer(), dx.buffer());
        }
        let dy = io.input(1)?;
        if dy.dims() != y.dims() {
            return Err(shape_error(
                What::input(def, 1),
                dy.dims(),
                format!("dY must have the dims of Y {:?}", y.dims()),
            ));
        }
        let dyi = In::<f32>::open(dy, dev, What::input(def, 1))?;
        let dx = Out::<f32>::overwrite(io.output(0)?, y.dims(), dev)?;
        ctx.kernels()
            .relu_grad(dx.len(), yi.buffer(), dyi.buffer(), dx.buffer())
    }
}
