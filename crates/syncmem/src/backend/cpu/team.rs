//! The `cpu` backend's threads: the calling thread and `cores - 1` workers (at most 3) that
//! share the parts of one job (a GEMM, an element-wise pass).
//!
//! Every thread, the caller included, takes the next part not taken yet until none is left;
//! the caller then waits only for the parts a worker took and is still running. A worker that
//! is slow to wake (its core busy with another process) takes no part once the others have
//! taken them all, and is not waited for: the caller runs its part. (A worker preempted in the
//! middle of a part it took is waited for.) With a join of fixed halves on a tree of threads, which waits for
//! the other half's thread to be scheduled, one busy process on a 2-core machine made
//! `syncmem train --device cpu --hidden 1024` epochs 5-7 times slower (62-68 ms to 330-450);
//! JAX under the same load slowed 1.15 times.
//!
//! One job runs at a time: a caller that finds the workers busy with another thread's job runs
//! its own parts alone. So does a job started from inside a part (see
//! [`in_part`]): it is never published.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

thread_local! {
    /// This thread runs a part of a job (a part of a split, see [`super::par`]).
    static IN_PART: Cell<bool> = const { Cell::new(false) };
}

/// True on a thread that runs a part of a job now: a split from there runs on the thread.
pub(crate) fn in_part() -> bool {
    IN_PART.with(Cell::get)
}

/// Runs `f` marked as a part of a job (see [`in_part`]).
pub(crate) fn as_part<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_PART.with(|p| p.set(self.0));
        }
    }
    let _reset = Reset(IN_PART.with(|p| p.replace(true)));
    f()
}

/// The most threads of a job (the caller and 3 workers).
pub(crate) const MAX_THREADS: usize = 4;

/// How long a worker looks for the next job before it sleeps (the products of one training
/// step follow each other within microseconds), and how long a caller done with its parts
/// watches for the workers to leave the job before it sleeps (they finish theirs about when it
/// does).
const SPIN: Duration = Duration::from_micros(50);

/// One job: parts `0..parts` of `f`, on the caller's stack while it runs.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    parts: usize,
    /// The next part to take.
    next: AtomicUsize,
    /// Workers inside the job (counted under the slot's lock, while the job is published).
    inside: AtomicUsize,
    /// The payload of a part that panicked on a worker, raised again on the caller.
    payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// The caller, woken by the last worker to leave.
    caller: Thread,
}

impl Job<'_> {
    /// Runs parts until none is left.
    fn run_parts(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.parts {
                return;
            }
            as_part(|| (self.f)(i));
        }
    }
}

/// A published job, its lifetime erased (see the safety argument in [`Team::run`]).
#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);

// SAFETY: the pointer is only dereferenced by a worker between its count in `Job::inside`
// (taken under the slot's lock while the job is published) and its release, which the caller
// waits for before the job goes; `Job` is `Sync` (atomics, a `Sync` closure, a `Thread`, a
// lock around a `Send` payload).
unsafe impl Send for JobPtr {}

struct Slot {
    job: Option<JobPtr>,
}

struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
    /// Jobs published so far: what a spinning worker watches.
    published: AtomicU64,
    /// Workers past their start (see [`work`]).
    ready: AtomicUsize,
}

/// The workers and what they share.
pub(crate) struct Team {
    shared: &'static Shared,
    /// Threads of a job: the workers started and the caller.
    threads: usize,
}

/// The team, started on first use (the machine's cores, at most [`MAX_THREADS`]; a worker
/// that cannot be started leaves the team smaller).
pub(crate) fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            slot: Mutex::new(Slot { job: None }),
            wake: Condvar::new(),
            published: AtomicU64::new(0),
            ready: AtomicUsize::new(0),
        }));
        let started = (1..cores.min(MAX_THREADS))
            .filter(|i| {
                std::thread::Builder::new()
                    .name(format!("syncmem-cpu-{i}"))
                    .spawn(move || work(shared))
                    .is_ok()
            })
            .count();
        // A thread allocates as it starts (the runtime's set-up, the lock library's data of a
        // thread that waits). Waiting for the workers here keeps those allocations in the
        // first use of the team, not in whatever step a worker happens to start in.
        while shared.ready.load(Ordering::Acquire) < started {
            std::thread::yield_now();
        }
        Team {
            shared,
            threads: started + 1,
        }
    })
}

impl Team {
    /// Threads a job can use (the caller included).
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every part `i < parts`, on the caller and the workers; returns when
    /// every part has run. A panic of a part is raised on the caller.
    pub(crate) fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run_or(parts, f, &|| (0..parts).for_each(f));
    }

    /// As [`Team::run`], but when the workers cannot take part (they are on another thread's
    /// job, or there are none), runs `alone` on the calling thread instead of the parts: a
    /// product that is cut the same way on any number of threads does its work in one piece
    /// there, with the thread's own buffers.
    pub(crate) fn run_or(&self, parts: usize, f: &(dyn Fn(usize) + Sync), alone: &dyn Fn()) {
        let job = Job {
            f,
            parts,
            next: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            payload: Mutex::new(None),
            caller: std::thread::current(),
        };
        let published = self.threads > 1 && parts > 1 && !in_part() && {
            let mut slot = self.shared.slot.lock();
            if slot.job.is_some() {
                false // the workers are on another thread's job: this one runs alone
            } else {
                let p: *const Job<'_> = &job;
                slot.job = Some(JobPtr(p.cast()));
                self.shared.published.fetch_add(1, Ordering::Release);
                true
            }
        };
        if !published {
            as_part(alone);
            return;
        }
        // Retracts the job and waits for the workers inside it, also when a part of the
        // caller's panics: the job must outlive every worker's use of it.
        let retract = Retract {
            shared: self.shared,
            job: &job,
        };
        self.shared.wake.notify_all();
        job.run_parts();
        drop(retract);
        let payload = job.payload.lock().take();
        if let Some(payload) = payload {
            std::panic::resume_unwind(payload);
        }
    }
}

/// Takes the job back from the slot (no worker enters it after), then waits until the
/// workers inside have left it.
struct Retract<'a, 'b> {
    shared: &'static Shared,
    job: &'a Job<'b>,
}

impl Drop for Retract<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A part of the caller's panicked: the workers take no part after their current
            // one.
            self.job.next.store(self.job.parts, Ordering::Relaxed);
        }
        self.shared.slot.lock().job = None;
        // Acquire: a worker's writes (its parts' results) happen before its release.
        // Watched before sleeping: a caller that sleeps at once is woken by a system call of
        // the last worker and then waits to be scheduled again, on a VM for a virtual CPU to
        // be woken. That wait made `syncmem train --device cpu --hidden 256` epochs about 1.25
        // times longer on a 2-core VM.
        let start = Instant::now();
        while self.job.inside.load(Ordering::Acquire) != 0 && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        while self.job.inside.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
    }
}

/// A worker: takes each published job's parts until the thread ends with the process.
fn work(shared: &'static Shared) {
    {
        // A wait that times out at once: the lock library sets up this thread's data for
        // waiting (allocating) now, while `team` waits for it.
        let mut slot = shared.slot.lock();
        let _ = shared.wake.wait_for(&mut slot, Duration::ZERO);
    }
    shared.ready.fetch_add(1, Ordering::Release);
    let mut seen = 0u64;
    loop {
        // Looks for a job without the lock for a while, then sleeps on the condition.
        let start = Instant::now();
        while shared.published.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let job = {
            let mut slot = shared.slot.lock();
            loop {
                let now = shared.published.load(Ordering::Acquire);
                if let Some(j) = slot.job.filter(|_| now != seen) {
                    // SAFETY: the job is published, so its caller has not retracted it and
                    // waits for `inside` to return to 0 before it goes (`Retract`); the count
                    // is raised under the slot's lock, which the retraction takes too.
                    let job = unsafe { &*j.0 };
                    // A job with no part left is not entered: its caller need not wait for
                    // this worker to be scheduled again.
                    if job.next.load(Ordering::Relaxed) < job.parts {
                        seen = now;
                        job.inside.fetch_add(1, Ordering::Relaxed);
                        break j;
                    }
                }
                seen = now;
                shared.wake.wait(&mut slot);
            }
        };
        // SAFETY: counted in `inside` above: the job lives until this worker's release below.
        let job = unsafe { &*job.0 };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job.run_parts())) {
            // The caller raises the first payload again. A later one is dropped here, under
            // `catch_unwind` (a panicking drop must not end the worker before it releases its
            // count: its caller would wait forever).
            let later = {
                let mut first = job.payload.lock();
                match *first {
                    None => first.replace(payload),
                    Some(_) => Some(payload),
                }
            };
            let _ = catch_unwind(AssertUnwindSafe(move || drop(later)));
        }
        // The caller may free the job as soon as the count is released: wake it with a
        // handle of its own.
        let caller = job.caller.clone();
        if job.inside.fetch_sub(1, Ordering::Release) == 1 {
            caller.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once() {
        for parts in [0, 1, 2, 3, 7, 64] {
            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            team().run(parts, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{parts}"
            );
        }
    }

    #[test]
    fn jobs_from_several_threads_at_once_all_complete() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        team().run(8, &|i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.into_inner(), 28);
                    }
                });
            }
        });
    }

    #[test]
    fn a_busy_core_does_not_hold_a_job_back() {
        // Parts that each take a while: whoever takes them, all run, and the caller returns
        // once they have (a worker that never woke would have left its part to the caller).
        let done = AtomicUsize::new(0);
        team().run(4, &|_| {
            std::thread::sleep(Duration::from_millis(2));
            done.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(done.into_inner(), 4);
    }

    #[test]
    fn a_job_the_workers_cannot_take_runs_alone() {
        // From inside a part: never published, `alone` runs instead of the parts.
        let (parts, alone) = (AtomicUsize::new(0), AtomicUsize::new(0));
        team().run(2, &|_| {
            team().run_or(
                4,
                &|_| {
                    parts.fetch_add(1, Ordering::Relaxed);
                },
                &|| {
                    alone.fetch_add(1, Ordering::Relaxed);
                },
            );
        });
        assert_eq!((parts.into_inner(), alone.into_inner()), (0, 2));
        // Otherwise either the job is published and every part runs, or `alone` runs (no
        // workers, or the workers on another test's job): never both, never neither.
        for _ in 0..50 {
            let (parts, alone) = (AtomicUsize::new(0), AtomicUsize::new(0));
            team().run_or(
                4,
                &|_| {
                    parts.fetch_add(1, Ordering::Relaxed);
                },
                &|| {
                    alone.fetch_add(1, Ordering::Relaxed);
                },
            );
            let got = (parts.into_inner(), alone.into_inner());
            assert!(got == (4, 0) || got == (0, 1), "{got:?}");
        }
    }

    #[test]
    fn a_panicking_part_is_raised_on_the_caller() {
        let r = catch_unwind(|| {
            team().run(8, &|i| {
                if i == 5 {
                    panic!("part 5");
                }
            })
        });
        // The part's own payload, wherever it ran.
        let payload = r.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"part 5"));
        // The team still works.
        let n = AtomicUsize::new(0);
        team().run(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.into_inner(), 8);
    }
}
