//! The timeline of an in-order stream: every command a backend enqueues on the stream gets a
//! sequence number (1, 2, 3, ...), and the stream keeps the events of its newest commands.
//!
//! A stream runs its commands in order, so "command `seq` is done" is all the rest of the crate
//! needs to know about any command: a buffer records the `(stream, seq)` of the work that reads
//! or writes it, the host waits for exactly that point, another stream waits for it on the
//! device, a pool block is reused once it is done. No event object is made per use of a buffer:
//! the stream keeps the events, in a ring of the last [`RING`] commands allocated once. A point
//! older than the ring is covered by the oldest event the ring still holds (it completes after
//! it: waiting for it is correct, only later than needed).
//!
//! `done` is the watermark of the commands known to be complete: waiting for an event, or a
//! blocking command returning, raises it, so later questions about earlier commands are
//! answered without asking the runtime.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::BackendEvent;
use crate::error::Result;

/// How many of a stream's newest command events are kept.
pub(crate) const RING: usize = 64;

/// The sequence numbers and recent events of one in-order stream.
pub(crate) struct Timeline<E> {
    ring: Mutex<Ring<E>>,
    /// `Ring::last`, readable without the lock (written under it).
    last: AtomicU64,
    /// Every command with a sequence number up to this one is complete.
    done: AtomicU64,
}

struct Ring<E> {
    /// The sequence number of the newest command (0: none yet).
    last: u64,
    /// The event of command `s` sits in slot `s % RING` while `s > last - RING`.
    slots: Vec<Option<E>>,
}

impl<E: BackendEvent> Default for Timeline<E> {
    fn default() -> Self {
        Self {
            ring: Mutex::new(Ring {
                last: 0,
                slots: (0..RING).map(|_| None).collect(),
            }),
            last: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }
}

impl<E: BackendEvent> Timeline<E> {
    /// Enqueues one command with `enqueue` (which returns the command's completion event) and
    /// records it; returns its sequence number. The timeline's lock is held while `enqueue`
    /// runs, so that numbers follow the queue's order when threads share the stream.
    ///
    /// # Errors
    /// The error of `enqueue`; nothing is recorded then.
    pub(crate) fn submit(&self, enqueue: impl FnOnce() -> Result<E>) -> Result<u64> {
        self.submit_reusing(|_| enqueue())
    }

    /// [`Timeline::submit`], where `enqueue` is also handed the slot of the event that the new
    /// one replaces (the ring's oldest, or `None`): it may take that event to record it again
    /// instead of making one, when nothing else holds it. An `enqueue` that fails must leave
    /// the slot as it found it.
    pub(crate) fn submit_reusing(
        &self,
        enqueue: impl FnOnce(&mut Option<E>) -> Result<E>,
    ) -> Result<u64> {
        let old;
        let seq;
        {
            let mut r = self.ring.lock();
            let next = slot(r.last + 1);
            let event = enqueue(&mut r.slots[next])?;
            r.last += 1;
            seq = r.last;
            old = r.slots[next].replace(event);
            self.last.store(seq, Ordering::Release);
        }
        // The event it replaces (unless `enqueue` took it) is released outside the lock.
        drop(old);
        Ok(seq)
    }

    /// Records a command that ran to completion before returning (a blocking copy): every
    /// command before it is complete too.
    pub(crate) fn submit_blocking(&self, enqueue: impl FnOnce() -> Result<E>) -> Result<u64> {
        let seq = self.submit(enqueue)?;
        self.mark_done(seq);
        Ok(seq)
    }

    /// The sequence number of the newest command (0 when none was enqueued): without the lock
    /// (a launch reads it right after queueing, to record its point on its buffers).
    pub(crate) fn last(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    /// The watermark: every command up to it is known to be complete.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    /// Notes that every command up to `seq` is complete (after a blocking command or a wait).
    pub(crate) fn mark_done(&self, seq: u64) {
        self.done.fetch_max(seq, Ordering::AcqRel);
    }

    /// The event that completes no earlier than command `seq`, with its own sequence number:
    /// the command's own event while the ring holds it, else the oldest one it holds. `None`
    /// when `seq` is known to be complete.
    pub(crate) fn covering(&self, seq: u64) -> Option<(u64, E)> {
        if seq <= self.done() {
            return None;
        }
        let r = self.ring.lock();
        let newest = r.last;
        let oldest = newest.saturating_sub(RING as u64 - 1).max(1);
        let s = seq.clamp(oldest, newest.max(1));
        r.slots[slot(s)].clone().map(|e| (s, e))
    }

    /// True when command `seq` has completed. Never blocks (it may ask the runtime).
    ///
    /// # Errors
    /// The error of a command that failed.
    pub(crate) fn is_done(&self, seq: u64) -> Result<bool> {
        match self.covering(seq) {
            None => Ok(true),
            Some((s, e)) => {
                let complete = e.is_complete()?;
                if complete {
                    self.mark_done(s);
                }
                Ok(complete)
            }
        }
    }

    /// Blocks until command `seq` has completed. Returns whether it had to wait (the command
    /// was not known to be complete).
    ///
    /// # Errors
    /// The error of a command that failed.
    pub(crate) fn wait(&self, seq: u64) -> Result<bool> {
        match self.covering(seq) {
            None => Ok(false),
            Some((s, e)) => {
                // A failed command is reported by the wait itself (it names the wait).
                let blocked = !matches!(e.is_complete(), Ok(true));
                if blocked {
                    e.wait()?;
                }
                self.mark_done(s);
                Ok(blocked)
            }
        }
    }
}

fn slot(seq: u64) -> usize {
    (seq % RING as u64) as usize
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;

    /// An event that completes when its flag is set.
    #[derive(Clone)]
    struct Flag(Arc<AtomicBool>);

    impl BackendEvent for Flag {
        fn wait(&self) -> Result<()> {
            self.0.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn is_complete(&self) -> Result<bool> {
            Ok(self.0.load(Ordering::SeqCst))
        }
    }

    fn flag() -> (Flag, Arc<AtomicBool>) {
        let f = Arc::new(AtomicBool::new(false));
        (Flag(f.clone()), f)
    }

    #[test]
    fn commands_are_numbered_and_waited_for_exactly() {
        let t: Timeline<Flag> = Timeline::default();
        assert_eq!(t.last(), 0);
        assert!(t.is_done(0).unwrap(), "nothing before the first command");
        let (a, a_done) = flag();
        let (b, _b_done) = flag();
        assert_eq!(t.submit(|| Ok(a)).unwrap(), 1);
        assert_eq!(t.submit(|| Ok(b)).unwrap(), 2);
        assert!(!t.is_done(1).unwrap());
        a_done.store(true, Ordering::SeqCst);
        assert!(t.is_done(1).unwrap());
        assert_eq!(t.done(), 1, "the watermark follows");
        assert!(!t.is_done(2).unwrap(), "command 2 is still running");
        assert!(t.wait(2).unwrap(), "had to wait");
        assert!(!t.wait(2).unwrap(), "known complete: no wait");
        assert!(!t.wait(1).unwrap());
    }

    #[test]
    fn old_points_are_covered_by_the_oldest_event_kept() {
        let t: Timeline<Flag> = Timeline::default();
        let flags: Vec<_> = (0..RING + 10)
            .map(|_| {
                let (e, f) = flag();
                t.submit(|| Ok(e)).unwrap();
                f
            })
            .collect();
        // Command 3 fell out of the ring: the oldest kept event (11) stands for it.
        let (s, _) = t.covering(3).unwrap();
        assert_eq!(s, 11);
        flags[10].store(true, Ordering::SeqCst);
        assert!(t.is_done(3).unwrap());
        assert_eq!(t.done(), 11);
        // A blocking command marks everything before it as done.
        t.mark_done(RING as u64 + 10);
        assert!(t.covering(RING as u64 + 10).is_none());
    }

    #[test]
    fn the_event_pushed_out_of_the_ring_is_offered_for_reuse() {
        let t: Timeline<Flag> = Timeline::default();
        let flags: Vec<_> = (0..RING).map(|_| flag()).collect();
        for (f, _) in &flags {
            let f = f.clone();
            t.submit_reusing(|spare| {
                assert!(spare.is_none(), "the ring is not full yet");
                Ok(f)
            })
            .unwrap();
        }
        // The next command replaces command 1's event: it is handed over and can be taken.
        let taken = t
            .submit_reusing(|spare| Ok(spare.take().expect("command 1's event")))
            .unwrap();
        assert_eq!(taken, RING as u64 + 1);
        assert!(Arc::ptr_eq(&t.covering(taken).unwrap().1 .0, &flags[0].1));
        // An enqueue that fails leaves the slot as it was, and numbers nothing.
        let e = t.submit_reusing(|_| {
            Err(crate::Error::Unsupported {
                device: "test".into(),
                what: "a failed enqueue".into(),
            })
        });
        assert!(e.is_err());
        assert_eq!(t.last(), RING as u64 + 1);
        let (s, oldest) = t.covering(2).unwrap();
        assert_eq!(s, 2, "command 2 is still the oldest kept");
        assert!(Arc::ptr_eq(&oldest.0, &flags[1].1));
    }
}
