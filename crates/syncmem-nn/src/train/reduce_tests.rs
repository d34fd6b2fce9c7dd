//! The buckets keep the sum exact: random gradient sizes, bucket sizes, shares and rank
//! counts, summed by the reducer over [`Local`] ranks, against the sums computed here.

use std::sync::Arc;

use proptest::prelude::*;
use syncmem::{Device, Tensor, Workspace};

use super::{BucketPlan, Reducer, Share};
use crate::train::collective::{Collective, Local};

/// Buckets of at most `cap` elements over `sizes`, in order (a larger gradient alone), as
/// [`super::plan_buckets`] groups them.
fn buckets(sizes: &[usize], cap: usize) -> Vec<BucketPlan> {
    let mut out: Vec<BucketPlan> = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        if out.last().is_none_or(|b| b.len + n > cap) {
            out.push(BucketPlan {
                grads: Vec::new(),
                len: 0,
                ready_after: Some(k),
            });
        }
        let b = out.last_mut().unwrap();
        b.grads.push((format!("g{k}"), n));
        b.len += n;
        b.ready_after = Some(k);
    }
    out
}

/// Rank `r`'s value of element `i` of gradient `k`: small integers, so every sum is exact.
fn value(r: usize, k: usize, i: usize) -> f32 {
    ((r * 7 + k * 3 + i) % 11) as f32 - 5.0
}

fn run_rank(c: Local, sizes: &[usize], cap: usize, share: Share, steps: usize) -> Vec<Vec<f32>> {
    let dev = Device::cpu();
    let ws = Arc::new(Workspace::new());
    let rank = c.rank();
    let fill = |ws: &Workspace| {
        for (k, &n) in sizes.iter().enumerate() {
            let data: Vec<f32> = (0..n).map(|i| value(rank, k, i)).collect();
            let t = Tensor::from_slice(&[n], &data, Some(&dev)).unwrap();
            ws.create_blob(&format!("g{k}")).unwrap().write().reset(t);
        }
    };
    let mut reducer = Reducer::start(ws.clone(), buckets(sizes, cap), Arc::new(c)).unwrap();
    for _ in 0..steps {
        fill(&ws);
        // Some buckets submitted one by one, the rest at once, as a step does.
        if !reducer.buckets.is_empty() {
            reducer.submit(0, share).unwrap();
        }
        reducer.submit_rest(share).unwrap();
        reducer.submit_scalars([1.0, 0.5]).unwrap();
        let scalars = reducer.wait_all().unwrap();
        assert_eq!(scalars[0], reducer.collective.size() as f64);
    }
    assert_eq!(reducer.stats.steps, steps as u64);
    let total: usize = sizes.iter().sum();
    assert_eq!(reducer.stats.bytes, (total * 4 * steps) as u64);
    (0..sizes.len())
        .map(|k| {
            let blob = ws.get_blob(&format!("g{k}")).unwrap();
            let guard = blob.read();
            let values = guard
                .get::<Tensor>()
                .unwrap()
                .host::<f32>()
                .unwrap()
                .to_vec();
            values
        })
        .collect()
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn buckets_sum_exactly_over_any_rank_count(
        sizes in proptest::collection::vec(1usize..3000, 1..7),
        cap in 1usize..6000,
        ranks in 1usize..5,
        share_exp in 0i32..3,
        common in any::<bool>(),
    ) {
        // Shares that are powers of two keep the scaled values exact too, scaled before the
        // sum (each rank's own share) or after it (a share common to every rank: a bucket of
        // one gradient is then summed straight from it).
        let weight = 2f32.powi(-share_exp);
        let share = Share::new(weight, common);
        let group = Local::group(ranks);
        let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .into_iter()
                .map(|c| s.spawn(|| run_rank(c, &sizes, cap, share, 2)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (k, &n) in sizes.iter().enumerate() {
            let want: Vec<f32> = (0..n)
                .map(|i| (0..ranks).map(|r| value(r, k, i) * weight).sum())
                .collect();
            for (r, got) in results.iter().enumerate() {
                prop_assert_eq!(&got[k], &want, "rank {} gradient {}", r, k);
            }
        }
    }
}

#[test]
fn a_share_of_zero_sends_zeros_without_reading_the_gradient() {
    let group = Local::group(2);
    let sizes = [5usize, 3];
    let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|c| {
                // Rank 0's single-gradient bucket is summed straight from the gradient, rank 1's
                // zeros from the packing buffer: the calls match all the same.
                let share = Share::own(if c.rank() == 1 { 0.0 } else { 1.0 });
                s.spawn(move || run_rank(c, &sizes, 4, share, 1))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, &n) in sizes.iter().enumerate() {
        let want: Vec<f32> = (0..n).map(|i| value(0, k, i)).collect();
        assert_eq!(results[0][k], want);
        assert_eq!(results[1][k], want);
    }
}
