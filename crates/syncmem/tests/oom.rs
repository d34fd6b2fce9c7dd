//! Out of memory under a device memory cap, end to end (on `cpu` and on OpenCL/PoCL): cached
//! blocks are freed first, then clean device mirrors are dropped, then dirty ones spilled (see
//! tests/spill.rs), and only then does an allocation fail, with a report naming the biggest
//! holders. No data is ever lost. The buffers here keep two mirrors (zero-copy off): a
//! zero-copy buffer has no clean mirror to drop, only memory to spill.
//!
//! PoCL creates buffers lazily and reports gigabytes, so a real out-of-memory would not be
//! deterministic; the cap, enforced by the pool, is. Every test works on its own
//! `Device::detached()` handle with its own pool and cap.

use syncmem::{Device, Error, Head, MemoryCap, PoolConfig, SyncedMemory, ZeroCopy};

const MIB: usize = 1 << 20;
const BUF: usize = 16 * MIB;

fn capped(dev: &Device, cap: usize) -> Device {
    let d = dev.detached();
    d.set_zero_copy(ZeroCopy::Off);
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(cap as u64)))
        .unwrap();
    assert_eq!(d.memory_cap(), Some(cap as u64));
    d
}

fn device_bytes(m: &SyncedMemory) -> Vec<u8> {
    let mut out = vec![0u8; m.len()];
    m.device().unwrap().read_into(&mut out).unwrap();
    out
}

/// Four 16 MiB buffers, host-written with `i + 1`, then synced to the device: head Synced.
fn four_synced(d: &Device) -> Vec<SyncedMemory> {
    (0..4)
        .map(|i| {
            let m = SyncedMemory::new(BUF, d).with_label(format!("synced{i}"));
            m.host_mut().unwrap().fill(i as u8 + 1);
            drop(m.device().unwrap());
            assert_eq!(m.head(), Head::Synced);
            m
        })
        .collect()
}

/// Four 16 MiB buffers written on the device only: head AtDevice (dirty).
fn four_dirty(d: &Device) -> Vec<SyncedMemory> {
    (0..4)
        .map(|i| {
            let m = SyncedMemory::new(BUF, d).with_label(format!("dirty{i}"));
            m.device_mut().unwrap().fill(0x10 + i as u8).unwrap();
            assert_eq!(m.head(), Head::AtDevice);
            m
        })
        .collect()
}

fn clean_mirrors_are_dropped_to_make_room(dev: &Device) {
    let d = capped(dev, 64 * MIB);
    let bufs = four_synced(&d);
    assert_eq!(d.pool_stats().unwrap().reserved.current, 64 * MIB as u64);
    // A fifth buffer needs room: one clean mirror goes.
    let e = SyncedMemory::new(BUF, &d).with_label("extra");
    e.device_mut().unwrap().fill(0xEE).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!((s.evictions, s.evicted_bytes), (1, BUF as u64), "{s}");
    assert_eq!(s.alloc_retries, 1);
    assert!(s.reserved.current <= 64 * MIB as u64);
    // Equal sizes: the mirror allocated first goes first.
    let evicted: Vec<_> = bufs.iter().filter(|m| !m.device_allocated()).collect();
    assert_eq!(evicted.len(), 1);
    let victim = evicted[0];
    assert_eq!(victim.label(), "synced0");
    assert_eq!(
        victim.head(),
        Head::AtHost,
        "the host copy is now the only one"
    );
    // Every buffer still holds its data; the evicted one reads it from the host.
    for (i, m) in bufs.iter().enumerate() {
        assert!(
            m.host().unwrap().iter().all(|&b| b == i as u8 + 1),
            "{}",
            m.label()
        );
    }
    // The next device access re-uploads it, dropping the oldest clean mirror left (`extra` is
    // dirty).
    assert_eq!(device_bytes(victim), vec![1; BUF]);
    assert_eq!(victim.head(), Head::Synced);
    assert_eq!(d.pool_stats().unwrap().evictions, 2);
    let left: Vec<_> = bufs.iter().map(SyncedMemory::device_allocated).collect();
    assert_eq!(left, [true, false, true, true]);
    assert_eq!(
        device_bytes(&e),
        vec![0xEE; BUF],
        "dirty data was never dropped"
    );
    assert!(d.last_oom_report().is_none(), "no allocation failed");
}

/// The block of a mirror the out-of-memory path drops may go into the thread's cache (a small
/// block freed with no work in flight): the retry takes it there, and the pool neither gives
/// its segment back nor makes another.
fn a_mirror_dropped_into_the_threads_cache_is_the_retrys_room(dev: &Device) {
    const SMALL: usize = 16 << 10;
    let d = capped(dev, 4 * SMALL);
    let bufs: Vec<_> = (0..4)
        .map(|i| {
            let m = SyncedMemory::new(SMALL, &d).with_label(format!("small{i}"));
            m.host_mut().unwrap().fill(i as u8 + 1);
            drop(m.device().unwrap());
            m
        })
        .collect();
    let before = d.pool_stats().unwrap();
    assert_eq!(before.reserved.current, 4 * SMALL as u64, "{before}");
    let e = SyncedMemory::new(SMALL, &d).with_label("extra");
    e.device_mut().unwrap().fill(0xEE).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!((s.evictions, s.alloc_retries), (1, 1), "{s}");
    assert_eq!(
        (s.backend_allocs, s.backend_frees),
        (before.backend_allocs, before.backend_frees),
        "the dropped mirror's block served the request: {s}"
    );
    assert_eq!(bufs.iter().filter(|m| !m.device_allocated()).count(), 1);
    for (i, m) in bufs.iter().enumerate() {
        assert!(m.host().unwrap().iter().all(|&b| b == i as u8 + 1));
    }
    assert_eq!(device_bytes(&e), vec![0xEE; SMALL]);
}

fn dirty_buffers_held_by_guards_fill_the_cap_and_the_error_names_them(dev: &Device) {
    let d = capped(dev, 64 * MIB);
    let bufs = four_dirty(&d);
    // Guards hold every buffer: nothing may be dropped or spilled.
    let guards: Vec<_> = bufs.iter().map(|m| m.device().unwrap()).collect();
    let e = SyncedMemory::new(BUF, &d).with_label("one-too-many");
    e.host_mut().unwrap().fill(1);
    let err = e.device().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let text = err.to_string();
    for needle in [
        "requested 16.0 MiB",
        "allocated 64.0 MiB",
        "reserved 64.0 MiB",
        "largest free block 0 B",
        "cap 64.0 MiB",
        "biggest holders",
        "dirty0 (16.0 MiB)",
        "dirty3 (16.0 MiB)",
        "one-too-many",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in: {text}");
    }
    assert_eq!(
        e.head(),
        Head::AtHost,
        "a failed access leaves the state alone"
    );
    assert!(!e.device_allocated());
    let report = d.last_oom_report().unwrap();
    assert_eq!((report.requested, report.holders.len()), (BUF, 4));
    assert!(report.holders.iter().all(|(_, bytes)| *bytes == BUF));
    // The error carries the same figures as data.
    let carried = err.oom_report().expect("an out-of-memory report");
    assert_eq!(carried.holders, report.holders);
    assert_eq!(carried.cap, Some(64 * MIB as u64));
    assert_eq!(carried.allocated, Some(64 * MIB as u64));
    assert_eq!(carried.reserved, Some(64 * MIB as u64));
    assert_eq!(carried.purpose.as_deref(), Some("buffer one-too-many"));
    // Every holder is dirty (head at the device): none could be dropped.
    assert!(d
        .live_buffers()
        .iter()
        .all(|h| h.head == Some(Head::AtDevice)));
    let retry = report.retry.as_ref().expect("the out-of-memory path ran");
    assert!(retry.evicted.is_empty() && retry.spilled.is_empty());
    let s = d.pool_stats().unwrap();
    assert_eq!((s.ooms, s.evictions, s.spills), (1, 0, 0));
    drop(guards);
    // Free now: the least recently used dirty mirrors are spilled, twice the request's worth.
    assert_eq!(device_bytes(&e), vec![1u8; BUF]);
    let s = d.pool_stats().unwrap();
    assert_eq!(
        (s.evictions, s.spills, s.spilled_bytes),
        (0, 2, 2 * BUF as u64),
        "{s}"
    );
    let spilled: Vec<_> = bufs.iter().map(|m| m.device_allocated()).collect();
    assert_eq!(spilled, [false, false, true, true]);
    // Nothing was lost.
    for (i, m) in bufs.iter().enumerate() {
        assert!(m.host().unwrap().iter().all(|&b| b == 0x10 + i as u8));
    }
}

fn buffers_in_use_are_skipped(dev: &Device) {
    let d = capped(dev, 64 * MIB);
    let bufs = four_synced(&d);
    // A guard makes a buffer busy: its mirror may not be dropped.
    let guards: Vec<_> = bufs.iter().map(|m| m.host().unwrap()).collect();
    let e = SyncedMemory::new(BUF, &d).with_label("waiting");
    let err = e.device_mut().unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("(16.0 MiB)"), "{err}");
    assert_eq!(err.oom_report().unwrap().holders.len(), 4, "{err}");
    assert_eq!(d.pool_stats().unwrap().evictions, 0);
    drop(guards);
    e.device_mut().unwrap().fill(2).unwrap();
    assert_eq!(d.pool_stats().unwrap().evictions, 1);
    // A thread holding a device guard blocks eviction of that buffer only.
    let held = bufs.iter().find(|m| m.device_allocated()).unwrap();
    let g = held.device().unwrap();
    let f = SyncedMemory::new(BUF, &d);
    f.device_mut().unwrap().fill(3).unwrap();
    assert!(held.device_allocated(), "in use: kept");
    drop(g);
}

fn cached_blocks_go_before_mirrors(dev: &Device) {
    // Pools that keep idle segments free them on the out-of-memory path (a retry).
    let d = dev.detached();
    let cfg = PoolConfig::default()
        .with_memory_cap(MemoryCap::Bytes(64 * MIB as u64))
        .with_max_idle_percent(None);
    d.set_pool(cfg).unwrap();
    // The out-of-memory path gives back only what the request needs: two of the three 16 MiB
    // segments for 32 MiB; the third stays cached.
    assert_eq!(cached_before_mirrors(&d), (1, 2));
    // By default a pool gives settled idle segments back itself before it grows; those whose
    // device work it cannot see completed yet still go on the out-of-memory path.
    assert!(cached_before_mirrors(&capped(dev, 64 * MIB)).0 <= 1);
}

/// Fills a 64 MiB-capped device with cached segments, then asks for a block none of them fits:
/// as much of the cache as the request needs goes, the clean mirror stays. Returns the retries it
/// took and the segments given back.
fn cached_before_mirrors(d: &Device) -> (u64, u64) {
    let d = d.clone();
    let keep = SyncedMemory::new(BUF, &d).with_label("keep");
    keep.host_mut().unwrap().fill(7);
    drop(keep.device().unwrap());
    let mut v: Vec<_> = (0..3).map(|_| SyncedMemory::new(BUF, &d)).collect();
    for m in &v {
        m.device_mut().unwrap().fill(0).unwrap();
    }
    v.clear(); // three 16 MiB segments stay cached
    assert_eq!(d.pool_stats().unwrap().reserved.current, 64 * MIB as u64);
    // 32 MiB fits in no cached block: the cache is released, the clean mirror stays.
    let big = SyncedMemory::new(2 * BUF, &d);
    big.device_mut().unwrap().fill(1).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!(s.evictions, 0, "{s}");
    // At least the two segments that make room go; a pool that gives back idle segments
    // before growing may give back all three whose work it has seen complete.
    assert!((2..=3).contains(&s.backend_frees), "{s}");
    assert!(keep.device_allocated());
    assert_eq!(device_bytes(&keep), vec![7u8; BUF]);
    (s.alloc_retries, s.backend_frees)
}

fn direct_allocations_share_the_cap(dev: &Device) {
    let d = capped(dev, 64 * MIB);
    let bufs = four_synced(&d);
    let scratch = d.alloc(BUF).unwrap();
    assert!(!scratch.is_pooled());
    let s = d.pool_stats().unwrap();
    assert_eq!((s.evictions, s.direct_bytes), (1, BUF as u64), "{s}");
    assert_eq!(bufs.iter().filter(|m| m.device_allocated()).count(), 3);
    // Above the cap: fails at once, without dropping anything.
    let e = d.alloc(65 * MIB).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(bufs.iter().filter(|m| m.device_allocated()).count(), 3);
    assert_eq!(d.pool_stats().unwrap().evictions, 1);
    drop(scratch);
    assert_eq!(d.pool_stats().unwrap().direct_bytes, 0);
}

fn fraction_caps_resolve_against_total_memory(dev: &Device) {
    let d = dev.detached();
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Fraction(0.5)))
        .unwrap();
    assert_eq!(d.memory_cap(), Some(d.info().total_memory / 2));
    let e = d
        .set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Fraction(1.5)))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
}

/// A setting given after the buffer's device mirror exists and while a pin lives (a label
/// given late) leaves the buffer as it was: its data, copy counts and pin, and its one place
/// in the out-of-memory path, which names it by its new label.
fn settings_given_late_keep_the_buffer(dev: &Device) {
    let d = capped(dev, 32 * MIB);
    let m = SyncedMemory::new(BUF, &d).with_label("before");
    m.host_mut().unwrap().fill(5);
    drop(m.device().unwrap());
    let pin = m.pin_placement();
    let m = m.with_label("after").with_pinned_host(false);
    assert_eq!(m.label(), "after");
    assert_eq!((m.placement_pins(), m.head()), (1, Head::Synced));
    assert_eq!(m.copy_stats().host_to_device.count, 1);
    let other = SyncedMemory::new(BUF, &d).with_label("other");
    let held = other.device_mut().unwrap();
    // Pinned, the clean mirror may not go: the allocation fails, naming both holders once.
    let e = SyncedMemory::new(BUF, &d);
    let err = e.device_mut().unwrap_err();
    let mut holders: Vec<String> = err
        .oom_report()
        .unwrap()
        .holders
        .iter()
        .map(|h| h.0.clone())
        .collect();
    holders.sort();
    assert_eq!(holders, ["after", "other"], "{err}");
    drop(pin);
    assert_eq!(m.placement_pins(), 0);
    e.device_mut().unwrap().fill(7).unwrap();
    assert!(
        !m.device_allocated(),
        "unpinned, the clean mirror was dropped"
    );
    assert_eq!(d.pool_stats().unwrap().evictions, 1);
    assert!(m.host().unwrap().iter().all(|&b| b == 5));
    assert_eq!(m.head(), Head::AtHost);
    drop(held);
}

fn threads_under_pressure_neither_deadlock_nor_lose_data(dev: &Device) {
    let d = capped(dev, 24 * MIB);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let d = d.clone();
            s.spawn(move || {
                let mut ok = 0;
                for round in 0..12u8 {
                    let v = t.wrapping_mul(31).wrapping_add(round);
                    let m = SyncedMemory::new(2 * MIB + 1000 * t as usize, &d);
                    m.host_mut().unwrap().fill(v);
                    match m.device() {
                        Ok(g) => {
                            let mut back = vec![0u8; m.len()];
                            g.read_into(&mut back).unwrap();
                            assert!(back.iter().all(|&b| b == v));
                            ok += 1;
                        }
                        Err(e) => assert!(e.is_out_of_memory(), "{e}"),
                    }
                    assert!(m.host().unwrap().iter().all(|&b| b == v), "data kept");
                }
                assert!(ok > 0, "thread {t} never got device memory");
            });
        }
    });
    let s = d.pool_stats().unwrap();
    assert!(s.reserved.peak <= 24 * MIB as u64, "{s}");
    assert_eq!(s.allocated.current, 0);
}

syncmem::for_each_device!(
    clean_mirrors_are_dropped_to_make_room,
    a_mirror_dropped_into_the_threads_cache_is_the_retrys_room,
    dirty_buffers_held_by_guards_fill_the_cap_and_the_error_names_them,
    buffers_in_use_are_skipped,
    cached_blocks_go_before_mirrors,
    direct_allocations_share_the_cap,
    fraction_caps_resolve_against_total_memory,
    settings_given_late_keep_the_buffer,
    threads_under_pressure_neither_deadlock_nor_lose_data,
);
