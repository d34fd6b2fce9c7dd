//! `Relu` (`Y = max(X, 0)`, in place allowed) and `ReluGradient` (`dX = dY · [Y > 0]`, in
//! place on `dY` allowed).

use syncmem::kernels;
use syncmem::ops::{check_context, with_io, Args, Operand as What, Operator, OperatorDef};
use syncmem::{Context, Device, Result, Workspace};

use super::access::{shape_error, In, Out};

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

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let dev = ctx.device();
        with_io(ws, &self.def, dev, &[(0, 0)], |io| {
            let def = io.def();
            if io.in_place(0).is_some() {
                let mut y = Out::<f32>::in_place(io.output(0)?, dev, What::output(def, 0))?;
                return kernels::relu(ctx.stream(), y.len(), None, y.dst());
            }
            let x = io.input(0)?;
            let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
            let mut y = Out::<f32>::overwrite(io.output(0)?, x.dims(), dev)?;
            kernels::relu(ctx.stream(), y.len(), Some(xi.src()), y.dst())
        })
    }
}

impl Operator for ReluGradient {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let dev = ctx.device();
        with_io(ws, &self.def, dev, &[(1, 0)], |io| {
            let def = io.def();
            let y = io.input(0)?;
            let yi = In::<f32>::open(y, dev, What::input(def, 0))?;
            let same_dims = |dims: &[usize]| -> Result<()> {
                if dims == y.dims() {
                    return Ok(());
                }
                Err(shape_error(
                    What::input(def, 1),
                    dims,
                    format!("dY must have the dims of Y {:?}", y.dims()),
                ))
            };
            if io.in_place(1).is_some() {
                let dx_t = io.output(0)?;
                same_dims(dx_t.dims())?;
                let mut dx = Out::<f32>::in_place(dx_t, dev, What::output(def, 0))?;
                let n = dx.len();
                return kernels::relu_grad(ctx.stream(), n, yi.src(), None, dx.dst());
            }
            let dy = io.input(1)?;
            same_dims(dy.dims())?;
            let dyi = In::<f32>::open(dy, dev, What::input(def, 1))?;
            let mut dx = Out::<f32>::overwrite(io.output(0)?, y.dims(), dev)?;
            let n = dx.len();
            kernels::relu_grad(ctx.stream(), n, yi.src(), Some(dyi.src()), dx.dst())
        })
    }
}
