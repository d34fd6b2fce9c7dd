//! The GEMM against an f64 reference on every path, with each set of micro-kernels this CPU
//! has.
use super::*;

/// The micro-kernels this CPU runs (AVX-512F, AVX2), whatever `SYNCMEM_CPU_GEMM` says.
fn isas() -> Vec<Isa> {
    let v: Vec<Isa> = available().collect();
    if v.is_empty() {
        eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 (matrixmultiply runs)");
    }
    v
}

/// `op(A)·op(B)` in f64, row-major.
fn reference(
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|l| {
                    let x = if ta { a[l * m + i] } else { a[i * k + l] };
                    let y = if tb { b[j * k + l] } else { b[l * n + j] };
                    f64::from(x) * f64::from(y)
                })
                .sum();
        }
    }
    c
}

/// Every path against an f64 reference: tiles and the edges of both sides, reductions over
/// several blocks, packed and unpacked operands, one thread and the team's threads, `nt` as dot
/// products (long reductions, masked tails) and as tiles (short ones), narrow products run
/// transposed, and the three ways of `beta` (0 reads nothing of C: it starts as NaN); with
/// each set of micro-kernels.
#[test]
fn every_path_matches_the_reference() {
    for isa in isas() {
        every_path_on(isa);
    }
}

fn every_path_on(isa: Isa) {
    for (m, n, k) in [
        (64, 96, 64),
        (70, 100, 600),
        (13, 530, 300),
        (300, 40, 37),
        (3, 2, 1100),
        (600, 3, 64),
        (70, 300, 5),
        (20, 48, 33),
        (20, 45, 33),
        (9, 59, 70),
        (7, 33, 200),
        (1, 1, 1),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0)
            .collect();
        for (ta, tb) in [(false, false), (true, false), (false, true)] {
            let want = reference((ta, tb), (m, n, k), &a, &b);
            for beta in [0.0f32, 1.0, 0.5] {
                let start = |i: usize| if beta == 0.0 { f32::NAN } else { i as f32 };
                let mut c: Vec<f32> = (0..m * n).map(start).collect();
                assert!(gemm_on(isa, (ta, tb), (m, n, k), &a, &b, beta, &mut c));
                for (i, (&x, &y)) in c.iter().zip(&want).enumerate() {
                    let old = if beta == 0.0 {
                        0.0
                    } else {
                        f64::from(start(i))
                    };
                    let y = y + f64::from(beta) * old;
                    let tol = 1e-4 * (1.0 + y.abs()) * (k as f64).sqrt();
                    assert!(
                        (f64::from(x) - y).abs() <= tol,
                        "{isa:?} {m}x{n}x{k} ta {ta} tb {tb} beta {beta}: C[{i}] = {x}, want {y}"
                    );
                }
            }
        }
        let mut c = vec![0f32; m * n];
        assert!(
            !gemm_on(isa, (true, true), (m, n, k), &a, &b, 0.0, &mut c),
            "tt is not ours"
        );
    }
}

/// The same product twice gives the same bits (each element summed in one order, whatever
/// the threads do).
#[test]
fn results_repeat_bit_for_bit() {
    for isa in isas() {
        repeat_on(isa);
    }
}

fn repeat_on(isa: Isa) {
    for (t, (m, n, k)) in [
        ((false, false), (64, 512, 600)),
        ((true, false), (512, 512, 64)),
        ((false, true), (64, 512, 600)),
    ] {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut c1, mut c2) = (vec![0f32; m * n], vec![0f32; m * n]);
        assert!(gemm_on(isa, t, (m, n, k), &a, &b, 0.0, &mut c1));
        assert!(gemm_on(isa, t, (m, n, k), &a, &b, 0.0, &mut c2));
        assert!(
            c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{isa:?} {t:?}"
        );
    }
}

/// The AVX2 tiles sum each element in the AVX-512 tiles' order and store it the same way, and
/// the `nt` dot products add their 16 lanes up in the same order: `nn`, `tn` and `nt` products
/// (tiles and edges of 2 to 27 columns, with either of a sub-tile's two vectors partly masked,
/// dot products with partial last vectors and odd tile edges, short `nt` reductions, several
/// blocks, every `beta`) give the same bits.
#[test]
fn avx2_tiles_give_the_avx512_bits() {
    if isas() != [Isa::Avx512, Isa::Avx2] {
        eprintln!("skipped: this CPU lacks AVX-512F or AVX2");
        return;
    }
    for (m, n, k) in [
        (64, 96, 64),
        (70, 100, 600),
        (13, 530, 300),
        (600, 3, 64),
        (20, 48, 33),
        (20, 45, 33),
        (9, 59, 70),
        (7, 33, 200),
    ] {
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        for t in [(false, false), (true, false), (false, true)] {
            for beta in [0.0f32, 1.0, 0.5] {
                let start: Vec<f32> = (0..m * n).map(|i| (i as f32 * 0.7).sin()).collect();
                let (mut c1, mut c2) = (start.clone(), start);
                assert!(gemm_on(Isa::Avx512, t, (m, n, k), &a, &b, beta, &mut c1));
                assert!(gemm_on(Isa::Avx2, t, (m, n, k), &a, &b, beta, &mut c2));
                assert!(
                    c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m}x{n}x{k} {t:?} beta {beta}"
                );
            }
        }
    }
}

/// The register transpose of short `nt` products writes every element where the element-wise
/// copy does, with its blocks of 8 x 8 and the rows and columns past them.
#[test]
fn the_transpose_moves_every_element() {
    if !is_x86_feature_detected!("avx") {
        eprintln!("skipped: this CPU has no AVX");
        return;
    }
    for (n, k) in [
        (64, 64),
        (64, 2),
        (3, 64),
        (45, 33),
        (8, 8),
        (7, 9),
        (1, 1),
        (16, 120),
    ] {
        let b: Vec<f32> = (0..n * k).map(|i| i as f32 + 0.5).collect();
        let mut got = vec![f32::NAN; n * k];
        // SAFETY: b holds n rows of k, `got` n * k floats; the CPU has AVX (checked above).
        unsafe { kernel::transpose(&b, n, k, got.as_mut_ptr()) };
        for j in 0..n {
            for l in 0..k {
                assert_eq!(
                    got[l * n + j].to_bits(),
                    b[j * k + l].to_bits(),
                    "{n}x{k} at ({j}, {l})"
                );
            }
        }
    }
}
