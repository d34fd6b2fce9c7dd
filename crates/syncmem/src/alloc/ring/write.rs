//! The write path of the rings: an event encoded as words straight into the next slot of the
//! thread's ring of its source.

use std::backtrace::Backtrace;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use super::slots::{self, Slot, SourceRing};
use super::{register, trace_stacks, Local, Names, Recorder, LOCAL, SAMPLE, STEP};
use crate::alloc::event::{PoolEvent, StreamId};
use crate::alloc::stats::Direction;

/// The labels of pools and devices, numbered for the whole process (a pool takes its number
/// when it is made: the write path stores it as it is).
static LABELS: LazyLock<Mutex<Names>> = LazyLock::new(Mutex::default);

/// The number of the pool or device label `label`, for the whole process.
pub(crate) fn label_key(label: &str) -> u32 {
    LABELS.lock().id(label)
}

/// Every label numbered ([`label_key`]): number `n` is at `n - 1`.
pub(super) fn labels() -> Vec<Arc<str>> {
    LABELS.lock().list.clone()
}

/// Runs `f` with this thread's recorder of the history of `generation`, joining it first when
/// needed; does nothing for a re-entrant event (a stack capture allocating from a recorded
/// pool) or while the thread ends.
#[inline(always)]
fn with_recorder(generation: u64, f: impl FnOnce(Option<&Arc<str>>, &mut Recorder)) {
    let _ = LOCAL.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else {
            return;
        };
        let l: &mut Local = &mut l;
        if !matches!(&l.recorder, Some(r) if r.generation == generation) && !register(l, generation)
        {
            return;
        }
        if let Some(r) = &mut l.recorder {
            f(l.op.as_ref(), r);
        }
    });
}

/// Records pool event `e` of `source`, from the pool labelled `label` (its [`label_key`]),
/// with its shard's `order`, into this thread's ring.
#[inline]
pub(crate) fn record_pool(
    generation: u64,
    source: u64,
    label: u32,
    e: &PoolEvent,
    order: (u64, u64),
) {
    with_recorder(generation, |op, r| r.pool(op, source, label, e, order));
}

/// Records a copy into this thread's ring.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_copy(
    generation: u64,
    source: u64,
    device: &str,
    stream: StreamId,
    direction: Direction,
    bytes: usize,
    peer: Option<&str>,
) {
    let label = label_key(device);
    let peer = peer.map_or(0, label_key);
    with_recorder(generation, |_, r| {
        r.now = r.rings.now();
        let (seq, slot) = r.begin(source, slots::COPY, label);
        slot.set(6, stream);
        slot.set(7, slots::direction_code(direction));
        slot.set(8, bytes as u64);
        slot.set(9, u64::from(peer));
        slot.end(seq);
    });
}

impl Recorder {
    /// The ring of `source`, made at its first event.
    #[inline(always)]
    fn ring(&mut self, source: u64) -> &SourceRing {
        if self.last.0 != source {
            self.switch_ring(source);
        }
        &self.last.1
    }

    /// Makes the ring of `source` the current one, made at its first event.
    #[cold]
    fn switch_ring(&mut self, source: u64) {
        let ring = match self.sources.iter().find(|(s, _)| *s == source) {
            Some((_, r)) => r.clone(),
            None => {
                let ring = Arc::new(SourceRing::new(source, self.rings.max_entries));
                self.thread.rings.lock().push(ring.clone());
                self.sources.push((source, ring.clone()));
                ring
            }
        };
        self.last = (source, ring);
    }

    /// The number of `name` in the history (through the thread's cache).
    #[inline(always)]
    fn id_of(&mut self, name: &Arc<str>) -> u32 {
        let addr = Arc::as_ptr(name) as *const u8 as usize;
        let i = (addr >> 4) & (super::CACHE - 1);
        match &self.cache[i] {
            Some((held, id)) if Arc::ptr_eq(held, name) => *id,
            _ => self.id_slow(i, name),
        }
    }

    #[cold]
    fn id_slow(&mut self, i: usize, name: &Arc<str>) -> u32 {
        let id = self.rings.names.lock().id(name);
        self.cache[i] = Some((name.clone(), id));
        id
    }

    #[cold]
    fn text_id(&mut self, text: &str) -> u32 {
        self.rings.names.lock().id(text)
    }

    /// Starts writing an event of `kind` from `label` into the ring of `source`: its slot, with
    /// the time, step, kind, label and thread set, and its sequence number.
    #[inline(always)]
    fn begin(&mut self, source: u64, kind: u64, label: u32) -> (u64, &Slot) {
        let now = self.now;
        let head = kind | self.thread_bits | u64::from(label) << 32;
        let (seq, slot) = self.ring(source).next_slot();
        slot.begin();
        slot.set(0, now);
        slot.set(1, STEP.load(Relaxed).wrapping_add(1));
        slot.set(2, head);
        (seq, slot)
    }

    /// Records a pool event.
    #[inline(always)]
    fn pool(
        &mut self,
        op: Option<&Arc<str>>,
        source: u64,
        label: u32,
        e: &PoolEvent,
        order: (u64, u64),
    ) {
        self.count += 1;
        if self.count & (SAMPLE - 1) == 0 {
            self.now = self.rings.now();
        }
        match e {
            PoolEvent::Alloc {
                requested,
                size,
                cache_hit,
                block,
                stream,
                segment,
                offset,
                owner,
            } => {
                let owner = owner.as_ref().map_or(0, |o| self.id_of(o));
                let op = op.map_or(0, |o| self.id_of(o));
                let kind = slots::ALLOC | u64::from(*cache_hit) << 8;
                let (seq, slot) = self.begin(source, kind, label);
                slot.set(3, order.0);
                slot.set(4, order.1);
                slot.set(5, u64::from(owner) | u64::from(op) << 32);
                slot.set(6, *requested as u64);
                slot.set(7, *size as u64);
                slot.set(8, *block);
                slot.set(9, *stream);
                slot.set(10, *segment);
                slot.set(11, *offset as u64);
                slot.end(seq);
                if trace_stacks() {
                    self.keep_stack(source, seq);
                }
            }
            PoolEvent::Free { size, block } => {
                let (seq, slot) = self.begin(source, slots::FREE, label);
                slot.set(3, order.0);
                slot.set(4, order.1);
                slot.set(7, *size as u64);
                slot.set(8, *block);
                slot.end(seq);
            }
            other => self.rare(source, label, other, order),
        }
    }

    #[cold]
    fn keep_stack(&mut self, source: u64, seq: u64) {
        let bt = Arc::new(Backtrace::force_capture());
        self.ring(source).keep_stack(seq, bt);
    }

    /// The rare pool events (they read the clock).
    #[cold]
    fn rare(&mut self, source: u64, label: u32, e: &PoolEvent, order: (u64, u64)) {
        self.now = self.rings.now();
        // Words 5 to 11.
        let mut w = [0u64; 7];
        let kind = match e {
            PoolEvent::SegmentAlloc {
                bytes,
                segment,
                stream,
            } => {
                (w[2], w[5], w[4]) = (*bytes as u64, *segment, *stream);
                slots::SEGMENT_ALLOC
            }
            PoolEvent::SegmentFree { bytes, segment } => {
                (w[2], w[5]) = (*bytes as u64, *segment);
                slots::SEGMENT_FREE
            }
            PoolEvent::Evict { label, bytes } => {
                (w[0], w[2]) = (u64::from(self.text_id(label)), *bytes as u64);
                slots::EVICT
            }
            PoolEvent::OutOfMemory { requested } => {
                w[1] = *requested as u64;
                slots::OOM
            }
            PoolEvent::Alloc { .. } | PoolEvent::Free { .. } => return,
        };
        let (seq, slot) = self.begin(source, kind, label);
        slot.set(3, order.0);
        slot.set(4, order.1);
        for (i, v) in w.iter().enumerate() {
            slot.set(5 + i, *v);
        }
        slot.end(seq);
    }
}
