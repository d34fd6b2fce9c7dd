//! Tests of a thread cache's two flags.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::Magazine;
use crate::backend::barrier;

/// A wide window between a read and its write.
fn pause() {
    for _ in 0..if cfg!(miri) { 1 } else { 200 } {
        std::hint::spin_loop();
    }
}

/// The owner's fast path and a claimer from another thread never hold the magazine at
/// once: each adds to its byte count with a plain read and write, and no addition is lost
/// (under Miri, a race on the count is reported as one).
#[test]
fn the_owner_and_a_claimer_take_turns() {
    take_turns(barrier::asymmetric());
}

/// The same with full fences on both sides, as where the system has no process-wide barrier.
#[test]
fn the_owner_and_a_claimer_take_turns_with_fences_only() {
    take_turns(false);
}

/// An owner and a claimer on a magazine of `asym`'s kind.
fn take_turns(asym: bool) {
    let rounds = if cfg!(miri) { 20 } else { 20_000 };
    let m = Arc::new(Magazine::<(), ()>::with_barrier(asym));
    let stop = Arc::new(AtomicBool::new(false));
    let claimer = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) || n == 0 {
                let mut g = m.lock(false);
                let b = g.bytes;
                pause();
                g.bytes = b + 1;
                n += 1;
                drop(g);
                pause();
            }
            n
        })
    };
    let (mut mine, mut tried) = (0, 0);
    // Until the owner got in at least once: a claimer preempted while it holds the
    // magazine keeps it out for a while.
    while tried < rounds || mine == 0 {
        tried += 1;
        if let Some(mut g) = m.try_lock() {
            let b = g.bytes;
            pause();
            g.bytes = b + 1;
            mine += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let theirs = claimer.join().expect("the claimer ran");
    assert!(mine > 0, "the owner never got in");
    assert_eq!(m.lock(true).bytes, mine + theirs, "an addition was lost");
}

/// A thread that finds the flag taken leaves it taken: a failed `try_lock` once gave the
/// holder's flag back (the guard was made before the test and dropped), so that the
/// owner's next `try_lock` and the holder (a drain) touched the leases at once.
#[test]
fn a_failed_try_lock_leaves_the_holder_its_flag() {
    for own in [true, false] {
        let m = Magazine::<(), ()>::new();
        let held = m.lock(own);
        assert!(m.try_lock().is_none());
        assert!(m.try_lock().is_none(), "the holder's flag was given back");
        drop(held);
        assert!(m.try_lock().is_some());
    }
}

/// A reading of the counts while the owner counts, without the flag: every reading is one
/// moment between two events (no count torn from the others of its event), and the counts
/// only grow. Under Miri, a race on a count is reported as one.
#[test]
fn counts_read_while_the_owner_counts_are_whole() {
    use super::HIT;
    let rounds: u64 = if cfg!(miri) { 30 } else { 200_000 };
    let m = Arc::new(Magazine::<(), ()>::new());
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (m, done) = (m.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut last, mut reads) = (0, 0u64);
            while !done.load(Ordering::Relaxed) || reads == 0 {
                let c = m.tally.read();
                let n = c.n[HIT];
                assert_eq!(c.bytes[HIT], n * 4096, "bytes torn from the count");
                assert_eq!(c.req[HIT], n * 1000, "requested bytes torn from the count");
                assert!(n >= last, "the count went back from {last} to {n}");
                last = n;
                reads += 1;
            }
            reads
        })
    };
    for _ in 0..rounds {
        let g = m.try_lock().expect("nobody claims the magazine");
        g.count(HIT, 4096, 1000);
        drop(g);
        pause();
    }
    done.store(true, Ordering::Relaxed);
    assert!(reader.join().expect("the reader ran") > 0);
    let c = m.tally.read();
    assert_eq!((c.n[HIT], c.bytes[HIT]), (rounds, rounds * 4096));
}
