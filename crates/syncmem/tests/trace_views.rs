//! What traces carry for pictures of memory (owners, placements, segments, streams, times,
//! steps), the timeline built from them, and the snapshots in PyTorch's format.

use std::collections::HashMap;
use std::sync::Arc;

use syncmem::report::timeline::{Timeline, TimelineOptions};
use syncmem::report::torch::{TorchAction, TorchSnapshot, TorchState};
use syncmem::report::{Place, Stamp, Trace, TraceEvent};
use syncmem::{Device, Direction, SyncedMemory};

const MIB: u64 = 1 << 20;

/// Checks the two properties PyTorch's viewer relies on: the blocks of every segment tile it,
/// and replaying each device's history backwards from the final state works (every `alloc`
/// finds its block, every freed block lies in a segment, every `segment_alloc` finds its
/// segment empty) and, for a trace that began with empty pools (`from_empty`), ends empty.
fn check_torch(s: &TorchSnapshot, from_empty: bool) {
    for seg in &s.segments {
        let sum: u64 = seg.blocks.iter().map(|b| b.size).sum();
        assert_eq!(
            sum, seg.total_size,
            "blocks tile segment {:#x}",
            seg.address
        );
        assert!(seg.device < s.device_traces.len());
    }
    for (device, trace) in s.device_traces.iter().enumerate() {
        let mut segments: HashMap<u64, u64> = HashMap::new();
        let mut blocks: HashMap<u64, u64> = HashMap::new();
        for seg in s.segments.iter().filter(|g| g.device == device) {
            segments.insert(seg.address, seg.total_size);
            let mut addr = seg.address;
            for b in &seg.blocks {
                if b.state != TorchState::Inactive {
                    blocks.insert(addr, b.size);
                }
                addr += b.size;
            }
        }
        let inside = |segments: &HashMap<u64, u64>, addr: u64| {
            segments.iter().any(|(&a, &n)| a <= addr && addr < a + n)
        };
        for e in trace.iter().rev() {
            match e.action {
                TorchAction::Alloc => {
                    assert!(blocks.remove(&e.addr).is_some(), "alloc {:#x}", e.addr);
                }
                TorchAction::FreeRequested => {
                    assert!(blocks.contains_key(&e.addr), "free_requested {:#x}", e.addr);
                }
                TorchAction::FreeCompleted => {
                    assert!(inside(&segments, e.addr), "freed block {:#x}", e.addr);
                    blocks.insert(e.addr, e.size);
                }
                TorchAction::SegmentAlloc => {
                    assert_eq!(segments.remove(&e.addr), Some(e.size), "{:#x}", e.addr);
                    assert!(!blocks.keys().any(|&b| e.addr <= b && b < e.addr + e.size));
                }
                TorchAction::SegmentFree => {
                    segments.insert(e.addr, e.size);
                }
                TorchAction::Oom => {}
            }
        }
        if from_empty {
            assert!(blocks.is_empty() && segments.is_empty(), "device {device}");
        }
    }
}

fn alloc(id: u64, size: usize, owner: &str, place: Option<(u64, u64, u64)>) -> TraceEvent {
    TraceEvent::Alloc {
        id,
        size,
        stream: 1,
        device: "dev".into(),
        owner: Some(owner.into()),
        place: place.map(|(segment, offset, size)| Place {
            segment,
            offset,
            size,
        }),
        operator: None,
        frames: Vec::new(),
    }
}

fn free(id: u64) -> TraceEvent {
    TraceEvent::Free {
        id,
        device: "dev".into(),
    }
}

fn seg(segment: u64, size: u64, alloc: bool) -> TraceEvent {
    if alloc {
        TraceEvent::SegmentAlloc {
            segment,
            size: size as usize,
            stream: 1,
            device: "dev".into(),
        }
    } else {
        TraceEvent::SegmentFree {
            segment,
            size: size as usize,
            device: "dev".into(),
        }
    }
}

fn at(t_us: u64, step: Option<u64>) -> Stamp {
    Stamp { t_us, step }
}

/// A 4 MiB segment: a (1 MiB) and b (2 MiB), a freed, c (0.5 MiB) in a's place; a copy and an
/// out-of-memory failure; steps 1 and 2.
fn small_trace() -> Trace {
    let events = vec![
        seg(0, 4 * MIB, true),
        alloc(0, MIB as usize, "a", Some((0, 0, MIB))),
        alloc(1, 2 * MIB as usize, "b", Some((0, MIB, 2 * MIB))),
        TraceEvent::Copy {
            direction: Direction::HostToDevice,
            bytes: 4096,
            device: "dev".into(),
            stream: Some(1),
            peer: None,
        },
        free(0),
        alloc(2, 1000, "c", Some((0, 0, MIB / 2))),
        TraceEvent::Oom {
            size: 64 * MIB as usize,
            device: "dev".into(),
        },
    ];
    let stamps = vec![
        at(10, Some(1)),
        at(20, Some(1)),
        at(30, Some(1)),
        at(35, Some(1)),
        at(40, Some(2)),
        at(50, Some(2)),
        at(60, Some(2)),
    ];
    Trace::from_stamped(events, stamps)
}

#[test]
fn timeline_of_a_small_trace() {
    let t = Timeline::build(&small_trace(), &TimelineOptions::default());
    assert!(t.timed);
    assert_eq!((t.end, t.events), (60, 7));
    let steps: Vec<(u64, u64)> = t.steps.iter().map(|s| (s.step, s.x)).collect();
    assert_eq!(steps, [(1, 10), (2, 40)]);
    let p = t.pool("dev").unwrap();
    assert!(p.segments_recorded && !p.host);
    assert_eq!((p.allocs, p.frees), (3, 1));
    // Allocated: 0, 1, 3, 2, 2.5 MiB; reserved 4 MiB from the start.
    let alloc: Vec<u64> = p.samples.iter().map(|s| s.alloc_hi).collect();
    assert_eq!(alloc, [0, MIB, 3 * MIB, 2 * MIB, 2 * MIB + MIB / 2]);
    assert!(p.samples.iter().all(|s| s.reserved_hi == 4 * MIB));
    assert_eq!(
        (
            p.peak_allocated.bytes,
            p.peak_allocated.x,
            p.peak_allocated.step
        ),
        (3 * MIB, 30, Some(1))
    );
    assert_eq!((p.peak_reserved.bytes, p.peak_reserved.x), (4 * MIB, 10));
    // Alive at the peak: b then a, largest first, with their lifetimes.
    let at_peak: Vec<(&str, u64, u64, Option<u64>)> = p
        .at_peak
        .iter()
        .map(|b| (b.owner.as_deref().unwrap(), b.size, b.alloc_x, b.free_x))
        .collect();
    assert_eq!(
        at_peak,
        [("b", 2 * MIB, 30, None), ("a", MIB, 20, Some(40))]
    );
    assert_eq!(p.at_peak_count, 2);
    let marks: Vec<(&str, u64, u64, u64)> = p
        .marks
        .iter()
        .map(|m| (m.kind.as_str(), m.x, m.count, m.bytes))
        .collect();
    assert_eq!(
        marks,
        [("host_to_device", 35, 1, 4096), ("oom", 60, 1, 64 * MIB)]
    );
}

#[test]
fn downsampling_keeps_every_peak() {
    // 100,000 events: a sawtooth of one-block allocations, and a single spike of 1 GiB.
    let mut events = Vec::new();
    let mut id = 0;
    for k in 0..25_000u64 {
        let size = if k == 12_345 {
            1 << 30
        } else {
            1000 + k as usize % 7
        };
        events.push(alloc(id, size, "x", None));
        events.push(alloc(id + 1, 10, "y", None));
        events.push(free(id + 1));
        events.push(free(id));
        id += 2;
    }
    let stamps = (0..events.len() as u64)
        .map(|k| at(k * 3 + 1, None))
        .collect();
    let trace = Trace::from_stamped(events, stamps);
    let opts = TimelineOptions {
        buckets: 100,
        top_blocks: 5,
    };
    let t = Timeline::build(&trace, &opts);
    let p = t.pool("dev").unwrap();
    assert!(p.samples.len() <= 100, "{}", p.samples.len());
    assert!(!p.segments_recorded);
    let hi = p.samples.iter().map(|s| s.alloc_hi).max().unwrap();
    assert_eq!(hi, (1 << 30) + 10);
    assert_eq!(p.peak_allocated.bytes, (1 << 30) + 10);
    // Each bucket spans the sawtooth: its lowest point is 0.
    assert!(p.samples.iter().all(|s| s.alloc_lo == 0));
    assert_eq!(p.at_peak[0].size, 1 << 30);
}

#[test]
fn torch_snapshot_of_a_small_trace() {
    let s = TorchSnapshot::from_trace(&small_trace()).unwrap();
    check_torch(&s, true);
    assert_eq!(s.device_labels, ["dev"]);
    assert_eq!(s.segments.len(), 1);
    let blocks: Vec<(u64, u64, TorchState)> = s.segments[0]
        .blocks
        .iter()
        .map(|b| (b.size, b.requested_size, b.state))
        .collect();
    assert_eq!(
        blocks,
        [
            (MIB / 2, 1000, TorchState::Allocated),
            (MIB / 2, 0, TorchState::Inactive),
            (2 * MIB, 2 * MIB, TorchState::Allocated),
            (MIB, 0, TorchState::Inactive),
        ]
    );
    let actions: Vec<&str> = s.device_traces[0]
        .iter()
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "alloc",
            "oom"
        ]
    );
    let base = s.segments[0].address;
    let c = &s.device_traces[0][5];
    assert_eq!((c.addr, c.size, c.time_us), (base, 1000, 50));
    let f = c.frame.as_ref().unwrap();
    assert_eq!((f.pool.as_str(), f.step, f.owner.as_str()), ("dev", 2, "c"));
    // The pickle: protocol 3, ends with STOP.
    let bytes = s.to_pickle();
    assert_eq!(&bytes[..2], &[0x80, 3]);
    assert_eq!(bytes.last(), Some(&b'.'));
}

#[test]
fn torch_snapshot_of_an_old_trace_gives_each_block_a_segment() {
    // No placements, no segments, no times: as written before they were recorded.
    let t = Trace::load(
        &b"{\"op\":\"alloc\",\"id\":0,\"size\":1000,\"stream\":1,\"device\":\"opencl:0\"}\n\
           {\"op\":\"alloc\",\"id\":1,\"size\":64,\"stream\":0,\"device\":\"host\"}\n\
           {\"op\":\"free\",\"id\":0,\"device\":\"opencl:0\"}\n"[..],
    )
    .unwrap();
    let s = TorchSnapshot::from_trace(&t).unwrap();
    check_torch(&s, true);
    assert_eq!(s.device_labels, ["opencl:0", "host"]);
    // The host block is still alive: its segment (512 bytes) is in the final state.
    assert_eq!(s.segments.len(), 1);
    assert_eq!((s.segments[0].device, s.segments[0].total_size), (1, 512));
    let actions: Vec<&str> = s.device_traces[0]
        .iter()
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free"
        ]
    );
    // The timeline of such a trace counts events instead of time.
    let tl = Timeline::build(&t, &TimelineOptions::default());
    assert!(!tl.timed);
    assert_eq!(tl.end, 2);
}

#[test]
fn torch_snapshot_refuses_overlapping_blocks() {
    let t = Trace::from_events(vec![
        seg(0, MIB, true),
        alloc(0, 1000, "a", Some((0, 0, 1024))),
        alloc(1, 1000, "b", Some((0, 512, 1024))),
    ]);
    let e = TorchSnapshot::from_trace(&t).unwrap_err();
    assert!(e.to_string().contains("over each other"), "{e}");
}

#[test]
fn recorded_events_carry_owner_place_stream_time_and_step() {
    let d = Device::cpu().detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&d);
    d.mark_trace_step(Some(7));
    let m = SyncedMemory::new(100_000, &d).with_label("weights");
    m.host_mut().unwrap().fill(1);
    drop(m.device().unwrap());
    d.mark_trace_step(None);
    drop(m);
    drop(guard);
    trace.with_stamped(|events, stamps| {
        assert!(stamps.windows(2).all(|w| w[0].t_us <= w[1].t_us));
        let label = d.label();
        let i = events
            .iter()
            .position(|e| matches!(e, TraceEvent::Alloc { device, .. } if device == label))
            .expect("the device mirror's allocation");
        let TraceEvent::Alloc {
            owner, place, size, ..
        } = &events[i]
        else {
            unreachable!()
        };
        assert_eq!((owner.as_deref(), *size), (Some("weights"), 100_000));
        let place = place.expect("a placement");
        assert!(place.size >= 100_000);
        // Its segment was recorded before it.
        assert!(events[..i].iter().any(|e| matches!(e,
            TraceEvent::SegmentAlloc { segment, .. } if *segment == place.segment)));
        assert_eq!(stamps[i].step, Some(7));
        let copy = events
            .iter()
            .position(|e| {
                matches!(
                    e,
                    TraceEvent::Copy {
                        stream: Some(_),
                        ..
                    }
                )
            })
            .expect("the upload");
        assert_eq!(stamps[copy].step, Some(7));
        // The free came after the step was unmarked.
        let last_free = events
            .iter()
            .rposition(|e| matches!(e, TraceEvent::Free { .. }))
            .unwrap();
        assert_eq!(stamps[last_free].step, None);
    });
    let s = TorchSnapshot::from_trace(&trace).unwrap();
    check_torch(&s, true);
}

#[test]
fn torch_snapshot_of_the_pools_now() {
    let d = Device::cpu().detached();
    let m = SyncedMemory::new(300_000, &d).with_label("kept");
    drop(m.device().unwrap());
    let snap = TorchSnapshot::from_snapshot(&syncmem::MemorySnapshot::new(d.pool_snapshots()));
    check_torch(&snap, false);
    let kept = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.frame.as_ref().is_some_and(|f| f.owner == "kept"))
        .expect("the block of `kept`");
    assert_eq!(kept.state, TorchState::Allocated);
    assert_eq!(kept.requested_size, 300_000);
    assert!(snap.device_traces.iter().all(Vec::is_empty));
}
