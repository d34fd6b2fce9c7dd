//! `SGD`: `param -= lr · grad`, in place (Caffe's `Blob::Update` scaled by a learning rate).
//!
//! Runs [`crate::kernels::axpy`] with `a = -lr` on the parameter's device mirror (taken for
//! reading and writing) and the gradient's; the parameter blob is locked once, for writing.

use super::access::{shape_error, Backend, In, Out};
use super::args::{invalid, Args};
use super::io::{in_what, Blobs};
use super::{Operator, OperatorDef};
use crate::context::Context;
use crate::device::Device;
use crate::error::Result;
use crate::kernels;
use crate::workspace::Workspace;

struct Sgd {
    def: OperatorDef,
    device: Device,
    lr: f32,
}

pub(crate) fn build_sgd(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (2, 2), (0, 1), &["lr"])?;
    let lr = args.f32_required("lr")?;
    if let Some(out) = def.outputs.first() {
        if *out != def.inputs[0] {
            return Err(invalid(
                def,
                format!(
                    "updates its parameter in place: the output must be {:?} (input 0), not \
                     {out:?}",
                    def.inputs[0]
                ),
            ));
        }
    }
    Ok(Box::new(Sgd {
        def: def.clone(),
        device: device.clone(),
        lr,
    }))
}

impl Operator for Sgd {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        // Backend::for_run checks the context and that the device has kernels.
        let _backend = Backend::for_run(&self.def, &self.device, ctx)?;
        // With no output listed, the parameter is still written: run as if it were output 0.
        let mut def = self.def.clone();
        if def.outputs.is_empty() {
            def.outputs.push(def.inputs[0].clone());
        }
        let blobs = Blobs::resolve(ws, &def, &[(0, 0)])?;
        let mut locked = blobs.lock();
        let mut io = locked.io(ctx.device())?;
        let grad = io.input(1)?;
        let param = io.output(0)?;
        if grad.dims() != param.dims() {
            return Err(shape_error(
                in_what(&self.def, 1),
                grad.dims(),
                format!(
                    "the gradient must have the dims of the parameter {:?}",
                    param.dims()
                ),
            ));
        }
        let gi = In::<f32>::open(grad, in_what(&self.def, 1))?;
        let mut p = Out::<f32>::in_place(param, in_what(&self.def, 0))?;
        let n = p.len();
        match (gi.guard(), p.guard_mut()) {
            (Some(g), Some(w)) => kernels::axpy::<f32>(n, -self.lr, g, w),
            _ => Ok(()),
        }
    }
}
