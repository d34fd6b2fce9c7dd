//! The AVX-512 micro-kernel of the `cpu` GEMM: a register-blocked tile of C, the element-by-
//! element edge at C's right side, and the store of a block's sums (see the [parent](super)).

use super::{Tile, NR};

/// An `R x NR` tile (`R <= MR` rows): `R` broadcasts of op(A) and two vectors of op(B) per
/// step of the reduction, `2·R` fused multiply-adds into registers.
///
/// # Safety
/// The tile lies inside its matrices; no other thread writes it; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn tile<const R: usize>(t: Tile) {
    use std::arch::x86_64::{
        __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };
    let mut acc: [[__m512; 2]; R] = [[_mm512_setzero_ps(); 2]; R];
    for l in 0..t.kc {
        // SAFETY: step l of the tile's rows and columns is inside A' and B'.
        unsafe {
            let bp = t.b.add(l * t.rsb);
            let (b0, b1) = (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)));
            let ap = t.a.add(l * t.csa);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*ap.add(r * t.rsa));
                acc_r[0] = _mm512_fmadd_ps(a, b0, acc_r[0]);
                acc_r[1] = _mm512_fmadd_ps(a, b1, acc_r[1]);
            }
        }
    }
    if t.csc == 1 {
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
        // C' is Cᵀ: element by element (once per block of the reduction).
        let mut out = [[0f32; NR]; R];
        for (o, acc_r) in out.iter_mut().zip(&acc) {
            // SAFETY: `o` holds 32 floats, two vectors.
            unsafe {
                _mm512_storeu_ps(o.as_mut_ptr(), acc_r[0]);
                _mm512_storeu_ps(o.as_mut_ptr().add(16), acc_r[1]);
            }
        }
        for (r, o) in out.iter().enumerate() {
            for (q, &v) in o.iter().enumerate() {
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

/// The `mm x nn` part of a tile at the right edge of C (fewer than [`NR`] columns), element
/// by element, each sum in the same order as the tiles'.
///
/// # Safety
/// The part lies inside its matrices; no other thread writes it; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn edge(t: Tile, (mm, nn): (usize, usize)) {
    for r in 0..mm {
        for q in 0..nn {
            let mut s = 0f32;
            for l in 0..t.kc {
                // SAFETY: row r, column q and step l are inside the part.
                let (av, bv) =
                    unsafe { (*t.a.add(r * t.rsa + l * t.csa), *t.b.add(l * t.rsb + q)) };
                s = av.mul_add(bv, s);
            }
            // SAFETY: (r, q) is inside the part, written by this thread alone.
            unsafe {
                let cp = t.c.add(r * t.rsc + q * t.csc);
                *cp = store(*cp, s, t.beta, t.first);
            }
        }
    }
}
