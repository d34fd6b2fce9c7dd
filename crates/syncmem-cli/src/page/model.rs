//! What the memory page draws, read from a trace in one pass: per pool, every block with its
//! lifetime (event indices and times), owner, stream, placement and any field of its event
//! the page does not know by name (an operator, frames); the segments; the other events as
//! marks; the peak of training and of the whole run; and the phases of the run.
//!
//! The page's script computes the stacked view, the state at a moment and the allocator's
//! segments from these lists. A trace with more than [`MAX_BLOCKS`] blocks keeps the blocks
//! alive at a peak and then the largest; the others are counted (the page says so and draws
//! the pool's total from the downsampled series).

use std::collections::{BTreeMap, HashMap};

use syncmem::report::{Stamp, Trace, TraceEvent};

use super::phases::{phases, Phase};

/// The most blocks the page lists, over every pool.
pub const MAX_BLOCKS: usize = 100_000;
/// The most segments the page lists per pool.
pub const MAX_SEGMENTS: usize = 20_000;
/// Marks are counted in this many spans of the whole run, per kind and pool.
pub const MARK_BUCKETS: u64 = 20_000;
/// The most step starts the page lists (more are thinned evenly).
pub const MAX_STEPS: usize = 50_000;

/// The fields of a block event the page shows by name; any other is shown as it is.
const KNOWN: [&str; 7] = ["op", "id", "size", "stream", "device", "owner", "place"];

/// One block: where it came from, where it lay, when it lived.
#[derive(Debug, Clone)]
pub struct Block {
    pub id: u64,
    /// Index of its allocation event, and of its free (`None`: alive at the end).
    pub ai: usize,
    pub fi: Option<usize>,
    /// Bytes it occupies, and bytes asked for.
    pub size: u64,
    pub requested: u64,
    /// Index in [`Model::owners`] (`None`: no owner).
    pub owner: Option<u32>,
    pub stream: u64,
    /// Segment and offset, when the trace has placements.
    pub place: Option<(u64, u64)>,
    /// Index in [`Model::extras`]: the event's fields the page does not know by name.
    pub extra: Option<u32>,
}

impl Block {
    /// True when the block is alive just after event `k`.
    pub fn alive_after(&self, k: usize) -> bool {
        self.ai <= k && self.fi.is_none_or(|f| f > k)
    }
}

/// A segment with its lifetime (event indices).
#[derive(Debug, Clone)]
pub struct Segment {
    pub id: u64,
    pub size: u64,
    pub ai: usize,
    pub fi: Option<usize>,
    pub stream: u64,
}

/// The highest allocated bytes in a span and the event just after which they were first
/// reached.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peak {
    pub bytes: u64,
    /// The event index (`None`: nothing was allocated in the span).
    pub at: Option<usize>,
}

/// One pool of the trace.
#[derive(Debug, Clone, Default)]
pub struct PoolModel {
    pub label: String,
    pub blocks: Vec<Block>,
    pub segments: Vec<Segment>,
    /// The peak during the main phase (training), and over the whole run.
    pub peak: Peak,
    pub peak_all: Peak,
    pub peak_reserved: u64,
    pub segments_recorded: bool,
    pub allocs: u64,
    /// Blocks not listed (over [`MAX_BLOCKS`]), and the largest of them.
    pub elided: u64,
    pub elided_max: u64,
    /// (kind, bucket) -> (first x, count, bytes), in order of first appearance.
    pub marks: Vec<(String, u64, u64, u64)>,
    mark_at: HashMap<(String, u64), usize>,
    live: u64,
    reserved: u64,
}

/// The whole trace as the page sees it.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub timed: bool,
    /// The axis value of each event (microseconds since the trace began, or its index).
    pub xs: Vec<u64>,
    pub steps: Vec<Option<u64>>,
    pub phases: Vec<Phase>,
    pub pools: Vec<PoolModel>,
    pub owners: Vec<String>,
    /// The unknown fields of block events, as JSON objects (interned).
    pub extras: Vec<String>,
}

impl Model {
    /// Reads `trace`.
    pub fn build(trace: &Trace) -> Model {
        trace.with_stamped(build)
    }

    /// The main phase (training, or the whole run).
    pub fn main_phase(&self) -> Option<&Phase> {
        self.phases.iter().find(|p| p.main)
    }

    /// The phase holding event `k`.
    pub fn phase_of(&self, k: usize) -> Option<&Phase> {
        self.phases.iter().find(|p| p.first <= k && k <= p.last)
    }

    /// The blocks of `pool` alive just after event `k`, largest first.
    pub fn alive_after<'a>(&self, pool: &'a PoolModel, k: usize) -> Vec<&'a Block> {
        let mut v: Vec<&Block> = pool.blocks.iter().filter(|b| b.alive_after(k)).collect();
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
        v
    }

    /// The owner of `b` as a name.
    pub fn owner_name(&self, b: &Block) -> &str {
        b.owner
            .and_then(|o| self.owners.get(o as usize))
            .map_or("(no owner)", String::as_str)
    }
}

/// The axis: monotonic microseconds when the trace has times, else event indices.
fn axis(stamps: &[Stamp], n: usize) -> (bool, Vec<u64>) {
    if stamps.iter().any(|s| s.t_us > 0) {
        let mut last = 0;
        let xs = stamps
            .iter()
            .map(|s| {
                last = last.max(s.t_us);
                last
            })
            .collect();
        (true, xs)
    } else {
        (false, (0..n as u64).collect())
    }
}

/// The pool order of the page: devices in order of appearance, then pinned pools, then host.
fn pool_labels(events: &[TraceEvent]) -> Vec<String> {
    let mut labels: Vec<&str> = Vec::new();
    for e in events {
        if !labels.contains(&e.device()) {
            labels.push(e.device());
        }
    }
    labels.sort_by_key(|l| match *l {
        "host" => 2,
        l if l.ends_with(" pinned") => 1,
        _ => 0,
    });
    labels.into_iter().map(str::to_string).collect()
}

/// Interns strings: index of each.
#[derive(Default)]
struct Interner {
    list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Interner {
    fn get(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The fields of `e` the page does not know by name, as a JSON object, when there are any.
fn extra_fields(e: &TraceEvent) -> Option<String> {
    let serde_json::Value::Object(mut map) = serde_json::to_value(e).ok()? else {
        return None;
    };
    for k in KNOWN {
        map.remove(k);
    }
    map.retain(|_, v| !v.is_null());
    (!map.is_empty()).then(|| serde_json::Value::Object(map).to_string())
}

/// The kind of mark an event makes, `None` for block and segment events.
fn mark_kind(e: &TraceEvent) -> Option<String> {
    match e {
        TraceEvent::Alloc { .. }
        | TraceEvent::Free { .. }
        | TraceEvent::SegmentAlloc { .. }
        | TraceEvent::SegmentFree { .. }
        | TraceEvent::Plan { .. } => None,
        TraceEvent::Copy { direction, .. } => Some(direction.as_str().to_string()),
        other => Some(other.kind().to_string()),
    }
}

/// The walk over the events.
struct Walk {
    pools: Vec<PoolModel>,
    pool_of: HashMap<String, usize>,
    /// Block id -> (pool, index in its blocks).
    block_of: HashMap<u64, (usize, usize)>,
    /// (pool, segment id) -> index in its segments.
    segment_of: HashMap<(usize, u64), usize>,
    owners: Interner,
    extras: Interner,
    /// Events of the main phase.
    main: (usize, usize),
    start: u64,
    bucket: u64,
}

fn build(events: &[TraceEvent], stamps: &[Stamp]) -> Model {
    let (timed, xs) = axis(stamps, events.len());
    let steps: Vec<Option<u64>> = (0..events.len())
        .map(|i| stamps.get(i).and_then(|s| s.step))
        .collect();
    let phases = phases(events, &steps, &xs);
    let main = phases
        .iter()
        .find(|p| p.main)
        .map_or((0, 0), |p| (p.first, p.last));
    let labels = pool_labels(events);
    let start = xs.first().copied().unwrap_or(0);
    let span = xs.last().copied().unwrap_or(0) - start;
    let mut w = Walk {
        pool_of: labels.iter().cloned().zip(0..).collect(),
        pools: labels
            .into_iter()
            .map(|label| PoolModel {
                label,
                ..PoolModel::default()
            })
            .collect(),
        block_of: HashMap::new(),
        segment_of: HashMap::new(),
        owners: Interner::default(),
        extras: Interner::default(),
        main,
        start,
        bucket: (span / MARK_BUCKETS + 1).max(1),
    };
    for (i, e) in events.iter().enumerate() {
        w.event(i, e, xs[i]);
    }
    let mut pools = w.pools;
    elide(&mut pools);
    Model {
        timed,
        xs,
        steps,
        phases,
        pools,
        owners: w.owners.list,
        extras: w.extras.list,
    }
}

impl Walk {
    fn event(&mut self, i: usize, e: &TraceEvent, x: u64) {
        let Some(&p) = self.pool_of.get(e.device()) else {
            return;
        };
        // The level before the main phase began counts as its own.
        if i == self.main.0 && i > 0 {
            let pool = &mut self.pools[p];
            if pool.live > pool.peak.bytes {
                pool.peak = Peak {
                    bytes: pool.live,
                    at: Some(i - 1),
                };
            }
        }
        match e {
            TraceEvent::Alloc {
                id,
                size,
                stream,
                owner,
                place,
                ..
            } => {
                let owner = owner.as_deref().map(|o| self.owners.get(o));
                let extra = extra_fields(e).map(|x| self.extras.get(&x));
                let pool = &mut self.pools[p];
                let b = Block {
                    id: *id,
                    ai: i,
                    fi: None,
                    size: place.map_or(*size as u64, |pl| pl.size),
                    requested: *size as u64,
                    owner,
                    stream: *stream,
                    place: place.map(|pl| (pl.segment, pl.offset)),
                    extra,
                };
                pool.live += b.size;
                pool.allocs += 1;
                self.block_of.insert(*id, (p, pool.blocks.len()));
                pool.blocks.push(b);
            }
            TraceEvent::Free { id, .. } => {
                if let Some((q, k)) = self.block_of.remove(id) {
                    let b = &mut self.pools[q].blocks[k];
                    b.fi = Some(i);
                    let size = b.size;
                    self.pools[q].live -= size;
                }
            }
            _ => self.other(p, i, e, x),
        }
        self.note_peaks(p, i);
    }

    /// Segments and marks.
    fn other(&mut self, p: usize, i: usize, e: &TraceEvent, x: u64) {
        let pool = &mut self.pools[p];
        match e {
            TraceEvent::SegmentAlloc {
                segment,
                size,
                stream,
                ..
            } => {
                pool.segments_recorded = true;
                pool.reserved += *size as u64;
                pool.peak_reserved = pool.peak_reserved.max(pool.reserved);
                self.segment_of.insert((p, *segment), pool.segments.len());
                pool.segments.push(Segment {
                    id: *segment,
                    size: *size as u64,
                    ai: i,
                    fi: None,
                    stream: *stream,
                });
            }
            TraceEvent::SegmentFree { segment, .. } => {
                if let Some(k) = self.segment_of.remove(&(p, *segment)) {
                    pool.segments[k].fi = Some(i);
                    pool.reserved -= pool.segments[k].size;
                }
            }
            _ => {
                let Some(kind) = mark_kind(e) else { return };
                let bucket = (x - self.start) / self.bucket;
                let bytes = e.bytes().unwrap_or(0);
                match pool.mark_at.get(&(kind.clone(), bucket)) {
                    Some(&k) => {
                        pool.marks[k].2 += 1;
                        pool.marks[k].3 += bytes;
                    }
                    None => {
                        pool.mark_at
                            .insert((kind.clone(), bucket), pool.marks.len());
                        pool.marks.push((kind, x, 1, bytes));
                    }
                }
            }
        }
    }

    fn note_peaks(&mut self, p: usize, i: usize) {
        let main = self.main;
        let pool = &mut self.pools[p];
        if pool.live > pool.peak_all.bytes {
            pool.peak_all = Peak {
                bytes: pool.live,
                at: Some(i),
            };
        }
        if (main.0..=main.1).contains(&i) && pool.live > pool.peak.bytes {
            pool.peak = Peak {
                bytes: pool.live,
                at: Some(i),
            };
        }
    }
}

/// Keeps at most [`MAX_BLOCKS`] blocks over all pools: those alive at a pool's peaks first,
/// then the largest (the longest lived among equals).
fn elide(pools: &mut [PoolModel]) {
    let total: usize = pools.iter().map(|p| p.blocks.len()).sum();
    let segs: usize = pools.iter().map(|p| p.segments.len()).sum();
    if segs > 0 {
        for p in pools.iter_mut() {
            p.segments.truncate(MAX_SEGMENTS);
        }
    }
    if total <= MAX_BLOCKS {
        return;
    }
    // (must keep, size, lifetime in events, pool, index)
    let mut rank: Vec<(bool, u64, usize, usize, usize)> = Vec::with_capacity(total);
    for (q, p) in pools.iter().enumerate() {
        let peaks = [p.peak.at, p.peak_all.at];
        for (k, b) in p.blocks.iter().enumerate() {
            let keep = peaks.iter().flatten().any(|&at| b.alive_after(at));
            let life = b.fi.unwrap_or(usize::MAX) - b.ai;
            rank.push((keep, b.size, life, q, k));
        }
    }
    rank.sort_unstable_by_key(|r| std::cmp::Reverse((r.0, r.1, r.2)));
    let mut kept: Vec<Vec<bool>> = pools.iter().map(|p| vec![false; p.blocks.len()]).collect();
    for r in rank.iter().take(MAX_BLOCKS) {
        kept[r.3][r.4] = true;
    }
    for (p, kept) in pools.iter_mut().zip(kept) {
        let mut k = kept.iter();
        let before = std::mem::take(&mut p.blocks);
        for b in before {
            if *k.next().unwrap_or(&false) {
                p.blocks.push(b);
            } else {
                p.elided += 1;
                p.elided_max = p.elided_max.max(b.size);
            }
        }
    }
}

/// Slot name -> the blobs a memory plan put in it, in the order the net first writes them.
pub type Slots = BTreeMap<String, Vec<String>>;

/// The planner slots the plans recorded in `trace` name ([`TraceEvent::Plan`]: one per net
/// built with a plan while it recorded); empty for a trace without plans (older ones).
pub fn slots_of(trace: &syncmem::report::Trace) -> Slots {
    let mut slots = Slots::new();
    for e in trace.events() {
        if let TraceEvent::Plan { slots: plan, .. } = e {
            for (slot, blobs) in plan {
                let known = slots.entry(slot).or_default();
                for b in blobs {
                    if !known.contains(&b) {
                        known.push(b);
                    }
                }
            }
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(json: &str) -> TraceEvent {
        serde_json::from_str(json).unwrap()
    }

    fn alloc(id: u64, size: u64, owner: &str) -> TraceEvent {
        ev(&format!(
            r#"{{"op":"alloc","id":{id},"size":{size},"stream":0,"device":"cpu","owner":"{owner}"}}"#
        ))
    }

    fn free(id: u64) -> TraceEvent {
        ev(&format!(r#"{{"op":"free","id":{id},"device":"cpu"}}"#))
    }

    fn stamped(events: &[(TraceEvent, Option<u64>)]) -> Trace {
        let stamps = (0..events.len() as u64)
            .map(|i| Stamp {
                t_us: 10 + i,
                step: events[i as usize].1,
            })
            .collect();
        Trace::from_stamped(events.iter().map(|e| e.0.clone()).collect(), stamps)
    }

    #[test]
    fn the_peak_shown_is_the_peak_of_training() {
        // A measurement reaching 1000 bytes, then training peaking at 300 (100 of which were
        // allocated in set-up and alive when training began).
        let t = stamped(&[
            (alloc(0, 1000, "probe"), None),
            (free(0), None),
            (alloc(1, 100, "w"), None),
            (alloc(2, 200, "x"), Some(1)),
            (free(2), Some(1)),
            (alloc(3, 50, "x"), Some(2)),
            (free(3), None),
        ]);
        let m = Model::build(&t);
        let names: Vec<_> = m.phases.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "planning measurement",
                "set-up",
                "training",
                "after training"
            ]
        );
        let p = &m.pools[0];
        assert_eq!((p.peak.bytes, p.peak.at), (300, Some(3)));
        assert_eq!((p.peak_all.bytes, p.peak_all.at), (1000, Some(0)));
        let alive: Vec<_> = m.alive_after(p, 3).iter().map(|b| b.id).collect();
        assert_eq!(alive, [2, 1], "largest first");
        assert_eq!(m.owner_name(m.alive_after(p, 3)[0]), "x");
        // Times start at the first event; the block freed at event 4 lived from event 3.
        assert_eq!((m.xs[0], p.blocks[2].fi), (10, Some(4)));
        assert!(
            p.blocks.iter().all(|b| b.extra.is_none()),
            "no unknown fields"
        );
    }

    #[test]
    fn a_long_trace_keeps_the_blocks_of_its_peaks_then_the_largest() {
        let n = MAX_BLOCKS as u64 + 10;
        let mut events = vec![(alloc(0, 4096, "w"), Some(1))];
        for id in 1..=n {
            // Sizes 1..=8 bytes, each block freed at once: the peak is w with the first 8-byte one.
            events.push((alloc(id, 1 + id % 8, "a"), Some(1)));
            events.push((free(id), Some(1)));
        }
        let m = Model::build(&stamped(&events));
        let p = &m.pools[0];
        assert_eq!(p.blocks.len(), MAX_BLOCKS);
        assert_eq!(p.elided, 11);
        assert_eq!(p.elided_max, 1, "the smallest go");
        let at = p.peak.at.unwrap();
        assert_eq!(p.peak.bytes, 4096 + 8);
        assert_eq!(m.alive_after(p, at).len(), 2, "the peak's blocks are kept");
    }
}
