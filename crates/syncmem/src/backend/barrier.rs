//! Asymmetric memory barriers: a side taken often pays a compiler fence only, and a side
//! taken rarely makes every running thread of the process execute a full barrier
//! (Linux's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`).
//!
//! A flag taken by one thread on its fast path and, rarely, by another one (a thread cache
//! of the pools) needs the two sides ordered as Dekker's algorithm does: each stores its
//! flag, then loads the other's, and never may both load the old value. With a full fence on
//! each side that costs the fast path a serialising instruction; with [`light`] there and
//! [`heavy`] on the rare side, the fast path stores, loads and runs on. [`heavy`] forces a
//! barrier on every thread of the process that is running (an interrupt on its core; a
//! thread that is not running was switched out, which orders its memory), so that a fast
//! path either ran its store before it, and the rare side sees it, or runs its load after
//! it, and sees the rare side's store.
//!
//! Where the kernel does not offer the command (another system, an old kernel, a sandbox
//! that refuses the call, or under Miri), [`asymmetric`] says so, and both sides use full
//! fences: [`light`] is then a full fence too.

use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

/// Not asked yet.
const UNKNOWN: u8 = 0;
/// The process is registered for expedited barriers.
const ASYMMETRIC: u8 = 1;
/// No expedited barriers here: full fences on both sides.
const SYMMETRIC: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether [`heavy`] is a process-wide barrier (and [`light`] a compiler fence only). Asks
/// the kernel, and registers the process, once; the answer never changes afterwards, so
/// that a flag built on one answer keeps its two sides matched.
pub(crate) fn asymmetric() -> bool {
    match MODE.load(Ordering::Acquire) {
        ASYMMETRIC => true,
        SYMMETRIC => false,
        _ => {
            let mode = if sys::register() {
                ASYMMETRIC
            } else {
                SYMMETRIC
            };
            // Two threads asking at once both register (which is idempotent); the first
            // answer stays.
            match MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => mode == ASYMMETRIC,
                Err(set) => set == ASYMMETRIC,
            }
        }
    }
}

/// The fast side's barrier between its store and its load: a compiler fence when `asym`
/// (the answer of [`asymmetric`]), else a full fence.
#[inline(always)]
pub(crate) fn light(asym: bool) {
    if asym {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The rare side's barrier between its store and its load: a full barrier on every running
/// thread of the process when `asym` (the answer of [`asymmetric`]), else a full fence of
/// this thread. Costs a system call (microseconds): once per drain or snapshot, not per flag.
pub(crate) fn heavy(asym: bool) {
    fence(Ordering::SeqCst);
    if asym {
        sys::expedited();
    }
    fence(Ordering::SeqCst);
}

#[cfg(all(target_os = "linux", not(miri)))]
mod sys {
    /// `MEMBARRIER_CMD_QUERY`: the commands this kernel supports.
    const QUERY: libc::c_long = 0;
    /// `MEMBARRIER_CMD_GLOBAL`: a barrier on every thread of the system (slow, needs no
    /// registration).
    const GLOBAL: libc::c_long = 1;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// `membarrier(cmd, 0, 0)`.
    fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: `membarrier` takes integers only and touches no memory of the caller.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }

    /// Registers the process for expedited barriers; false where the kernel lacks them or
    /// refuses the call.
    pub(super) fn register() -> bool {
        let supported = membarrier(QUERY);
        let both = PRIVATE_EXPEDITED | REGISTER_PRIVATE_EXPEDITED;
        supported >= 0 && supported & both == both && membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A barrier on every running thread of the process.
    pub(super) fn expedited() {
        // Registered, the command does not fail (the registration is kept across `fork`);
        // should a kernel refuse it all the same, it is registered again and asked again,
        // then the global barrier (slow, with no registration) keeps the fast sides ordered.
        // A kernel refusing all of them leaves no way to order them: the process stops rather
        // than let two threads hold one flag.
        if membarrier(PRIVATE_EXPEDITED) != 0
            && !(membarrier(REGISTER_PRIVATE_EXPEDITED) == 0 && membarrier(PRIVATE_EXPEDITED) == 0)
            && membarrier(GLOBAL) != 0
        {
            eprintln!("syncmem: the kernel refused a registered memory barrier");
            std::process::abort();
        }
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
mod sys {
    /// No expedited barriers on this system.
    pub(super) fn register() -> bool {
        false
    }

    /// Never called: [`super::asymmetric`] is false here.
    pub(super) fn expedited() {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::{asymmetric, heavy, light};

    /// The answer is asked once and kept.
    #[test]
    fn the_answer_stays() {
        let a = asymmetric();
        assert_eq!(asymmetric(), a);
        #[cfg(miri)]
        assert!(!a, "no system calls under Miri");
    }

    /// Dekker's exclusion on the two barriers: a fast side (store its flag, `light`, load the
    /// other's) and a rare side (store, `heavy`, load) never both find the other's flag
    /// clear, and so never are both inside at once.
    #[test]
    fn the_two_sides_exclude_each_other() {
        exclusion(asymmetric());
    }

    /// The same with full fences on both sides (the fallback where the system has no
    /// process-wide barrier).
    #[test]
    fn the_two_sides_exclude_each_other_with_fences_only() {
        exclusion(false);
    }

    /// The fast and the rare side, with barriers of `asym`'s kind.
    fn exclusion(asym: bool) {
        let rounds = if cfg!(miri) { 30 } else { 2_000 };
        let fast = Arc::new(AtomicBool::new(false));
        let rare = Arc::new(AtomicBool::new(false));
        let inside = Arc::new(AtomicUsize::new(0));
        let entered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        // Stops the fast side when this side fails, so that the failure is not a hang.
        struct StopOnDrop(Arc<AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(stop.clone());
        let worker = {
            let (fast, rare, inside, entered, stop) = (
                fast.clone(),
                rare.clone(),
                inside.clone(),
                entered.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    fast.store(true, Ordering::Relaxed);
                    light(asym);
                    let refused = rare.load(Ordering::Acquire);
                    if !refused {
                        assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0, "both inside");
                        entered.fetch_add(1, Ordering::Relaxed);
                        inside.fetch_sub(1, Ordering::Relaxed);
                    }
                    fast.store(false, Ordering::Release);
                    // A pause, as a real fast side works between its turns.
                    for _ in 0..16 {
                        std::hint::spin_loop();
                    }
                    // Refused, it waits for the rare side (which waits for this flag).
                    while refused && rare.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        for _ in 0..rounds {
            rare.store(true, Ordering::Relaxed);
            heavy(asym);
            while fast.load(Ordering::Acquire) && !worker.is_finished() {
                std::hint::spin_loop();
            }
            if worker.is_finished() {
                break;
            }
            assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0, "both inside");
            inside.fetch_sub(1, Ordering::Relaxed);
            rare.store(false, Ordering::Release);
            std::thread::yield_now();
        }
        // The fast side got in at least once (it may start late).
        while entered.load(Ordering::Relaxed) == 0 && !worker.is_finished() {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        worker
            .join()
            .expect("the fast side never found both inside");
    }
}
