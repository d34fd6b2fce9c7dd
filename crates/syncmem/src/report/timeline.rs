//! A trace as memory over time, pool by pool: what a page or a plot of the trace draws.
//!
//! [`Timeline::build`] walks a [`Trace`] once per pool and gives, on one time axis shared by
//! every pool (microseconds since the trace began; the event's index in traces recorded
//! without times):
//!
//! - the allocated bytes (blocks handed out, at their rounded size when the trace has it) and
//!   the reserved bytes (segments held) over time, downsampled to at most
//!   [`TimelineOptions::buckets`] samples that each keep the lowest and highest value of their
//!   span, so that no peak is lost however long the trace;
//! - the peak of each, when it was first reached, and in which step;
//! - the blocks alive at the allocated peak, largest first, with their owners and lifetimes;
//! - every other event (copies, evictions, out-of-memory failures, and any kind added later)
//!   as marks on the time axis, counted and summed in the same buckets;
//! - the steps the program marked, with the time each began.

use std::collections::HashMap;

use serde::Serialize;

use super::event::{Stamp, TraceEvent};
use super::trace::Trace;
use crate::alloc::pool::StreamId;

/// How much detail [`Timeline::build`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineOptions {
    /// The most samples per pool and marks per kind and pool (at least 1): longer series are
    /// cut into this many equal spans of time.
    pub buckets: usize,
    /// The most blocks listed as alive at a peak (the rest are counted).
    pub top_blocks: usize,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        Self {
            buckets: 1500,
            top_blocks: 40,
        }
    }
}

/// The memory of a trace over time (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// True when the trace has times: `x` values are microseconds since it began; otherwise
    /// they are event indices.
    pub timed: bool,
    /// The last `x` of the trace (0 for an empty one).
    pub end: u64,
    /// Events in the trace.
    pub events: usize,
    /// The steps marked, in order, with the `x` of the first event of each.
    pub steps: Vec<StepStart>,
    /// One per pool: device pools in order of first appearance, then pinned pools, then the
    /// host pool.
    pub pools: Vec<PoolTimeline>,
}

/// The start of a marked step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepStart {
    /// The step.
    pub step: u64,
    /// The `x` of its first event.
    pub x: u64,
}

/// One sample of a pool's series: the span `[x, next sample's x)` (the last one ends at
/// [`Timeline::end`]), the lowest and highest allocated and reserved bytes during it, and the
/// values at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Start of the span.
    pub x: u64,
    /// Lowest allocated bytes in the span.
    pub alloc_lo: u64,
    /// Highest allocated bytes in the span.
    pub alloc_hi: u64,
    /// Allocated bytes at its end.
    pub alloc_end: u64,
    /// Lowest reserved bytes in the span.
    pub reserved_lo: u64,
    /// Highest reserved bytes in the span.
    pub reserved_hi: u64,
    /// Reserved bytes at its end.
    pub reserved_end: u64,
}

/// The highest value of a series and when it was first reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// Bytes.
    pub bytes: u64,
    /// When.
    pub x: u64,
    /// The step marked then.
    pub step: Option<u64>,
}

/// A block of a pool, with its lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockLife {
    /// The trace's id of the block.
    pub id: u64,
    /// The label of the buffer it was handed to, when known.
    pub owner: Option<String>,
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes it occupies (the rounded size; `requested` when the trace lacks placements).
    pub size: u64,
    /// The stream it was allocated for.
    pub stream: StreamId,
    /// When it was allocated.
    pub alloc_x: u64,
    /// When it was freed (`None`: still alive at the end of the trace).
    pub free_x: Option<u64>,
    /// The step marked when it was allocated.
    pub step: Option<u64>,
}

/// Events of one kind in one bucket of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// The kind: `host_to_device`, `device_to_host`, `device_to_device` (copies), `evict`,
    /// `oom`, or the [`TraceEvent::kind`] of any other event that is not a block or segment
    /// allocation or free.
    pub kind: String,
    /// The `x` of the first of them.
    pub x: u64,
    /// How many.
    pub count: u64,
    /// Their bytes together.
    pub bytes: u64,
}

/// One pool's memory over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolTimeline {
    /// The pool's label (`opencl:0`, `opencl:0 pinned`, `host`).
    pub label: String,
    /// True for host memory pools (`host`, `... pinned`).
    pub host: bool,
    /// True when the trace has this pool's segments: reserved bytes are known.
    pub segments_recorded: bool,
    /// The series, in order of `x`.
    pub samples: Vec<Sample>,
    /// The peak of allocated bytes.
    pub peak_allocated: Peak,
    /// The peak of reserved bytes.
    pub peak_reserved: Peak,
    /// The blocks alive at the allocated peak, largest first (at most
    /// [`TimelineOptions::top_blocks`]).
    pub at_peak: Vec<BlockLife>,
    /// How many blocks were alive at the allocated peak, listed or not.
    pub at_peak_count: u64,
    /// Block allocations.
    pub allocs: u64,
    /// Block frees.
    pub frees: u64,
    /// Other events, bucketed, in order of `x` within each kind.
    pub marks: Vec<Mark>,
}

/// True for the labels of host memory pools.
fn is_host(label: &str) -> bool {
    label == "host" || label.ends_with(" pinned")
}

/// The kind of mark an event makes, `None` for block and segment events.
fn mark_kind(e: &TraceEvent) -> Option<String> {
    match e {
        TraceEvent::Alloc { .. }
        | TraceEvent::Free { .. }
        | TraceEvent::SegmentAlloc { .. }
        | TraceEvent::SegmentFree { .. } => None,
        TraceEvent::Copy { direction, .. } => Some(direction.as_str().to_string()),
        other => Some(other.kind().to_string()),
    }
}

impl Timeline {
    /// The timeline of `trace` (see the [module docs](self)).
    pub fn build(trace: &Trace, options: &TimelineOptions) -> Timeline {
        trace.with_stamped(|events, stamps| build(events, stamps, options))
    }

    /// The pool labelled `label`.
    pub fn pool(&self, label: &str) -> Option<&PoolTimeline> {
        self.pools.iter().find(|p| p.label == label)
    }
}

fn build(events: &[TraceEvent], stamps: &[Stamp], options: &TimelineOptions) -> Timeline {
    let timed = stamps.iter().any(|s| s.t_us > 0);
    let xs: Vec<u64> = if timed {
        // Monotonic by construction; kept so if a file was edited by hand.
        let mut last = 0;
        stamps
            .iter()
            .map(|s| {
                last = last.max(s.t_us);
                last
            })
            .collect()
    } else {
        (0..events.len() as u64).collect()
    };
    let end = xs.last().copied().unwrap_or(0);
    let mut steps: Vec<StepStart> = Vec::new();
    for (s, &x) in stamps.iter().zip(&xs) {
        if let Some(step) = s.step {
            if steps.last().map(|l| l.step) != Some(step) {
                steps.push(StepStart { step, x });
            }
        }
    }
    let mut labels: Vec<&str> = Vec::new();
    for e in events {
        if !labels.contains(&e.device()) {
            labels.push(e.device());
        }
    }
    // Devices first, then pinned pools, then the host pool.
    labels.sort_by_key(|l| match *l {
        "host" => 2,
        l if l.ends_with(" pinned") => 1,
        _ => 0,
    });
    let buckets = options.buckets.max(1) as u64;
    let width = (end / buckets + 1).max(1);
    let ctx = Ctx {
        events,
        stamps,
        xs: &xs,
        width,
        options,
    };
    let pools = labels.into_iter().map(|l| ctx.pool(l)).collect();
    Timeline {
        timed,
        end,
        events: events.len(),
        steps,
        pools,
    }
}

struct Ctx<'a> {
    events: &'a [TraceEvent],
    stamps: &'a [Stamp],
    xs: &'a [u64],
    /// The span of one bucket.
    width: u64,
    options: &'a TimelineOptions,
}

/// Allocated and reserved bytes now.
#[derive(Default, Clone, Copy)]
struct Gauges {
    allocated: u64,
    reserved: u64,
}

/// Pass 1 over the events of one pool: the gauges and their series, the peaks, the marks.
#[derive(Default)]
struct PoolPass {
    g: Gauges,
    /// Live blocks: id -> bytes.
    live: HashMap<u64, u64>,
    /// Live segments: id -> bytes.
    segs: HashMap<u64, u64>,
    series: Series,
    peak_allocated: Peak,
    /// The index of the event of the allocated peak.
    peak_index: Option<usize>,
    peak_reserved: Peak,
    marks: Vec<Mark>,
    /// (kind, bucket) -> index in `marks`.
    mark_at: HashMap<(String, u64), usize>,
    allocs: u64,
    frees: u64,
    segments_recorded: bool,
}

impl PoolPass {
    /// Follows a block or segment event in the gauges; false for any other event.
    fn apply(&mut self, e: &TraceEvent) -> bool {
        match e {
            TraceEvent::Alloc {
                id, size, place, ..
            } => {
                let bytes = place.map_or(*size as u64, |p| p.size);
                self.live.insert(*id, bytes);
                self.g.allocated += bytes;
                self.allocs += 1;
            }
            TraceEvent::Free { id, .. } => {
                // A block allocated before the trace began: not counted.
                if let Some(bytes) = self.live.remove(id) {
                    self.g.allocated -= bytes;
                }
                self.frees += 1;
            }
            TraceEvent::SegmentAlloc { segment, size, .. } => {
                self.segs.insert(*segment, *size as u64);
                self.g.reserved += *size as u64;
                self.segments_recorded = true;
            }
            TraceEvent::SegmentFree { segment, .. } => {
                if let Some(bytes) = self.segs.remove(segment) {
                    self.g.reserved -= bytes;
                }
            }
            _ => return false,
        }
        true
    }

    /// Raises the peaks to the gauges after event `i`, at `x`, in step `step`.
    fn note_peaks(&mut self, i: usize, x: u64, step: Option<u64>) {
        if self.g.allocated > self.peak_allocated.bytes {
            self.peak_allocated = Peak {
                bytes: self.g.allocated,
                x,
                step,
            };
            self.peak_index = Some(i);
        }
        if self.g.reserved > self.peak_reserved.bytes {
            self.peak_reserved = Peak {
                bytes: self.g.reserved,
                x,
                step,
            };
        }
    }

    /// Counts event `e`, at `x`, in the mark of its kind in `bucket`.
    fn mark(&mut self, e: &TraceEvent, x: u64, bucket: u64) {
        let Some(kind) = mark_kind(e) else {
            return;
        };
        let bytes = e.bytes().unwrap_or(0);
        match self.mark_at.get(&(kind.clone(), bucket)) {
            Some(&k) => {
                self.marks[k].count += 1;
                self.marks[k].bytes += bytes;
            }
            None => {
                self.mark_at
                    .insert((kind.clone(), bucket), self.marks.len());
                self.marks.push(Mark {
                    kind,
                    x,
                    count: 1,
                    bytes,
                });
            }
        }
    }
}

impl Ctx<'_> {
    fn pool(&self, label: &str) -> PoolTimeline {
        // Pass 1: the series, the peaks, the marks.
        let mut p = PoolPass::default();
        let mine = self.events.iter().enumerate();
        for (i, e) in mine.filter(|(_, e)| e.device() == label) {
            let x = self.xs[i];
            if p.apply(e) {
                p.series.add(x / self.width, x, p.g);
                p.note_peaks(i, x, self.stamps[i].step);
            } else {
                p.mark(e, x, x / self.width);
            }
        }
        let (at_peak, at_peak_count) = match p.peak_index {
            Some(peak) => self.alive_at(label, peak),
            None => (Vec::new(), 0),
        };
        PoolTimeline {
            label: label.to_string(),
            host: is_host(label),
            segments_recorded: p.segments_recorded,
            samples: p.series.finish(self.options.buckets),
            peak_allocated: p.peak_allocated,
            peak_reserved: p.peak_reserved,
            at_peak,
            at_peak_count,
            allocs: p.allocs,
            frees: p.frees,
            marks: p.marks,
        }
    }

    /// Pass 2: the blocks of pool `label` alive just after event `peak`, largest first, with
    /// their lifetimes; and how many there were.
    fn alive_at(&self, label: &str, peak: usize) -> (Vec<BlockLife>, u64) {
        let mut live: HashMap<u64, BlockLife> = HashMap::new();
        for (i, e) in self.events.iter().enumerate().take(peak + 1) {
            match e {
                TraceEvent::Alloc {
                    id,
                    size,
                    stream,
                    device,
                    owner,
                    place,
                    ..
                } if device == label => {
                    live.insert(
                        *id,
                        BlockLife {
                            id: *id,
                            owner: owner.clone(),
                            requested: *size as u64,
                            size: place.map_or(*size as u64, |p| p.size),
                            stream: *stream,
                            alloc_x: self.xs[i],
                            free_x: None,
                            step: self.stamps[i].step,
                        },
                    );
                }
                TraceEvent::Free { id, device } if device == label => {
                    live.remove(id);
                }
                _ => {}
            }
        }
        let count = live.len() as u64;
        let mut blocks: Vec<BlockLife> = live.into_values().collect();
        blocks.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
        blocks.truncate(self.options.top_blocks);
        let mut index: HashMap<u64, usize> =
            blocks.iter().enumerate().map(|(k, b)| (b.id, k)).collect();
        for (i, e) in self.events.iter().enumerate().skip(peak + 1) {
            if index.is_empty() {
                break;
            }
            if let TraceEvent::Free { id, device } = e {
                if device == label {
                    if let Some(k) = index.remove(id) {
                        blocks[k].free_x = Some(self.xs[i]);
                    }
                }
            }
        }
        (blocks, count)
    }
}

/// The series of one pool while it is built: one sample per change, merged into buckets when
/// there are too many.
#[derive(Default)]
struct Series {
    /// (bucket, sample).
    raw: Vec<(u64, Sample)>,
}

impl Series {
    fn add(&mut self, bucket: u64, x: u64, g: Gauges) {
        self.raw.push((
            bucket,
            Sample {
                x,
                alloc_lo: g.allocated,
                alloc_hi: g.allocated,
                alloc_end: g.allocated,
                reserved_lo: g.reserved,
                reserved_hi: g.reserved,
                reserved_end: g.reserved,
            },
        ));
    }

    /// The samples: every change when there are at most `buckets`, else one per bucket of
    /// time holding the extremes of its span (including the value it starts from).
    fn finish(self, buckets: usize) -> Vec<Sample> {
        if self.raw.len() <= buckets.max(1) {
            return self.raw.into_iter().map(|(_, s)| s).collect();
        }
        let mut out: Vec<(u64, Sample)> = Vec::new();
        for (b, s) in self.raw {
            match out.last_mut() {
                Some((lb, last)) if *lb == b => {
                    last.alloc_lo = last.alloc_lo.min(s.alloc_lo);
                    last.alloc_hi = last.alloc_hi.max(s.alloc_hi);
                    last.alloc_end = s.alloc_end;
                    last.reserved_lo = last.reserved_lo.min(s.reserved_lo);
                    last.reserved_hi = last.reserved_hi.max(s.reserved_hi);
                    last.reserved_end = s.reserved_end;
                }
                Some((_, last)) => {
                    // The new bucket starts from the value the last one ended with.
                    let (a, r) = (last.alloc_end, last.reserved_end);
                    let mut s = s;
                    s.alloc_lo = s.alloc_lo.min(a);
                    s.alloc_hi = s.alloc_hi.max(a);
                    s.reserved_lo = s.reserved_lo.min(r);
                    s.reserved_hi = s.reserved_hi.max(r);
                    out.push((b, s));
                }
                None => out.push((b, s)),
            }
        }
        out.into_iter().map(|(_, s)| s).collect()
    }
}
