//! `FC` and `FCGradient` (Caffe2's fully connected operator).
//!
//! `X` is viewed as `[N, K]` by flattening its dims before `axis` into `N` and the rest into
//! `K`; `W` as `[M, K]` around `axis_w`. `Y = X·Wᵀ + b` has `X`'s dims before `axis`, then `M`.
//! The gradient computes `dW = dYᵀ·X` (dims of `W`), `db = Σ_rows dY` (`[M]`) and, with a third
//! output, `dX = dY·W` (dims of `X`). With `db_in_gemm = 1` the `dW` GEMM's launch also writes
//! `db` (it reads `dY` anyway), bit for bit the column sums a separate launch writes: one launch
//! fewer (a fused bias gradient, see [`crate::fuse`]).
//!
//! `FC` with `relu = 1` writes `max(X·Wᵀ + b, 0)`: the GEMM applies the ReLU as it stores each
//! result, bit for bit what `FC` then `Relu` give, in one pass and without the pre-activation
//! blob. Its gradient is `ReluGradient` (which needs only the output) then `FCGradient`.
//!
//! `FCGradient` with a fourth input `R` (dims of `X`) writes `dX = (dY·W) · [R > 0]`: the GEMM
//! applies the mask as it stores, bit for bit `FCGradient` then `ReluGradient` with `Y = R`
//! (a fused FCGradient + ReluGradient, see [`crate::fuse`]).
//!
//! `FC` with `activation = "T"` (and `activation_args`, the arguments of the `T` it replaces)
//! applies the GEMM epilogue declared for the user's element-wise type `T`
//! ([`syncmem::ops::register_epilogue`]) as it stores each result: `Y = act(X·Wᵀ + b)`.
//! `FCGradient` with a fourth input `R` and `activation = "G"` (the gradient's type of such a
//! `T`) writes `dX = act_grad(dY·W, R)` instead of the mask: `FCGradient` then `G` with
//! `Y = R`, in one launch (a fused user's activation, see [`crate::fuse`]).

use syncmem::kernels::{self, Epilogue, Gemm};
use syncmem::ops::{
    self, check_context, invalid_def, with_io, Args, Operand as What, Operator, OperatorDef,
    OperatorIo,
};
use syncmem::{Context, Device, Result, Tensor, Workspace};

use super::access::{shape_error, In, Out};

struct Fc {
    def: OperatorDef,
    device: Device,
    axis: i64,
    axis_w: i64,
    relu: bool,
    /// `FCGradient` with `db_in_gemm = 1`: the `dW` GEMM's launch also writes `db`.
    db_in_gemm: bool,
    gradient: bool,
    /// A user's element-wise operator fused into the GEMM (`activation`): its epilogue, applied
    /// as the GEMM stores `Y` (`FC`), or its gradient applied to `dX` from the fourth input
    /// `R = Y` (`FCGradient`).
    activation: Option<Epilogue>,
}

fn build(def: &OperatorDef, device: &Device, gradient: bool) -> Result<Box<dyn Operator>> {
    let (inputs, outputs) = if gradient {
        ((3, 4), (2, 3))
    } else {
        ((3, 3), (1, 1))
    };
    let known: &[&str] = if gradient {
        &[
            "axis",
            "axis_w",
            "db_in_gemm",
            "activation",
            "activation_args",
        ]
    } else {
        &["axis", "axis_w", "relu", "activation", "activation_args"]
    };
    let args = Args::check(def, inputs, outputs, known)?;
    if def.inputs.len() == 4 && def.outputs.len() != 3 {
        return Err(invalid_def(
            def,
            "a fourth input (the ReLU mask of dX) needs the output dX".to_string(),
        ));
    }
    let flag = |name: &str| match args.i64_or(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(invalid_def(
            def,
            format!("argument \"{name}\" must be 0 or 1, got {v}"),
        )),
    };
    let relu = flag("relu")?;
    let db_in_gemm = flag("db_in_gemm")?;
    let activation = activation(def, &args, gradient)?;
    if relu && activation.is_some() {
        return Err(invalid_def(
            def,
            "\"relu\" and \"activation\" are two epilogues; give one".to_string(),
        ));
    }
    Ok(Box::new(Fc {
        def: def.clone(),
        device: device.clone(),
        axis: args.i64_or("axis", 1)?,
        axis_w: args.i64_or("axis_w", 1)?,
        relu,
        db_in_gemm,
        gradient,
        activation,
    }))
}

/// The epilogue of argument `activation` (an element-wise operator type, or its gradient's for
/// `FCGradient`, declared with [`syncmem::ops::register_epilogue`]) built from the arguments
/// in `activation_args` (an object); `None` without it.
fn activation(def: &OperatorDef, args: &Args<'_>, gradient: bool) -> Result<Option<Epilogue>> {
    let op_type = args.str_or("activation", "")?;
    if op_type.is_empty() {
        return Ok(None);
    }
    let mut act = OperatorDef::new(op_type, &[], &[]);
    match def.args.get("activation_args") {
        None => {}
        Some(serde_json::Value::Object(m)) => act.args = m.clone(),
        Some(v) => {
            return Err(invalid_def(
                def,
                format!("argument \"activation_args\" must be an object, got {v}"),
            ))
        }
    }
    let epilogue = if gradient {
        ops::gradient_epilogue_of(&act)?
    } else {
        ops::epilogue_of(&act)?
    };
    let epilogue = epilogue.ok_or_else(|| {
        invalid_def(
            def,
            format!("activation {op_type:?} has no GEMM epilogue (see register_epilogue)"),
        )
    })?;
    if gradient && def.inputs.len() != 4 {
        return Err(invalid_def(
            def,
            "an activation's gradient needs its output as the fourth input".to_string(),
        ));
    }
    Ok(Some(epilogue))
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
    what: What<'_>,
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

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        with_io(ws, &self.def, ctx.device(), &[], |io| {
            let def = io.def();
            let (x, w) = (io.input(0)?, io.input(1)?);
            let (ax, n, k) = split(x, self.axis, "axis", What::input(def, 0))?;
            let (_, m, kw) = split(w, self.axis_w, "axis_w", What::input(def, 1))?;
            if kw != k {
                return Err(shape_error(
                    What::input(def, 1),
                    w.dims(),
                    format!(
                        "W has {kw} columns (dims from axis_w {}) but X ({:?}) has {k} (dims \
                         from axis {})",
                        self.axis_w,
                        x.dims(),
                        self.axis
                    ),
                ));
            }
            if self.gradient {
                return self.gradient(ctx, io, (n, m, k));
            }
            self.forward(ctx, io, ax, (n, m, k))
        })
    }
}

impl Fc {
    /// `Y = X·Wᵀ + b` (then `max(·, 0)` with `relu`).
    fn forward(
        &self,
        ctx: &Context,
        io: &mut OperatorIo<'_>,
        ax: usize,
        (n, m, k): (usize, usize, usize),
    ) -> Result<()> {
        let def = io.def();
        let dev = ctx.device();
        let (x, w, b) = (io.input(0)?, io.input(1)?, io.input(2)?);
        if b.dims() != [m] {
            return Err(shape_error(
                What::input(def, 2),
                b.dims(),
                format!("the bias must have dims [{m}] (the rows of W)"),
            ));
        }
        let mut y_dims: smallvec::SmallVec<[usize; 6]> = x.dims()[..ax].iter().copied().collect();
        y_dims.push(m);
        let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
        let wi = In::<f32>::open(w, dev, What::input(def, 1))?;
        let bi = In::<f32>::open(b, dev, What::input(def, 2))?;
        let mut y = Out::<f32>::overwrite(io.output(0)?, &y_dims, dev)?;
        let g = Gemm::new((n, m, k), xi.src(), wi.src(), y.dst())
            .b_transposed(true)
            .bias(Some(bi.src()))
            .relu(self.relu)
            .activation(self.activation.as_ref());
        kernels::gemm(ctx.stream(), g)
    }

    /// `dW = dYᵀ·X`, `db = Σ_rows dY`, and `dX = dY·W` (masked by `R > 0` with a fourth input).
    fn gradient(
        &self,
        ctx: &Context,
        io: &mut OperatorIo<'_>,
        (n, m, k): (usize, usize, usize),
    ) -> Result<()> {
        let def = io.def();
        let dev = ctx.device();
        let (x, w, dy) = (io.input(0)?, io.input(1)?, io.input(2)?);
        if dy.numel() != n.checked_mul(m) {
            return Err(shape_error(
                What::input(def, 2),
                dy.dims(),
                format!(
                    "dY must hold N x M = {n} x {m} elements (X {:?}, W {:?})",
                    x.dims(),
                    w.dims()
                ),
            ));
        }
        let xi = In::<f32>::open(x, dev, What::input(def, 0))?;
        let wi = In::<f32>::open(w, dev, What::input(def, 1))?;
        let dyi = In::<f32>::open(dy, dev, What::input(def, 2))?;
        let mut dw = Out::<f32>::overwrite(io.output(0)?, w.dims(), dev)?;
        let mut db = Out::<f32>::overwrite(io.output(1)?, &[m], dev)?;
        let mask = match def.inputs.len() {
            4 => {
                let r = io.input(3)?;
                if r.dims() != x.dims() {
                    return Err(shape_error(
                        What::input(def, 3),
                        r.dims(),
                        format!("the ReLU mask must have the dims of X {:?}", x.dims()),
                    ));
                }
                Some(In::<f32>::open(r, dev, What::input(def, 3))?)
            }
            _ => None,
        };
        let mut dx = match def.outputs.len() {
            3 => Some(Out::<f32>::overwrite(io.output(2)?, x.dims(), dev)?),
            _ => None,
        };
        let s = ctx.stream();
        // db = the column sums of dY: with `db_in_gemm`, written by the dW GEMM's launch
        // (which reads dY as its transposed A), bit for bit the same.
        let g = Gemm::new((m, k, n), dyi.src(), xi.src(), dw.dst()).a_transposed(true);
        if self.db_in_gemm {
            kernels::gemm(s, g.a_col_sums(Some(db.dst())))?;
        } else {
            kernels::gemm(s, g)?;
            kernels::col_sum(s, (n, m), dyi.src(), db.dst())?;
        }
        if let Some(dx) = &mut dx {
            let g = Gemm::new((n, k, m), dyi.src(), wi.src(), dx.dst());
            let g = match (&self.activation, &mask) {
                (Some(e), Some(r)) => g.activation_grad(Some((e, r.src()))),
                _ => g.mask(mask.as_ref().map(In::src)),
            };
            kernels::gemm(s, g)?;
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "opencl"))]
mod tests {
    use syncmem::ops::{create_operator, OperatorDef};
    use syncmem::{Context, Tensor, Workspace};

    /// `FCGradient` with `db_in_gemm = 1` queues one kernel launch per GEMM on a device: the
    /// `dW` GEMM's launch also writes `db`; without it, one more for `db`.
    #[test]
    fn fc_gradient_writes_db_in_the_dw_launch() {
        let Some(dev) = syncmem::testing::opencl_or_skip("fc_gradient_writes_db_in_the_dw_launch")
        else {
            return;
        };
        crate::register_operators().unwrap();
        let ctx = Context::new(&dev).unwrap();
        let ws = Workspace::new();
        let (n, k, m) = (70, 5, 130);
        for (name, dims) in [("x", [n, k]), ("w", [m, k]), ("dy", [n, m])] {
            let vals: Vec<f32> = (0..dims[0] * dims[1]).map(|i| (i % 7) as f32).collect();
            let t = Tensor::from_slice(&dims, &vals, Some(&dev)).unwrap();
            ws.create_blob(name).unwrap().write().reset(t);
        }
        for (outputs, fused, launches) in [
            (&["dw", "db"][..], 1, 1),
            (&["dw", "db", "dx"][..], 1, 2),
            (&["dw", "db"][..], 0, 2),
            (&["dw", "db", "dx"][..], 0, 3),
        ] {
            let def =
                OperatorDef::new("FCGradient", &["x", "w", "dy"], outputs).arg("db_in_gemm", fused);
            let op = create_operator(&def, &dev).unwrap();
            // The first run moves the inputs to the device and allocates the outputs.
            op.run(&ws, &ctx).unwrap();
            let before = ctx.stream().commands_queued();
            op.run(&ws, &ctx).unwrap();
            let queued = ctx.stream().commands_queued() - before;
            assert_eq!(queued, launches, "{outputs:?}");
        }
        // No inputs (K = 0): no product, but db still holds the column sums of dY.
        for (name, dims, vals) in [
            ("x0", [2, 0], vec![]),
            ("w0", [3, 0], vec![]),
            ("dy0", [2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ] {
            let t = Tensor::from_slice(&dims, &vals, Some(&dev)).unwrap();
            ws.create_blob(name).unwrap().write().reset(t);
        }
        let def = OperatorDef::new("FCGradient", &["x0", "w0", "dy0"], &["dw0", "db0"])
            .arg("db_in_gemm", 1);
        create_operator(&def, &dev).unwrap().run(&ws, &ctx).unwrap();
        let db = ws.get_blob("db0").unwrap();
        let db = db.read();
        let db = db.get::<Tensor>().unwrap().host::<f32>().unwrap().to_vec();
        assert_eq!(db, [5.0, 7.0, 9.0]);
    }
}
