//! Caching pools end to end: the host pool, device pools of every kind on `cpu` and OpenCL,
//! stream-ordered reuse, selection by environment variable, and the statistics reports.
//!
//! Device tests run on `Device::detached()` handles, whose pools and counters no other test
//! touches, so counts are asserted exactly.

use std::process::Command;
use std::time::Instant;

use syncmem::alloc::pool::PoolEvent;
use syncmem::{Device, Error, Head, HostPool, PoolConfig, PoolKind, SyncedMemory};

const MIB: usize = 1 << 20;

// ----- host pool -------------------------------------------------------------------------------

#[test]
fn host_pool_reuses_a_64mib_block_at_the_same_address() {
    let pool = HostPool::new("test host", PoolConfig::default()).unwrap();
    let t0 = Instant::now();
    let mut a = pool.alloc(64 * MIB).unwrap();
    a.as_mut_slice().fill(1);
    let first = t0.elapsed();
    let addr = a.as_ptr();
    assert_eq!(addr as usize % 64, 0, "64-byte aligned");
    drop(a);
    let t1 = Instant::now();
    let mut b = pool.alloc(64 * MIB).unwrap();
    b.as_mut_slice().fill(2);
    let second = t1.elapsed();
    assert_eq!(b.as_ptr(), addr, "the cached block comes back");
    let s = pool.stats();
    assert_eq!((s.allocations, s.cache_hits, s.backend_allocs), (2, 1, 1));
    assert_eq!(s.reserved.current, 64 * MIB as u64);
    eprintln!(
        "host pool, 64 MiB alloc + fill: fresh {:.2} ms, cached {:.2} ms",
        first.as_secs_f64() * 1e3,
        second.as_secs_f64() * 1e3
    );
    drop(b);
    assert_eq!(pool.empty_cache(), 64 * MIB as u64);
}

#[test]
fn host_pool_zeroes_only_when_required() {
    let pool = HostPool::new("zeroing", PoolConfig::default()).unwrap();
    let mut a = pool.alloc(100_000).unwrap();
    assert!(a.was_zeroed(), "fresh segments are calloc'ed");
    assert!(a.as_slice().iter().all(|&b| b == 0));
    assert!(!a.zero(), "nothing to write");
    a.as_mut_slice().fill(0xAB);
    drop(a);
    let mut b = pool.alloc(100_000).unwrap();
    assert!(
        !b.was_zeroed(),
        "a reused block holds its last user's bytes"
    );
    assert!(
        b.as_slice().iter().all(|&x| x == 0xAB),
        "initialised old bytes"
    );
    assert!(b.zero(), "zeroed on request");
    assert!(b.as_slice().iter().all(|&x| x == 0));
    let empty = pool.alloc(0).unwrap();
    assert!(empty.is_empty() && empty.as_slice().is_empty());
}

#[test]
fn synced_host_mirror_reads_zero_even_from_a_reused_block() {
    let host = HostPool::global().unwrap();
    for round in 0..3 {
        let before = host.stats().cache_hits;
        let m = SyncedMemory::host_only(3 * MIB + 5);
        assert!(m.host().unwrap().iter().all(|&b| b == 0), "round {round}");
        m.host_mut().unwrap().fill(9);
        drop(m);
        if round > 0 {
            assert!(
                host.stats().cache_hits > before,
                "round {round} reused a block"
            );
        }
    }
    // A mirror filled by a device-to-host copy is not zeroed, and holds the device's bytes.
    let dev = Device::cpu().detached();
    let m = SyncedMemory::new(3 * MIB + 5, &dev);
    m.device_mut().unwrap().fill(4).unwrap();
    assert!(m.host().unwrap().iter().all(|&b| b == 4));
}

// ----- device pools ----------------------------------------------------------------------------

fn device_mirrors_come_from_the_pool(dev: &Device) {
    let d = dev.detached();
    let a = SyncedMemory::new(MIB, &d).with_label("a");
    a.host_mut().unwrap().fill(3);
    assert!(a.device().unwrap().buffer().is_pooled());
    assert_eq!(a.head(), Head::Synced);
    let live = d.live_buffers();
    assert_eq!(live.len(), 1);
    assert_eq!(
        (live[0].label.as_str(), live[0].bytes, live[0].head),
        ("a", MIB as u64, Some(Head::Synced))
    );
    drop(a);
    assert!(d.live_buffers().is_empty(), "unregistered on drop");
    let b = SyncedMemory::new(MIB, &d);
    b.host_mut().unwrap().fill(5);
    let mut back = vec![0u8; MIB];
    b.device().unwrap().read_into(&mut back).unwrap();
    assert!(back.iter().all(|&x| x == 5));
    let s = d.pool_stats().unwrap();
    assert_eq!(
        (s.kind, s.allocations, s.cache_hits),
        (PoolKind::Caching, 2, 1)
    );
    assert_eq!(s.backend_allocs, 1, "one segment");
    // Device::alloc stays direct.
    let direct = d.alloc(1000).unwrap();
    assert!(!direct.is_pooled());
    assert_eq!(d.pool_stats().unwrap().direct_bytes, 1000);
}

fn pooled_buffers_are_separate_and_correct(dev: &Device) {
    let d = dev.detached();
    let s = d.new_stream().unwrap();
    let mut bufs: Vec<_> = (0..5)
        .map(|i| d.alloc_pooled(1000 + i * 700, &s).unwrap())
        .collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        s.write(b, 0, &vec![i as u8 + 1; b.len()]).unwrap();
    }
    for (i, b) in bufs.iter().enumerate() {
        let mut back = vec![0u8; b.len()];
        s.read(b, 0, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == i as u8 + 1), "buffer {i}");
        #[cfg(feature = "opencl")]
        if let Some(cl) = b.as_opencl() {
            use opencl3::memory::ClMem;
            // A sub-buffer of the whole block (kept for the block's next user): at least the
            // requested size, a whole number of 512-byte units; kernels see the block at
            // offset 0.
            let size = cl.size().unwrap();
            assert!(size >= b.len() && size % 512 == 0, "{size} for {}", b.len());
            assert!(!cl.associated_memobject().unwrap().is_null());
            assert_eq!(cl.offset().unwrap() % 512, 0);
        }
    }
    assert_eq!(d.pool_stats().unwrap().backend_allocs, 1);
    // Out-of-range access is still checked against the buffer, not the segment.
    let e = s.write(&mut bufs[0], 990, &[0u8; 11]).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { size: 1000, .. }), "{e}");
    let other = Device::cpu().detached();
    let e = d
        .alloc_pooled(10, &other.new_stream().unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

fn every_pool_kind_works(dev: &Device) {
    for kind in [PoolKind::None, PoolKind::Binned, PoolKind::Caching] {
        let d = dev.detached();
        d.set_pool(PoolConfig::new(kind)).unwrap();
        for round in 0..3u8 {
            let m = SyncedMemory::new(5000, &d);
            m.host_mut().unwrap().fill(round);
            let mut back = vec![0u8; 5000];
            m.device().unwrap().read_into(&mut back).unwrap();
            assert!(back.iter().all(|&b| b == round), "{kind} round {round}");
        }
        let s = d.pool_stats().unwrap();
        assert_eq!((s.kind, s.allocations, s.frees), (kind, 3, 3), "{kind}");
        let (hits, backend) = match kind {
            PoolKind::None => (0, 3),
            _ => (2, 1),
        };
        assert_eq!(
            (s.cache_hits, s.backend_allocs),
            (hits, backend),
            "{kind}: {s}"
        );
        if kind == PoolKind::Binned {
            assert_eq!(
                s.reserved.current,
                5 << 10,
                "5000 B rounds up to the 5 KiB bin (4 KiB x 1.25): {s}"
            );
        }
    }
}

fn set_pool_is_refused_while_blocks_live(dev: &Device) {
    let d = dev.detached();
    let m = SyncedMemory::new(100, &d);
    m.device_mut().unwrap().fill(1).unwrap();
    let e = d.set_pool(PoolConfig::new(PoolKind::Binned)).unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    assert_eq!(m.host().unwrap()[0], 1);
    drop(m);
    d.set_pool(PoolConfig::new(PoolKind::Binned)).unwrap();
    assert_eq!(d.pool_stats().unwrap().kind, PoolKind::Binned);
    let e = d
        .set_pool(PoolConfig::default().with_bins(1, 3, 4))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
}

fn pinned_host_mirrors_come_from_the_pinned_pool(dev: &Device) {
    let d = dev.detached();
    for round in 0..3u8 {
        let m = SyncedMemory::new(MIB, &d).with_pinned_host(true);
        assert!(
            m.host().unwrap().iter().all(|&b| b == 0),
            "zero out of Uninitialized, round {round}"
        );
        m.host_mut().unwrap().fill(round + 1);
        let mut back = vec![0u8; MIB];
        m.device().unwrap().read_into(&mut back).unwrap();
        assert!(back.iter().all(|&b| b == round + 1));
    }
    let s = d.pinned_pool_stats().unwrap();
    assert_eq!(
        (s.allocations, s.cache_hits, s.backend_allocs),
        (3, 2, 1),
        "{s}"
    );
    assert_eq!(d.pinned_stats().allocs, 3);
    assert!(d.empty_cache() > 0);
}

fn pools_report_in_stats(dev: &Device) {
    // Two mirrors, so that the host pool is used too.
    let m = SyncedMemory::new(4096, dev)
        .with_zero_copy(false)
        .with_label("reported");
    m.host_mut().unwrap().fill(1);
    drop(m.device().unwrap());
    let snap = syncmem::stats();
    let text = snap.to_string();
    assert!(text.contains("pool"), "{text}");
    assert!(snap.pools.iter().any(|p| p.label == dev.label()), "{text}");
    assert!(snap.pools.iter().any(|p| p.label == "host"), "{text}");
    let json = snap.to_json();
    check_json(&json);
    assert!(
        json.contains(&format!("\"label\":\"{}\"", dev.label())),
        "{json}"
    );
    assert!(json.contains("\"fragmentation\":"), "{json}");
    let p = dev.pool_stats().unwrap();
    check_json(&p.to_json());
    assert!(p.to_string().contains("largest free block"), "{p}");
}

fn kernels_run_on_pooled_mirrors_at_nonzero_offsets(dev: &Device) {
    let d = dev.detached();
    let n = 1000;
    let pad = SyncedMemory::new(3000, &d);
    pad.device_mut().unwrap().fill(0).unwrap();
    let x = SyncedMemory::new(n * 4, &d);
    let y = SyncedMemory::new(n * 4, &d);
    for (i, v) in x
        .host_mut()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        *v = i as f32;
    }
    y.host_mut()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .fill(1.0);
    {
        let xr = x.device().unwrap();
        let mut yw = y.device_mut().unwrap();
        #[cfg(feature = "opencl")]
        if let Some(b) = yw.buffer().as_opencl() {
            use opencl3::memory::ClMem;
            assert_eq!(
                b.offset().unwrap(),
                3072 + 4096,
                "y sits inside the segment"
            );
        }
        syncmem::kernels::axpy::<f32>(n, 2.0, &xr, &mut yw).unwrap();
        syncmem::kernels::scale::<f32>(n, 0.5, &mut yw).unwrap();
    }
    let h = y.host().unwrap();
    let ys = h.as_slice_of::<f32>().unwrap();
    assert!(
        ys.iter().enumerate().all(|(i, &v)| v == 0.5 + i as f32),
        "{:?}",
        &ys[..4]
    );
    assert_eq!(
        d.pool_stats().unwrap().backend_allocs,
        1,
        "one shared segment"
    );
}

syncmem::for_each_device!(
    device_mirrors_come_from_the_pool,
    pooled_buffers_are_separate_and_correct,
    every_pool_kind_works,
    set_pool_is_refused_while_blocks_live,
    pinned_host_mirrors_come_from_the_pinned_pool,
    pools_report_in_stats,
    kernels_run_on_pooled_mirrors_at_nonzero_offsets,
);

// ----- stream-ordered reuse on a real queue ----------------------------------------------------

/// Blocks `stream` until the returned closure is called (an OpenCL user event in a barrier).
#[cfg(feature = "opencl")]
fn block_queue(stream: &syncmem::Stream) -> impl FnOnce() {
    use opencl3::command_queue as cq;
    use opencl3::event as ev;
    let q = stream.as_opencl().expect("an OpenCL stream");
    let ctx = q.context().unwrap();
    let user = ev::create_user_event(ctx).unwrap();
    let list = [user];
    // SAFETY: `list` holds a live user event for the duration of the call; the barrier keeps
    // its own reference.
    let barrier = unsafe { cq::enqueue_barrier_with_wait_list(q.get(), 1, list.as_ptr()) }.unwrap();
    cq::flush(q.get()).unwrap();
    move || {
        ev::set_user_event_status(user, ev::CL_COMPLETE).unwrap();
        // SAFETY: both events were created above and are released exactly once, here.
        unsafe {
            ev::release_event(user).unwrap();
            ev::release_event(barrier).unwrap();
        }
    }
}

#[cfg(feature = "opencl")]
#[test]
fn opencl_block_freed_with_pending_work_is_reused_on_its_stream_only() {
    let Some(dev) = syncmem::testing::opencl_or_skip("opencl_stream_ordered_reuse") else {
        return;
    };
    let d = dev.detached();
    // PyTorch's layout: 2 MiB segments, every free merged at once (a block on a stream's
    // exact-size list is not shared with other streams anyway).
    let cfg = PoolConfig::default()
        .with_segment_growth(2 * MIB, 0)
        .with_size_class_limit(0);
    d.set_pool(cfg).unwrap();
    let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let release = block_queue(&s1);
    let mut x = d.alloc_pooled(MIB, &s1).unwrap();
    s1.fill(&mut x, 0, MIB, 7).unwrap(); // queued behind the blocked barrier
    drop(x); // the block goes back with the fill pending
    let x2 = d.alloc_pooled(MIB, &s1).unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!(
        (s.cache_hits, s.backend_allocs),
        (1, 1),
        "same stream: at once"
    );
    // No work of its own: the block still carries the fill of its first user.
    drop(x2);
    let y = d.alloc_pooled(MIB, &s2).unwrap();
    assert_eq!(
        d.pool_stats().unwrap().backend_allocs,
        2,
        "another stream must not take a block whose event is pending"
    );
    release();
    s1.synchronize().unwrap();
    let y2 = d.alloc_pooled(MIB, &s2).unwrap(); // the rest of y's segment
    let y3 = d.alloc_pooled(MIB, &s2).unwrap(); // the first segment, now settled
    let s = d.pool_stats().unwrap();
    assert_eq!((s.backend_allocs, s.cache_hits), (2, 3), "{s}");
    drop((y, y2, y3));
}

// ----- selection by environment variable -------------------------------------------------------

const CHILD: &str = "SYNCMEM_POOL_TEST_CHILD";

fn run_child(mode: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "env_child_probe",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, mode);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {mode} failed:\n{text}");
    assert!(text.contains(&format!("probe {mode} ok")), "{text}");
    text
}

#[test]
fn env_vars_select_pool_kinds_and_options() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    run_child(
        "binned",
        &[
            ("SYNCMEM_DEVICE_POOL", "binned"),
            (
                "SYNCMEM_POOL_CONF",
                "memory_cap=64MiB,max_cached_bytes=1MiB",
            ),
            ("SYNCMEM_HOST_POOL", "none"),
            ("SYNCMEM_PINNED_POOL", "binned"),
        ],
    );
    run_child("bogus", &[("SYNCMEM_DEVICE_POOL", "fancy")]);
}

/// Runs only in the child processes of the test above.
#[test]
fn env_child_probe() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let dev = Device::cpu();
    match mode.as_str() {
        "binned" => {
            let m = SyncedMemory::new(1000, &dev).with_pinned_host(true);
            m.host_mut().unwrap().fill(1);
            drop(m.device().unwrap());
            let s = dev.pool_stats().unwrap();
            assert_eq!((s.kind, s.cap), (PoolKind::Binned, Some(64 << 20)));
            assert_eq!(s.allocated.current, 1024, "1000 B in the 1 KiB bin");
            assert_eq!(dev.memory_cap(), Some(64 << 20));
            assert_eq!(dev.pinned_pool_stats().unwrap().kind, PoolKind::Binned);
            let h = SyncedMemory::host_only(10);
            drop(h.host().unwrap());
            assert_eq!(HostPool::global().unwrap().stats().kind, PoolKind::None);
        }
        "bogus" => {
            let e = dev.alloc(10).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
            assert!(e.to_string().contains("SYNCMEM_DEVICE_POOL"), "{e}");
            let m = SyncedMemory::new(10, &dev);
            assert!(matches!(m.device(), Err(Error::InvalidConfig { .. })));
            assert_eq!(m.head(), Head::Uninitialized);
            assert_eq!(m.host().unwrap().len(), 10, "the host side is unaffected");
        }
        other => panic!("unknown child mode {other}"),
    }
    println!("probe {mode} ok");
}

// ----- observer and JSON -----------------------------------------------------------------------

#[test]
fn observer_hook_sees_host_pool_events() {
    use std::sync::{Arc, Mutex};
    struct Log(Mutex<Vec<PoolEvent>>);
    impl syncmem::alloc::pool::PoolObserver for Log {
        fn on_event(&self, _: &str, e: &PoolEvent) {
            self.0.lock().unwrap().push(e.clone());
        }
    }
    let pool = HostPool::new("observed", PoolConfig::new(PoolKind::Binned)).unwrap();
    let log = Arc::new(Log(Mutex::new(Vec::new())));
    pool.pool().set_observer(Some(log.clone()));
    drop(pool.alloc(100).unwrap());
    drop(pool.alloc(100).unwrap());
    let events = log.0.lock().unwrap();
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(matches!(
        events[3],
        PoolEvent::Alloc {
            cache_hit: true,
            ..
        }
    ));
}

/// A minimal JSON syntax check (objects, arrays, strings, numbers, null).
fn check_json(s: &str) {
    fn value(b: &[u8], i: &mut usize) -> Result<(), String> {
        match b.get(*i) {
            Some(b'{') | Some(b'[') => {
                let close = if b[*i] == b'{' { b'}' } else { b']' };
                let obj = close == b'}';
                *i += 1;
                if b.get(*i) == Some(&close) {
                    *i += 1;
                    return Ok(());
                }
                loop {
                    if obj {
                        string(b, i)?;
                        (b.get(*i) == Some(&b':'))
                            .then_some(())
                            .ok_or("expected :")?;
                        *i += 1;
                    }
                    value(b, i)?;
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(c) if *c == close => {
                            *i += 1;
                            return Ok(());
                        }
                        _ => return Err(format!("bad container at {i}")),
                    }
                }
            }
            Some(b'"') => string(b, i),
            Some(b'n') if b[*i..].starts_with(b"null") => {
                *i += 4;
                Ok(())
            }
            Some(c) if c.is_ascii_digit() || *c == b'-' => {
                while b.get(*i).is_some_and(|c| b"0123456789.eE+-".contains(c)) {
                    *i += 1;
                }
                Ok(())
            }
            _ => Err(format!("unexpected byte at {i}")),
        }
    }
    fn string(b: &[u8], i: &mut usize) -> Result<(), String> {
        (b.get(*i) == Some(&b'"'))
            .then_some(())
            .ok_or("expected string")?;
        *i += 1;
        while let Some(&c) = b.get(*i) {
            *i += 1;
            match c {
                b'\\' => *i += 1,
                b'"' => return Ok(()),
                _ => {}
            }
        }
        Err("unterminated string".into())
    }
    let mut i = 0;
    value(s.as_bytes(), &mut i).unwrap_or_else(|e| panic!("{e}: {s}"));
    assert_eq!(i, s.len(), "trailing bytes: {s}");
}
