//! The f32 FMA peak of this CPU, measured: independent chains of fused multiply-adds on the
//! widest SIMD registers the CPU has (AVX-512, else AVX2 + FMA, else whatever the compiler makes
//! of plain multiply-adds), on one thread and on several at once.
//!
//! Twelve chains per thread: more than FMA latency times FMA units (4 cycles x 2 units on
//! current x86 cores), so the units never wait for a result. Every chain stays finite
//! (`a = a * 0.999999 + 1e-7` converges to 0.1).

use std::hint::black_box;
use std::time::Instant;

/// Independent accumulator registers per thread.
const CHAINS: usize = 12;
const MUL: f32 = 0.999_999;
const ADD: f32 = 1e-7;

/// The instruction set the peak was measured with.
pub(crate) fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2+fma";
        }
    }
    "portable"
}

/// `iters` rounds of the chains on this thread; returns (flops, a value to keep).
fn chains(iters: u64) -> (f64, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            let v = unsafe { x86::chains_avx512(iters) };
            return ((iters * (CHAINS * 16 * 2) as u64) as f64, v);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            let v = unsafe { x86::chains_avx2(iters) };
            return ((iters * (CHAINS * 8 * 2) as u64) as f64, v);
        }
    }
    let mut acc = [[1.0f32; 8]; CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for l in a.iter_mut() {
                *l = *l * MUL + ADD;
            }
        }
        black_box(&mut acc);
    }
    let v = acc.iter().flatten().sum();
    ((iters * (CHAINS * 8 * 2) as u64) as f64, v)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ADD, CHAINS, MUL};

    #[target_feature(enable = "avx512f")]
    pub(super) fn chains_avx512(iters: u64) -> f32 {
        let (m, a) = (_mm512_set1_ps(MUL), _mm512_set1_ps(ADD));
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, m, a);
            }
        }
        let mut s = _mm512_setzero_ps();
        for v in acc {
            s = _mm512_add_ps(s, v);
        }
        _mm512_reduce_add_ps(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn chains_avx2(iters: u64) -> f32 {
        let (m, a) = (_mm256_set1_ps(MUL), _mm256_set1_ps(ADD));
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, m, a);
            }
        }
        let mut s = _mm256_setzero_ps();
        for v in acc {
            s = _mm256_add_ps(s, v);
        }
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let q = _mm_hadd_ps(q, q);
        _mm_cvtss_f32(_mm_hadd_ps(q, q))
    }
}

/// GFLOP/s of `threads` threads running the chains at once (`iters` rounds each): the best of
/// `runs` runs (the peak is what the machine can do; interference only lowers it).
pub(crate) fn fma_peak(threads: usize, iters: u64, runs: usize) -> f64 {
    (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            let flops: f64 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads.max(1))
                    .map(|_| s.spawn(move || black_box(chains(iters)).0))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
            });
            flops / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_stay_finite_and_count_flops() {
        let (flops, v) = chains(1000);
        assert!(v.is_finite() && v > 0.0);
        assert!(flops >= 1000.0 * (CHAINS * 8 * 2) as f64);
        assert!(fma_peak(2, 1000, 1) > 0.0);
        assert!(["avx512f", "avx2+fma", "portable"].contains(&isa()));
    }
}
