//! The `nt` product (`Y = X·Wᵀ`, both operands along the reduction) as dot products.

use super::kernel::lanes;
use super::kernel::store;
use super::{on_threads, share, Isa, Problem};

/// Rows of A and of B in a tile of the `nt` product (`DR x DR` dot products).
const DR: usize = 4;

/// Runs the `nt` product `C = A·Bᵀ` of `p` (`A[m,k]` and `B[n,k]`, both rows contiguous along
/// the reduction: `rsa = rsb = k`) as dot products: a tile of [`DR`] rows of A against `DR`
/// rows of B sums `DR x DR` vectors of 16 products along k, then adds each vector up. Nothing
/// is copied. Each thread takes a range of B's rows (of W's: each reads its part of W once)
/// and meets it with every row of A, which stays in cache.
///
/// With AVX2, a vector of 16 products is two of 8 (tiles of [`DR2`] x `DR2` dot products, so
/// that the accumulators fit the 16 registers), summed in the same order, and added up in the
/// same order ([`hsum16`]): the same bits as with AVX-512.
pub(super) fn run_nt(p: &Problem) {
    let step = match p.isa {
        Isa::Avx512 => DR,
        Isa::Avx2 => DR2,
    };
    on_threads(p, &|t, parts| {
        let (lo, hi) = share((t, parts), p.n.div_ceil(step), step, p.n);
        // SAFETY: rows lo..hi of B and every row of A lie inside the slices `gemm`'s caller
        // checked; this thread alone writes columns lo..hi of C; `isa()` found the ISA.
        unsafe {
            match p.isa {
                Isa::Avx512 => nt_part(p, (lo, hi)),
                Isa::Avx2 => nt_part_avx2(p, (lo, hi)),
            }
        }
    });
}

/// Rows of A and of B in an AVX2 tile of the `nt` product (`DR2 x DR2` dot products of two
/// accumulators each).
const DR2: usize = 2;

/// The sum of the 16 lanes `lo` (0..8) and `hi` (8..16), in one fixed order: lanes `t` and
/// `t + 8`, then the halves of that (`t` and `t + 4`), then `t` and `t + 2`, then the two
/// left. Both ISAs add their dot products up this way.
#[target_feature(enable = "avx")]
fn hsum16(lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_castps256_ps128, _mm256_extractf128_ps, _mm_add_ps, _mm_cvtss_f32,
        _mm_shuffle_ps,
    };
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    // Lanes [2, 3, 0, 1].
    let s2 = _mm_add_ps(s4, _mm_shuffle_ps::<0b01_00_11_10>(s4, s4));
    _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps::<0b01>(s2, s2))
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
        __m512, _mm512_castps512_ps256, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_maskz_loadu_ps,
        _mm512_setzero_ps, _mm512_shuffle_f32x4,
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
                // Lanes 8..16 moved down, for the fixed order of `hsum16`.
                let hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
                let sum = hsum16(_mm512_castps512_ps256(v), hi);
                *cp = store(*cp, sum, p.beta, true);
            }
        }
    }
}

/// Columns `cols.0..cols.1` of the `nt` product `p` with AVX2 (see [`run_nt`]).
///
/// # Safety
/// As in [`run_nt`]; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn nt_part_avx2(p: &Problem, cols: (usize, usize)) {
    // The walk of `nt_part`, written out again: an iterator shared by the two made the
    // AVX-512 epoch at hidden 1024 slower (65-82 ms against 57-63 ms).
    for i0 in (0..p.m).step_by(BLOCK_ROWS) {
        let i_end = (i0 + BLOCK_ROWS).min(p.m);
        for j in (cols.0..cols.1).step_by(DR2) {
            let nn = DR2.min(cols.1 - j);
            for i in (i0..i_end).step_by(DR2) {
                let mm = DR2.min(i_end - i);
                // SAFETY: the caller's promise, for rows i..i + mm of A and j..j + nn of B.
                unsafe {
                    match (mm, nn) {
                        (2, 2) => nt_tile_avx2::<2, 2>(p, i, j),
                        (2, _) => nt_tile_avx2::<2, 1>(p, i, j),
                        (_, 2) => nt_tile_avx2::<1, 2>(p, i, j),
                        _ => nt_tile_avx2::<1, 1>(p, i, j),
                    }
                }
            }
        }
    }
}

/// The `R x Q` tile of the `nt` product at row `i`, column `j` with AVX2: each dot product in
/// two accumulators of 8 lanes, lane `t` of the pair summing the products `l ≡ t (mod 16)` in
/// order, as [`nt_tile`]'s 16 lanes do.
///
/// # Safety
/// As in [`run_nt`]; rows i..i + R of A and j..j + Q of B exist; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn nt_tile_avx2<const R: usize, const Q: usize>(p: &Problem, i: usize, j: usize) {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_maskload_ps, _mm256_setzero_ps,
    };
    // acc[q][r]: row i + r of A against row j + q of B, lanes 0..8 and 8..16.
    let mut acc: [[[__m256; 2]; R]; Q] = [[[_mm256_setzero_ps(); 2]; R]; Q];
    // SAFETY: the rows exist and hold k floats each; the last, partial vectors are loaded
    // under masks (nothing past a row is read).
    unsafe {
        let a = p.a.add(i * p.rsa);
        let b = p.b.add(j * p.rsb);
        let whole = p.k / 16 * 16;
        let mut l = 0;
        while l < whole {
            let av: [[__m256; 2]; R] = std::array::from_fn(|r| {
                let ar = a.add(r * p.rsa + l);
                [_mm256_loadu_ps(ar), _mm256_loadu_ps(ar.add(8))]
            });
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let bq = b.add(q * p.rsb + l);
                let bv = [_mm256_loadu_ps(bq), _mm256_loadu_ps(bq.add(8))];
                for (x, av) in acc_q.iter_mut().zip(&av) {
                    x[0] = _mm256_fmadd_ps(av[0], bv[0], x[0]);
                    x[1] = _mm256_fmadd_ps(av[1], bv[1], x[1]);
                }
            }
            l += 16;
        }
        if whole < p.k {
            let rest = p.k - whole;
            let (m0, m1) = (lanes(rest), lanes(rest.saturating_sub(8)));
            let load = |ptr: *const f32| {
                [
                    _mm256_maskload_ps(ptr, m0),
                    _mm256_maskload_ps(ptr.wrapping_add(8), m1),
                ]
            };
            let av: [[__m256; 2]; R] = std::array::from_fn(|r| load(a.add(r * p.rsa + whole)));
            for (q, acc_q) in acc.iter_mut().enumerate() {
                let bv = load(b.add(q * p.rsb + whole));
                for (x, av) in acc_q.iter_mut().zip(&av) {
                    x[0] = _mm256_fmadd_ps(av[0], bv[0], x[0]);
                    x[1] = _mm256_fmadd_ps(av[1], bv[1], x[1]);
                }
            }
        }
        for (q, acc_q) in acc.iter().enumerate() {
            for (r, x) in acc_q.iter().enumerate() {
                let cp = p.c.add((i + r) * p.rsc + j + q);
                *cp = store(*cp, hsum16(x[0], x[1]), p.beta, true);
            }
        }
    }
}
