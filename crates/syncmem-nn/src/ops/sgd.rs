//! `SGD`: `param -= lr · grad`, in place (Caffe's `Blob::Update` scaled by a learning rate).
//!
//! Runs the device's axpy kernel with `a = -lr` on the parameter's device mirror (taken for
//! reading and writing) and the gradient's; the parameter blob is locked once, for writing.
//!
//! One `SGD` may update several parameters: inputs `[p0, g0, p1, g1, ...]`, outputs none or
//! `[p0, p1, ...]` (each output the parameter of its pair). All of them go to the device in one
//! launch per [`AXPY_MULTI`] pairs (a multi-tensor update), bit for bit what one `SGD` per
//! parameter gives; [`crate::fuse::sgd`] merges the `SGD`s of a net this way.

use smallvec::SmallVec;

use syncmem::kernels::{self, AxpyTriple, AXPY_MULTI};
use syncmem::ops::{
    check_context, invalid_def as invalid, with_io, Args, Operand as What, Operator, OperatorDef,
};
use syncmem::{Context, Device, Result, Workspace};

use super::access::{shape_error, In, Out};

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

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let dev = ctx.device();
        with_io(ws, &self.run_def, dev, &self.in_place, |io| {
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
            let mut triples: SmallVec<[AxpyTriple<'_>; SGD_MAX_PAIRS]> = views
                .iter_mut()
                .map(|(g, p)| (p.len(), g.src(), p.dst()))
                .collect();
            kernels::axpy_multi::<f32>(ctx.stream(), -self.lr, &mut triples)
        })
    }
}
