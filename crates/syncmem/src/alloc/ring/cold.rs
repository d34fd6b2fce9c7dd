//! The cold path of the write path ([`super::hot`]): joining a history, switching rings,
//! starting the next run of slots (and reading the clock every [`SAMPLE`] events of a ring),
//! numbering a name, keeping a stack. Each borrows the thread's recorder and takes the hot
//! state out of use while it changes it, so that an event made meanwhile on the thread (an
//! allocation of the stack capture, say) is dropped rather than written half-way.

use std::backtrace::Backtrace;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::hot::{cache_index, Hot, DISARMED, HOT};
use super::slots::SourceRing;
use super::{Local, Recorder, ThreadRings, CURRENT, LOCAL, SAMPLE};

/// Runs `f` with the thread's recorder state and the hot state taken out of use (its
/// generation is put back after); `None` for an event made while the recorder is borrowed (a
/// re-entrant one) or while the thread ends.
fn with_local<R>(f: impl FnOnce(&mut Local, &Hot) -> R) -> Option<R> {
    LOCAL
        .try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            HOT.with(|h| {
                let generation = h.disarm();
                let out = f(&mut l, h);
                // Armed again only for the recorder it mirrors (`prepare` arms it itself).
                if h.generation.get() == DISARMED
                    && matches!(&l.recorder, Some(r) if r.generation == generation)
                {
                    h.generation.set(generation);
                }
                Some(out)
            })
        })
        .ok()
        .flatten()
}

/// Makes the hot state ready for an event of `source` in the history of `generation`: joins
/// the history, switches to the ring of `source` and starts a run of slots as needed. False
/// when the event cannot be recorded.
#[cold]
#[inline(never)]
pub(super) fn prepare(generation: u64, source: u64) -> bool {
    if generation == 0 {
        // The history stopped since the pool looked.
        return false;
    }
    with_local(|l, h| {
        let joined = matches!(&l.recorder, Some(r) if r.generation == generation);
        if !joined && !register(l, h, generation) {
            return false;
        }
        let Some(r) = &mut l.recorder else {
            return false;
        };
        if h.source.get() != source {
            r.switch_ring(h, source);
        } else if h.cur.get() == h.end.get() {
            let ring = r.ring(source);
            start_run(r, h, &ring);
        }
        h.generation.set(generation);
        true
    })
    .unwrap_or(false)
}

/// Starts the run of slots of `ring` at the hot state's sequence number, reading the clock
/// when the run starts a new [`SAMPLE`] of the ring's events.
fn start_run(r: &Recorder, h: &Hot, ring: &SourceRing) {
    let seq = h.seq.get();
    if seq.is_multiple_of(SAMPLE) {
        h.read_clock(&r.rings);
    }
    let run = ring.run(seq, SAMPLE);
    h.cur.set(run.start);
    h.end.set(run.end);
}

impl Recorder {
    /// The ring of `source`, made at its first event.
    fn ring(&mut self, source: u64) -> Arc<SourceRing> {
        if let Some((_, r)) = self.sources.iter().find(|(s, _)| *s == source) {
            return r.clone();
        }
        let ring = Arc::new(SourceRing::new(source, self.rings.max_entries));
        self.thread.rings.lock().push(ring.clone());
        self.sources.push((source, ring.clone()));
        ring
    }

    /// Makes the ring of `source` the one the hot state writes, leaving the sequence number
    /// of the one it wrote with that ring.
    fn switch_ring(&mut self, h: &Hot, source: u64) {
        if let Some((_, old)) = self.sources.iter().find(|(s, _)| *s == h.source.get()) {
            old.set_next(h.seq.get());
        }
        let ring = self.ring(source);
        h.source.set(source);
        h.seq.set(ring.next());
        start_run(self, h, &ring);
    }

    /// The number of `name` in the history (through the thread's cache, which the hot state
    /// mirrors).
    pub(super) fn id_of(&mut self, h: &Hot, name: &Arc<str>) -> u32 {
        let addr = Arc::as_ptr(name) as *const u8 as usize;
        let i = cache_index(addr);
        match &self.cache[i] {
            Some((held, id)) if Arc::ptr_eq(held, name) => *id,
            _ => {
                let id = self.rings.names.lock().id(name);
                self.cache[i] = Some((name.clone(), id));
                h.names[i].set((addr, id));
                id
            }
        }
    }
}

/// Numbers `name` for the hot state (0 when it cannot be numbered now).
#[cold]
#[inline(never)]
pub(super) fn number(_h: &Hot, name: &Arc<str>) -> u32 {
    with_local(|l, h| l.recorder.as_mut().map_or(0, |r| r.id_of(h, name))).unwrap_or(0)
}

/// Captures the stack of the allocation `seq` of `source` and keeps it with the ring.
#[cold]
#[inline(never)]
pub(super) fn keep_stack(source: u64, seq: u64) {
    with_local(|l, _| {
        if let Some(r) = &mut l.recorder {
            let bt = Arc::new(Backtrace::force_capture());
            r.ring(source).keep_stack(seq, bt);
        }
    });
}

/// Reads the clock into the hot state.
#[cold]
#[inline(never)]
pub(super) fn read_clock(_h: &Hot) {
    with_local(|l, h| {
        if let Some(r) = &l.recorder {
            h.read_clock(&r.rings);
        }
    });
}

/// Numbers `text` in the history the thread records (0 when it cannot now).
#[cold]
pub(super) fn text_id(text: &str) -> u32 {
    with_local(|l, _| {
        l.recorder
            .as_ref()
            .map_or(0, |r| r.rings.names.lock().id(text))
    })
    .unwrap_or(0)
}

/// Joins the history of `generation` (once per thread and history), setting the hot state
/// for it (not armed: the caller arms it).
fn register(l: &mut Local, h: &Hot, generation: u64) -> bool {
    if let Some(old) = l.recorder.take() {
        old.rings.retire(&old.thread);
    }
    reset(h);
    let Some(rings) = CURRENT.read().clone() else {
        return false;
    };
    if rings.generation != generation {
        return false;
    }
    let thread = {
        let mut threads = rings.threads.lock();
        let t = Arc::new(ThreadRings {
            number: rings.next_thread.fetch_add(1, Relaxed),
            rings: parking_lot::Mutex::new(Vec::new()),
        });
        threads.push(t.clone());
        t
    };
    h.read_clock(&rings);
    h.thread_bits.set((thread.number & 0xffff) << 16);
    h.mark.set(super::hot::mark_of(thread.number));
    let mut r = Recorder {
        generation,
        rings,
        thread,
        sources: Vec::new(),
        cache: Box::new(std::array::from_fn(|_| None)),
    };
    let op = l.op.as_ref().map_or(0, |o| r.id_of(h, o));
    h.op.set(u64::from(op) << 32);
    l.recorder = Some(r);
    true
}

/// Clears the hot state (no history, no ring, no names).
pub(super) fn reset(h: &Hot) {
    h.generation.set(DISARMED);
    h.source.set(u64::MAX);
    h.cur.set(std::ptr::null());
    h.end.set(std::ptr::null());
    h.seq.set(0);
    h.now.set(0);
    h.op.set(0);
    h.mark.set(super::hot::MARK_UNKNOWN);
    for n in &h.names {
        n.set((0, 0));
    }
}
