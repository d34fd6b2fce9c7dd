//! The device layer on every device of every backend (`cpu`, each OpenCL device, each CUDA
//! device): copies with offsets, fills, device copies (overlapping too), asynchronous copies,
//! events across streams, pinned memory, counters, limits and errors, threads.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::alloc::pool::snapshot::BlockState;
use crate::alloc::pool::{PoolConfig, PoolKind};
use crate::device::buffer::DeviceBuffer;
use crate::error::Error;
use crate::testing::all_or_skip;
use crate::Device;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn round_trip_with_offsets(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(4096).unwrap();
    let data = pattern(1000, 7);
    s.write(&mut buf, 0, &vec![0u8; 4096]).unwrap();
    s.write(&mut buf, 123, &data).unwrap();
    let mut back = vec![0u8; 1000];
    s.read(&buf, 123, &mut back).unwrap();
    assert_eq!(back, data);
    let mut part = vec![0xAAu8; 10];
    s.read(&buf, 118, &mut part).unwrap();
    assert_eq!(&part[..5], &[0; 5]);
    assert_eq!(&part[5..], &data[..5]);
    let mut tail = vec![0xAAu8; 3];
    s.read(&buf, 4093, &mut tail).unwrap();
    assert_eq!(tail, [0, 0, 0]);
    let big = pattern(100_000, 1);
    let mut b = dev.alloc(big.len()).unwrap();
    s.write(&mut b, 0, &big).unwrap();
    let mut back = vec![0u8; big.len()];
    s.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, big);
}

fn fill(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(1000).unwrap();
    s.fill(&mut buf, 0, 1000, 0x11).unwrap();
    s.fill(&mut buf, 250, 333, 0xEE).unwrap();
    let mut back = vec![0u8; 1000];
    s.read(&buf, 0, &mut back).unwrap();
    assert!(back[..250].iter().all(|&b| b == 0x11));
    assert!(back[250..583].iter().all(|&b| b == 0xEE));
    assert!(back[583..].iter().all(|&b| b == 0x11));
}

fn copy_within_device(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let data = pattern(512, 3);
    let mut a = dev.alloc(512).unwrap();
    let mut b = dev.alloc(700).unwrap();
    s.write(&mut a, 0, &data).unwrap();
    s.fill(&mut b, 0, 700, 0).unwrap();
    s.copy(&a, 100, &mut b, 50, 400).unwrap();
    let mut back = vec![0xFFu8; 700];
    s.read(&b, 0, &mut back).unwrap();
    assert!(back[..50].iter().all(|&x| x == 0));
    assert_eq!(&back[50..450], &data[100..500]);
    assert!(back[450..].iter().all(|&x| x == 0));
}

fn overlapping_copy_in_one_buffer(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let data = pattern(1024, 9);
    let mut a = dev.alloc(1024).unwrap();
    s.write(&mut a, 0, &data).unwrap();
    // copy_raw takes both buffers by `&`, like the crate's own callers may; both directions.
    let mut model = data.clone();
    s.copy_raw(&a, 0, &a, 3, 600).unwrap();
    model.copy_within(0..600, 3);
    s.copy_raw(&a, 300, &a, 200, 500).unwrap();
    model.copy_within(300..800, 200);
    // Same offset: nothing to do.
    s.copy_raw(&a, 8, &a, 8, 100).unwrap();
    let mut back = vec![0u8; 1024];
    s.read(&a, 0, &mut back).unwrap();
    assert_eq!(back, model);
}

fn async_write_record_wait(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let len = 1 << 20;
    let data = pattern(len, 42);
    let mut buf = dev.alloc(len).unwrap();
    // SAFETY: `data` is neither dropped nor modified before the event has completed.
    unsafe { s.write_async(&mut buf, 0, &data).unwrap() };
    let ev = s.record().unwrap();
    ev.wait().unwrap();
    assert!(ev.is_complete().unwrap());
    let mut back = vec![0u8; len];
    // SAFETY: `back` is untouched until the event below has completed.
    unsafe { s.read_async(&buf, 0, &mut back).unwrap() };
    s.record().unwrap().wait().unwrap();
    assert_eq!(back, data);
}

fn events_order_two_streams(dev: &Device) {
    let s1 = dev.new_stream().unwrap();
    let s2 = dev.new_stream().unwrap();
    let len = 4 << 20;
    let data = pattern(len, 5);
    let mut buf = dev.alloc(len).unwrap();
    let mut other = dev.alloc(len).unwrap();
    s2.fill(&mut other, 0, len, 0).unwrap();
    s2.synchronize().unwrap();
    // SAFETY: `data` outlives `s1.synchronize()` below.
    unsafe { s1.write_async(&mut buf, 0, &data).unwrap() };
    s1.fill(&mut buf, 0, 16, 0xCD).unwrap();
    let ev = s1.record().unwrap();
    s2.wait_for(&ev).unwrap();
    s2.copy(&buf, 0, &mut other, 0, len).unwrap();
    let mut back = vec![0u8; len];
    s2.read(&other, 0, &mut back).unwrap();
    assert!(back[..16].iter().all(|&b| b == 0xCD));
    assert_eq!(&back[16..], &data[16..]);
    s1.synchronize().unwrap();
    let clone = ev.clone();
    assert!(ev.is_complete().unwrap() && clone.is_complete().unwrap());
    // Without a backend that queues work an event has nothing to release: still fine.
    #[allow(clippy::drop_non_drop)]
    drop(ev);
    clone.wait().unwrap();
    // The default stream works too.
    dev.synchronize().unwrap();
    let done = dev.default_stream().unwrap().record().unwrap();
    done.wait().unwrap();
    assert!(done.is_complete().unwrap());
}

fn pinned_memory(dev: &Device) {
    let len = 3 * 4096 + 17;
    let mut pinned = dev.alloc_pinned(len).unwrap();
    assert_eq!(pinned.len(), len);
    assert!(pinned.as_slice().iter().all(|&b| b == 0), "zero-filled");
    let data = pattern(len, 77);
    pinned.as_mut_slice().copy_from_slice(&data);
    assert_eq!(pinned.as_slice(), &data[..]);
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(len).unwrap();
    s.write(&mut buf, 0, pinned.as_slice()).unwrap();
    // And as the destination of an asynchronous read.
    let mut pinned2 = dev.alloc_pinned(len).unwrap();
    // SAFETY: `pinned2` is not touched until synchronize returns.
    unsafe { s.read_async(&buf, 0, pinned2.as_mut_slice()).unwrap() };
    s.synchronize().unwrap();
    assert_eq!(pinned2.as_slice(), &data[..]);
    assert!(dev.pinned_stats().in_use >= 2 * len as u64);
    drop((pinned, pinned2));
    // Many small pinned buffers, alive together and dropped in another order.
    let mut v: Vec<_> = (1..20)
        .map(|i| dev.alloc_pinned(i * 100).unwrap())
        .collect();
    for (i, p) in v.iter_mut().enumerate() {
        p.as_mut_slice().fill(i as u8);
    }
    v.reverse();
    for p in &v {
        let first = p.as_slice()[0];
        assert!(p.as_slice().iter().all(|&b| b == first));
    }
}

fn memory_stats_track_alloc_and_free(shared: &Device) {
    // The shared device's counters are exact-checked only where other tests cannot
    // interfere (monotonic counters); an isolated device gets exact checks.
    let before = shared.memory_stats();
    let b = shared.alloc(1_234_567).unwrap();
    let during = shared.memory_stats();
    assert!(during.allocs > before.allocs);
    assert!(during.in_use >= 1_234_567);
    assert!(during.peak >= 1_234_567);
    drop(b);
    assert!(shared.memory_stats().frees > before.frees);

    let dev = shared.isolated();
    assert_eq!(dev.label(), shared.label());
    assert!(!dev.same(shared));
    let a = dev.alloc(1000).unwrap();
    let b = dev.alloc(24).unwrap();
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (1024, 1024, 2, 0));
    drop(a);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (24, 1024, 2, 1));
    drop(b);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (0, 1024, 2, 2));
    let p = dev.alloc_pinned(4096).unwrap();
    assert_eq!(dev.pinned_stats().in_use, 4096);
    assert_eq!(dev.memory_stats().in_use, 0);
    drop(p);
    let p = dev.pinned_stats();
    assert_eq!((p.in_use, p.allocs, p.frees), (0, 1, 1));
}

fn pooled_buffers_count_in_memory_stats_across_pool_replacement(shared: &Device) {
    let dev = shared.isolated();
    let s = dev.new_stream().unwrap();
    let direct = dev.alloc(100).unwrap();
    let a = dev.alloc_pooled(1000, &s).unwrap();
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (1100, 1100, 2, 0));
    // A block is out: the pool stays, and so do the counts.
    let e = dev
        .set_pool(PoolConfig::new(PoolKind::Caching))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
    drop(a);
    dev.set_pool(PoolConfig::new(PoolKind::Caching)).unwrap();
    // The replaced pool's counts and peak stay in the device's.
    let b = dev.alloc_pooled(24, &s).unwrap();
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.peak, m.allocs, m.frees), (124, 1100, 3, 1));
    drop((b, direct));
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.allocs, m.frees), (0, 3, 3));
    dev.reset_peak_stats();
    assert_eq!(dev.memory_stats().peak, 0);
}

fn set_pool_racing_pooled_allocations_fails_none_of_them(shared: &Device) {
    let dev = shared.isolated();
    let stop = AtomicBool::new(false);
    let (mut replaced, mut refused) = (0, 0);
    let total: u64 = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                sc.spawn(|| {
                    let s = dev.new_stream().unwrap();
                    let mut n = 0u64;
                    while !stop.load(Relaxed) {
                        // Never the replaced pool's refusal: the allocation reads the new one.
                        drop(dev.alloc_pooled(4096, &s).unwrap());
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for _ in 0..100 {
            match dev.set_pool(PoolConfig::new(PoolKind::Caching)) {
                Ok(()) => replaced += 1,
                Err(Error::InvalidState { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
            std::thread::yield_now();
        }
        stop.store(true, Relaxed);
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(replaced + refused, 100);
    // Nothing is out now: the replacement goes through, and every allocation was counted
    // once, in whichever pool served it.
    dev.set_pool(PoolConfig::new(PoolKind::Caching)).unwrap();
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.allocs, m.frees), (0, total, total));
}

/// An unnamed pooled buffer freed with no work in flight waits in the freeing thread's cache
/// for the next request of its length on its stream (no shard lock either way), and for no
/// other stream or length; the device's counts stay exact.
fn a_freed_block_comes_back_from_the_thread_cache_on_its_stream(shared: &Device) {
    let dev = shared.isolated();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let hits = || dev.pool_stats().map_or(0, |p| p.thread_cache_hits);
    // The first request makes the pool (the slow way, whose block is cached as any other).
    drop(dev.alloc_pooled(4096, &s1).unwrap());
    assert_eq!(dev.pool_stats().unwrap().thread_cached_bytes, 4096);
    let a = dev.alloc_pooled(4096, &s1).unwrap();
    let at = a.placement();
    assert_eq!(hits(), 1);
    drop(a);
    assert_eq!(dev.pool_stats().unwrap().thread_cached_bytes, 4096);
    let mut b = dev.alloc_pooled(4096, &s1).unwrap();
    assert_eq!(
        (b.placement(), hits()),
        (at, 2),
        "the same block, from the cache"
    );
    s1.write(&mut b, 0, &pattern(4096, 3)).unwrap();
    let mut back = vec![0u8; 4096];
    s1.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 3));
    drop(b);
    // Another stream's request: not from the cache; the cached block goes back to the
    // shard first (a new block would raise the peak).
    let c = dev.alloc_pooled(4096, &s2).unwrap();
    let p = dev.pool_stats().unwrap();
    assert_eq!((p.thread_cache_hits, p.thread_cached_bytes), (2, 0));
    assert_eq!(p.allocated.peak, 4096, "the peak counts no cached block");
    drop(c);
    // Another length: from the shards.
    let d = dev.alloc_pooled(2048, &s2).unwrap();
    assert_eq!(hits(), 2);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.allocs, m.frees), (2048, 5, 4));
    drop(d);
    // A buffer whose native handle was handed out may have work the crate does not see on a
    // device that queues work: its block goes to the shard, fenced.
    let e = dev.alloc_pooled(4096, &s2).unwrap();
    let before = hits();
    assert!(e.native_address().is_some());
    drop(e);
    drop(dev.alloc_pooled(4096, &s2).unwrap());
    let queues = dev.backend() != crate::error::BackendKind::Cpu;
    assert_eq!(hits(), before + u64::from(!queues));
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.allocs, m.frees), (0, 7, 7));
    // Emptied by `empty_cache`, from any thread.
    std::thread::scope(|sc| {
        sc.spawn(|| dev.empty_cache());
    });
    let p = dev.pool_stats().unwrap();
    assert_eq!((p.thread_cached_bytes, p.reserved.current), (0, 0));
}

/// The owners' names of the blocks handed out by `dev`'s pools, as its snapshots show them.
fn owners(dev: &Device) -> Vec<Option<String>> {
    let snaps = dev.pool_snapshots();
    snaps
        .iter()
        .flat_map(|s| s.blocks())
        .filter(|(_, b)| b.state == BlockState::Allocated)
        .map(|(_, b)| b.owner.clone())
        .collect()
}

/// A named pooled buffer (a tensor's device mirror) freed with no work in flight waits in the
/// freeing thread's cache as an unnamed one does; the request that takes it back writes its
/// own name, or none, as the block's owner, so a snapshot names the owner of the moment. The
/// device's counts stay exact.
fn a_cached_block_is_named_by_the_request_that_takes_it(shared: &Device) {
    let dev = shared.isolated();
    let s = dev.new_stream().unwrap();
    let hits = || dev.pool_stats().map_or(0, |p| p.thread_cache_hits);
    let (first, second): (Arc<str>, Arc<str>) = ("first".into(), "second".into());
    let pooled = |owner: Option<&Arc<str>>| DeviceBuffer::pooled(&dev, 4096, &s, owner).unwrap();
    // The first request makes the pool (the slow way, whose block is cached as any other).
    drop(pooled(Some(&first)));
    let a = pooled(Some(&first));
    let at = a.placement();
    assert_eq!(hits(), 1);
    assert_eq!(owners(&dev), [Some("first".to_string())]);
    drop(a);
    assert_eq!(dev.pool_stats().unwrap().thread_cached_bytes, 4096);
    // Another name takes the cached block, and names it.
    let b = pooled(Some(&second));
    assert_eq!(
        (b.placement(), hits()),
        (at, 2),
        "the same block, from the cache"
    );
    assert_eq!(owners(&dev), [Some("second".to_string())]);
    // (The snapshot emptied the cache; the block goes there again.)
    drop(b);
    // An unnamed request takes it: the block has no owner's name any more.
    let c = pooled(None);
    assert_eq!((c.placement(), hits()), (at, 3));
    assert_eq!(owners(&dev), [None]);
    drop(c);
    // And a named one after an unnamed one.
    let d = pooled(Some(&first));
    assert_eq!((d.placement(), hits()), (at, 4));
    assert_eq!(owners(&dev), [Some("first".to_string())]);
    drop(d);
    let m = dev.memory_stats();
    assert_eq!((m.in_use, m.allocs, m.frees), (0, 5, 5));
    assert!(owners(&dev).is_empty());
}

fn uses_of_three_streams_are_freed_with_the_buffer(dev: &Device) {
    let s0 = dev.new_stream().unwrap();
    let mut buf = dev.alloc_pooled(64, &s0).unwrap();
    s0.write(&mut buf, 0, &[7u8; 64]).unwrap();
    let streams: Vec<_> = (0..3).map(|_| dev.new_stream().unwrap()).collect();
    let mut outs: Vec<_> = streams
        .iter()
        .map(|s| dev.alloc_pooled(64, s).unwrap())
        .collect();
    // Readers on three streams: the third goes past the two reader slots.
    for (s, out) in streams.iter().zip(&mut outs) {
        s.copy(&buf, 0, out, 0, 64).unwrap();
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    buf.wait_uses().unwrap();
    if dev.backend() != crate::BackendKind::Cpu {
        // Every point is forgotten, but the room for the third stream's reader stays: the
        // buffer's drop must free it (a leak the sanitizer run would report).
        let uses = buf.uses.lock();
        assert!(uses.is_empty());
        assert!(!uses.owns_nothing());
    }
    drop(buf);
    let mut back = [0u8; 64];
    streams[2].read(&outs[2], 0, &mut back).unwrap();
    assert_eq!(back, [7u8; 64]);
}

fn alloc_above_max_alloc_is_out_of_memory(dev: &Device) {
    let max = usize::try_from(dev.info().max_alloc).unwrap_or(usize::MAX);
    let too_big = max.saturating_add(1);
    let e = dev.alloc(too_big).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains(dev.label()), "{e}");
    let e = dev.alloc_pinned(too_big).unwrap_err();
    assert!(
        e.is_out_of_memory() || matches!(e, Error::SizeOverflow { .. }),
        "{e}"
    );
    // Nothing was counted.
    let m = dev.isolated();
    assert!(m.alloc(too_big).is_err());
    assert_eq!(m.memory_stats().allocs, 0);
}

fn out_of_bounds_and_other_backends_are_errors(dev: &Device) {
    let s = dev.new_stream().unwrap();
    let mut buf = dev.alloc(100).unwrap();
    let e = s.write(&mut buf, 90, &[0u8; 11]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                offset: 90,
                len: 11,
                size: 100,
                ..
            }
        ),
        "{e}"
    );
    let e = s.read(&buf, usize::MAX, &mut [0u8; 2]).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = s.fill(&mut buf, 50, 51, 0).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let mut other = dev.alloc(10).unwrap();
    let e = s.copy(&buf, 0, &mut other, 5, 6).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // A stream of another backend rejects the buffer.
    let foreign = if dev.backend() == crate::BackendKind::Cpu {
        crate::Device::first_accelerator()
    } else {
        Some(Device::cpu())
    };
    if let Some(f) = foreign {
        let e = f
            .new_stream()
            .unwrap()
            .write(&mut buf, 0, &[1])
            .unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    }
}

fn streams_on_many_threads(dev: &Device) {
    std::thread::scope(|scope| {
        for t in 0..8u8 {
            let dev = dev.clone();
            scope.spawn(move || {
                let s = dev.new_stream().unwrap();
                for round in 0..10u8 {
                    let len = 1000 + usize::from(t) * 100 + usize::from(round);
                    let data = pattern(len, t ^ round);
                    let mut buf = dev.alloc(len).unwrap();
                    s.write(&mut buf, 0, &data).unwrap();
                    let mut back = vec![0u8; len];
                    s.read(&buf, 0, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
}

/// A copy from a buffer of one device into a buffer of another device of the same backend,
/// queued on either device's stream (when the backend can: one OpenCL context per platform,
/// CUDA peer copies). Needs two devices (`POCL_DEVICES="pthread pthread"` gives two OpenCL
/// devices).
fn copy_between_two_devices(dev0: &Device) {
    let all = all_or_skip(dev0.backend(), "copy_between_two_devices");
    let Some(dev1) = all.iter().find(|d| !d.same(dev0)) else {
        eprintln!(
            "copy_between_two_devices on {}: only one {} device; nothing to check",
            dev0.label(),
            dev0.backend()
        );
        return;
    };
    let s0 = dev0.new_stream().unwrap();
    let s1 = dev1.new_stream().unwrap();
    let data = pattern(10_000, 11);
    let mut a = dev0.alloc(10_000).unwrap();
    let mut b = dev1.alloc(10_000).unwrap();
    s0.write(&mut a, 0, &data).unwrap();
    s1.fill(&mut b, 0, 10_000, 0).unwrap();
    s1.synchronize().unwrap();
    match s0.copy(&a, 0, &mut b, 0, 10_000) {
        Err(Error::DeviceMismatch { .. }) => {
            eprintln!(
                "copy_between_two_devices: {} and {} cannot copy into each other",
                dev0.label(),
                dev1.label()
            );
            return;
        }
        r => r.unwrap(),
    }
    s0.synchronize().unwrap();
    let mut back = vec![0u8; 10_000];
    s1.read(&b, 0, &mut back).unwrap();
    assert_eq!(back, data);
    // And back the other way, on device 1's stream, with offsets.
    s1.copy(&b, 10, &mut a, 20, 500).unwrap();
    s1.synchronize().unwrap();
    let mut part = vec![0u8; 500];
    s0.read(&a, 20, &mut part).unwrap();
    assert_eq!(part, &data[10..510]);
}

/// The buffers of a device the process keeps (the registry's) point at the process's handle
/// and take no reference count of it, whichever way they are made (threads sharing a stream
/// would all write that one count); those of an isolated device hold one each, given back
/// with the buffer. A block of a stream of its own points at the stream's handle.
fn buffers_take_a_reference_count_of_isolated_devices_only(dev: &Device) {
    use crate::device::handle::DeviceHandle;
    assert!(
        dev.shared.process.get().is_some(),
        "{} is the registry's",
        dev.label()
    );
    let stream = dev.default_stream().unwrap();
    let bufs = [
        dev.alloc(4096).unwrap(),
        dev.alloc_pooled(4096, &stream).unwrap(),
        DeviceBuffer::pooled_default(dev, 4096, None).unwrap(),
        dev.alloc_pooled(0, &stream).unwrap(),
    ];
    for b in &bufs {
        assert!(matches!(&b.device, DeviceHandle::Process(d) if d.same(dev)));
    }
    let own = dev.new_stream().unwrap();
    let lent = dev.alloc_pooled(4096, &own).unwrap();
    assert!(!lent.device.is_device() && lent.device.same(dev));

    let iso = dev.isolated();
    assert!(iso.shared.process.get().is_none());
    let stream = iso.default_stream().unwrap();
    let held = Arc::strong_count(&iso.shared);
    let bufs = [
        iso.alloc(4096).unwrap(),
        iso.alloc_pooled(4096, &stream).unwrap(),
        DeviceBuffer::pooled_default(&iso, 4096, None).unwrap(),
    ];
    assert_eq!(Arc::strong_count(&iso.shared), held + bufs.len());
    for b in &bufs {
        assert!(matches!(&b.device, DeviceHandle::Device(d) if d.same(&iso)));
    }
    drop(bufs);
    assert_eq!(Arc::strong_count(&iso.shared), held);
}

crate::for_each_device!(
    round_trip_with_offsets,
    fill,
    copy_within_device,
    overlapping_copy_in_one_buffer,
    async_write_record_wait,
    events_order_two_streams,
    pinned_memory,
    memory_stats_track_alloc_and_free,
    pooled_buffers_count_in_memory_stats_across_pool_replacement,
    set_pool_racing_pooled_allocations_fails_none_of_them,
    a_freed_block_comes_back_from_the_thread_cache_on_its_stream,
    a_cached_block_is_named_by_the_request_that_takes_it,
    uses_of_three_streams_are_freed_with_the_buffer,
    alloc_above_max_alloc_is_out_of_memory,
    out_of_bounds_and_other_backends_are_errors,
    streams_on_many_threads,
    copy_between_two_devices,
    buffers_take_a_reference_count_of_isolated_devices_only,
);
