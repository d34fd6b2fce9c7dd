//! The host versions of the kernels: plain loops over slices (Caffe's CPU BLAS calls).
//!
//! Sums are accumulated in `f64` whatever the element type, then rounded once.

use super::Float;
use crate::error::{Error, Result};

/// `y += a * x`.
///
/// # Errors
/// [`Error::SizeMismatch`] when `x` and `y` have different lengths.
pub fn axpy<F: Float>(a: F, x: &[F], y: &mut [F]) -> Result<()> {
    if x.len() != y.len() {
        return Err(Error::SizeMismatch {
            what: format!(
                "host axpy<{}>: x has {} elements, y has {}",
                F::KIND,
                x.len(),
                y.len()
            ),
            expected: std::mem::size_of_val(y),
            actual: std::mem::size_of_val(x),
        });
    }
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = *yi + a * xi;
    }
    Ok(())
}

/// `x *= a`.
pub fn scale<F: Float>(a: F, x: &mut [F]) {
    for xi in x {
        *xi = *xi * a;
    }
}

/// `sum |x[i]|`.
pub fn asum<F: Float>(x: &[F]) -> F {
    F::from_f64(x.iter().map(|v| v.abs().to_f64()).sum())
}

/// `sum x[i]^2`.
pub fn sumsq<F: Float>(x: &[F]) -> F {
    F::from_f64(
        x.iter()
            .map(|v| {
                let d = v.to_f64();
                d * d
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_kernels() {
        let x = [1.0f32, -2.0, 3.0];
        let mut y = [1.0f32, 1.0, 1.0];
        axpy(2.0, &x, &mut y).unwrap();
        assert_eq!(y, [3.0, -3.0, 7.0]);
        scale(-1.0, &mut y);
        assert_eq!(y, [-3.0, 3.0, -7.0]);
        assert_eq!(asum(&x), 6.0);
        assert_eq!(sumsq(&x), 14.0);
        assert_eq!(asum::<f64>(&[]), 0.0);
        assert!(matches!(
            axpy(1.0, &x, &mut [0.0f32; 2]),
            Err(Error::SizeMismatch { .. })
        ));
    }
}
