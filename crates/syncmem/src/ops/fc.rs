//! `FC` and `FCGradient` (Caffe2's fully connected operator).
//!
//! `X` is viewed as `[N, K]` by flattening its dims before `axis` into `N` and the rest into
//! `K`; `W` as `[M, K]` around `axis_w`. `Y = X·Wᵀ + b` has `X`'s dims before `axis`, then `M`.
//! The gradient computes `dW = dYᵀ·X` (dims of `W`), `db = Σ_rows dY` (`[M]`) and, with a third
//! output, `dX = dY·W` (dims of `X`). With `db_in_gemm = 1` the `dW` GEMM's launch also writes
//! `db` (it reads `dY` anyway), bit for bit the column sums a separate launch writes: one launch
//! fewer (a fused bias gradient, see [`crate::net::fuse`]).
//!
//! `FC` with `relu = 1` writes `max(X·Wᵀ + b, 0)`: the GEMM applies the ReLU as it stores each
//! result, bit for bit what `FC` then `Relu` give, in one pass and without the pre-activation
//! blob. Its gradient is `ReluGradient` (which needs only the output) then `FCGradient`.
//!
//! `FCGradient` with a fourth input `R` (dims of `X`) writes `dX = (dY·W) · [R > 0]`: the GEMM
//! applies the mask as it stores, bit for bit `FCGradient` then `ReluGradient` with `Y = R`
//! (a fused FCGradient + ReluGradient, see [`crate::net::fuse`]).

use super::access::{check_context, shape_error, In, Out, What};
use super::args::Args;
use super::io::Blobs;
use super::{Operator, OperatorDef};
use crate::backend::Gemm;
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
    relu: bool,
    /// `FCGradient` with `db_in_gemm = 1`: the `dW` GEMM's launch also writes `db`.
    db_in_gemm: bool,
    gradient: bool,
}

fn build(def: &OperatorDef, device: &Device, gradient: bool) -> Result<Box<dyn Operator>> {
    let (inputs, outputs) = if gradient {
        ((3, 4), (2, 3))
    } else {
        ((3, 3), (1, 1))
    };
    let known: &[&str] = if gradient {
        &["axis", "axis_w", "db_in_gemm"]
    } else {
        &["axis", "axis_w", "relu"]
    };
    let args = Args::check(def, inputs, outputs, known)?;
    if def.inputs.len() == 4 && def.outputs.len() != 3 {
        return Err(super::args::invalid(
            def,
            "a fourth input (the ReLU mask of dX) needs the output dX".to_string(),
        ));
    }
    let flag = |name: &str| match args.i64_or(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(super::args::invalid(
            def,
            format!("argument \"{name}\" must be 0 or 1, got {v}"),
        )),
    };
    let relu = flag("relu")?;
    let db_in_gemm = flag("db_in_gemm")?;
    Ok(Box::new(Fc {
        def: def.clone(),
        device: device.clone(),
        axis: args.i64_or("axis", 1)?,
        axis_w: args.i64_or("axis_w", 1)?,
        relu,
        db_in_gemm,
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

/// A GEMM of `m x n` results over `k`, with transposes `(ta, tb)`, no ReLU.
fn gemm((ta, tb): (bool, bool), (m, n, k): (usize, usize, usize)) -> Gemm {
    Gemm {
        ta,
        tb,
        m,
        n,
        k,
        relu: false,
    }
}

impl Operator for Fc {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let blobs = Blobs::resolve(ws, &self.def, &[])?;
        let mut locked = blobs.lock();
        let dev = ctx.device();
        let mut io = locked.io(dev)?;
        let def = io.def();
        let (x, w) = (io.input(0)?, io.input(1)?);
        let (ax, n, k) = split(x, self.axis, "axis", What::input(def, 0))?;
        let (_, m, kw) = split(w, self.axis_w, "axis_w", What::input(def, 1))?;
        if kw != k {
            return Err(shape_error(
                What::input(def, 1),
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
            return self.gradient(ctx, &mut io, (n, m, k));
        }
        let b = io.input(2)?;
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
        let y = Out::<f32>::overwrite(io.output(0)?, &y_dims, dev)?;
        ctx.kernels().gemm(
            Gemm {
                relu: self.relu,
                ..gemm((false, true), (n, m, k))
            },
            xi.buffer(),
            wi.buffer(),
            y.buffer(),
            Some(bi.buffer()),
            None,
            None,
        )
    }
}

impl Fc {
    fn gradient(
        &self,
        ctx: &Context,
        io: &mut super::io::Io<'_>,
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
        let dw = Out::<f32>::overwrite(io.output(0)?, w.dims(), dev)?;
        let db = Out::<f32>::overwrite(io.output(1)?, &[m], dev)?;
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
        let dx = match def.outputs.len() {
            3 => Some(Out::<f32>::overwrite(io.output(2)?, x.dims(), dev)?),
            _ => None,
        };
        let kern = ctx.kernels();
        let (xb, wb, dyb) = (xi.buffer(), wi.buffer(), dyi.buffer());
        // db = the column sums of dY: with `db_in_gemm`, written by the dW GEMM's launch
        // (which reads dY as its transposed A), bit for bit the same.
        let db_sum = self.db_in_gemm.then(|| db.buffer());
        kern.gemm(
            gemm((true, false), (m, k, n)),
            dyb,
            xb,
            dw.buffer(),
            None,
            None,
            db_sum,
        )?;
        if !self.db_in_gemm {
            kern.col_sum(n, m, dyb, db.buffer())?;
        }
        if let Some(dx) = &dx {
            let mask = mask.as_ref().map(In::buffer);
            kern.gemm(
                gemm((false, false), (n, k, m)),
                dyb,
                wb,
                dx.buffer(),
                None,
                mask,
                None,
            )?;
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "opencl"))]
mod tests {
    use crate::ops::{create_operator, OperatorDef};
    use crate::tensor::Tensor;
    use crate::{Context, Workspace};

    /// `FCGradient` with `db_in_gemm = 1` queues one kernel launch per GEMM on a device: the
    /// `dW` GEMM's launch also writes `db`; without it, one more for `db`.
    #[test]
    fn fc_gradient_writes_db_in_the_dw_launch() {
        let Some(dev) = crate::testing::opencl_or_skip("fc_gradient_writes_db_in_the_dw_launch")
        else {
            return;
        };
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
            let before = ctx.stream().raw.last_seq();
            op.run(&ws, &ctx).unwrap();
            let queued = ctx.stream().raw.last_seq() - before;
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
