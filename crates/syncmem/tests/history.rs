//! The always-on history (`record_history`) and the out-of-memory observers
//! (`on_out_of_memory`, `OomDump`), on `cpu` and on OpenCL/PoCL: the history keeps the newest
//! events of each device and reads as a trace that every view takes; an observer runs at a
//! failure, before the error returns, and stops running once its handle is dropped; the
//! ready-made one leaves a report, a snapshot and a history that ends with the failure.
//!
//! The history and the observers are process-wide: the tests of this file take one lock.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use syncmem::device::on_out_of_memory;
use syncmem::report::torch::TorchSnapshot;
use syncmem::report::{
    op_scope, record_history, replay_with, set_trace_stacks, OomDump, ReplayOptions, Trace,
    TraceEvent,
};
use syncmem::{Device, Error, MemoryCap, PoolConfig, PoolKind};

#[path = "common/blocks.rs"]
mod blocks;
use blocks::{blocks_of, live_after};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn capped(dev: &Device, cap: u64) -> Device {
    let d = dev.detached();
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(cap)))
        .unwrap();
    d
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("syncmem-history-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn history_keeps_the_newest_events_of_each_device(dev: &Device) {
    let _one = lock();
    let h = record_history(Some(16)).unwrap();
    let d = dev.detached();
    let label = d.label().to_string();
    let stream = d.default_stream().unwrap();
    let op = op_scope("my phase".into());
    for i in 0..100 {
        // The last allocation with its stack.
        set_trace_stacks(i == 99);
        drop(d.alloc_pooled(4096, &stream).unwrap());
    }
    set_trace_stacks(false);
    drop(op);
    // Host pool traffic after the device's does not push the device's events out.
    let host = syncmem::alloc::pool::HostPool::global().unwrap();
    for _ in 0..100 {
        drop(host.alloc(4096).unwrap());
    }
    let trace = h.trace();
    record_history(None);
    let mine: Vec<TraceEvent> = trace
        .events()
        .into_iter()
        .filter(|e| e.device() == label)
        .collect();
    // 16 kept: the newest, so allocations and frees of the last 8 cycles, in order.
    assert_eq!(mine.len(), 16, "{mine:?}");
    assert_eq!(mine[0].kind(), "alloc");
    assert_eq!(mine[15].kind(), "free");
    // Allocations keep their operator, and the last one its stack.
    let TraceEvent::Alloc {
        operator, frames, ..
    } = &mine[14]
    else {
        panic!("{mine:?}")
    };
    assert_eq!(operator.as_deref(), Some("my phase"));
    assert!(
        frames.iter().any(|f| f.name.contains("history_keeps")),
        "{frames:?}"
    );
    let TraceEvent::Alloc { frames, .. } = &mine[12] else {
        panic!("{mine:?}")
    };
    assert!(frames.is_empty());
    assert!(
        trace
            .events()
            .iter()
            .filter(|e| e.device() == "host")
            .count()
            <= 16
    );
    // Every view takes it: replay, PyTorch's format, a round trip through a file.
    let r = replay_with(
        &trace,
        &PoolConfig::new(PoolKind::Caching),
        &ReplayOptions::new(),
    );
    assert_eq!(r.unwrap().device(&label).unwrap().ooms, 0);
    TorchSnapshot::from_trace(&trace).unwrap();
    let mut file = Vec::new();
    trace.save(&mut file).unwrap();
    assert_eq!(Trace::load(&file[..]).unwrap().events(), trace.events());
}

fn a_bounded_history_leaves_out_frees_of_dropped_allocations(dev: &Device) {
    let _one = lock();
    let h = record_history(Some(3)).unwrap();
    let d = dev.detached();
    let stream = d.default_stream().unwrap();
    let kept = d.alloc_pooled(4096, &stream).unwrap();
    for _ in 0..4 {
        drop(d.alloc_pooled(4096, &stream).unwrap());
    }
    drop(kept);
    let trace = h.trace();
    record_history(None);
    // The free of `kept`, whose allocation fell out of the ring, is not in the trace: every
    // free there has its allocation before it.
    let events: Vec<TraceEvent> = trace
        .events()
        .into_iter()
        .filter(|e| e.device() == d.label())
        .collect();
    // The ring kept the last cycle's allocation and free, and the free of `kept`.
    let kinds: Vec<&str> = events.iter().map(TraceEvent::kind).collect();
    assert_eq!(kinds, ["alloc", "free"], "{events:?}");
    replay_with(&trace, &PoolConfig::default(), &ReplayOptions::new()).unwrap();
}

fn threads_merge_with_each_allocation_before_its_free(dev: &Device) {
    let _one = lock();
    let h = record_history(Some(1000)).unwrap();
    let d = dev.detached();
    let label = d.label().to_string();
    // Blocks allocated on one thread and freed on another, while both record into rings of
    // their own: the history puts each free after its allocation (the pool's order).
    let (tx, rx) = std::sync::mpsc::channel();
    let producer = {
        let d = d.clone();
        std::thread::spawn(move || {
            let s = d.default_stream().unwrap();
            for _ in 0..200 {
                tx.send(d.alloc_pooled(4096, &s).unwrap()).unwrap();
            }
        })
    };
    let consumer = std::thread::spawn(move || rx.into_iter().for_each(drop));
    producer.join().unwrap();
    consumer.join().unwrap();
    let kinds = |trace: &Trace| -> Vec<&'static str> {
        let mine = trace.events().into_iter().filter(|e| e.device() == label);
        mine.map(|e| e.kind()).collect()
    };
    let trace = h.trace();
    let k = kinds(&trace);
    // A free whose allocation is not before it would be left out.
    assert_eq!(k.iter().filter(|k| **k == "alloc").count(), 200, "{k:?}");
    assert_eq!(k.iter().filter(|k| **k == "free").count(), 200, "{k:?}");
    replay_with(&trace, &PoolConfig::default(), &ReplayOptions::new()).unwrap();
    // Six threads of 100 cycles each into a history of 50 events per device: the newest 50
    // are kept (the rings of the threads that ended too, past four of them merged into one).
    // A free at the window's start whose allocation fell out of it is left out when read: at
    // most one per thread.
    let h = record_history(Some(50)).unwrap();
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                let stream = d.default_stream().unwrap();
                for _ in 0..100 {
                    drop(d.alloc_pooled(4096, &stream).unwrap());
                }
            });
        }
    });
    let trace = h.trace();
    record_history(None);
    let k = kinds(&trace);
    assert!((44..=50).contains(&k.len()), "{} events: {k:?}", k.len());
    let allocs = k.iter().filter(|k| **k == "alloc").count();
    assert!(allocs >= k.len() - allocs, "{k:?}");
}

fn one_thread_alternating_devices_and_histories_keeps_each_in_order(dev: &Device) {
    let _one = lock();
    let h = record_history(Some(100)).unwrap();
    let (a, b) = (dev.detached(), dev.detached());
    let (sa, sb) = (a.default_stream().unwrap(), b.default_stream().unwrap());
    // Both carry the device's label: their events are told apart by their sizes.
    let label = a.label().to_string();
    drop(a.alloc_pooled(4096, &sa).unwrap());
    // The operator marked after the thread joined the history is the one its events carry.
    let op = op_scope("alternating".into());
    // Each event goes to the other device's ring than the one before: 300 events per device
    // into rings of 100 (runs of slots end, rings wrap).
    for _ in 0..150 {
        drop(a.alloc_pooled(4096, &sa).unwrap());
        drop(b.alloc_pooled(8192, &sb).unwrap());
    }
    drop(op);
    let mine = |trace: &Trace| -> Vec<TraceEvent> {
        let mine = trace.events().into_iter().filter(|e| e.device() == label);
        mine.collect()
    };
    let sizes = |events: &[TraceEvent]| -> Vec<usize> {
        let sizes = events.iter().filter_map(|e| match e {
            TraceEvent::Alloc { size, .. } => Some(*size),
            _ => None,
        });
        sizes.collect()
    };
    let trace = h.trace();
    // The newest 100 of each: 50 cycles each, every free after its allocation.
    let events = mine(&trace);
    assert_eq!(events.len(), 200, "{events:?}");
    let s = sizes(&events);
    assert_eq!(s.iter().filter(|s| **s == 4096).count(), 50, "{s:?}");
    assert_eq!(s.iter().filter(|s| **s == 8192).count(), 50, "{s:?}");
    let last = events.iter().rev().find(|e| e.kind() == "alloc");
    let Some(TraceEvent::Alloc { operator, .. }) = last else {
        panic!("{events:?}")
    };
    assert_eq!(operator.as_deref(), Some("alternating"));
    replay_with(&trace, &PoolConfig::default(), &ReplayOptions::new()).unwrap();
    // A history started anew takes the thread's next events; the one before keeps its own.
    let h2 = record_history(Some(100)).unwrap();
    for _ in 0..10 {
        drop(a.alloc_pooled(4096, &sa).unwrap());
    }
    let (old, new) = (mine(&h.trace()), mine(&h2.trace()));
    record_history(None);
    assert_eq!(old.len(), 200);
    assert_eq!(new.len(), 20, "{new:?}");
    assert_eq!(sizes(&new), [4096; 10]);
}

fn an_observer_runs_once_per_failed_upload(dev: &Device) {
    let _one = lock();
    let d = capped(dev, 1 << 20);
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handle = on_out_of_memory(move |_| {
        c.fetch_add(1, SeqCst);
    });
    // A buffer larger than the cap, written on the host (where the device shares host memory,
    // its first allocation tries the device and falls back to a host mirror: no error) and
    // then read on the device: one error, one call.
    let m = syncmem::SyncedMemory::new(4 << 20, &d);
    m.host_mut().unwrap().fill(1);
    let e = m.device().map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert_eq!(count.load(SeqCst), 1);
    drop(handle);
}

fn an_observer_runs_at_the_failure_until_its_handle_is_dropped(dev: &Device) {
    let _one = lock();
    let d = capped(dev, 1 << 20);
    let stream = d.default_stream().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handle = on_out_of_memory(move |r| s.lock().unwrap().push((r.device.clone(), r.requested)));
    let held = d.alloc_pooled(768 << 10, &stream).unwrap();
    let e = d.alloc_pooled(512 << 10, &stream).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert_eq!(*seen.lock().unwrap(), [(d.label().to_string(), 512 << 10)]);
    drop(handle);
    assert!(d.alloc_pooled(512 << 10, &stream).is_err());
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "an unregistered observer ran"
    );
    drop(held);
    // An allocation that fits calls no observer.
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let _h = on_out_of_memory(move |_| {
        c.fetch_add(1, SeqCst);
    });
    drop(d.alloc_pooled(512 << 10, &stream).unwrap());
    assert_eq!(count.load(SeqCst), 0);
}

fn the_ready_made_observer_writes_a_snapshot_and_a_history_ending_at_the_failure(dev: &Device) {
    let _one = lock();
    let dir = scratch(&format!("dump-{}", dev.label().replace(':', "-")));
    let h = record_history(Some(1000)).unwrap();
    let dump = OomDump::new(&dir).unwrap();
    let d = capped(dev, 1 << 20);
    let stream = d.default_stream().unwrap();
    let held = d.alloc_pooled(768 << 10, &stream).unwrap();
    assert!(d.alloc_pooled(512 << 10, &stream).is_err());
    record_history(None);
    drop(h);
    assert_eq!(dump.failures(), 1);
    assert_eq!(dump.error(), None);
    let names: Vec<String> = dump
        .files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["oom-1.txt", "oom-1.snapshot.pickle", "oom-1.history.jsonl"]
    );
    let text = std::fs::read_to_string(dir.join("oom-1.txt")).unwrap();
    assert!(text.contains("out of memory on"), "{text}");
    // The pickle starts as protocol 3 does.
    let pickle = std::fs::read(dir.join("oom-1.snapshot.pickle")).unwrap();
    assert_eq!(&pickle[..2], b"\x80\x03");
    let trace = Trace::load_file(&dir.join("oom-1.history.jsonl")).unwrap();
    let mine: Vec<TraceEvent> = trace
        .events()
        .into_iter()
        .filter(|e| e.device() == d.label())
        .collect();
    assert_eq!(mine.last().map(TraceEvent::kind), Some("oom"), "{mine:?}");
    assert!(mine.iter().any(|e| e.kind() == "alloc"));
    drop(held);
    drop(dump);
    let _ = std::fs::remove_dir_all(&dir);
}

fn thread_caches_serve_while_the_history_records_and_write_their_events(dev: &Device) {
    let _one = lock();
    let d = dev.detached();
    let label = d.label().to_string();
    let cycles = |d: &Device| {
        let stream = d.default_stream().unwrap();
        for _ in 0..100 {
            drop(d.alloc_pooled(4096, &stream).unwrap());
        }
        d.pool_stats().unwrap().thread_cache_hits
    };
    // The same cycles on a device of their own with no history, then with one.
    let unrecorded = cycles(&dev.detached());
    let h = record_history(Some(1000)).unwrap();
    let hits = cycles(&d);
    let trace = h.trace();
    record_history(None);
    // The thread's cache served the cycles as it does with no history (all but the first
    // few, which went to a shard) ...
    assert!(hits >= 95, "{hits} thread cache hits");
    assert_eq!(
        hits, unrecorded,
        "thread cache hits with the history and without"
    );
    // ... and the history has every allocation and free, in turn.
    let mine = blocks_of(&trace, &label);
    assert_eq!(mine.len(), 200, "{mine:?}");
    assert_eq!(live_after(&mine), Ok(0));
    for pair in mine.chunks(2) {
        assert_eq!((pair[0].0, pair[1].0), ("alloc", "free"), "{mine:?}");
        assert_eq!(pair[0].1, pair[1].1, "{mine:?}");
    }
    replay_with(&trace, &PoolConfig::default(), &ReplayOptions::new()).unwrap();
    TorchSnapshot::from_trace(&trace).unwrap();
}

fn blocks_passed_between_threads_with_caches_keep_their_order(dev: &Device) {
    let _one = lock();
    let d = dev.detached();
    let label = d.label().to_string();
    let h = record_history(Some(10_000)).unwrap();
    // Two threads, each with a cache of its own (each allocates), pass blocks back and forth:
    // each frees into its cache the blocks the other allocated, and allocates from it again,
    // while each stamps its events with the time it read last.
    let (to_b, from_a) = std::sync::mpsc::channel();
    let (to_a, from_b) = std::sync::mpsc::channel();
    let rounds = 300;
    std::thread::scope(|s| {
        let da = d.clone();
        s.spawn(move || {
            let stream = da.default_stream().unwrap();
            for _ in 0..rounds {
                to_b.send(da.alloc_pooled(4096, &stream).unwrap()).unwrap();
                drop(from_b.recv().unwrap());
            }
        });
        let db = d.clone();
        s.spawn(move || {
            let stream = db.default_stream().unwrap();
            for _ in 0..rounds {
                let theirs = from_a.recv().unwrap();
                let mine = db.alloc_pooled(4096, &stream).unwrap();
                drop(theirs);
                to_a.send(mine).unwrap();
            }
        });
    });
    let hits = d.pool_stats().unwrap().thread_cache_hits;
    let trace = h.trace();
    record_history(None);
    assert!(hits > 0, "the threads' caches served nothing");
    let mine = blocks_of(&trace, &label);
    // Every event kept (a free read before its allocation would be left out), in an order
    // where each block is allocated and freed in turn.
    assert_eq!(mine.len(), 4 * rounds, "events of the blocks");
    assert_eq!(live_after(&mine), Ok(0));
    replay_with(&trace, &PoolConfig::default(), &ReplayOptions::new()).unwrap();
    TorchSnapshot::from_trace(&trace).unwrap();
}

syncmem::for_each_device!(
    thread_caches_serve_while_the_history_records_and_write_their_events,
    blocks_passed_between_threads_with_caches_keep_their_order,
    history_keeps_the_newest_events_of_each_device,
    a_bounded_history_leaves_out_frees_of_dropped_allocations,
    threads_merge_with_each_allocation_before_its_free,
    one_thread_alternating_devices_and_histories_keeps_each_in_order,
    an_observer_runs_at_the_failure_until_its_handle_is_dropped,
    an_observer_runs_once_per_failed_upload,
    the_ready_made_observer_writes_a_snapshot_and_a_history_ending_at_the_failure,
);

/// A bounded trace attached to a device keeps only its newest events.
#[test]
fn a_bounded_trace_keeps_its_newest_events() {
    // Its allocations would land in the history of the other tests.
    let _one = lock();
    let dev = Device::cpu().detached();
    let trace = Arc::new(Trace::bounded(5));
    assert_eq!(trace.max_entries(), Some(5));
    let guard = trace.attach_device_only(&dev);
    let stream = dev.default_stream().unwrap();
    let blocks: Vec<_> = (0..20)
        .map(|_| dev.alloc_pooled(4096, &stream).unwrap())
        .collect();
    drop(guard);
    let events = trace.events();
    assert_eq!(events.len(), 5);
    assert_eq!(trace.stamps().len(), 5);
    // The newest: the last allocation is the last event.
    let TraceEvent::Alloc { id, .. } = events[4] else {
        panic!("{events:?}")
    };
    assert_eq!(id, 19, "{events:?}");
    drop(blocks);
}

/// Frees made on threads that end land in rings merged and cut apart from the rings of the
/// threads that allocated: a block's free can go while its allocation stays. The history then
/// leaves the allocation out (seen when another allocation lands on its bytes), so that it
/// always exports: no two live blocks over each other. Two threads allocate host blocks, free
/// a third of them on short-lived threads, and read the history as they go.
#[test]
fn frees_on_threads_that_end_never_leave_two_blocks_over_each_other() {
    let _one = lock();
    let h = record_history(Some(512)).unwrap();
    let pool = syncmem::HostPool::global().unwrap();
    std::thread::scope(|s| {
        for t in 0..2 {
            let h = &h;
            s.spawn(move || {
                let mut kept = Vec::new();
                for i in 0..1500 {
                    let a = pool.alloc([100, 4096, 16384][(i + t) % 3]).unwrap();
                    match i % 3 {
                        0 => std::thread::scope(|s| {
                            s.spawn(move || drop(a));
                        }),
                        1 => {
                            kept.push(a);
                            if kept.len() > 3 {
                                kept.remove(0);
                            }
                        }
                        _ => drop(a),
                    }
                    if i % 97 == 0 {
                        let trace = h.trace();
                        if let Err(e) = TorchSnapshot::from_trace(&trace) {
                            panic!("thread {t}, round {i}: {e}");
                        }
                    }
                }
            });
        }
    });
    record_history(None);
}
