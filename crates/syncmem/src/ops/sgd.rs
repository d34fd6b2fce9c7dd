//! `SGD`: `param -= lr · grad`, in place (Caffe's `Blob::Update` scaled by a learning rate).
//!
//! Runs the device's axpy kernel with `a = -lr` on the parameter's device mirror (taken for
//! reading and writing) and the gradient's; the parameter blob is locked once, for writing.
//!
//! One `SGD` may update several parameters: inputs `[p0, g0, p1, g1, ...]`, outputs none or
//! `[p0, p1, ...]` (each output the parameter of its pair). All of them go to the device in one
//! launch per [`AXPY_MULTI`] pairs (a multi-tensor update), bit for bit what one `SGD` per
//! parameter gives; `net::fuse_sgd` merges the `SGD`s of a net this way.

use smallvec::SmallVec;

use super::access::{check_context, shape_error, In, Out, What};
use super::args::{invalid, Args};
use super::io::Blobs;
use super::{Operator, OperatorDef};
use crate::backend::AXPY_MULTI;
use crate::context::Context;
use crate::device::{Device, DeviceBuffer};
use crate::error::Result;
use crate::workspace::Workspace;

/// The most (parameter, gradient) pairs of one `SGD`.
pub(crate) const SGD_MAX_PAIRS: usize = AXPY_MULTI;

struct Sgd {
    def: OperatorDef,
    /// `def` with its outputs spelled out: with no output listed, the parameters are still
    /// written, so they run as if they were the outputs.
    run_def: OperatorDef,
    /// The (input, output) pairs computed in place: `(2i, i)`.
    in_place: Vec<(usize, usize)>,
    device: Device,
    lr: f32,
}

pub(crate) fn build_sgd(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (2, 2 * SGD_MAX_PAIRS), (0, SGD_MAX_PAIRS), &["lr"])?;
    let lr = args.f32_required("lr")?;
    if !def.inputs.len().is_multiple_of(2) {
        return Err(invalid(
            def,
            format!(
                "takes (parameter, gradient) pairs: an even number of inputs, got {}",
                def.inputs.len()
            ),
        ));
    }
    let pairs = def.inputs.len() / 2;
    if !def.outputs.is_empty() && def.outputs.len() != pairs {
        return Err(invalid(
            def,
            format!(
                "updates its {pairs} parameter(s) in place: list none or all of them as \
                 outputs, not {}",
                def.outputs.len()
            ),
        ));
    }
    for (i, out) in def.outputs.iter().enumerate() {
        if *out != def.inputs[2 * i] {
            return Err(invalid(
                def,
                format!(
                    "updates its parameter in place: output {i} must be {:?} (input {}), not \
                     {out:?}",
                    def.inputs[2 * i],
                    2 * i
                ),
            ));
        }
    }
    let mut run_def = def.clone();
    if run_def.outputs.is_empty() {
        run_def.outputs = def.inputs.iter().step_by(2).cloned().collect();
    }
    Ok(Box::new(Sgd {
        def: def.clone(),
        run_def,
        in_place: (0..pairs).map(|i| (2 * i, i)).collect(),
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
        let blobs = Blobs::resolve(ws, &self.run_def, &self.in_place)?;
        let mut locked = blobs.lock();
        let dev = ctx.device();
        let mut io = locked.io(dev)?;
        let mut views: SmallVec<[(In<'_, f32>, Out<'_, f32>); SGD_MAX_PAIRS]> = SmallVec::new();
        for i in 0..self.in_place.len() {
            let grad = io.input(2 * i + 1)?;
            let param = io.output(i)?;
            if grad.dims() != param.dims() {
                return Err(shape_error(
                    What::input(&self.def, 2 * i + 1),
                    grad.dims(),
                    format!(
                        "the gradient must have the dims of the parameter {:?}",
                        param.dims()
                    ),
                ));
            }
            let gi = In::<f32>::open(grad, dev, What::input(&self.def, 2 * i + 1))?;
            let p = Out::<f32>::in_place(param, dev, What::input(&self.def, 2 * i))?;
            views.push((gi, p));
        }
        if let [(g, p)] = views.as_slice() {
            return ctx
                .kernels()
                .axpy::<f32>(p.len(), -self.lr, g.buffer(), p.buffer());
        }
        let pairs: SmallVec<[(usize, &DeviceBuffer, &DeviceBuffer); SGD_MAX_PAIRS]> = views
            .iter()
            .map(|(g, p)| (p.len(), g.buffer(), p.buffer()))
            .collect();
        ctx.kernels().axpy_multi::<f32>(-self.lr, &pairs)
    }
}
