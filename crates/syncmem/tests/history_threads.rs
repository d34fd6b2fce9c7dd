//! The always-on history with the device pool's thread caches, under random programs of
//! several threads that allocate, free and pass blocks to each other (on `cpu` and on
//! OpenCL/PoCL): every allocation and free is in the history, and each block's in turn. A
//! free read before its allocation would be left out as lost, and counted missing here.
//!
//! Each thread stamps its events with the time it read last, so a block passed to another
//! thread is where the order can go wrong; the threads' caches serve blocks freed there
//! again on the same thread, with no shard's sequence number to order them, and a snapshot
//! gives the cached blocks back to their shards with no event.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use proptest::prelude::*;
use syncmem::device::DeviceBuffer;
use syncmem::report::record_history;
use syncmem::Device;

#[path = "common/blocks.rs"]
mod blocks;
use blocks::{blocks_of, live_after};

/// The history is process-wide: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const THREADS: usize = 3;

/// One step of a program.
#[derive(Debug, Clone)]
enum Op {
    /// Thread `t` allocates `kib` KiB.
    Alloc { t: usize, kib: usize },
    /// Thread `t` frees one of its blocks (the `i`-th, modulo how many it holds).
    Free { t: usize, i: usize },
    /// Thread `t` passes one of its blocks to thread `to`.
    Pass { t: usize, i: usize, to: usize },
    /// The pool's snapshot, from the test's own thread: every thread's cached blocks go back
    /// to their shards (with no event: their frees were the ones into the caches).
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..THREADS, 1..4usize).prop_map(|(t, kib)| Op::Alloc { t, kib }),
        2 => (0..THREADS, any::<usize>()).prop_map(|(t, i)| Op::Free { t, i }),
        2 => (0..THREADS, any::<usize>(), 0..THREADS).prop_map(|(t, i, to)| Op::Pass { t, i, to }),
        1 => Just(Op::Snapshot),
    ]
}

/// What a worker thread is told to do; it answers each with the block taken, if any.
enum Cmd {
    Alloc(usize),
    Free(usize),
    Take(usize),
    Give(Box<DeviceBuffer>),
}

/// A thread holding blocks of `dev`, doing what it is told until its channel closes; then it
/// frees what it holds.
fn worker(dev: Device, rx: Receiver<Cmd>, done: Sender<Option<DeviceBuffer>>) {
    let stream = dev.default_stream().unwrap();
    let mut held: Vec<DeviceBuffer> = Vec::new();
    for cmd in rx {
        let out = match cmd {
            Cmd::Alloc(kib) => {
                held.push(dev.alloc_pooled(kib * 1024, &stream).unwrap());
                None
            }
            Cmd::Free(i) => {
                if !held.is_empty() {
                    drop(held.swap_remove(i % held.len()));
                }
                None
            }
            Cmd::Take(i) => (!held.is_empty()).then(|| held.swap_remove(i % held.len())),
            Cmd::Give(b) => {
                held.push(*b);
                None
            }
        };
        done.send(out).unwrap();
    }
}

/// Runs `ops` on `THREADS` threads of a device of their own, the history recording; checks
/// the history.
fn run(dev: &Device, ops: &[Op]) -> Result<(), TestCaseError> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = dev.detached();
    let label = d.label().to_string();
    let h = record_history(Some(100_000)).unwrap();
    let mut allocs = 0;
    std::thread::scope(|s| {
        let mut to = Vec::new();
        let mut from = Vec::new();
        for _ in 0..THREADS {
            let (tx, rx) = channel();
            let (done_tx, done_rx) = channel();
            let d = d.clone();
            s.spawn(move || worker(d, rx, done_tx));
            to.push(tx);
            from.push(done_rx);
        }
        let ask = |t: usize, cmd: Cmd| {
            to[t].send(cmd).unwrap();
            from[t].recv().unwrap()
        };
        for op in ops {
            match *op {
                Op::Alloc { t, kib } => {
                    allocs += 1;
                    ask(t, Cmd::Alloc(kib));
                }
                Op::Free { t, i } => {
                    ask(t, Cmd::Free(i));
                }
                Op::Pass { t, i, to } => {
                    if let Some(b) = ask(t, Cmd::Take(i)) {
                        ask(to, Cmd::Give(Box::new(b)));
                    }
                }
                Op::Snapshot => {
                    drop(d.pool_snapshots());
                }
            }
        }
        // The workers end, freeing what they hold.
        drop(to);
    });
    let trace = h.trace();
    record_history(None);
    let mine = blocks_of(&trace, &label);
    let count = |k: &str| mine.iter().filter(|(kind, _)| *kind == k).count();
    prop_assert_eq!(count("alloc"), allocs, "allocations in the history");
    prop_assert_eq!(count("free"), allocs, "frees in the history");
    prop_assert_eq!(live_after(&mine), Ok(0));
    Ok(())
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
    fn cpu_threads_passing_blocks_keep_each_block_in_order(
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(&Device::cpu(), &ops)?;
    }

    #[test]
    fn opencl_threads_passing_blocks_keep_each_block_in_order(
        ops in prop::collection::vec(op(), 1..120),
    ) {
        if let Some(dev) = syncmem::testing::opencl_or_skip("history_threads") {
            run(&dev, &ops)?;
        }
    }
}
