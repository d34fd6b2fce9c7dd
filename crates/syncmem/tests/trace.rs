//! Recording memory traffic end to end (on `cpu` and on OpenCL/PoCL): pool allocations and
//! frees, copies with their direction, size and device, evictions under a memory cap, and the
//! replay of what was recorded.
//!
//! Device tests run on `Device::detached()` handles, which are distinct trace sources: a trace
//! attached to one sees nothing of the other tests running at the same time.

use std::sync::Arc;

use syncmem::report::{replay_with, EnvTrace, ReplayOptions, Trace, TraceEvent};
use syncmem::{Device, Direction, Head, MemoryCap, PoolConfig, PoolKind, SyncedMemory};

const MIB: usize = 1 << 20;

fn copies(t: &Trace) -> Vec<(Direction, usize, String)> {
    t.events()
        .into_iter()
        .filter_map(|e| match e {
            TraceEvent::Copy {
                direction,
                bytes,
                device,
                stream,
                ..
            } => {
                // Every copy names the stream that made it.
                assert!(stream.is_some(), "{direction} of {bytes} bytes on {device}");
                Some((direction, bytes, device))
            }
            _ => None,
        })
        .collect()
}

/// Ids and sizes of the allocations recorded on pool `label`.
fn allocs(t: &Trace, label: &str) -> Vec<(u64, usize)> {
    t.events()
        .into_iter()
        .filter_map(|e| match e {
            TraceEvent::Alloc {
                id, size, device, ..
            } if device == label => Some((id, size)),
            _ => None,
        })
        .collect()
}

fn freed(t: &Trace, id: u64) -> bool {
    t.events()
        .iter()
        .any(|e| matches!(e, TraceEvent::Free { id: i, .. } if *i == id))
}

/// A host -> device -> host round trip of a `bytes`-byte buffer with two mirrors (copies).
fn round_trip(d: &Device, bytes: usize) {
    round_trip_of(SyncedMemory::new(bytes, d).with_zero_copy(false));
}

fn round_trip_of(m: SyncedMemory) {
    let m = m.with_label("round-trip");
    m.host_mut().unwrap().fill(3);
    drop(m.device().unwrap()); // host to device
    m.device_mut().unwrap().fill(9).unwrap(); // a fill on the device: no copy
    assert!(m.host().unwrap().iter().all(|&b| b == 9)); // device to host
}

fn copies_of_a_round_trip_are_recorded(dev: &Device) {
    const N: usize = 40_000;
    let d = dev.detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&d);
    round_trip(&d, N);
    drop(guard);
    let label = d.label().to_string();
    assert_eq!(
        copies(&trace),
        vec![
            (Direction::HostToDevice, N, label.clone()),
            (Direction::DeviceToHost, N, label.clone()),
        ]
    );
    // The device mirror came from the device pool and went back to it.
    let a = allocs(&trace, &label);
    assert_eq!(a.len(), 1, "{:?}", trace.events());
    assert_eq!(a[0].1, N);
    assert!(freed(&trace, a[0].0));
    // Without the host pool: no host event at all.
    assert!(allocs(&trace, "host").is_empty());
    let s = trace.summary();
    assert_eq!(
        (s.copies.host_to_device.bytes, s.copies.device_to_host.bytes),
        (N as u64, N as u64)
    );

    // Detached: nothing more is recorded.
    let before = trace.len();
    round_trip(&d, N);
    assert_eq!(trace.len(), before);
}

fn attach_records_the_host_pool_too(dev: &Device) {
    const N: usize = 40_007;
    let d = dev.detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach(&d);
    round_trip(&d, N);
    drop(guard);
    // The host mirror (other tests may use the host pool at the same time: look for ours).
    let host = allocs(&trace, "host");
    assert!(host.iter().any(|&(_, size)| size == N), "{host:?}");
    assert_eq!(allocs(&trace, d.label()).len(), 1);
    assert_eq!(copies(&trace).len(), 2);
}

fn attach_covers_a_pool_set_later(dev: &Device) {
    let d = dev.detached();
    let trace = Arc::new(Trace::new());
    let _guard = trace.attach_device_only(&d);
    d.set_pool(PoolConfig::new(PoolKind::Binned)).unwrap();
    let s = d.new_stream().unwrap();
    let b = d.alloc_pooled(1000, &s).unwrap();
    drop(b);
    d.set_pool(PoolConfig::new(PoolKind::None)).unwrap();
    let b = d.alloc_pooled(2000, &s).unwrap();
    drop(b);
    let a = allocs(&trace, d.label());
    assert_eq!(a.iter().map(|x| x.1).collect::<Vec<_>>(), [1000, 2000]);
    assert!(a.iter().all(|x| freed(&trace, x.0)));
}

fn eviction_under_a_cap_is_recorded_and_replayed(dev: &Device) {
    const BUF: usize = 16 * MIB;
    let d = dev.detached();
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(64 * MIB as u64)))
        .unwrap();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&d);
    let bufs: Vec<SyncedMemory> = (0..4)
        .map(|i| {
            let m = SyncedMemory::new(BUF, &d)
                .with_zero_copy(false)
                .with_label(format!("synced{i}"));
            m.host_mut().unwrap().fill(i as u8 + 1);
            drop(m.device().unwrap());
            assert_eq!(m.head(), Head::Synced);
            m
        })
        .collect();
    // A fifth buffer needs room: one clean mirror goes.
    let extra = SyncedMemory::new(BUF, &d)
        .with_zero_copy(false)
        .with_label("extra");
    extra.device_mut().unwrap().fill(0xEE).unwrap();
    drop(guard);
    assert_eq!(d.pool_stats().unwrap().evictions, 1);

    let label = d.label().to_string();
    let evicts: Vec<_> = trace
        .events()
        .into_iter()
        .filter(|e| matches!(e, TraceEvent::Evict { .. }))
        .collect();
    assert_eq!(evicts.len(), 1, "{evicts:?}");
    let TraceEvent::Evict {
        label: victim,
        bytes,
        device,
    } = &evicts[0]
    else {
        unreachable!()
    };
    // Equal sizes: the mirror allocated first is the one evicted.
    assert_eq!((victim.as_str(), *bytes, device), ("synced0", BUF, &label));
    assert!(!bufs[0].device_allocated());
    assert!(bufs[1..].iter().all(SyncedMemory::device_allocated));
    assert_eq!(copies(&trace).len(), 4, "four uploads, nothing else");

    // Replayed under the same cap, the recorded frees make room: no out-of-memory.
    let opts = |cap: usize| ReplayOptions::new().with_cap(Some(cap as u64));
    let r = replay_with(&trace, &PoolConfig::default(), &opts(64 * MIB)).unwrap();
    let rd = r.device(&label).unwrap();
    assert_eq!((rd.ooms, rd.allocations), (0, 5), "{rd:?}");
    assert_eq!((rd.evictions, rd.evicted_bytes), (1, BUF as u64));
    assert_eq!(rd.copies.host_to_device.count, 4);
    assert!(rd.peak_reserved <= 64 * MIB as u64);
    // Under a 40 MiB cap, the third and fourth buffers cannot be placed (the victim frees
    // only after them); the fifth fits in the place of the victim, the first buffer.
    let r = replay_with(&trace, &PoolConfig::default(), &opts(40 * MIB)).unwrap();
    let rd = r.device(&label).unwrap();
    assert_eq!((rd.ooms, rd.oom_bytes), (2, 2 * BUF as u64), "{rd:?}");
}

fn attach_all_sees_this_device(dev: &Device) {
    const N: usize = 40_013;
    let d = dev.detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_all();
    round_trip(&d, N);
    drop(guard);
    let c = copies(&trace);
    for dir in [Direction::HostToDevice, Direction::DeviceToHost] {
        assert!(c.contains(&(dir, N, d.label().to_string())), "{dir}: {c:?}");
    }
}

/// Zero-copy syncs are traced as such (`mapped`), with their bytes, and as no copy.
fn zero_copy_syncs_are_recorded(dev: &Device) {
    const N: usize = 40_000;
    let d = dev.detached();
    if d.zero_copy_protocol().is_none() {
        return;
    }
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&d);
    round_trip_of(SyncedMemory::new(N, &d));
    drop(guard);
    let label = d.label().to_string();
    assert_eq!(
        copies(&trace),
        vec![
            (Direction::Mapped, N, label.clone()),
            (Direction::Mapped, N, label),
        ]
    );
    let s = trace.summary();
    assert_eq!((s.copies.total_count(), s.copies.mapped.count), (0, 2));
}

syncmem::for_each_device!(
    zero_copy_syncs_are_recorded,
    copies_of_a_round_trip_are_recorded,
    attach_records_the_host_pool_too,
    attach_covers_a_pool_set_later,
    eviction_under_a_cap_is_recorded_and_replayed,
    attach_all_sees_this_device,
);

#[test]
fn out_of_memory_of_device_and_pinned_pools_is_recorded() {
    let d = Device::cpu().detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&d);
    // More than any machine has: the system allocator refuses.
    let huge = 1usize << 60;
    assert!(d
        .alloc_pooled(huge, &d.default_stream().unwrap())
        .unwrap_err()
        .is_out_of_memory());
    let pinned = SyncedMemory::new(huge, &d).with_pinned_host(true);
    assert!(pinned.host_mut().unwrap_err().is_out_of_memory());
    drop(guard);
    let ooms: Vec<TraceEvent> = trace
        .events()
        .into_iter()
        .filter(|e| e.kind() == "oom")
        .collect();
    assert_eq!(
        ooms,
        [
            TraceEvent::Oom {
                size: huge,
                device: "cpu".into()
            },
            TraceEvent::Oom {
                size: huge,
                device: "cpu pinned".into()
            },
        ]
    );
    assert_eq!(trace.summary().ooms, 2);
}

#[test]
fn two_traces_record_independently() {
    let d = Device::cpu().detached();
    let first = Arc::new(Trace::new());
    let second = Arc::new(Trace::new());
    let g1 = first.attach_device_only(&d);
    let g2 = second.attach_device_only(&d);
    round_trip(&d, 1000);
    drop(g1);
    round_trip(&d, 2000);
    drop(g2);
    let sizes = |t: &Trace| copies(t).into_iter().map(|c| c.1).collect::<Vec<_>>();
    assert_eq!(sizes(&first), [1000, 1000]);
    assert_eq!(sizes(&second), [1000, 1000, 2000, 2000]);
}

#[test]
fn a_detached_handle_is_not_the_same_device() {
    let d = Device::cpu().detached();
    let other = d.detached();
    let trace = Arc::new(Trace::new());
    let _g = trace.attach_device_only(&d);
    round_trip(&other, 1000);
    assert!(trace.is_empty(), "{:?}", trace.events());
}

#[test]
fn env_trace_saves_a_loadable_file() {
    let dir = std::env::temp_dir().join(format!("syncmem-trace-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("process.jsonl");
    let rec = EnvTrace::start(&path).unwrap();
    let d = Device::cpu().detached();
    round_trip(&d, 40_021);
    let n = rec.finish().unwrap();
    let back = Trace::load_file(&path).unwrap();
    assert_eq!(back.len(), n);
    assert!(copies(&back).contains(&(Direction::HostToDevice, 40_021, "cpu".to_string())));
    assert!(EnvTrace::start(&dir.join("no-such-dir").join("x.jsonl")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
