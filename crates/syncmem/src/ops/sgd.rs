//! `SGD`: `param -= lr · grad`, in place (Caffe's `Blob::Update` scaled by a learning rate).
//!
//! Runs the device's axpy kernel with `a = -lr` on the parameter's device mirror (taken for
//! reading and writing) and the gradient's; the parameter blob is locked once, for writing.

use super::access::{check_context, shape_error, In, Out, What};
use super::args::{invalid, Args};
use super::io::Blobs;
use super::{Operator, OperatorDef};
use crate::context::Context;
use crate::device::Device;
use crate::error::Result;
use crate::workspace::Workspace;

struct Sgd {
    def: OperatorDef,
    /// `def` with its output spelled out: with no output listed, the parameter is still
    /// written, so it runs as if it were output 0.
    run_def: OperatorDef,
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
    let mut run_def = def.clone();
    if run_def.outputs.is_empty() {
        run_def.outputs.push(run_def.inputs[0].clone());
    }
    Ok(Box::new(Sgd {
        def: def.clone(),
        run_def,
        device: device.clone(),
        lr,
    }))
}

impl Operator for Sgd {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.run_def, &[(0, 0)])?;
        let mut locked = blobs.lock();
        let dev = ctx.device();
        let mut io = locked.io(dev)?;
        let grad = io.input(1)?;
        let param = io.output(0)?;
        if grad.dims() != param.dims() {
            return Err(shape_error(
                What::input(&self.def, 1),
                grad.dims(),
                format!(
                    "the gradient must have the dims of the parameter {:?}",
                    param.dims()
                ),
            ));
        }
        let gi = In::<f32>::open(grad, dev, What::input(&self.def, 1))?;
        let p = Out::<f32>::in_place(param, dev, What::input(&self.def, 0))?;
        ctx.kernels()
            .axpy::<f32>(p.len(), -self.lr, gi.buffer(), p.buffer())
    }
}
