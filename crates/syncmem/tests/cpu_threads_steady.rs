//! The `cpu` backend's worker threads allocate nothing once their team has started: what a
//! thread allocates as it starts (the runtime's set-up, the lock library's data for a thread
//! that waits) happens before the team's first job returns, not while later work runs. A
//! counting global allocator for the whole process (every thread) checks it; this file holds
//! one test, so no other test allocates meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

#[path = "common/counting.rs"]
mod counting;
use counting::Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    ALLOCS.fetch_add(1, Relaxed);
}

#[global_allocator]
static GLOBAL: Counting = Counting(count);

#[test]
fn the_cpu_threads_allocate_nothing_after_their_first_job() {
    // Long enough to be split between the threads (the first split starts them).
    let mut x = vec![1.0f32; 1 << 20];
    syncmem::kernels::host::scale(2.0, &mut x);
    let before = ALLOCS.load(Relaxed);
    // The workers look for work for a while, then wait: the first wait of a thread is where
    // the lock library would set up its data.
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..20 {
        syncmem::kernels::host::scale(1.0, &mut x);
        std::thread::sleep(Duration::from_millis(2));
    }
    let after = ALLOCS.load(Relaxed);
    assert_eq!(
        after - before,
        0,
        "allocations after the threads' first job"
    );
    assert!(x.iter().all(|&v| v == 2.0));
}
