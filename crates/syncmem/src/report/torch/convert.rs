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
    // Pass 1: every segment's device, size and stream; blocks without a placement
    // (older traces) get a segment of their own, numbered after the trace's.
    let mut segs: HashMap<u64, Seg> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    // Numbered far above the trace's own segment ids.
    let mut next_virtual = u64::MAX / 2;
    let mut own_segment: HashMap<u64, u64> = HashMap::new();
    for e in events {
        let device = ordinal[e.device()];
        let mut note = |id: u64, size: u64, stream: StreamId| {
            let s = segs.entry(id).or_insert_with(|| {
                order.push(id);
                Seg {
                    device,
                    size: 0,
                    stream,
                    address: 0,
                    freed: false,
                }
            });
            s.size = s.size.max(size);
        };
        match e {
            TraceEvent::SegmentAlloc {
                segment,
                size,
                stream,
                ..
            } => note(*segment, *size as u64, *stream),
            TraceEvent::SegmentFree { segment, size, .. } => {
                note(*segment, *size as u64, 0);
            }
            TraceEvent::Alloc {
                id,
                size,
                stream,
                place,
                ..
            } => match place {
                Some(p) => note(p.segment, p.offset + p.size, *stream),
                None => {
                    own_segment.insert(*id, next_virtual);
                    note(
                        next_virtual,
                        (*size as u64).div_ceil(ALIGN) * ALIGN,
                        *stream,
                    );
                    next_virtual += 1;
                }
            },
            _ => {}
        }
    }
    let mut next_addr: Vec<u64> = vec![BASE; labels.len()];
    for id in &order {
        let s = segs.get_mut(id).expect("noted above");
        s.address = next_addr[s.device];
        next_addr[s.device] += s.size.max(1).div_ceil(ALIGN) * ALIGN;
    }
    // Pass 2: the history, and the blocks alive at the end.
    let mut traces: Vec<Vec<TorchEntry>> = vec![Vec::new(); labels.len()];
    let mut live: HashMap<u64, Live> = HashMap::new();
    for (e, st) in events.iter().zip(stamps) {
        let device = ordinal[e.device()];
        let entry = |action, addr, size, stream, frame| TorchEntry {
            action,
            addr,
            size,
            stream,
            time_us: st.t_us,
            frame,
        };
        let out = &mut traces[device];
        match e {
            TraceEvent::Alloc {
                id,
                size,
                stream,
                device: pool,
                owner,
                place,
            } => {
                let f = frame(pool, st.step, owner.as_deref());
                let (segment, offset, block) = match place {
                    Some(p) => (p.segment, p.offset, p.size),
                    None => {
                        let sid = own_segment[id];
                        let s = &segs[&sid];
                        out.push(entry(
                            TorchAction::SegmentAlloc,
                            s.address,
                            s.size,
                            *stream,
                            None,
                        ));
                        (sid, 0, s.size)
                    }
                };
                let addr = segs[&segment].address + offset;
                out.push(entry(
                    TorchAction::Alloc,
                    addr,
                    *size as u64,
                    *stream,
                    Some(f.clone()),
                ));
                let prev = live.insert(
                    *id,
                    Live {
                        segment,
                        offset,
                        size: block,
                        requested: *size as u64,
                        stream: *stream,
                        frame: f,
                    },
                );
                if prev.is_some() {
                    return Err(invalid(format!("trace allocates block {id} twice")));
                }
            }
            TraceEvent::Free { id, .. } => {
                // A block allocated before the trace began: not in the history.
                let Some(b) = live.remove(id) else { continue };
                let addr = segs[&b.segment].address + b.offset;
                for action in [TorchAction::FreeRequested, TorchAction::FreeCompleted] {
                    out.push(entry(
                        action,
                        addr,
                        b.requested,
                        b.stream,
                        Some(b.frame.clone()),
                    ));
                }
                if own_segment.contains_key(id) {
                    let s = segs.get_mut(&b.segment).expect("noted above");
                    s.freed = true;
                    out.push(entry(
                        TorchAction::SegmentFree,
                        s.address,
                        s.size,
                        b.stream,
                        None,
                    ));
                }
            }
            TraceEvent::SegmentAlloc {
                segment, stream, ..
            } => {
                let s = segs.get_mut(segment).expect("noted above");
                s.freed = false;
                out.push(entry(
                    TorchAction::SegmentAlloc,
                    s.address,
                    s.size,
                    *stream,
                    None,
                ));
            }
            TraceEvent::SegmentFree { segment, .. } => {
                let s = segs.get_mut(segment).expect("noted above");
                s.freed = true;
                out.push(entry(
                    TorchAction::SegmentFree,
                    s.address,
                    s.size,
                    s.stream,
                    None,
                ));
            }
            TraceEvent::Oom { size, .. } => {
                out.push(entry(TorchAction::Oom, 0, *size as u64, 0, None));
            }
            _ => {}
        }
    }
    let segments = final_segments(&segs, &order, live)?;
    Ok(TorchSnapshot {
        device_labels: labels,
        segments,
        device_traces: traces,
    })
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
