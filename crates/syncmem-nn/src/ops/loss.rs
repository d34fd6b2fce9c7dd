//! `SoftmaxWithLoss`, `SoftmaxWithLossGradient` and `Accuracy`.
//!
//! Labels are `i32` class indices, one per row (dims `[N]` or `[N, 1]`). The loss and the
//! accuracy are 0-dimensional `f32` tensors written on the device, so a training loop reads
//! back only those scalars.
//!
//! `SoftmaxWithLoss` with `accuracy_top_k = K` also writes the `Accuracy` (top K) of its
//! probabilities as output 2, and with `gradient = 1` the `SoftmaxWithLossGradient` (with
//! `dLoss = 1`) as the output after it, in the same pass over the rows, bit for bit what the
//! separate operators give (see [`crate::fuse::loss`]). With `accuracy_top_k` and `scalars = 1`, its
//! last output is `[loss, accuracy]` (`f32 [2]`), the same two values again side by side, so
//! that a training loop brings both back with one read.
//!
//! An out-of-range label is an error naming the row on the `cpu` device, and on OpenCL and CUDA
//! whenever the labels' host copy is current (checked there without any copy). When the labels
//! live only on the device, checking would need a read-back: the kernels then make the loss, the
//! gradient rows and the accuracy NaN instead.

use syncmem::kernels::{
    self, host::check_labels as host_check_labels, Accuracy, BadLabel, SoftmaxLoss, SoftmaxLossGrad,
};
use syncmem::ops::{
    check_context, invalid_def as invalid, with_io, Args, Operand as What, Operator, OperatorDef,
    OperatorIo as Io,
};
use syncmem::synced::Head;
use syncmem::{Context, Device, Error, Result, Tensor};

use super::access::{expect_dtype, shape_error, In, Out};
use super::fc::split;
use syncmem::Workspace;

#[derive(Clone, Copy)]
enum Kind {
    /// With `accuracy_top_k`, output 2 is the accuracy; with `gradient = 1`, the next output
    /// is the gradient of the loss (with `dLoss = 1`); with `scalars = 1` (and the accuracy),
    /// the last output is `[loss, accuracy]`: all from the same pass.
    Forward {
        top_k: Option<usize>,
        gradient: bool,
        scalars: bool,
    },
    Gradient,
    Accuracy {
        top_k: usize,
    },
}

struct LossOp {
    def: OperatorDef,
    device: Device,
    axis: i64,
    kind: Kind,
}

pub(crate) fn build_softmax_with_loss(
    def: &OperatorDef,
    device: &Device,
) -> Result<Box<dyn Operator>> {
    let args = Args::check(
        def,
        (2, 2),
        (2, 5),
        &["axis", "accuracy_top_k", "gradient", "scalars"],
    )?;
    let top_k = match def.args.contains_key("accuracy_top_k") {
        true => Some(top_k_of(def, args.i64_or("accuracy_top_k", 1)?)?),
        false => None,
    };
    let flag = |name: &str| match args.i64_or(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(invalid(
            def,
            format!("argument \"{name}\" must be 0 or 1, got {v}"),
        )),
    };
    let (gradient, scalars) = (flag("gradient")?, flag("scalars")?);
    if scalars && top_k.is_none() {
        return Err(invalid(
            def,
            "argument \"scalars\" needs \"accuracy_top_k\" (it writes the loss and the accuracy)"
                .to_string(),
        ));
    }
    let want = 2 + usize::from(top_k.is_some()) + usize::from(gradient) + usize::from(scalars);
    if def.outputs.len() != want {
        return Err(invalid(
            def,
            format!(
                "writes P, the loss{}{}{}: {want} outputs, got {}",
                if top_k.is_some() {
                    ", the accuracy"
                } else {
                    ""
                },
                if gradient { ", dX" } else { "" },
                if scalars { ", [loss, accuracy]" } else { "" },
                def.outputs.len()
            ),
        ));
    }
    op(
        def,
        device,
        args.i64_or("axis", 1)?,
        Kind::Forward {
            top_k,
            gradient,
            scalars,
        },
    )
}

fn top_k_of(def: &OperatorDef, top_k: i64) -> Result<usize> {
    usize::try_from(top_k)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| invalid(def, format!("top_k must be at least 1, got {top_k}")))
}

pub(crate) fn build_softmax_with_loss_gradient(
    def: &OperatorDef,
    device: &Device,
) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (2, 4), (1, 1), &["axis"])?;
    op(def, device, args.i64_or("axis", 1)?, Kind::Gradient)
}

pub(crate) fn build_accuracy(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (2, 2), (1, 1), &["top_k"])?;
    let top_k = top_k_of(def, args.i64_or("top_k", 1)?)?;
    op(def, device, 1, Kind::Accuracy { top_k })
}

fn op(def: &OperatorDef, device: &Device, axis: i64, kind: Kind) -> Result<Box<dyn Operator>> {
    Ok(Box::new(LossOp {
        def: def.clone(),
        device: device.clone(),
        axis,
        kind,
    }))
}

/// Checks the labels' type and count (`rows`), and their values when the host copy is current
/// (no copy is made for that).
fn check_labels(
    def: &OperatorDef,
    i: usize,
    labels: &Tensor,
    rows: usize,
    classes: usize,
) -> Result<()> {
    let what = What::input(def, i);
    expect_dtype::<i32>(labels, what)?;
    let dims = labels.dims();
    if labels.numel() != Some(rows) || !(dims.len() == 1 || dims.get(1..) == Some(&[1][..])) {
        return Err(shape_error(
            what,
            dims,
            format!("labels must have dims [{rows}] or [{rows}, 1] (one per row)"),
        ));
    }
    if matches!(labels.head(), Some(Head::AtHost | Head::Synced)) {
        let host = labels.host::<i32>()?;
        host_check_labels(&host, classes)
            .map_err(|(row, label)| bad_label(def, i, classes, (row, label)))?;
    }
    Ok(())
}

fn bad_label(def: &OperatorDef, i: usize, classes: usize, (row, label): (usize, i32)) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: What::input(def, i).to_string(),
        reason: format!("label {label} of row {row} is not a class index in 0..{classes}"),
    }
}

/// The kernels' verdict on the labels: an out-of-range label the backend saw is an error.
fn labels_ok(def: &OperatorDef, classes: usize, seen: Option<BadLabel>) -> Result<()> {
    match seen {
        Some(b) => Err(bad_label(def, 1, classes, (b.row, b.label))),
        None => Ok(()),
    }
}

impl Operator for LossOp {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        with_io(ws, &self.def, ctx.device(), &[], |io| match self.kind {
            Kind::Forward {
                top_k,
                gradient,
                scalars,
            } => self.forward(ctx, io, top_k, gradient, scalars),
            Kind::Gradient => self.gradient(ctx, io),
            Kind::Accuracy { top_k } => self.accuracy(ctx, io, top_k),
        })
    }
}

impl LossOp {
    fn forward(
        &self,
        ctx: &Context,
        io: &mut Io<'_>,
        top_k: Option<usize>,
        gradient: bool,
        scalars: bool,
    ) -> Result<()> {
        let def = io.def();
        let dev = ctx.device();
        let (x, labels) = (io.input(0)?, io.input(1)?);
        let (_, n, c) = split(x, self.axis, "axis", What::input(def, 0))?;
        check_labels(def, 1, labels, n, c)?;
        let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
        let li = In::<i32>::open(labels, dev, What::input(def, 1))?;
        let mut p = Out::<f32>::overwrite(io.output(0)?, x.dims(), dev)?;
        let mut loss = Out::<f32>::overwrite(io.output(1)?, &[], dev)?;
        let mut acc = match top_k {
            Some(k) => Some((k, Out::<f32>::overwrite(io.output(2)?, &[], dev)?)),
            None => None,
        };
        let mut dx = match gradient {
            true => {
                let j = 2 + usize::from(top_k.is_some());
                Some(Out::<f32>::overwrite(io.output(j)?, x.dims(), dev)?)
            }
            false => None,
        };
        let mut both = match scalars {
            true => {
                let j = def.outputs.len() - 1;
                Some(Out::<f32>::overwrite(io.output(j)?, &[2], dev)?)
            }
            false => None,
        };
        let run = SoftmaxLoss::new((n, c), xi.src(), li.src(), p.dst(), loss.dst())
            .accuracy(acc.as_mut().map(|(k, a)| (*k, a.dst())))
            .grad(dx.as_mut().map(Out::dst))
            .scalars(both.as_mut().map(Out::dst));
        let seen = kernels::softmax_loss(ctx.stream(), run)?;
        labels_ok(def, c, seen)
    }

    fn gradient(&self, ctx: &Context, io: &mut Io<'_>) -> Result<()> {
        let def = io.def();
        let dev = ctx.device();
        // [P, labels], [P, labels, dLoss], or Caffe2's [X, labels, P, dLoss].
        let (pi_idx, dl_idx) = match def.inputs.len() {
            2 => (0, None),
            3 => (0, Some(2)),
            _ => (2, Some(3)),
        };
        let (p, labels) = (io.input(pi_idx)?, io.input(1)?);
        if pi_idx == 2 {
            let x = io.input(0)?;
            if x.dims() != p.dims() {
                return Err(shape_error(
                    What::input(def, 0),
                    x.dims(),
                    format!("X must have the dims of P {:?}", p.dims()),
                ));
            }
        }
        let (_, n, c) = split(p, self.axis, "axis", What::input(def, pi_idx))?;
        check_labels(def, 1, labels, n, c)?;
        let dl = match dl_idx {
            Some(i) => {
                let t = io.input(i)?;
                if t.numel() != Some(1) {
                    return Err(shape_error(
                        What::input(def, i),
                        t.dims(),
                        "dLoss must be a scalar".into(),
                    ));
                }
                Some(In::<f32>::open(t, dev, What::input(def, i))?)
            }
            None => None,
        };
        let pi = In::<f32>::open(p, dev, What::input(def, pi_idx))?;
        let li = In::<i32>::open(labels, dev, What::input(def, 1))?;
        let mut dx = Out::<f32>::overwrite(io.output(0)?, p.dims(), dev)?;
        let g = SoftmaxLossGrad::new((n, c), pi.src(), li.src()).dloss(dl.as_ref().map(In::src));
        let seen = kernels::softmax_loss_grad(ctx.stream(), g, dx.dst())?;
        labels_ok(def, c, seen)
    }

    fn accuracy(&self, ctx: &Context, io: &mut Io<'_>, top_k: usize) -> Result<()> {
        let def = io.def();
        let dev = ctx.device();
        let (x, labels) = (io.input(0)?, io.input(1)?);
        let (_, n, c) = split(x, self.axis, "axis", What::input(def, 0))?;
        check_labels(def, 1, labels, n, c)?;
        let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
        let li = In::<i32>::open(labels, dev, What::input(def, 1))?;
        let mut out = Out::<f32>::overwrite(io.output(0)?, &[], dev)?;
        let a = Accuracy::new((n, c), top_k, xi.src(), li.src());
        let seen = kernels::accuracy(ctx.stream(), a, out.dst())?;
        labels_ok(def, c, seen)
    }
}
