//! [`TorchSnapshot::from_trace`]: the final state and the history of a trace.

use std::collections::HashMap;

use super::{
    frame, ordinals, TorchAction, TorchBlock, TorchEntry, TorchFrame, TorchSegment, TorchSnapshot,
    TorchState, ALIGN, BASE,
};
use crate::alloc::pool::StreamId;
use crate::error::Result;
use crate::report::event::{invalid, Stamp, TraceEvent};

/// A segment of the trace while it is converted.
struct Seg {
    device: usize,
    size: u64,
    stream: StreamId,
    address: u64,
    freed: bool,
}

/// A live block while the trace is converted.
struct Live {
    segment: u64,
    offset: u64,
    size: u64,
    requested: u64,
    stream: StreamId,
    frame: TorchFrame,
}

/// [`TorchSnapshot::from_trace`] of these events and stamps.
pub(super) fn from_events(events: &[TraceEvent], stamps: &[Stamp]) -> Result<TorchSnapshot> {
    let labels = ordinals(events.iter().map(TraceEvent::device));
    let ordinal: HashMap<&str, usize> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.as_str(), i))
        .collect();
    // Pass 1: every segment's device, size, stream and address.
    let layout = Layout::of(events, &ordinal, labels.len());
    // Pass 2: the history, and the blocks alive at the end.
    let mut h = History {
        segs: layout.segs,
        own_segment: layout.own_segment,
        traces: vec![Vec::new(); labels.len()],
        live: HashMap::new(),
    };
    for (e, st) in events.iter().zip(stamps) {
        h.apply(ordinal[e.device()], e, st)?;
    }
    let segments = final_segments(&h.segs, &layout.order, h.live)?;
    Ok(TorchSnapshot {
        device_labels: labels,
        segments,
        device_traces: h.traces,
    })
}

/// Where the segments of a trace lie.
struct Layout {
    /// Every segment by id.
    segs: HashMap<u64, Seg>,
    /// Segment ids in order of first appearance.
    order: Vec<u64>,
    /// Blocks without a placement (older traces) -> the segment of their own.
    own_segment: HashMap<u64, u64>,
}

impl Layout {
    /// Every segment's device, size and stream, from the events of `events`; a block without
    /// a placement gets a segment of its own, numbered after the trace's. Then each segment's
    /// address: one range per segment and device, in order of first appearance.
    fn of(events: &[TraceEvent], ordinal: &HashMap<&str, usize>, devices: usize) -> Layout {
        let mut l = Layout {
            segs: HashMap::new(),
            order: Vec::new(),
            own_segment: HashMap::new(),
        };
        // Numbered far above the trace's own segment ids.
        let mut next_virtual = u64::MAX / 2;
        for e in events {
            let device = ordinal[e.device()];
            match e {
                TraceEvent::SegmentAlloc {
                    segment,
                    size,
                    stream,
                    ..
                } => l.note(device, *segment, *size as u64, *stream),
                TraceEvent::SegmentFree { segment, size, .. } => {
                    l.note(device, *segment, *size as u64, 0);
                }
                TraceEvent::Alloc {
                    id,
                    size,
                    stream,
                    place,
                    ..
                } => match place {
                    Some(p) => l.note(device, p.segment, p.offset + p.size, *stream),
                    None => {
                        l.own_segment.insert(*id, next_virtual);
                        let rounded = (*size as u64).div_ceil(ALIGN) * ALIGN;
                        l.note(device, next_virtual, rounded, *stream);
                        next_virtual += 1;
                    }
                },
                _ => {}
            }
        }
        let mut next_addr: Vec<u64> = vec![BASE; devices];
        for id in &l.order {
            let s = l.segs.get_mut(id).expect("noted above");
            s.address = next_addr[s.device];
            next_addr[s.device] += s.size.max(1).div_ceil(ALIGN) * ALIGN;
        }
        l
    }

    /// Segment `id` of `device` reaches at least `size` bytes; `stream` is its stream when
    /// this is its first appearance.
    fn note(&mut self, device: usize, id: u64, size: u64, stream: StreamId) {
        let s = self.segs.entry(id).or_insert_with(|| {
            self.order.push(id);
            Seg {
                device,
                size: 0,
                stream,
                address: 0,
                freed: false,
            }
        });
        s.size = s.size.max(size);
    }
}

/// Pass 2 of a conversion: each device's history, and the blocks alive.
struct History {
    segs: HashMap<u64, Seg>,
    own_segment: HashMap<u64, u64>,
    /// One list of entries per device ordinal.
    traces: Vec<Vec<TorchEntry>>,
    live: HashMap<u64, Live>,
}

impl History {
    /// Adds the entries of event `e` of device `device`, stamped `st`.
    fn apply(&mut self, device: usize, e: &TraceEvent, st: &Stamp) -> Result<()> {
        let out = &mut self.traces[device];
        let mut push = |action, addr, size, stream, frame| {
            out.push(TorchEntry {
                action,
                addr,
                size,
                stream,
                time_us: st.t_us,
                frame,
            });
        };
        match e {
            TraceEvent::Alloc { .. } => return self.alloc(device, e, st),
            TraceEvent::Free { id, .. } => self.free(device, *id, st.t_us),
            TraceEvent::SegmentAlloc {
                segment, stream, ..
            } => {
                let s = self.segs.get_mut(segment).expect("noted above");
                s.freed = false;
                push(TorchAction::SegmentAlloc, s.address, s.size, *stream, None);
            }
            TraceEvent::SegmentFree { segment, .. } => {
                let s = self.segs.get_mut(segment).expect("noted above");
                s.freed = true;
                push(TorchAction::SegmentFree, s.address, s.size, s.stream, None);
            }
            TraceEvent::Oom { size, .. } => push(TorchAction::Oom, 0, *size as u64, 0, None),
            _ => {}
        }
        Ok(())
    }

    /// The entries of allocation `e` (a [`TraceEvent::Alloc`]): the segment of its own of a
    /// block without a placement, then the allocation.
    fn alloc(&mut self, device: usize, e: &TraceEvent, st: &Stamp) -> Result<()> {
        let TraceEvent::Alloc {
            id,
            size,
            stream,
            device: pool,
            owner,
            place,
            operator,
            frames,
        } = e
        else {
            return Ok(());
        };
        let out = &mut self.traces[device];
        let entry = |action, addr, size, frame| TorchEntry {
            action,
            addr,
            size,
            stream: *stream,
            time_us: st.t_us,
            frame,
        };
        let mut f = frame(pool, st.step, owner.as_deref());
        f.op.clone_from(operator);
        f.stack.clone_from(frames);
        let (segment, offset, block) = match place {
            Some(p) => (p.segment, p.offset, p.size),
            None => {
                let sid = self.own_segment[id];
                let s = &self.segs[&sid];
                out.push(entry(TorchAction::SegmentAlloc, s.address, s.size, None));
                (sid, 0, s.size)
            }
        };
        let addr = self.segs[&segment].address + offset;
        out.push(entry(
            TorchAction::Alloc,
            addr,
            *size as u64,
            Some(f.clone()),
        ));
        let block = Live {
            segment,
            offset,
            size: block,
            requested: *size as u64,
            stream: *stream,
            frame: f,
        };
        if self.live.insert(*id, block).is_some() {
            return Err(invalid(format!("trace allocates block {id} twice")));
        }
        Ok(())
    }

    /// The entries of the free of block `id` at `time_us`: the free, then the free of its
    /// segment of its own (a block without a placement).
    fn free(&mut self, device: usize, id: u64, time_us: u64) {
        // A block allocated before the trace began: not in the history.
        let Some(b) = self.live.remove(&id) else {
            return;
        };
        let out = &mut self.traces[device];
        let addr = self.segs[&b.segment].address + b.offset;
        for action in [TorchAction::FreeRequested, TorchAction::FreeCompleted] {
            out.push(TorchEntry {
                action,
                addr,
                size: b.requested,
                stream: b.stream,
                time_us,
                frame: Some(b.frame.clone()),
            });
        }
        if self.own_segment.contains_key(&id) {
            let s = self.segs.get_mut(&b.segment).expect("noted above");
            s.freed = true;
            out.push(TorchEntry {
                action: TorchAction::SegmentFree,
                addr: s.address,
                size: s.size,
                stream: b.stream,
                time_us,
                frame: None,
            });
        }
    }
}

/// The segments alive at the end, their live blocks in address order and the gaps between
/// them as inactive blocks.
fn final_segments(
    segs: &HashMap<u64, Seg>,
    order: &[u64],
    live: HashMap<u64, Live>,
) -> Result<Vec<TorchSegment>> {
    let mut by_seg: HashMap<u64, Vec<Live>> = HashMap::new();
    for (_, b) in live {
        by_seg.entry(b.segment).or_default().push(b);
    }
    let mut out = Vec::new();
    for id in order {
        let s = &segs[id];
        if s.freed {
            continue;
        }
        let mut blocks = Vec::new();
        let mut at = 0;
        let mut mine = by_seg.remove(id).unwrap_or_default();
        mine.sort_by_key(|b| b.offset);
        let stream = mine.first().map_or(s.stream, |b| b.stream);
        for b in mine {
            if b.offset < at {
                return Err(invalid(format!(
                    "trace places two live blocks over each other at offset {} of segment {id}",
                    b.offset
                )));
            }
            if b.offset > at {
                blocks.push(inactive(b.offset - at));
            }
            at = b.offset + b.size;
            blocks.push(TorchBlock {
                size: b.size,
                requested_size: b.requested,
                state: TorchState::Allocated,
                frame: Some(b.frame),
            });
        }
        if s.size > at {
            blocks.push(inactive(s.size - at));
        }
        out.push(TorchSegment {
            device: s.device,
            address: s.address,
            total_size: s.size,
            stream,
            blocks,
        });
    }
    Ok(out)
}

fn inactive(size: u64) -> TorchBlock {
    TorchBlock {
        size,
        requested_size: 0,
        state: TorchState::Inactive,
        frame: None,
    }
}
