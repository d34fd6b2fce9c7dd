//! Element-wise loops compiled for the widest vectors of this CPU: [`wide`] runs a loop inside
//! a function built with AVX-512F (else AVX2) where the CPU has them, so that the compiler
//! turns it into 16 (8) lanes a step instead of the baseline's 4.
//!
//! The loop computes the same operations on every element, in the same order, whatever the
//! vectors' width: its results are the baseline's bit for bit. Only `avx512f` and `avx2` are
//! enabled, never `fma`: a multiply and an add stay two roundings, as in the baseline.
//!
//! Measured (callgrind, `syncmem train --device cpu` at hidden 64, AVX2 under valgrind, which
//! has no AVX-512): the column sums of the bias gradients 27.4K -> 8.8K instructions a step,
//! the ReLU 9.2K -> 2.9K, its gradient 15.4K -> 2.9K, the SGD update 7.6K -> 2.6K.

use std::sync::OnceLock;

/// The vector extensions [`wide`] may use on this CPU.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Width {
    /// AVX-512F.
    Avx512,
    /// AVX2.
    Avx2,
    /// Neither: the baseline's vectors.
    Baseline,
}

/// The widest vectors [`wide`] uses on this CPU (found once).
pub(crate) fn width() -> Width {
    static WIDTH: OnceLock<Width> = OnceLock::new();
    *WIDTH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Width::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return Width::Avx2;
            }
        }
        Width::Baseline
    })
}

/// Runs `f`, compiled with AVX-512F or AVX2 where the CPU has them (`f` is inlined into a
/// function built for them; the compiler declines that for a large `f`, such as a fully
/// unrolled loop: such a loop is a function marked `#[inline(always)]`, called from
/// functions of its own built for each [`Width`], as `math::col_sum` does).
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match width() {
        // SAFETY: the CPU has AVX-512F (detected above).
        Width::Avx512 => return unsafe { with_avx512(f) },
        // SAFETY: the CPU has AVX2 (detected above).
        Width::Avx2 => return unsafe { with_avx2(f) },
        Width::Baseline => {}
    }
    f()
}

/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loops_give_the_baseline_bits() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let axpy = |y: &mut [f32]| {
            for (yi, &xi) in y.iter_mut().zip(&x) {
                *yi += 0.3 * xi;
            }
        };
        let mut base: Vec<f32> = x.iter().map(|v| v * 0.5 - 1.0).collect();
        let mut w = base.clone();
        axpy(&mut base);
        wide(|| axpy(&mut w));
        assert_eq!(
            base.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            w.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
