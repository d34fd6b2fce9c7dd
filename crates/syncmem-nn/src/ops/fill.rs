//! Fill operators: `ConstantFill`, `UniformFill`, `GaussianFill`, `XavierFill`, `MSRAFill`.
//!
//! Random values are drawn on the host from the context's seeded generator, in element order,
//! and written to the device once, so equal seeds give identical tensors on every backend. On
//! the `cpu` device they are drawn straight into its memory; elsewhere into a host vector that is
//! uploaded with one blocking write. `ConstantFill` of `float` runs a fill kernel on OpenCL and
//! CUDA.

use rand::Rng;

use syncmem::kernels;
use syncmem::ops::{
    check_context, invalid_def as invalid, with_io, Args, Operand as What, Operator, OperatorDef,
};
use syncmem::{Context, Device, Result, Workspace};

use super::access::{shape_error, Out};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Constant(f32),
    ConstantInt(i32),
    Uniform { min: f32, max: f32 },
    Gaussian { mean: f32, std: f32 },
    Xavier,
    Msra,
}

struct Fill {
    def: OperatorDef,
    device: Device,
    shape: Option<Vec<usize>>,
    kind: Kind,
}

fn common(def: &OperatorDef, device: &Device, extra: &[&str], kind: Kind) -> Result<Fill> {
    let mut known = vec!["shape"];
    known.extend_from_slice(extra);
    let args = Args::check(def, (0, 1), (1, 1), &known)?;
    let shape = args.dims("shape")?;
    if shape.is_none() && def.inputs.is_empty() {
        return Err(invalid(
            def,
            "needs a \"shape\" argument or an input to take the shape from".into(),
        ));
    }
    if shape.is_some() && !def.inputs.is_empty() {
        return Err(invalid(
            def,
            "takes its shape from the \"shape\" argument or from its input, not both".into(),
        ));
    }
    Ok(Fill {
        def: def.clone(),
        device: device.clone(),
        shape,
        kind,
    })
}

pub(crate) fn build_constant(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (0, 1), (1, 1), &["shape", "value", "dtype"])?;
    let value = args.f32_or("value", 0.0)?;
    let kind = match args.str_or("dtype", "float")? {
        "float" | "float32" | "f32" => Kind::Constant(value),
        "int32" | "int" | "i32" => {
            if value.fract() != 0.0 || value < i32::MIN as f32 || value > i32::MAX as f32 {
                return Err(invalid(
                    def,
                    format!("value {value} is not an int32 (dtype \"int32\")"),
                ));
            }
            Kind::ConstantInt(value as i32)
        }
        other => {
            return Err(invalid(
                def,
                format!("dtype {other:?} is not supported (\"float\" or \"int32\")"),
            ))
        }
    };
    Ok(Box::new(common(def, device, &["value", "dtype"], kind)?))
}

pub(crate) fn build_uniform(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (0, 1), (1, 1), &["shape", "min", "max"])?;
    let (min, max) = (args.f32_or("min", 0.0)?, args.f32_or("max", 1.0)?);
    if min > max {
        return Err(invalid(def, format!("min {min} is above max {max}")));
    }
    let kind = Kind::Uniform { min, max };
    Ok(Box::new(common(def, device, &["min", "max"], kind)?))
}

pub(crate) fn build_gaussian(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    let args = Args::check(def, (0, 1), (1, 1), &["shape", "mean", "std"])?;
    let (mean, std) = (args.f32_or("mean", 0.0)?, args.f32_or("std", 1.0)?);
    if std < 0.0 {
        return Err(invalid(def, format!("std {std} is negative")));
    }
    let kind = Kind::Gaussian { mean, std };
    Ok(Box::new(common(def, device, &["mean", "std"], kind)?))
}

pub(crate) fn build_xavier(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    Ok(Box::new(common(def, device, &[], Kind::Xavier)?))
}

pub(crate) fn build_msra(def: &OperatorDef, device: &Device) -> Result<Box<dyn Operator>> {
    Ok(Box::new(common(def, device, &[], Kind::Msra)?))
}

/// Standard normal values by the Box-Muller transform (rand's `StdRng` has no normal
/// distribution without `rand_distr`), two per pair of uniforms.
fn gaussian(rng: &mut impl Rng, mean: f32, std: f32, out: &mut [f32]) {
    let mut pairs = out.chunks_mut(2);
    for pair in &mut pairs {
        // u1 in (0, 1]: ln(u1) is finite.
        let u1 = 1.0 - rng.random::<f64>();
        let u2 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        let z = [r * t.cos(), r * t.sin()];
        for (o, z) in pair.iter_mut().zip(z) {
            *o = (f64::from(mean) + f64::from(std) * z) as f32;
        }
    }
}

fn uniform(rng: &mut impl Rng, min: f32, max: f32, out: &mut [f32]) {
    let span = f64::from(max) - f64::from(min);
    for o in out {
        let v = f64::from(min) + span * rng.random::<f64>();
        *o = (v as f32).clamp(min, max);
    }
}

impl Fill {
    /// The random distribution of this fill for `dims`, as a generator into a slice.
    fn generate(&self, dims: &[usize], ctx: &Context, out: &mut [f32]) -> Result<()> {
        let what = What::output(&self.def, 0);
        let numel = out.len();
        let mut rng = ctx.rng();
        match self.kind {
            Kind::Constant(v) => out.fill(v),
            Kind::ConstantInt(_) => {}
            Kind::Uniform { min, max } => uniform(&mut *rng, min, max, out),
            Kind::Gaussian { mean, std } => gaussian(&mut *rng, mean, std, out),
            Kind::Xavier if numel > 0 => {
                // Caffe2: fan_in = size / dim(0).
                let d0 = dims.first().copied().unwrap_or(0);
                if d0 == 0 {
                    return Err(shape_error(what, dims, "XavierFill needs dims[0]".into()));
                }
                let scale = (3.0 / (numel / d0) as f64).sqrt() as f32;
                uniform(&mut *rng, -scale, scale, out);
            }
            Kind::Msra if numel > 0 => {
                // Caffe2: fan_out = size / dim(1).
                let d1 = dims.get(1).copied().unwrap_or(0);
                if d1 == 0 {
                    return Err(shape_error(what, dims, "MSRAFill needs dims[1]".into()));
                }
                let std = (2.0 / (numel / d1) as f64).sqrt() as f32;
                gaussian(&mut *rng, 0.0, std, out);
            }
            Kind::Xavier | Kind::Msra => {}
        }
        Ok(())
    }
}

impl Operator for Fill {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let dev = ctx.device();
        with_io(ws, &self.def, dev, &[], |io| {
            let dims = match &self.shape {
                Some(s) => s.clone(),
                None => io.input(0)?.dims().to_vec(),
            };
            let t = io.output(0)?;
            let what = What::output(&self.def, 0);
            if let Kind::ConstantInt(v) = self.kind {
                let mut out = Out::<i32>::overwrite(t, &dims, dev)?;
                if let Some(values) = out.host_view_mut()? {
                    values.fill(v);
                    return Ok(());
                }
                return out.upload(&vec![v; out.len()], what);
            }
            let mut out = Out::<f32>::overwrite(t, &dims, dev)?;
            if let Kind::Constant(v) = self.kind {
                return kernels::fill(ctx.stream(), out.len(), v, out.dst());
            }
            // Memory the host addresses directly (the `cpu` device, zero-copy memory) gets its
            // values in place; elsewhere they are drawn into a host vector and uploaded with one
            // write.
            if let Some(values) = out.host_view_mut()? {
                return self.generate(&dims, ctx, values);
            }
            let mut values = vec![0.0f32; out.len()];
            self.generate(&dims, ctx, &mut values)?;
            out.upload(&values, what)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn distributions_have_the_right_moments() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut v = vec![0.0f32; 20001];
        gaussian(&mut rng, 2.0, 0.5, &mut v);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 2.0).abs() < 0.02 && (var.sqrt() - 0.5).abs() < 0.02);
        uniform(&mut rng, -1.0, 3.0, &mut v);
        assert!(v.iter().all(|&x| (-1.0..=3.0).contains(&x)));
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        assert!((mean - 1.0).abs() < 0.05);
        uniform(&mut rng, 1.0, 1.0, &mut v);
        assert!(v.iter().all(|&x| x == 1.0));
    }
}
