//! `MomentumSGD`: Caffe2's `MomentumSGDUpdate`, in place.
//!
//! ```text
//! m' = momentum · m + lr · grad
//! param −= m'                                   (nesterov = 0)
//! param −= (1 + momentum) · m' − momentum · m   (nesterov = 1)
//! ```
//!
//! Inputs `[param, grad, momentum]` per parameter, outputs none or `[param, momentum]` per
//! parameter; arguments `lr` (required, at least 0), `momentum` (0.9, in `[0, 1)`),
//! `nesterov` (0 or 1; 0). Unlike Caffe2's, the gradient is left as it is (Caffe2 writes the
//! adjusted gradient back into it).

use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::LazyLock;

use smallvec::{smallvec, SmallVec};

use syncmem::device::UserKernel;
use syncmem::kernels::Arg;
use syncmem::ops::{invalid_def as invalid, Operator, OperatorDef};
use syncmem::{Device, Result};

use super::{arg_in, build, first_n, Rule};

/// One state per parameter: the momentum.
pub(super) const STATES: usize = 1;

/// `momentum_sgd_update(p, g, m, n, lr, momentum, nesterov)`.
static KERNEL: LazyLock<UserKernel> = LazyLock::new(|| {
    const NAME: &str = "momentum_sgd_update";
    UserKernel::new(NAME)
        .with_opencl(include_str!("momentum.cl"))
        .with_cuda(include_str!("momentum.cu"))
        .with_host(|a| {
            let n = a.u32(3)? as usize;
            let (lr, mu, nesterov) = (a.f32(4)?, a.f32(5)?, a.i32(6)? != 0);
            let p = first_n(a.output::<f32>(0)?, NAME, 0, n)?;
            let g = a.input::<f32>(1)?;
            let m = first_n(a.output::<f32>(2)?, NAME, 2, n)?;
            for ((p, &g), m) in p.iter_mut().zip(g).zip(m) {
                let mi = *m;
                let mn = mu * mi + lr * g;
                *m = mn;
                *p -= if nesterov {
                    (1.0 + mu) * mn - mu * mi
                } else {
                    mn
                };
            }
            Ok(())
        })
});

struct Momentum {
    lr: f32,
    momentum: f32,
    nesterov: bool,
}

impl Rule for Momentum {
    const STATES: usize = STATES;

    fn kernel() -> &'static UserKernel {
        &KERNEL
    }

    fn scalars(&self, _t: u64) -> SmallVec<[Arg<'_>; 4]> {
        smallvec![
            self.lr.into(),
            self.momentum.into(),
            i32::from(self.nesterov).into()
        ]
    }
}

pub(crate) fn build_momentum_sgd(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    build(def, device, &["lr", "momentum", "nesterov"], |args| {
        let lr = arg_in(
            def,
            args,
            "lr",
            None,
            (Included(0.0), Unbounded),
            "at least 0",
        )?;
        let momentum = arg_in(
            def,
            args,
            "momentum",
            Some(0.9),
            (Included(0.0), Excluded(1.0)),
            "in [0, 1)",
        )?;
        let nesterov = match args.i64_or("nesterov", 0)? {
            0 => false,
            1 => true,
            other => {
                return Err(invalid(
                    def,
                    format!("argument \"nesterov\" must be 0 or 1, got {other}"),
                ))
            }
        };
        Ok(Momentum {
            lr,
            momentum,
            nesterov,
        })
    })
}
