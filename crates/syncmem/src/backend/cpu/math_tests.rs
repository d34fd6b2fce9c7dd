//! Tests of the host math ([`super`]).

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
