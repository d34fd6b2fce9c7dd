//! Unit tests of recording, the file format and replay.

use std::sync::Arc;

use super::*;
use crate::alloc::pool::PoolConfig;
use crate::alloc::pool::{HostPool, MemoryCap, PoolKind};
use crate::alloc::stats::Direction;
use crate::error::Error;

#[test]
fn record_save_load_round_trip() {
    let pool = HostPool::new("traced", PoolConfig::new(PoolKind::Caching)).unwrap();
    let trace = Arc::new(Trace::new());
    pool.pool().set_observer(Some(trace.clone()));
    let a = pool.alloc(1000).unwrap();
    let b = pool.alloc(5000).unwrap();
    drop(a);
    let c = pool.alloc(1000).unwrap();
    drop(b);
    drop(c);
    pool.pool().set_observer(None);
    let ev = trace.events();
    // The segment the first allocation made, then the six block events.
    assert_eq!(ev.len(), 7, "{ev:?}");
    assert!(matches!(
        &ev[0],
        TraceEvent::SegmentAlloc { segment: 0, size: 16384, stream: 0, device } if device == "traced"
    ));
    let place = |segment, offset, size| {
        Some(Place {
            segment,
            offset,
            size,
        })
    };
    assert!(
        matches!(&ev[1], TraceEvent::Alloc { id: 0, size: 1000, device, place: p, .. }
            if device == "traced" && *p == place(0, 0, 1024))
    );
    assert!(
        matches!(&ev[2], TraceEvent::Alloc { id: 1, size: 5000, place: p, .. }
            if *p == place(0, 1024, 5120))
    );
    assert!(matches!(&ev[3], TraceEvent::Free { id: 0, .. }));
    // The freed block is reused in place.
    assert!(matches!(&ev[4], TraceEvent::Alloc { id: 2, place: p, .. } if *p == place(0, 0, 1024)));
    assert!(matches!(&ev[6], TraceEvent::Free { id: 2, .. }));
    // Times are monotonic; no step was marked.
    let stamps = trace.stamps();
    assert_eq!(stamps.len(), 7);
    assert!(stamps.windows(2).all(|w| w[0].t_us <= w[1].t_us));
    assert!(stamps.iter().all(|s| s.step.is_none()));

    let mut bytes = Vec::new();
    trace.save(&mut bytes).unwrap();
    assert_eq!(String::from_utf8_lossy(&bytes).lines().count(), 7);
    let back = Trace::load(&bytes[..]).unwrap();
    assert_eq!(back.events(), ev);
    assert_eq!(back.stamps(), stamps);
    let r = replay(&back, &PoolConfig::default()).unwrap();
    assert!(r.cache_hits >= 1, "{r:?}");
}

#[test]
fn load_rejects_bad_lines() {
    let err = Trace::load(&b"{\"op\":\"alloc\"}\n"[..]).unwrap_err();
    assert!(err.to_string().contains("line 1"), "{err}");
    let t = Trace::from_events(vec![TraceEvent::Free {
        id: 3,
        device: "x".into(),
    }]);
    assert!(replay(&t, &PoolConfig::default()).is_err());
}

#[test]
fn replay_by_kind() {
    let trace = Trace::synthetic(8);
    assert!(trace.len() > 100);
    // Deterministic.
    assert_eq!(trace.events(), Trace::synthetic(8).events());
    let mut reports = Vec::new();
    for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
        let r = replay(&trace, &PoolConfig::new(kind)).unwrap();
        assert!(r.peak_reserved >= r.peak_allocated, "{kind}: {r:?}");
        assert!(r.peak_allocated > 0);
        reports.push(r);
    }
    let none = reports[2];
    assert_eq!(none.peak_reserved, none.peak_allocated);
    assert_eq!(none.cache_hits, 0);
    // Caching pools reuse memory: far fewer backend calls than direct allocation.
    assert!(reports[0].cache_hits > 0 && reports[1].cache_hits > 0);
    assert!(reports[0].backend_calls < none.backend_calls);
}

const MIB: usize = 1 << 20;

fn alloc(id: u64, size: usize, device: &str) -> TraceEvent {
    TraceEvent::Alloc {
        id,
        size,
        stream: 1,
        device: device.into(),
        owner: None,
        place: None,
        operator: None,
        frames: Vec::new(),
    }
}

fn free(id: u64, device: &str) -> TraceEvent {
    TraceEvent::Free {
        id,
        device: device.into(),
    }
}

#[test]
fn old_format_lines_still_load() {
    // Lines as written before copies and evictions were recorded.
    let old = "{\"op\":\"alloc\",\"id\":0,\"size\":1000,\"stream\":1,\"device\":\"opencl:0\"}\n\
               \n\
               {\"op\":\"free\",\"id\":0,\"device\":\"opencl:0\"}\n";
    let t = Trace::load(old.as_bytes()).unwrap();
    assert_eq!(
        t.events(),
        vec![alloc(0, 1000, "opencl:0"), free(0, "opencl:0")]
    );
    let r = replay(&t, &PoolConfig::default()).unwrap();
    assert_eq!(r.allocations, 1);
    assert_eq!(r.copies.total_count(), 0);
}

#[test]
fn copy_and_evict_lines_round_trip() {
    let events = vec![
        alloc(0, 64, "cpu"),
        TraceEvent::Copy {
            direction: Direction::HostToDevice,
            bytes: 64,
            device: "cpu".into(),
            stream: None,
            peer: None,
        },
        TraceEvent::Evict {
            label: "w".into(),
            bytes: 64,
            device: "cpu".into(),
        },
        free(0, "cpu"),
    ];
    let t = Trace::from_events(events.clone());
    let mut bytes = Vec::new();
    t.save(&mut bytes).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1],
        r#"{"op":"copy","direction":"host_to_device","bytes":64,"device":"cpu","t_us":0}"#
    );
    assert_eq!(
        lines[2],
        r#"{"op":"evict","label":"w","bytes":64,"device":"cpu","t_us":0}"#
    );
    assert_eq!(Trace::load(text.as_bytes()).unwrap().events(), events);
    let s = t.summary();
    assert_eq!((s.allocs, s.frees, s.evictions), (1, 1, 1));
    assert_eq!((s.alloc_bytes, s.evicted_bytes), (64, 64));
    assert_eq!(s.copies.host_to_device.bytes, 64);
    assert_eq!(s.devices, vec!["cpu".to_string()]);
    // A new allocation after loading gets a fresh id.
    let t = Arc::new(t);
    let pool = HostPool::new("cpu", PoolConfig::default()).unwrap();
    pool.pool().set_observer(Some(t.clone()));
    drop(pool.alloc(8).unwrap());
    let ids: Vec<u64> = t.with_events(|e| {
        e.iter()
            .filter_map(|e| match e {
                TraceEvent::Alloc { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    });
    assert_eq!(ids, [0, 1]);
}

#[test]
fn replay_keeps_devices_apart() {
    // a: 4 MiB, freed; then b: 3 MiB and a: 1 MiB at once. Each device gets its own pool.
    let t = Trace::from_events(vec![
        alloc(0, 4 * MIB, "a"),
        TraceEvent::Copy {
            direction: Direction::DeviceToHost,
            bytes: 10,
            device: "a".into(),
            stream: None,
            peer: None,
        },
        free(0, "a"),
        alloc(1, 3 * MIB, "b"),
        alloc(2, MIB, "a"),
        free(1, "b"),
        free(2, "a"),
    ]);
    let r = replay_with(
        &t,
        &PoolConfig::new(PoolKind::None),
        &ReplayOptions::default(),
    )
    .unwrap();
    let names: Vec<&str> = r.devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let a = r.device("a").unwrap();
    let b = r.device("b").unwrap();
    assert_eq!((a.peak_allocated, a.allocations), (4 * MIB as u64, 2));
    assert_eq!((b.peak_allocated, b.allocations), (3 * MIB as u64, 1));
    assert_eq!(a.copies.device_to_host.count, 1);
    assert_eq!(b.copies.total_count(), 0);
    // Together: 4 MiB at first, then 3 + 1 MiB at once: the peak of the sum, not the sum of
    // the peaks (7 MiB).
    assert_eq!(r.total.peak_allocated, 4 * MIB as u64);
    assert_eq!(r.total.peak_reserved, 4 * MIB as u64);
    assert_eq!(r.total.peak_requested, 4 * MIB as u64);
    assert_eq!(
        (a.peak_requested, b.peak_requested),
        (4 * MIB as u64, 3 * MIB as u64)
    );
    assert_eq!(r.total.allocations, 3);
    assert_eq!(r.total.copies.device_to_host.bytes, 10);
    // `replay` is the total.
    assert_eq!(
        replay(&t, &PoolConfig::new(PoolKind::None)).unwrap(),
        r.total
    );
    let by_dev = t.summaries_by_device();
    assert_eq!(by_dev.len(), 2);
    assert_eq!((by_dev[0].0.as_str(), by_dev[0].1.allocs), ("a", 2));
    assert_eq!(by_dev[0].1.copies.device_to_host.count, 1);
    assert_eq!((by_dev[1].0.as_str(), by_dev[1].1.events), ("b", 2));
}

#[test]
fn clear_forgets_events_and_their_blocks() {
    let pool = HostPool::new("cleared", PoolConfig::default()).unwrap();
    let trace = Arc::new(Trace::new());
    pool.pool().set_observer(Some(trace.clone()));
    let a = pool.alloc(100).unwrap();
    trace.clear();
    assert!(trace.is_empty());
    drop(a); // allocated before the clear: not recorded
    let b = pool.alloc(200).unwrap();
    drop(b);
    pool.pool().set_observer(None);
    let ev = trace.events();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(matches!(
        &ev[0],
        TraceEvent::Alloc {
            id: 1,
            size: 200,
            ..
        }
    ));
    assert!(matches!(&ev[1], TraceEvent::Free { id: 1, .. }));
    // What is left replays.
    assert_eq!(
        replay(&trace, &PoolConfig::default()).unwrap().allocations,
        1
    );
}

#[test]
fn cap_counts_out_of_memory_instead_of_failing() {
    let t = Trace::from_events(vec![
        alloc(0, 2 * MIB, "dev"),
        alloc(1, 2 * MIB, "dev"),  // over a 3 MiB cap
        alloc(2, 2 * MIB, "host"), // host pools are not under `cap`
        alloc(3, 2 * MIB, "host"),
        free(1, "dev"), // the refused block: skipped
        free(0, "dev"),
        alloc(4, 2 * MIB, "dev"), // fits again
        free(4, "dev"),
        free(2, "host"),
        free(3, "host"),
    ]);
    let opts = ReplayOptions {
        cap: Some(3 * MIB as u64),
        host_cap: None,
    };
    for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
        let r = replay_with(&t, &PoolConfig::new(kind), &opts).unwrap();
        let dev = r.device("dev").unwrap();
        assert_eq!(
            (dev.ooms, dev.oom_bytes),
            (1, 2 * MIB as u64),
            "{kind}: {dev:?}"
        );
        assert_eq!(dev.allocations, 2, "{kind}");
        assert!(dev.peak_reserved <= 3 * MIB as u64, "{kind}: {dev:?}");
        let host = r.device("host").unwrap();
        assert_eq!((host.ooms, host.allocations), (0, 2), "{kind}");
        assert_eq!(r.total.ooms, 1);
    }
    // Without a cap nothing is refused.
    let r = replay(&t, &PoolConfig::default()).unwrap();
    assert_eq!((r.ooms, r.allocations), (0, 5));
    // A host cap refuses the second host block.
    let opts = ReplayOptions {
        cap: None,
        host_cap: Some(3 * MIB as u64),
    };
    let r = replay_with(&t, &PoolConfig::default(), &opts).unwrap();
    assert_eq!(r.device("host").unwrap().ooms, 1);
    assert_eq!(r.device("dev").unwrap().ooms, 0);
}

#[test]
fn cap_releases_the_cache_before_refusing() {
    // A caching pool keeps the freed 2 MiB segment; the 3 MiB block fits under the 3 MiB cap
    // only once that cache is released.
    let t = Trace::from_events(vec![
        alloc(0, 2 * MIB, "dev"),
        free(0, "dev"),
        alloc(1, 3 * MIB, "dev"),
        free(1, "dev"),
    ]);
    let opts = ReplayOptions {
        cap: Some(3 * MIB as u64),
        host_cap: None,
    };
    let keep_idle = PoolConfig::new(PoolKind::Caching).with_max_idle_percent(None);
    let r = replay_with(&t, &keep_idle, &opts).unwrap();
    let dev = r.device("dev").unwrap();
    assert_eq!(
        (dev.ooms, dev.retries, dev.allocations),
        (0, 1, 2),
        "{dev:?}"
    );
    // By default the pool gives the idle segment back itself before it grows: no retry.
    let r = replay_with(&t, &PoolConfig::new(PoolKind::Caching), &opts).unwrap();
    let dev = r.device("dev").unwrap();
    assert_eq!(
        (dev.ooms, dev.retries, dev.allocations),
        (0, 0, 2),
        "{dev:?}"
    );
    assert_eq!(dev.peak_reserved, 3 * MIB as u64);
}

#[test]
fn replay_counts_recorded_evictions() {
    let t = Trace::from_events(vec![
        TraceEvent::Evict {
            label: "w".into(),
            bytes: 100,
            device: "d".into(),
        },
        TraceEvent::Evict {
            label: "v".into(),
            bytes: 50,
            device: "d".into(),
        },
    ]);
    let r = replay_with(&t, &PoolConfig::default(), &ReplayOptions::default()).unwrap();
    assert_eq!(
        (
            r.total.evictions,
            r.total.evicted_bytes,
            r.total.allocations
        ),
        (2, 150, 0)
    );
}

#[test]
fn save_file_and_load_file() {
    let dir = std::env::temp_dir().join(format!("syncmem-trace-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.jsonl");
    let t = Trace::synthetic(2);
    t.save_file(&path).unwrap();
    assert_eq!(Trace::load_file(&path).unwrap().events(), t.events());
    std::fs::write(&path, "{\"op\":\"alloc\",\"id\":0}\n").unwrap();
    let err = Trace::load_file(&path).unwrap_err();
    assert!(matches!(err, Error::Format { .. }), "{err}");
    assert!(err.to_string().contains("line 1"), "{err}");
    std::fs::write(&path, "").unwrap();
    assert!(Trace::load_file(&path)
        .unwrap_err()
        .to_string()
        .contains("no events"));
    let missing = dir.join("missing.jsonl");
    assert!(matches!(
        Trace::load_file(&missing).unwrap_err(),
        Error::Io { op: "open", .. }
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn out_of_memory_is_recorded_saved_and_counted() {
    let cfg = PoolConfig::default().with_memory_cap(MemoryCap::Bytes(64 << 10));
    let pool = HostPool::new("capped", cfg).unwrap();
    let trace = Arc::new(Trace::new());
    pool.pool().set_observer(Some(trace.clone()));
    let a = pool.alloc(32 << 10).unwrap();
    let e = pool.alloc(MIB).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    drop(a);
    pool.pool().set_observer(None);
    let oom = TraceEvent::Oom {
        size: MIB,
        device: "capped".into(),
    };
    // After the segment and the block.
    assert_eq!(trace.events()[2], oom, "{:?}", trace.events());
    assert_eq!(oom.kind(), "oom");
    assert_eq!(trace.summary().ooms, 1);
    let mut bytes = Vec::new();
    trace.save(&mut bytes).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let line = text.lines().nth(2).unwrap();
    assert!(
        line.starts_with(r#"{"op":"oom","size":1048576,"device":"capped","t_us":"#),
        "{line}"
    );
    let back = Trace::load(text.as_bytes()).unwrap();
    assert_eq!(back.events(), trace.events());
    let r = replay_with(&back, &PoolConfig::default(), &ReplayOptions::default()).unwrap();
    let d = r.device("capped").unwrap();
    assert_eq!((d.recorded_ooms, d.ooms, d.allocations), (1, 0, 1));
    assert_eq!(r.total.recorded_ooms, 1);
}

#[test]
fn replay_reports_memory_per_byte_requested() {
    // 100 B and 1000 B live at once.
    let t = Trace::from_events(vec![
        alloc(0, 100, "d"),
        alloc(1, 1000, "d"),
        free(0, "d"),
        alloc(2, 50, "d"),
        free(1, "d"),
        free(2, "d"),
    ]);
    let run = |cfg: PoolConfig| replay(&t, &cfg).unwrap();
    let none = run(PoolConfig::new(PoolKind::None));
    assert_eq!((none.peak_requested, none.peak_reserved), (1100, 1100));
    assert_eq!(none.reserved_per_requested(), 1.0);
    // Bins of 256 B and 1 KiB: nothing is wasted beyond the blocks, but the blocks are
    // rounded up: 1280 B held for 1100 B asked for.
    let binned = run(PoolConfig::new(PoolKind::Binned));
    assert_eq!(binned.peak_requested, 1100);
    assert_eq!((binned.peak_allocated, binned.peak_reserved), (1280, 1280));
    assert_eq!(binned.overhead(), 1.0);
    assert!((binned.reserved_per_requested() - 1280.0 / 1100.0).abs() < 1e-12);
    // The caching pool's first segment is 16 KiB.
    let caching = run(PoolConfig::default());
    assert_eq!(
        (caching.peak_reserved, caching.peak_allocated),
        (16 << 10, 1536)
    );
    assert!(caching.reserved_per_requested() > caching.overhead());
    // Nothing asked for: 1.0.
    assert_eq!(ReplayReport::default().reserved_per_requested(), 1.0);
}
