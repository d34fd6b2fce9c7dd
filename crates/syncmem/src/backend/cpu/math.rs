//! The host math: plain loops over slices, and for GEMM this crate's own on x86-64 CPUs with
//! AVX-512F or AVX2 (`super::gemm`: no operand copied whole, no heap allocation in a steady
//! state), else `matrixmultiply`. The `cpu` backend's kernels run these over the `cpu` device's
//! memory; parameter blobs whose head is at the host run the BLAS-1 functions on their host
//! mirrors (re-exported as [`crate::kernels::host`]).
//!
//! Sums (asum, sumsq, column sums, losses) are accumulated in `f64`, then rounded once.
//!
//! With its own GEMM, `syncmem train --device cpu` epochs (median of 3, three interleaved runs,
//! 2-core AVX-512 VM) took 61-64 ms at hidden 1024 against 81-85 ms with `matrixmultiply`,
//! 9.0-9.9 ms against 10.2-10.6 at 256, and 1.5-1.7 ms against 1.5 at 64, with no heap
//! allocation per step against 8 (`matrixmultiply`'s packing buffers).
//!
//! `matrixmultiply` is built with its `threading` feature: a GEMM large enough for it (its own
//! size heuristic) runs on up to as many threads as the machine has physical cores
//! (`MATMUL_NUM_THREADS` caps it), and `gemm` hands it the transposed problem when C has
//! fewer rows than columns (see there). Measured on 2 cores, `syncmem train --device cpu`
//! epoch time (median of 5, interleaved): hidden 1024 230 ms on one thread, 192-209 ms with
//! threading, 146 ms with threading on the transposed problem; hidden 256 12.6-17 -> 13.5 ms;
//! hidden 64 unchanged (2.2-2.7 ms).
//!
//! Element-wise work of at least 64K elements (axpy, scale, ReLU and its
//! gradient, column sums, the softmax gradient) is split between the same threads as the
//! GEMM (see `super::par`); each element is computed by the same code in every part, so the
//! results are the serial ones bit for bit (tested). Measured on the 2-core VM: an axpy of 1M
//! floats 86.5 -> 44.0 µs, of 64K floats 4.5 -> 3.1 µs, of 16K unchanged (below the
//! threshold); `syncmem train --device cpu --hidden 1024` epochs 98-101 -> 83-87 ms (three
//! interleaved runs, same loss bit for bit), hidden 256 and 64 unchanged. The losses and the
//! accuracy stay on the calling thread (their sums would depend on where the work is cut).

use super::par::{for_parts, Rows, THREADED_ELEMENTS};
use super::wide::{wide, width, Width};
use crate::backend::BadLabel;
use crate::dtype::Float;
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
    let threaded = y.len() >= THREADED_ELEMENTS;
    for_parts((x, y), threaded, &|(x, y)| {
        wide(|| {
            for (yi, &xi) in y.iter_mut().zip(x) {
                *yi = *yi + a * xi;
            }
        })
    });
    Ok(())
}

/// `x *= a`.
pub fn scale<F: Float>(a: F, x: &mut [F]) {
    let threaded = x.len() >= THREADED_ELEMENTS;
    for_parts(x, threaded, &|x| {
        wide(|| {
            for xi in x {
                *xi = *xi * a;
            }
        })
    });
}

/// Independent `f64` sums of [`lane_sum`].
const LANES: usize = 8;

/// The `f64` sum of `f(x[i])` in [`LANES`] lanes, lane `k` summing elements `k`, `k + 8`, ...
/// of the blocks of 8, then the lanes added by halves and the last elements one by one:
/// eight additions in flight instead of one chain of dependent ones, which the compiler turns
/// into vector additions. The order is fixed by the length alone, so every call on the same
/// values gives the same bits.
#[inline]
fn lane_sum<F: Float>(x: &[F], f: impl Fn(F) -> f64) -> f64 {
    let mut lanes = [0f64; LANES];
    let blocks = x.chunks_exact(LANES);
    let rest = blocks.remainder();
    for b in blocks {
        for (l, &v) in lanes.iter_mut().zip(b) {
            *l += f(v);
        }
    }
    // Halves added lane by lane: 8 -> 4 -> 2 -> 1.
    let l = lanes;
    let h = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let mut sum = (h[0] + h[2]) + (h[1] + h[3]);
    for &v in rest {
        sum += f(v);
    }
    sum
}

/// `sum |x[i]|`.
pub fn asum<F: Float>(x: &[F]) -> F {
    F::from_f64(lane_sum(x, |v| v.abs().to_f64()))
}

/// `sum x[i]^2`.
pub fn sumsq<F: Float>(x: &[F]) -> F {
    F::from_f64(lane_sum(x, |v| {
        let d = v.to_f64();
        d * d
    }))
}

/// `C[m,n] = op(A)·op(B) + beta·C`, with `op(A)[i,l] = ta ? A[l*m + i] : A[i*k + l]` and
/// `op(B)[l,j] = tb ? B[j*k + l] : B[l*n + j]` (row-major storage). `beta == 0` does not read
/// `C`.
///
/// # Errors
/// [`Error::SizeMismatch`] when a slice does not hold exactly its matrix;
/// [`Error::SizeOverflow`].
pub(crate) fn gemm(
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) -> Result<()> {
    check_gemm((m, n, k), (a.len(), b.len(), c.len()))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if beta == 0.0 {
            c.fill(0.0);
        } else {
            c.iter_mut().for_each(|v| *v *= beta);
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if super::gemm::gemm((ta, tb), (m, n, k), a, b, beta, c) {
        return Ok(());
    }
    // SAFETY: every operand holds exactly its matrix (checked above), and m, n, k > 0.
    unsafe { portable_gemm((ta, tb), (m, n, k), a, b, beta, c) };
    Ok(())
}

/// Checks that the operands of a GEMM of `(m, n, k)` hold exactly their matrices (lengths of
/// A, B and C in elements).
fn check_gemm((m, n, k): (usize, usize, usize), (a, b, c): (usize, usize, usize)) -> Result<()> {
    let size = |r: usize, s: usize, what: &str| {
        r.checked_mul(s).ok_or_else(|| Error::SizeOverflow {
            what: format!("GEMM {what}: {r} * {s}"),
        })
    };
    let check = |have: usize, want: usize, what: &str| {
        if have == want {
            return Ok(());
        }
        Err(Error::SizeMismatch {
            what: format!("cpu GEMM operand {what} (m={m}, n={n}, k={k}, in f32)"),
            expected: want.saturating_mul(4),
            actual: have.saturating_mul(4),
        })
    };
    check(a, size(m, k, "A")?, "A")?;
    check(b, size(k, n, "B")?, "B")?;
    check(c, size(m, n, "C")?, "C")
}

/// [`gemm`] through matrixmultiply, on any architecture.
///
/// # Safety
/// `a`, `b` and `c` hold exactly their matrices (`m*k`, `k*n` and `m*n` elements).
unsafe fn portable_gemm(
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    // Strides in elements. Every slice is at most isize::MAX bytes, so its dimensions fit.
    let (m_i, n_i, k_i) = (m as isize, n as isize, k as isize);
    let (rsa, csa) = if ta { (1, m_i) } else { (k_i, 1) };
    let (rsb, csb) = if tb { (1, k_i) } else { (n_i, 1) };
    // With fewer rows than columns (a batch of 64 against a wide layer), compute the same
    // numbers as Cᵀ = op(B)ᵀ·op(A)ᵀ (operands swapped, strides swapped, C written
    // column-major): matrixmultiply splits its threads over blocks of rows, and 64 rows make
    // one block, while the transposed problem has as many rows as the layer is wide. Measured
    // on 2 cores at 64 x 1024 x 1024: 99-111 -> 172-185 GFLOP/s; at 64 x 256 x 256:
    // 82-89 -> 132-150.
    let swap = n > m;
    // SAFETY: `a` holds exactly m*k elements (the contract) and is read at i*rsa + l*csa for i < m, l < k,
    // which is below m*k for both layouts; likewise `b` (k*n elements, l < k, j < n) and `c`
    // (m*n elements, written at i*n + j, in either order of the loops). `c` is a `&mut`
    // borrow, so it aliases neither `a` nor `b`. matrixmultiply does not keep the pointers
    // after returning.
    unsafe {
        if swap {
            matrixmultiply::sgemm(
                n,
                k,
                m,
                1.0,
                b.as_ptr(),
                csb,
                rsb,
                a.as_ptr(),
                csa,
                rsa,
                beta,
                c.as_mut_ptr(),
                1,
                n_i,
            );
        } else {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                beta,
                c.as_mut_ptr(),
                n_i,
                1,
            );
        }
    }
}

/// `out[j] = sum_i x[i*cols + j]`, accumulated in `f64`, a block of columns at a time on the
/// stack (no allocation); the columns are split between the threads from 64K elements of
/// `x`.
pub(crate) fn col_sum(rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let n = cols.min(out.len());
    let threaded = rows.saturating_mul(cols) >= THREADED_ELEMENTS;
    for_parts((&mut out[..n], 0..n), threaded, &|(out, range)| {
        let args = (rows, cols, x, range.start, out);
        match width() {
            // SAFETY: the CPU has AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Width::Avx512 => unsafe { col_sum_avx512(args) },
            // SAFETY: the CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            Width::Avx2 => unsafe { col_sum_avx2(args) },
            _ => col_sum_part(args),
        }
    });
}

/// Rows, columns, `x`, first column and the sums of [`col_sum_part`].
type ColSum<'a> = (usize, usize, &'a [f32], usize, &'a mut [f32]);

/// [`col_sum_part`] built for AVX-512F (8 sums a vector).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn col_sum_avx512(args: ColSum<'_>) {
    col_sum_part(args);
}

/// [`col_sum_part`] built for AVX2 (4 sums a vector).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn col_sum_avx2(args: ColSum<'_>) {
    col_sum_part(args);
}

/// Columns `first..first + out.len()` of [`col_sum`].
#[inline(always)]
fn col_sum_part((rows, cols, x, first, out): ColSum<'_>) {
    const BLOCK: usize = 64;
    let cols_ = cols.max(1);
    for (start, out_block) in (first..).step_by(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let width = out_block.len();
        let mut acc = [0.0f64; BLOCK];
        for row in x.chunks_exact(cols_).take(rows) {
            let row = &row[start..start + width];
            if let Ok(row) = <&[f32; BLOCK]>::try_from(row) {
                // A whole block: a loop of a fixed length, which the compiler keeps in
                // vector registers (the same sums in the same order).
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += f64::from(v);
                }
            } else {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += f64::from(v);
                }
            }
        }
        for (o, a) in out_block.iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
}

/// `y = max(x, 0)`.
pub(crate) fn relu(x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    for_parts((x, y), n >= THREADED_ELEMENTS, &|(x, y)| {
        wide(|| {
            for (yi, &xi) in y.iter_mut().zip(x) {
                *yi = if xi > 0.0 { xi } else { 0.0 };
            }
        })
    });
}

/// `y = max(y, 0)` in place.
pub(crate) fn relu_in_place(y: &mut [f32]) {
    let threaded = y.len() >= THREADED_ELEMENTS;
    for_parts(y, threaded, &|y| {
        wide(|| {
            for v in y {
                // NaN -> 0, as in `relu` and the OpenCL kernel.
                *v = if *v > 0.0 { *v } else { 0.0 };
            }
        })
    });
}

/// `dx = y > 0 ? dy : 0`.
pub(crate) fn relu_grad(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let n = y.len().min(dy.len()).min(dx.len());
    let (y, dy, dx) = (&y[..n], &dy[..n], &mut dx[..n]);
    for_parts((y, dy, dx), n >= THREADED_ELEMENTS, &|(y, dy, dx)| {
        wide(|| {
            for ((d, &yi), &g) in dx.iter_mut().zip(y).zip(dy) {
                *d = if yi > 0.0 { g } else { 0.0 };
            }
        })
    });
}

/// `dx = y > 0 ? dx : 0` in place (dx holds dY).
pub(crate) fn relu_grad_in_place(y: &[f32], dx: &mut [f32]) {
    let n = y.len().min(dx.len());
    let (y, dx) = (&y[..n], &mut dx[..n]);
    for_parts((y, dx), n >= THREADED_ELEMENTS, &|(y, dx)| {
        wide(|| {
            for (d, &yi) in dx.iter_mut().zip(y) {
                *d = if yi > 0.0 { *d } else { 0.0 };
            }
        })
    });
}

/// Checks that every label is a class index below `classes`; the error is the first row whose
/// label is not, and its label.
///
/// # Errors
/// `(row, label)` of the first label out of range.
pub fn check_labels(labels: &[i32], classes: usize) -> std::result::Result<(), BadLabel> {
    match labels
        .iter()
        .enumerate()
        .find(|(_, &l)| usize::try_from(l).map_or(true, |l| l >= classes))
    {
        Some((i, &l)) => Err((i, l)),
        None => Ok(()),
    }
}

/// Row-wise softmax of `x` (`rows × cols`) into `p`; returns the mean cross-entropy against
/// `labels` (0 for no rows). The row maximum is subtracted first and the loss of a row is
/// `log(sum exp(x - max)) - (x[label] - max)`, which never takes `log(0)`.
pub(crate) fn softmax_loss(
    rows: usize,
    cols: usize,
    x: &[f32],
    labels: &[i32],
    p: &mut [f32],
) -> std::result::Result<f32, BadLabel> {
    check_labels(&labels[..rows.min(labels.len())], cols)?;
    if rows == 0 {
        return Ok(0.0);
    }
    let mut total = 0.0f64;
    for ((xr, pr), &l) in x
        .chunks_exact(cols)
        .zip(p.chunks_exact_mut(cols))
        .zip(labels)
    {
        let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0f32;
        for (pj, &xj) in pr.iter_mut().zip(xr) {
            let e = (xj - m).exp();
            *pj = e;
            s += e;
        }
        let inv = 1.0 / s;
        pr.iter_mut().for_each(|v| *v *= inv);
        let l = l as usize; // checked above
        total += f64::from(s.ln() - (xr[l] - m));
    }
    Ok((total / rows as f64) as f32)
}

/// `dx = (p - onehot(labels)) * dloss / rows`.
pub(crate) fn softmax_loss_grad(
    rows: usize,
    cols: usize,
    p: &[f32],
    labels: &[i32],
    dloss: f32,
    dx: &mut [f32],
) -> std::result::Result<(), BadLabel> {
    check_labels(&labels[..rows.min(labels.len())], cols)?;
    if rows == 0 {
        return Ok(());
    }
    let scale = dloss / rows as f32;
    let n = rows
        .min(labels.len())
        .min(p.len() / cols)
        .min(dx.len() / cols);
    let parts = (
        Rows {
            s: &p[..n * cols],
            cols,
        },
        Rows {
            s: &mut dx[..n * cols],
            cols,
        },
        &labels[..n],
    );
    for_parts(parts, n * cols >= THREADED_ELEMENTS, &|(p, dx, labels)| {
        for ((pr, dr), &l) in
            p.s.chunks_exact(cols)
                .zip(dx.s.chunks_exact_mut(cols))
                .zip(labels)
        {
            for (d, &v) in dr.iter_mut().zip(pr) {
                *d = v * scale;
            }
            dr[l as usize] = (pr[l as usize] - 1.0) * scale;
        }
    });
    Ok(())
}

/// Fraction of rows in which fewer than `top_k` scores are strictly greater than the label's
/// (Caffe2's rule); 0 for no rows.
pub(crate) fn accuracy(
    rows: usize,
    cols: usize,
    top_k: usize,
    x: &[f32],
    labels: &[i32],
) -> std::result::Result<f32, BadLabel> {
    check_labels(&labels[..rows.min(labels.len())], cols)?;
    if rows == 0 {
        return Ok(0.0);
    }
    let correct = x
        .chunks_exact(cols)
        .zip(labels)
        .filter(|(xr, &l)| {
            let v = xr[l as usize];
            xr.iter().filter(|&&s| s > v).take(top_k).count() < top_k
        })
        .count();
    Ok((correct as f64 / rows as f64) as f32)
}

#[cfg(test)]
#[path = "math_tests.rs"]
mod tests;
