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
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi = *yi + a * xi;
        }
    });
    Ok(())
}

/// `x *= a`.
pub fn scale<F: Float>(a: F, x: &mut [F]) {
    let threaded = x.len() >= THREADED_ELEMENTS;
    for_parts(x, threaded, &|x| {
        for xi in x {
            *xi = *xi * a;
        }
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
        col_sum_part(rows, cols, x, range.start, out);
    });
}

/// Columns `first..first + out.len()` of [`col_sum`].
fn col_sum_part(rows: usize, cols: usize, x: &[f32], first: usize, out: &mut [f32]) {
    const BLOCK: usize = 64;
    let cols_ = cols.max(1);
    for (start, out_block) in (first..).step_by(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let width = out_block.len();
        let mut acc = [0.0f64; BLOCK];
        for row in x.chunks_exact(cols_).take(rows) {
            for (a, &v) in acc.iter_mut().zip(&row[start..start + width]) {
                *a += f64::from(v);
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
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi = if xi > 0.0 { xi } else { 0.0 };
        }
    });
}

/// `y = max(y, 0)` in place.
pub(crate) fn relu_in_place(y: &mut [f32]) {
    let threaded = y.len() >= THREADED_ELEMENTS;
    for_parts(y, threaded, &|y| {
        for v in y {
            // NaN -> 0, as in `relu` and the OpenCL kernel.
            *v = if *v > 0.0 { *v } else { 0.0 };
        }
    });
}

/// `dx = y > 0 ? dy : 0`.
pub(crate) fn relu_grad(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let n = y.len().min(dy.len()).min(dx.len());
    let (y, dy, dx) = (&y[..n], &dy[..n], &mut dx[..n]);
    for_parts((y, dy, dx), n >= THREADED_ELEMENTS, &|(y, dy, dx)| {
        for ((d, &yi), &g) in dx.iter_mut().zip(y).zip(dy) {
            *d = if yi > 0.0 { g } else { 0.0 };
        }
    });
}

/// `dx = y > 0 ? dx : 0` in place (dx holds dY).
pub(crate) fn relu_grad_in_place(y: &[f32], dx: &mut [f32]) {
    let n = y.len().min(dx.len());
    let (y, dx) = (&y[..n], &mut dx[..n]);
    for_parts((y, dx), n >= THREADED_ELEMENTS, &|(y, dx)| {
        for (d, &yi) in dx.iter_mut().zip(y) {
            *d = if yi > 0.0 { *d } else { 0.0 };
        }
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
        // Every length around the blocks of 8 lanes: each element counted once (sums of small
        // integers are exact in any order).
        for n in 0..=41usize {
            let v: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
            let abs: f32 = v.iter().map(|x| x.abs()).sum();
            let sq: f32 = v.iter().map(|x| x * x).sum();
            assert_eq!((asum(&v), sumsq(&v)), (abs, sq), "n = {n}");
        }
        assert!(matches!(
            axpy(1.0, &x, &mut [0.0f32; 2]),
            Err(Error::SizeMismatch { .. })
        ));
    }

    /// Naive reference: C = op(A) op(B).
    fn naive(ta: bool, tb: bool, m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for l in 0..k {
                    let av = if ta { a[l * m + i] } else { a[i * k + l] };
                    let bv = if tb { b[j * k + l] } else { b[l * n + j] };
                    s += av * bv;
                }
                c[i * n + j] = s;
            }
        }
        c
    }

    #[test]
    fn threaded_element_wise_work_gives_the_serial_bits() {
        use crate::backend::cpu::par::THREADED_ELEMENTS;
        // Above the threshold (split between the threads), with a ragged tail.
        let n = 2 * THREADED_ELEMENTS + 5;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y = g.clone();
        axpy(0.3, &x, &mut y).unwrap();
        assert!(y
            .iter()
            .zip(&x)
            .zip(&g)
            .all(|((&v, &a), &b)| v == b + 0.3 * a));
        scale(0.5, &mut y);
        let want: Vec<f32> = x
            .iter()
            .zip(&g)
            .map(|(&a, &b)| (b + 0.3 * a) * 0.5)
            .collect();
        assert_eq!(y, want);
        let relu_of = |v: f32| if v > 0.0 { v } else { 0.0 };
        let mut r = vec![f32::NAN; n];
        relu(&x, &mut r);
        assert!(r.iter().zip(&x).all(|(&v, &a)| v == relu_of(a)));
        let mut r2 = x.clone();
        relu_in_place(&mut r2);
        assert_eq!(r, r2);
        let mut dx = vec![f32::NAN; n];
        relu_grad(&x, &g, &mut dx);
        let mask = |(&a, &b): (&f32, &f32)| if a > 0.0 { b } else { 0.0 };
        assert!(dx.iter().zip(x.iter().zip(&g)).all(|(&v, p)| v == mask(p)));
        let mut dx2 = g.clone();
        relu_grad_in_place(&x, &mut dx2);
        assert_eq!(dx, dx2);
        // Column sums: every column summed over the rows in order, in f64.
        let (rows, cols) = (THREADED_ELEMENTS / 100, 203);
        let m: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.01).sin()).collect();
        let mut out = vec![f32::NAN; cols];
        col_sum(rows, cols, &m, &mut out);
        for (j, &o) in out.iter().enumerate() {
            let s: f64 = (0..rows).map(|i| f64::from(m[i * cols + j])).sum();
            assert_eq!(o, s as f32, "column {j}");
        }
        // The softmax gradient, row by row.
        let (rows, cols) = (THREADED_ELEMENTS / 3 + 7, 3);
        let p: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 / 7.0).collect();
        let labels: Vec<i32> = (0..rows).map(|i| (i % cols) as i32).collect();
        let mut d = vec![f32::NAN; rows * cols];
        softmax_loss_grad(rows, cols, &p, &labels, 2.0, &mut d).unwrap();
        let k = 2.0 / rows as f32;
        for (i, (dr, pr)) in d.chunks(cols).zip(p.chunks(cols)).enumerate() {
            for (j, (&v, &pv)) in dr.iter().zip(pr).enumerate() {
                let hot = if j == labels[i] as usize { 1.0 } else { 0.0 };
                let want = if hot == 1.0 { (pv - 1.0) * k } else { pv * k };
                assert_eq!(v, want, "row {i} column {j}");
            }
        }
    }

    #[test]
    fn gemm_matches_naive_for_every_transpose() {
        // More columns than rows (computed transposed), then more rows than columns.
        for (m, n, k) in [(5, 7, 3), (7, 5, 3)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            for ta in [false, true] {
                for tb in [false, true] {
                    let mut c = vec![f32::NAN; m * n];
                    gemm((ta, tb), (m, n, k), &a, &b, 0.0, &mut c).unwrap();
                    let r = naive(ta, tb, m, n, k, &a, &b);
                    for (x, y) in c.iter().zip(&r) {
                        assert!((x - y).abs() < 1e-5, "{m}x{n} {ta} {tb}: {x} vs {y}");
                    }
                    // beta = 1 adds to what C holds.
                    let mut c: Vec<f32> = (0..m * n).map(|i| i as f32).collect();
                    gemm((ta, tb), (m, n, k), &a, &b, 1.0, &mut c).unwrap();
                    for (i, (x, y)) in c.iter().zip(&r).enumerate() {
                        let want = y + i as f32;
                        assert!((x - want).abs() < 1e-4, "{m}x{n} {ta} {tb} beta 1");
                    }
                }
            }
        }
        let (a, b) = ([1.0f32; 3], [1.0f32; 4]);
        let mut c = vec![0.0; 4];
        assert!(gemm((false, false), (2, 2, 2), &a[..3], &b[..4], 0.0, &mut c).is_err());
        let mut c = vec![2.0; 4];
        gemm((false, false), (2, 2, 0), &[], &[], 0.5, &mut c).unwrap();
        assert_eq!(c, [1.0; 4]);
    }

    #[test]
    fn col_sum_covers_every_column_block() {
        // 150 columns: two full blocks of 64 and a partial one.
        let (rows, cols) = (3, 150);
        let x: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let mut out = vec![f32::NAN; cols];
        col_sum(rows, cols, &x, &mut out);
        for (j, &o) in out.iter().enumerate() {
            let want: f32 = (0..rows).map(|i| (i * cols + j) as f32).sum();
            assert_eq!(o, want, "column {j}");
        }
        let mut none = [7.0f32; 2];
        col_sum(0, 2, &[], &mut none);
        assert_eq!(none, [0.0, 0.0]);
    }

    #[test]
    fn softmax_accuracy_and_labels() {
        let x = [1.0f32, 2.0, 3.0, 1000.0, 0.0, -1000.0];
        let mut p = [0.0f32; 6];
        let loss = softmax_loss(2, 3, &x, &[2, 0], &mut p).unwrap();
        assert!(loss.is_finite() && loss > 0.0);
        assert!((p[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(p[3], 1.0);
        assert_eq!(softmax_loss(2, 3, &x, &[2, 3], &mut p), Err((1, 3)));
        assert_eq!(accuracy(2, 3, 1, &x, &[2, 1]).unwrap(), 0.5);
        assert_eq!(accuracy(2, 3, 2, &x, &[1, 1]).unwrap(), 1.0);
        assert_eq!(
            accuracy(1, 3, 1, &[1.0, 1.0, 0.0], &[1]).unwrap(),
            1.0,
            "ties count"
        );
        assert_eq!(check_labels(&[-1], 3), Err((0, -1)));
    }
}
