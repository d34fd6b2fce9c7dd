//! Reading the rings: every thread's events merged into one order, the newest of each source.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::sync::Arc;

use super::slots::{self, SourceRing, WORDS};
use super::{Rings, ThreadRings};
use crate::alloc::event::{PoolEvent, StreamId};
use crate::alloc::stats::Direction;

/// One event read from the rings.
#[derive(Debug)]
pub(crate) struct RawEvent {
    /// Its source.
    pub(crate) source: u64,
    /// Nanoseconds from the history's start (the time its thread read last; never before the
    /// event before it of the same source).
    pub(crate) t_ns: u64,
    /// The step marked then.
    pub(crate) step: Option<u64>,
    /// The pool's (or, for a copy, the device's) label.
    pub(crate) label: Arc<str>,
    pub(crate) what: RawWhat,
}

/// What an event read from the rings is.
#[derive(Debug)]
pub(crate) enum RawWhat {
    /// A pool event, with the operator running and the stack of an allocation.
    Pool(PoolEvent, Option<Arc<str>>, Option<Arc<Backtrace>>),
    /// A copy.
    Copy {
        stream: StreamId,
        direction: Direction,
        bytes: usize,
        peer: Option<Arc<str>>,
    },
}

/// An event as its ring holds it.
struct Entry {
    thread: u64,
    seq: u64,
    w: [u64; WORDS],
    stack: Option<Arc<Backtrace>>,
}

impl Entry {
    fn t(&self) -> u64 {
        self.w[0]
    }
}

impl Rings {
    /// Every ring of the history now (the retired ones first), with the retired rings locked
    /// so that no thread moves its events while they are read.
    fn entries(&self) -> HashMap<u64, Vec<Entry>> {
        let retired = self.retired.lock();
        let threads: Vec<Arc<ThreadRings>> = self.threads.lock().clone();
        let mut rings: Vec<Arc<SourceRing>> = retired.clone();
        for t in &threads {
            rings.extend(t.rings.lock().iter().cloned());
        }
        let mut by_source: HashMap<u64, Vec<Entry>> = HashMap::new();
        for r in &rings {
            let out = by_source.entry(r.source).or_default();
            for (seq, w, stack) in r.events() {
                out.push(Entry {
                    thread: (w[2] >> 16) & 0xffff,
                    seq,
                    w,
                    stack,
                });
            }
        }
        drop(retired);
        by_source
    }

    /// The events held now, the newest `max_entries` of each source, in one order: each
    /// thread's in its order, each pool shard's in its order, the rest by time.
    pub(crate) fn collect(&self) -> Vec<RawEvent> {
        let by_source = self.entries();
        let names: Vec<Arc<str>> = self.names.lock().list.clone();
        let labels = super::write::labels();
        let mut all = Vec::new();
        for (source, mut entries) in by_source {
            order(&mut entries);
            let skip = entries.len().saturating_sub(self.max_entries);
            let mut last = 0;
            for e in entries.into_iter().skip(skip) {
                last = e.t().max(last);
                all.push((last, source, e));
            }
        }
        // Stable: each source keeps its order.
        all.sort_by_key(|(t, ..)| *t);
        all.into_iter()
            .filter_map(|(t, source, e)| decode(source, t, e, &names, &labels))
            .collect()
    }

    /// Number of events a read would return now.
    pub(crate) fn len(&self) -> usize {
        self.entries()
            .values()
            .map(|v| v.len().min(self.max_entries))
            .sum()
    }
}

/// Puts `entries` (of one source) in order: by time, then thread, then the thread's order;
/// then the events of each pool shard, in the places they hold, into the shard's order.
fn order(entries: &mut Vec<Entry>) {
    entries.sort_by_key(|e| (e.t(), e.thread, e.seq));
    let mut shards: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        let (key, _) = slots::split_order(e.w[3]);
        if key != 0 {
            shards.entry(key).or_default().push(i);
        }
    }
    let mut at: Vec<usize> = (0..entries.len()).collect();
    let mut moved = false;
    for places in shards.values() {
        let mut by_seq: Vec<(u64, usize)> = places
            .iter()
            .map(|&i| (slots::split_order(entries[i].w[3]).1, i))
            .collect();
        if by_seq.windows(2).all(|p| p[0].0 < p[1].0) {
            continue;
        }
        by_seq.sort_unstable();
        for (&place, &(_, from)) in places.iter().zip(&by_seq) {
            at[place] = from;
        }
        moved = true;
    }
    if moved {
        let mut taken: Vec<Option<Entry>> = std::mem::take(entries).into_iter().map(Some).collect();
        *entries = at.iter().filter_map(|&i| taken[i].take()).collect();
    }
}

/// The event `e` of `source` at `t` (`None` for a slot of an unknown kind).
fn decode(
    source: u64,
    t: u64,
    e: Entry,
    names: &[Arc<str>],
    labels: &[Arc<str>],
) -> Option<RawEvent> {
    let name = |id: u64| {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| names.get(i).cloned())
    };
    let label_of = |id: u64| {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| labels.get(i).cloned())
    };
    let w = &e.w;
    let event = match w[2] & 0xff {
        slots::ALLOC => PoolEvent::Alloc {
            requested: w[6] as usize,
            size: w[7] as usize,
            cache_hit: (w[2] >> 8) & 1 == 1,
            block: w[8],
            stream: w[9],
            segment: w[10],
            offset: w[11] as usize,
            owner: name(w[5] & 0xffff_ffff),
        },
        slots::FREE => PoolEvent::Free {
            size: w[7] as usize,
            block: w[8],
        },
        slots::SEGMENT_ALLOC => PoolEvent::SegmentAlloc {
            bytes: w[7] as usize,
            segment: w[10],
            stream: w[9],
        },
        slots::SEGMENT_FREE => PoolEvent::SegmentFree {
            bytes: w[7] as usize,
            segment: w[10],
        },
        slots::EVICT => PoolEvent::Evict {
            label: name(w[5]).map(|l| l.to_string()).unwrap_or_default(),
            bytes: w[7] as usize,
        },
        slots::OOM => PoolEvent::OutOfMemory {
            requested: w[6] as usize,
        },
        slots::COPY => {
            return Some(RawEvent {
                source,
                t_ns: t,
                step: w[1].checked_sub(1),
                label: label_of(w[2] >> 32).unwrap_or_else(|| "?".into()),
                what: RawWhat::Copy {
                    stream: w[6],
                    direction: slots::direction_of(w[7]),
                    bytes: w[8] as usize,
                    peer: label_of(w[9]),
                },
            })
        }
        _ => return None,
    };
    let op = (w[2] & 0xff == slots::ALLOC)
        .then(|| name(w[5] >> 32))
        .flatten();
    Some(RawEvent {
        source,
        t_ns: t,
        step: w[1].checked_sub(1),
        label: label_of(w[2] >> 32).unwrap_or_else(|| "?".into()),
        what: RawWhat::Pool(event, op, e.stack),
    })
}
