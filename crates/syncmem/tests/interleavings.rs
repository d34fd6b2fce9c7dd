//! Random interleavings of queued kernels, uploads on either stream, host reads, host writes,
//! drops and re-allocations, on one and on two streams of the OpenCL device, checked against a
//! host model; with and without a small memory cap.
//!
//! Kernels are queued and never waited for, blocks freed with work pending go back to the
//! device pool and come out again for the next buffer of that size (whose first command may run
//! on the other stream: an upload there must still follow the old owner's work), and kernels on
//! one stream read buffers last written on the other: every value read back must still be the
//! model's. Under a cap, the pool must also reuse blocks across streams, release its cache and
//! evict clean mirrors while work is queued.
//!
//! A stream can be held by an OpenCL user-event gate (`Hold`), so that kernels and copies are
//! really still queued when the next operations run. Operations that must wait for the device
//! (host reads and writes, blocking device reads, dropping a buffer whose upload is held) open
//! the gates first; every other operation must return while the gates are closed: a watchdog
//! opens them if an operation blocks for 10 s, and the case fails. Under a cap an allocation may
//! rightly wait for queued work to free memory: there the watchdog opens the gates after a short
//! while and the case goes on (the values are still checked).
//!
//! A stress run (`many_operations_under_a_cap_keep_the_host_model`) runs 100,000 operations
//! drawn from the same kinds, with fewer that wait, under a cap, on both pool kinds.
//!
//! Values stay exact: the scale factors are powers of two or -1 and `axpy` adds `±x`, so a fused
//! multiply-add and a separate multiply and add round the same way.

#![cfg(feature = "opencl")]

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use syncmem::alloc::pool::{MemoryCap, PoolConfig, PoolKind};
use syncmem::{Device, Stream};

#[path = "common/gate.rs"]
mod gate;
#[path = "common/interleave.rs"]
mod interleave;
#[path = "common/model.rs"]
mod model;
use interleave::{op, op_with, run, Op, SIZES, SLOTS, STRESS_MIX};

/// The device of the capped cases: isolated (its own pool), capped at a little more than what
/// the four slots can hold at once, so that freed blocks must be reused across streams and the
/// cache released while work is queued. The caching pool keeps no exact-size lists here, so
/// blocks go through best fit (splits and merges carry their pending uses); the binned pool
/// reuses whole blocks of a bin.
fn capped_device(dev: &Device, kind: PoolKind) -> Device {
    let d = dev.isolated();
    let cap = (SLOTS * SIZES[1] * 4 + (64 << 10)) as u64;
    d.set_pool(
        PoolConfig::new(kind)
            .with_memory_cap(MemoryCap::Bytes(cap))
            .with_size_class_limit(0),
    )
    .unwrap();
    d
}

fn three_streams(dev: &Device) -> [Stream; 3] {
    [
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    ]
}

/// Case counts: `SYNCMEM_PROPTEST_CASES` raises them for a long local run.
fn cases(default: u32) -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(2048), ..ProptestConfig::default() })]

    #[test]
    fn queued_work_matches_the_host_model(ops in prop::collection::vec(op(), 1..40)) {
        let Some(dev) = syncmem::testing::opencl_or_skip("queued interleavings") else {
            return Ok(());
        };
        run(&dev, &three_streams(&dev), &ops, false)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(512), ..ProptestConfig::default() })]

    #[test]
    fn queued_work_under_a_small_cap_matches_the_host_model(
        ops in prop::collection::vec(op(), 1..40),
        binned in any::<bool>(),
    ) {
        let Some(dev) = syncmem::testing::opencl_or_skip("queued interleavings, capped") else {
            return Ok(());
        };
        let kind = if binned { PoolKind::Binned } else { PoolKind::Caching };
        let dev = capped_device(&dev, kind);
        run(&dev, &three_streams(&dev), &ops, true)?;
    }
}

/// 100,000 operations (`SYNCMEM_STRESS_OPS` sets another count) from the same strategy, gates
/// included, under the cap: frees happen with work queued, and blocks come back for uploads on
/// either stream.
#[test]
fn many_operations_under_a_cap_keep_the_host_model() {
    let Some(dev) = syncmem::testing::opencl_or_skip("stress under a cap") else {
        return;
    };
    let count: usize = std::env::var("SYNCMEM_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let mut runner = TestRunner::deterministic();
    let strategy = op_with(STRESS_MIX);
    let ops: Vec<Op> = (0..count)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    // Half the operations on each pool kind.
    for (i, chunk) in ops.chunks(10_000).enumerate() {
        let kind = if i % 2 == 0 {
            PoolKind::Caching
        } else {
            PoolKind::Binned
        };
        let dev = capped_device(&dev, kind);
        let t0 = std::time::Instant::now();
        if let Err(e) = run(&dev, &three_streams(&dev), chunk, true) {
            panic!("{kind:?} pool, operations from {}: {e}", i * 10_000);
        }
        eprintln!(
            "STRESS {kind:?} {:?}; stats {:?}",
            t0.elapsed(),
            dev.pool_stats().map(|s| (
                s.cache_hits,
                s.allocations,
                s.ooms,
                s.evictions,
                s.alloc_retries,
                s.backend_frees
            ))
        );
    }
}

/// A stream that waits on the device for a held stream holds what is queued on it after: the
/// upload of a new buffer on it is behind the gate, so dropping that buffer waits (the model
/// opens the gates first; before the model knew it, this case tripped the watchdog).
#[test]
fn a_stream_waiting_for_a_held_stream_holds_its_later_uploads() {
    let Some(dev) = syncmem::testing::opencl_or_skip("queued interleavings") else {
        return;
    };
    let streams = three_streams(&dev);
    let ops = [
        Op::Hold { stream: 0 },
        Op::Alloc {
            slot: 0,
            size: 0,
            stream: 0,
            seed: 1,
        },
        Op::Scale { slot: 0, a: 2.0 },
        Op::Alloc {
            slot: 1,
            size: 0,
            stream: 1,
            seed: 2,
        },
        Op::Axpy { x: 0, y: 1, a: 1.0 },
        Op::Alloc {
            slot: 2,
            size: 0,
            stream: 1,
            seed: 3,
        },
        Op::Scale { slot: 2, a: 2.0 },
        Op::Drop { slot: 2 },
        Op::HostRead { slot: 1 },
    ];
    run(&dev, &streams, &ops, false).unwrap();
}

/// The defect of a reused block: a buffer's kernel is queued behind a gate, the buffer dropped,
/// a new one of its size on its stream takes the block at once, and its upload is queued on
/// the other stream. The upload must follow the old kernel (before the fix it ran first, and
/// the old kernel then scaled the new data).
#[test]
fn a_reused_block_uploaded_on_the_other_stream_follows_the_old_work() {
    let Some(dev) = syncmem::testing::opencl_or_skip("reused block, other stream") else {
        return;
    };
    let streams = three_streams(&dev);
    let ops = [
        Op::Alloc {
            slot: 0,
            size: 1,
            stream: 0,
            seed: 1,
        },
        Op::Scale { slot: 0, a: 2.0 },
        Op::Hold { stream: 0 },
        Op::Scale { slot: 0, a: -1.0 },
        Op::Drop { slot: 0 },
        Op::Alloc {
            slot: 1,
            size: 1,
            stream: 0,
            seed: 2,
        },
        Op::Prefetch { slot: 1, stream: 1 },
        Op::DeviceRead { slot: 1 },
    ];
    run(&dev, &streams, &ops, false).unwrap();
}
