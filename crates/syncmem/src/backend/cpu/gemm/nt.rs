//! The `nt` product (`Y = X·Wᵀ`, both operands along the reduction) as dot products.

use super::kernel::store;
use super::{on_threads, share, Problem};

/// Rows of A and of B in a tile of the `nt` product (`DR x DR` dot products).
const DR: usize = 4;

/// Runs the `nt` product `C = A·Bᵀ` of `p` (`A[m,k]` and `B[n,k]`, both rows contiguous along
/// the reduction: `rsa = rsb = k`) as dot products: a tile of [`DR`] rows of A against `DR`
/// rows of B sums `DR x DR` vectors of 16 products along k, then adds each vector up. Nothing
/// is copied. Each thread takes a range of B's rows (of W's: each reads its part of W once)
/// and meets it with every row of A, which stays in cache.
pub(super) fn run_nt(p: &Problem) {
    on_threads(p, &|t, parts| {
        let (lo, hi) = share((t, parts), p.n.div_ceil(DR), DR, p.n);
        // SAFETY: rows lo..hi of B and every row of A lie inside the slices `gemm`'s caller
        // checked; this thread alone writes columns lo..hi of C; `isa()` found AVX-512F.
        unsafe { nt_part(p, (lo, hi)) };
    });
}

/// Rows of A a thread meets with all of its rows of B before the next ones (256 KiB at
/// k = 1024: they stay in the core's cache while its rows of B stream past; an evaluation of
/// 3000 samples at once would otherwise read W once per 4 rows from memory).
const BLOCK_ROWS: usize = 64;

/// Columns `cols.0..cols.1` of the `nt` product `p`.
///
/// # Safety
/// As in [`run_nt`].
#[target_feature(enable = "avx512f,fma")]
unsafe fn nt_part(p: &Problem, cols: (usize, usize)) {
    for i0 in (0..p.m).step_by(BLOCK_ROWS) {
        let i_end = (i0 + BLOCK_ROWS).min(p.m);
        for j in (cols.0..cols.1).step_by(DR) {
            let nn = DR.min(cols.1 - j);
            for i in (i0..i_end).step_by(DR) {
                let mm = DR.min(i_end - i);
                // SAFETY: the caller's promise, for rows i..i + mm of A and j..j + nn of B.
                unsafe {
                    match mm {
                        4 => rows_of::<4>(p, i, j, nn),
                        3 => rows_of::<3>(p, i, j, nn),
                        2 => rows_of::<2>(p, i, j, nn),
                        _ => rows_of::<1>(p, i, j, nn),
                    }
                }
            }
        }
    }
}

/// The tile of `R` rows of A from row `i` and `nn` rows of B from row `j`.
///
/// # Safety
/// As in [`run_nt`]; the rows exist.
#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_of<const R: usize>(p: &Problem, i: usize, j: usize, nn: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        match nn {
            4 => nt_tile::<R, 4>(p, i, j),
            3 => nt_tile::<R, 3>(p, i, j),
            2 => nt_tile::<R, 2>(p, i, j),
            _ => nt_tile::<R, 1>(p, i, j),
        }
    }
}

/// The `R x Q` tile of the `nt` product at row `i`, column `j` (`R, Q <= DR`).
///
/// # Safety
/// As in [`run_nt`]; rows i..i + R of A and j..j + Q of B exist.
#[target_feature(enable = "avx512f,fma")]
unsafe fn nt_tile<const R: usize, const Q: usize>(p: &Problem, i: usize, j: usize) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_maskz_loadu_ps, _mm512_reduce_add_ps,
        _mm512_setzero_ps,
    };
    // acc[q][r]: row i + r of A against row j + q of B.
    let mut acc: [[__m512; R]; Q] = [[_mm512_setzero_ps(); R]; Q];
    // SAFETY: the rows exist and hold k floats each; the last, partial vector is loaded under
    // a mask (nothing past a row is read).
    unsafe {
        let a = p.a.add(i * p.rsa);
        let b = p.b.add(j * p.rsb);
        let whole = p.k / 16 * 16;
        let mut l = 0;
        while l < whole {
            let av: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(a.add(r * p.rsa + l)));
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let bv = _mm512_loadu_ps(b.add(q * p.rsb + l));
                for (x, &av) in acc_q.iter_mut().zip(&av) {
                    *x = _mm512_fmadd_ps(av, bv, *x);
                }
            }
            l += 16;
        }
        if whole < p.k {
            let mask = (1u16 << (p.k - whole)) - 1;
            let av: [__m512; R] =
                std::array::from_fn(|r| _mm512_maskz_loadu_ps(mask, a.add(r * p.rsa + whole)));
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let bv = _mm512_maskz_loadu_ps(mask, b.add(q * p.rsb + whole));
                for (x, &av) in acc_q.iter_mut().zip(&av) {
                    *x = _mm512_fmadd_ps(av, bv, *x);
                }
            }
        }
        for (q, acc_q) in acc.iter().enumerate() {
            for (r, &v) in acc_q.iter().enumerate() {
                let cp = p.c.add((i + r) * p.rsc + j + q);
                *cp = store(*cp, _mm512_reduce_add_ps(v), p.beta, true);
            }
        }
    }
}
