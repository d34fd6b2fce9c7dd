//! `Adam`: Caffe2's `Adam` (Kingma and Ba's update), in place.
//!
//! ```text
//! m' = β1 · m + (1 − β1) · grad
//! v' = β2 · v + (1 − β2) · grad²
//! param −= lr · sqrt(1 − β2^t) / (1 − β1^t) · m' / (sqrt(v') + ε)
//! ```
//!
//! Inputs `[param, grad, m, v]` per parameter, outputs none or `[param, m, v]` per parameter;
//! arguments `lr` (required, at least 0), `beta1` (0.9) and `beta2` (0.999), each in
//! `[0, 1)`, `epsilon` (1e-8, above 0).
//!
//! The iteration count `t` of the bias correction is the operator's own: its runs, counted
//! from 1 (Caffe2 reads it from an `iter` blob). The learning rate with the correction is
//! computed once per run on the host, in `f64`, and handed to the kernel as one scalar. An
//! operator built again (a net created again) counts from 1 again, whatever its moments hold.

use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::LazyLock;

use smallvec::{smallvec, SmallVec};

use syncmem::device::UserKernel;
use syncmem::kernels::Arg;
use syncmem::ops::{Operator, OperatorDef};
use syncmem::{Device, Result};

use super::{arg_in, build, first_n, short, Rule};

/// Two states per parameter: the first and second moments.
pub(super) const STATES: usize = 2;

/// `adam_update(p, g, m, v, n, beta, epsilon, lr_t)`, `beta` a `float2` of β1 and β2.
static KERNEL: LazyLock<UserKernel> = LazyLock::new(|| {
    const NAME: &str = "adam_update";
    UserKernel::new(NAME)
        .with_opencl(include_str!("adam.cl"))
        // The host closure's division and square root are correctly rounded; OpenCL's need not
        // be without this option (a GPU's may be off by an ulp or two).
        .with_opencl_options("-cl-fp32-correctly-rounded-divide-sqrt")
        .with_cuda(include_str!("adam.cu"))
        .with_host(|a| {
            let n = a.u32(4)? as usize;
            let beta = a.bytes(5)?;
            let [b1, b2] = match bytemuck::try_pod_read_unaligned::<[f32; 2]>(beta) {
                Ok(b) => b,
                Err(_) => return Err(short(NAME, 5, 2)),
            };
            let (eps, lr_t) = (a.f32(6)?, a.f32(7)?);
            let p = first_n(a.output::<f32>(0)?, NAME, 0, n)?;
            let g = a.input::<f32>(1)?;
            let m = first_n(a.output::<f32>(2)?, NAME, 2, n)?;
            let v = first_n(a.output::<f32>(3)?, NAME, 3, n)?;
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                let mi = b1 * *m + (1.0 - b1) * g;
                let vi = b2 * *v + (1.0 - b2) * g * g;
                *m = mi;
                *v = vi;
                *p -= lr_t * mi / (vi.sqrt() + eps);
            }
            Ok(())
        })
});

struct Adam {
    lr: f32,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
    /// β1 and β2 as the kernel's `float2`.
    beta: [u8; 8],
}

impl Rule for Adam {
    const STATES: usize = STATES;

    fn kernel() -> &'static UserKernel {
        &KERNEL
    }

    fn scalars(&self, t: u64) -> SmallVec<[Arg<'_>; 4]> {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let (b1, b2) = (f64::from(self.beta1), f64::from(self.beta2));
        let correction = (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        let lr_t = (f64::from(self.lr) * correction) as f32;
        smallvec![Arg::bytes(&self.beta), self.epsilon.into(), lr_t.into()]
    }
}

pub(crate) fn build_adam(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    build(def, device, &["lr", "beta1", "beta2", "epsilon"], |args| {
        let unit = (Included(0.0), Excluded(1.0));
        let beta1 = arg_in(def, args, "beta1", Some(0.9), unit, "in [0, 1)")?;
        let beta2 = arg_in(def, args, "beta2", Some(0.999), unit, "in [0, 1)")?;
        Ok(Adam {
            lr: arg_in(
                def,
                args,
                "lr",
                None,
                (Included(0.0), Unbounded),
                "at least 0",
            )?,
            beta1,
            beta2,
            epsilon: arg_in(
                def,
                args,
                "epsilon",
                Some(1e-8),
                (Excluded(0.0), Unbounded),
                "above 0",
            )?,
            beta: bytemuck::cast([beta1, beta2]),
        })
    })
}
