//! The micro-kernels of the `cpu` GEMM: a register-blocked tile of C (AVX-512F, and AVX2 for
//! CPUs without it), which at C's right side loads op(B) with masks, the store of a block's
//! sums, and the transpose of a short `nt` product's W (see the [parent](super)).

use super::{Tile, NR};

/// An `R x nn` tile (`R <= MR` rows, `nn <= NR` columns): `R` broadcasts of op(A) and two
/// vectors of op(B) per step of the reduction, `2·R` fused multiply-adds into registers. A
/// tile at C's right edge (`nn < NR`) loads op(B) with masks, so the columns past `nn` are
/// never read (a masked load does not fault on them) and their sums stay zero, and stores its
/// `nn` columns one by one. Every element is summed in the same order whatever `nn` is, so an
/// edge gives the bits a whole tile would.
///
/// # Safety
/// The tile lies inside its matrices; no other thread writes it; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn tile<const R: usize>(t: Tile, nn: usize) {
    use std::arch::x86_64::{
        __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_maskz_loadu_ps,
        _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let whole = nn >= NR;
    // Lanes of the two vectors that hold columns of the tile.
    let bits = |from: usize| -> u16 {
        match nn.saturating_sub(from) {
            0 => 0,
            n if n >= 16 => u16::MAX,
            n => (1u16 << n) - 1,
        }
    };
    let (m0, m1) = (bits(0), bits(16));
    let mut acc: [[__m512; 2]; R] = [[_mm512_setzero_ps(); 2]; R];
    for l in 0..t.kc {
        // SAFETY: step l of the tile's rows is inside A'; its columns below `nn` are inside
        // B', and the masked loads read no others.
        unsafe {
            let bp = t.b.add(l * t.rsb);
            let (b0, b1) = if whole {
                (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
            } else {
                (
                    _mm512_maskz_loadu_ps(m0, bp),
                    _mm512_maskz_loadu_ps(m1, bp.wrapping_add(16)),
                )
            };
            let ap = t.a.add(l * t.csa);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*ap.add(r * t.rsa));
                acc_r[0] = _mm512_fmadd_ps(a, b0, acc_r[0]);
                acc_r[1] = _mm512_fmadd_ps(a, b1, acc_r[1]);
            }
        }
    }
    if whole && t.csc == 1 {
        // Rows of C' are rows of C: two vector stores per row.
        let beta = _mm512_set1_ps(t.beta);
        for (r, acc_r) in acc.iter().enumerate() {
            // SAFETY: row r of the tile holds NR contiguous floats of C (csc == 1).
            unsafe {
                let cp = t.c.add(r * t.rsc);
                for (h, &v) in acc_r.iter().enumerate() {
                    let at = cp.add(16 * h);
                    let v = match (t.first, t.beta == 0.0) {
                        (true, true) => v,
                        (true, false) => _mm512_fmadd_ps(beta, _mm512_loadu_ps(at), v),
                        (false, _) => _mm512_add_ps(_mm512_loadu_ps(at), v),
                    };
                    _mm512_storeu_ps(at, v);
                }
            }
        }
    } else {
        // C' is Cᵀ, or the tile is an edge: element by element (once per block of the
        // reduction).
        let mut out = [[0f32; NR]; R];
        for (o, acc_r) in out.iter_mut().zip(&acc) {
            // SAFETY: `o` holds 32 floats, two vectors.
            unsafe {
                _mm512_storeu_ps(o.as_mut_ptr(), acc_r[0]);
                _mm512_storeu_ps(o.as_mut_ptr().add(16), acc_r[1]);
            }
        }
        for (r, o) in out.iter().enumerate() {
            for (q, &v) in o.iter().take(nn).enumerate() {
                // SAFETY: (r, q) is inside the tile.
                unsafe {
                    let cp = t.c.add(r * t.rsc + q * t.csc);
                    *cp = store(*cp, v, t.beta, t.first);
                }
            }
        }
    }
}

/// The value of an element of C after a block: the block's sum `v` added to the old value
/// `old`, which the first block scales by `beta` (not read when `beta` is 0, as BLAS does).
#[inline(always)]
pub(super) fn store(old: f32, v: f32, beta: f32, first: bool) -> f32 {
    match (first, beta == 0.0) {
        (true, true) => v,
        (true, false) => beta * old + v,
        (false, _) => old + v,
    }
}

/// Rows of the AVX2 sub-tiles: 6 rows by two 8-float vectors, 12 accumulators (with the two
/// vectors of op(B) and the broadcast, 15 of the 16 AVX2 registers).
const AVX2_ROWS: usize = 6;

/// An `mm x nn` tile (`mm <= MR` rows, `nn <= NR` columns) with AVX2: sub-tiles of up to
/// [`AVX2_ROWS`] rows by 16 columns, each element summed over the block in the same order as
/// [`tile`] sums it (so the same bits), and stored the same way. At C's right edge a sub-tile
/// loads op(B) with masks, as [`tile`] does.
///
/// # Safety
/// The tile lies inside its matrices; no other thread writes it; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2(t: Tile, (mm, nn): (usize, usize)) {
    let mut r0 = 0;
    while r0 < mm {
        for h in 0..nn.min(NR).div_ceil(16) {
            let cols = (nn - 16 * h).min(16);
            // SAFETY: rows r0.. and columns 16h..16h+cols are inside the tile.
            unsafe {
                match mm - r0 {
                    1 => sub_avx2::<1>(t, r0, h, cols),
                    2 => sub_avx2::<2>(t, r0, h, cols),
                    3 => sub_avx2::<3>(t, r0, h, cols),
                    4 => sub_avx2::<4>(t, r0, h, cols),
                    5 => sub_avx2::<5>(t, r0, h, cols),
                    _ => sub_avx2::<AVX2_ROWS>(t, r0, h, cols),
                }
            }
        }
        r0 += AVX2_ROWS;
    }
}

/// The AVX2 load mask of the first `n` of 8 lanes (`n` above 8: all of them).
#[target_feature(enable = "avx2")]
pub(super) fn lanes(n: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::{_mm256_cmpgt_epi32, _mm256_set1_epi32, _mm256_setr_epi32};
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Rows `r0..r0 + R` and columns `16h..16h + cols` (`1 <= cols <= 16`) of an AVX2 tile (see
/// [`tile_avx2`]). With fewer than 16 columns, op(B) is loaded with masks: the columns past
/// `cols` are never read and their sums stay zero.
///
/// # Safety
/// As [`tile_avx2`], for this part of the tile.
#[target_feature(enable = "avx2,fma")]
unsafe fn sub_avx2<const R: usize>(t: Tile, r0: usize, h: usize, cols: usize) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_maskload_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let whole = cols >= 16;
    let (m0, m1) = (lanes(cols), lanes(cols.saturating_sub(8)));
    let mut acc: [[__m256; 2]; R] = [[_mm256_setzero_ps(); 2]; R];
    for l in 0..t.kc {
        // SAFETY: step l of the part's rows is inside A'; its columns below `cols` are inside
        // B', and the masked loads read no others.
        unsafe {
            let bp = t.b.add(l * t.rsb + 16 * h);
            let (b0, b1) = if whole {
                (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
            } else {
                (
                    _mm256_maskload_ps(bp, m0),
                    _mm256_maskload_ps(bp.wrapping_add(8), m1),
                )
            };
            let ap = t.a.add(r0 * t.rsa + l * t.csa);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let a = _mm256_set1_ps(*ap.add(r * t.rsa));
                acc_r[0] = _mm256_fmadd_ps(a, b0, acc_r[0]);
                acc_r[1] = _mm256_fmadd_ps(a, b1, acc_r[1]);
            }
        }
    }
    // SAFETY: the part's elements of C are inside the tile, written by this thread alone.
    let c = unsafe { t.c.add(r0 * t.rsc + 16 * h * t.csc) };
    if whole && t.csc == 1 {
        // As `tile`: the old value scaled by beta with one fused multiply-add.
        let beta = _mm256_set1_ps(t.beta);
        for (r, acc_r) in acc.iter().enumerate() {
            // SAFETY: row r of the part holds 16 contiguous floats of C (csc == 1).
            unsafe {
                let cp = c.add(r * t.rsc);
                for (v8, &v) in acc_r.iter().enumerate() {
                    let at = cp.add(8 * v8);
                    let v = match (t.first, t.beta == 0.0) {
                        (true, true) => v,
                        (true, false) => _mm256_fmadd_ps(beta, _mm256_loadu_ps(at), v),
                        (false, _) => _mm256_add_ps(_mm256_loadu_ps(at), v),
                    };
                    _mm256_storeu_ps(at, v);
                }
            }
        }
    } else {
        // C' is Cᵀ, or the part is an edge: element by element (once per block of the
        // reduction).
        let mut out = [[0f32; 16]; R];
        for (o, acc_r) in out.iter_mut().zip(&acc) {
            // SAFETY: `o` holds 16 floats, two vectors.
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr(), acc_r[0]);
                _mm256_storeu_ps(o.as_mut_ptr().add(8), acc_r[1]);
            }
        }
        for (r, o) in out.iter().enumerate() {
            for (q, &v) in o.iter().take(cols).enumerate() {
                // SAFETY: (r, q) is inside the part.
                unsafe {
                    let cp = c.add(r * t.rsc + q * t.csc);
                    *cp = store(*cp, v, t.beta, t.first);
                }
            }
        }
    }
}

/// Writes `bᵀ` into `buf`: `b` holds `n` rows of `k` floats, `buf` gets `k` rows of `n`
/// (`buf[l·n + j] = b[j·k + l]`). Blocks of 8 x 8 go through registers (eight row loads,
/// 24 shuffles, eight row stores); the rows and columns past the last whole block are copied
/// one by one. Moves values only: the result is the same bits as an element-wise copy.
///
/// # Safety
/// `b.len() == n·k`; `buf` holds `n·k` floats that nothing else reads or writes meanwhile; the
/// CPU has AVX.
#[target_feature(enable = "avx")]
pub(super) unsafe fn transpose(b: &[f32], n: usize, k: usize, buf: *mut f32) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
        _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    debug_assert_eq!(b.len(), n * k);
    let src = b.as_ptr();
    let (n8, k8) = (n / 8 * 8, k / 8 * 8);
    for j in (0..n8).step_by(8) {
        for l in (0..k8).step_by(8) {
            // SAFETY: rows j..j + 8 of b (j + 8 <= n) and columns l..l + 8 (l + 8 <= k): inside b.
            let r: [_; 8] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add((j + i) * k + l)) });
            let t = [
                _mm256_unpacklo_ps(r[0], r[1]),
                _mm256_unpackhi_ps(r[0], r[1]),
                _mm256_unpacklo_ps(r[2], r[3]),
                _mm256_unpackhi_ps(r[2], r[3]),
                _mm256_unpacklo_ps(r[4], r[5]),
                _mm256_unpackhi_ps(r[4], r[5]),
                _mm256_unpacklo_ps(r[6], r[7]),
                _mm256_unpackhi_ps(r[6], r[7]),
            ];
            let s = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            let out = [
                _mm256_permute2f128_ps::<0x20>(s[0], s[4]),
                _mm256_permute2f128_ps::<0x20>(s[1], s[5]),
                _mm256_permute2f128_ps::<0x20>(s[2], s[6]),
                _mm256_permute2f128_ps::<0x20>(s[3], s[7]),
                _mm256_permute2f128_ps::<0x31>(s[0], s[4]),
                _mm256_permute2f128_ps::<0x31>(s[1], s[5]),
                _mm256_permute2f128_ps::<0x31>(s[2], s[6]),
                _mm256_permute2f128_ps::<0x31>(s[3], s[7]),
            ];
            for (i, v) in out.into_iter().enumerate() {
                // SAFETY: row l + i < k of buf and columns j..j + 8 (j + 8 <= n): inside buf.
                unsafe { _mm256_storeu_ps(buf.add((l + i) * n + j), v) };
            }
        }
        for jj in j..j + 8 {
            for l in k8..k {
                // SAFETY: jj < n and l < k: inside both.
                unsafe { *buf.add(l * n + jj) = *src.add(jj * k + l) };
            }
        }
    }
    for jj in n8..n {
        for l in 0..k {
            // SAFETY: as above.
            unsafe { *buf.add(l * n + jj) = *src.add(jj * k + l) };
        }
    }
}
