//! Dropping the last handle of a device frees everything it owns: nothing the device owns
//! (its default stream, its pools' segments and views, its registry of mirrors) holds a strong
//! handle back to it.

use std::sync::{Arc, Weak};

use crate::alloc::pool::Pool;
use crate::backend::dispatch::{RawMem, RawPinned};
use crate::device::{Device, DeviceShared};
use crate::SyncedMemory;

/// Weak references to a device's state and to its two pools.
struct Watch {
    shared: Weak<DeviceShared>,
    pool: Weak<Pool<RawMem, RawMem>>,
    pinned: Weak<Pool<RawPinned>>,
}

impl Watch {
    fn of(d: &Device) -> Self {
        let m = &d.shared.memory;
        Self {
            shared: Arc::downgrade(&d.shared),
            pool: Arc::downgrade(&m.current_pool().expect("the device pool was used")),
            pinned: Arc::downgrade(&m.current_pinned_pool().expect("the pinned pool was used")),
        }
    }

    fn all_freed(&self) -> bool {
        self.shared.strong_count() == 0
            && self.pool.strong_count() == 0
            && self.pinned.strong_count() == 0
    }
}

/// Uses every part of a device that keeps state: the default stream, a second stream, pooled
/// and direct device memory, pinned memory and the mirror registry. Everything it makes is
/// dropped on return, with cached blocks left in both pools.
fn exercise(d: &Device) {
    let s = d.default_stream().unwrap();
    let other = d.new_stream().unwrap();
    let pooled = d.alloc_pooled(4096, &other).unwrap();
    let direct = d.alloc(4096).unwrap();
    let pinned = d.alloc_pinned(4096).unwrap();
    let m = SyncedMemory::new(1 << 20, d).with_label("mirrored");
    m.host_mut().unwrap().fill(7);
    drop(m.device().unwrap());
    assert_eq!(d.live_buffers().len(), 1);
    let p = SyncedMemory::new(1 << 16, d)
        .with_pinned_host(true)
        .with_stream(&other)
        .unwrap();
    p.host_mut().unwrap().fill(1);
    drop(p.device_mut().unwrap());
    s.synchronize().unwrap();
    drop((pooled, direct, pinned, m, p, s, other));
    let stats = d.pool_stats().unwrap();
    assert!(
        stats.reserved.current > 0,
        "the pool caches segments: {stats}"
    );
}

/// An isolated device on `base` is used, then dropped: its state and pools go with it.
fn last_handle_frees_the_device_and_its_pools(base: &Device) {
    let d = base.isolated();
    exercise(&d);
    let watch = Watch::of(&d);
    let clone = d.clone();
    drop(d);
    assert!(!watch.all_freed(), "a handle is still alive");
    drop(clone);
    assert!(
        watch.shared.strong_count() == 0,
        "the device's state outlives its last handle"
    );
    assert!(
        watch.all_freed(),
        "the pools (and their cached segments) outlive the device"
    );
}

#[test]
fn dropping_the_last_handle_frees_the_device_and_its_pools() {
    last_handle_frees_the_device_and_its_pools(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn dropping_the_last_opencl_handle_frees_the_device_and_its_pools() {
    if let Some(d) = crate::testing::opencl_or_skip("dropping_the_last_opencl_handle") {
        last_handle_frees_the_device_and_its_pools(&d);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn dropping_the_last_cuda_handle_frees_the_device_and_its_pools() {
    if let Some(d) = crate::testing::cuda_or_skip("dropping_the_last_cuda_handle") {
        last_handle_frees_the_device_and_its_pools(&d);
    }
}

#[test]
fn the_default_stream_does_not_keep_its_device_alive() {
    let d = Device::cpu().isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.default_stream().unwrap();
    assert!(s.device().same(&d));
    assert_eq!(
        s.id(),
        d.default_stream().unwrap().id(),
        "one default stream"
    );
    drop(s);
    drop(d);
    assert_eq!(shared.strong_count(), 0);
}

/// A buffer pooled on a stream of its own keeps the device alive after the stream's and the
/// device's last handles are gone (the pool keeps the stream's handle for the buffer), and
/// lets it go when it is dropped.
fn a_pooled_buffer_outlives_its_stream_and_device(base: &Device) {
    let d = base.isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.new_stream().unwrap();
    let mut buf = d.alloc_pooled(4096, &s).unwrap();
    let other = s.clone();
    drop((s, d));
    other.write(&mut buf, 0, &[5; 64]).unwrap();
    drop(other);
    assert_eq!(
        shared.strong_count(),
        1,
        "the buffer's stream holds the device"
    );
    let label = buf.device().label().to_string();
    let mut back = [0u8; 64];
    let s = buf.device().new_stream().unwrap();
    s.read(&buf, 0, &mut back).unwrap();
    assert_eq!(back, [5; 64], "the buffer on {label} still holds its bytes");
    drop(s);
    // Its native handle handed out: the free records a fence on the buffer's stream, read
    // through the handle the pool keeps.
    assert!(buf.native_address().is_some());
    drop(buf);
    assert_eq!(
        shared.strong_count(),
        0,
        "the last buffer let the device go"
    );
}

#[test]
fn a_pooled_buffer_outlives_its_stream_and_device_on_cpu() {
    a_pooled_buffer_outlives_its_stream_and_device(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn a_pooled_opencl_buffer_outlives_its_stream_and_device() {
    if let Some(d) = crate::testing::opencl_or_skip("a_pooled_opencl_buffer_outlives") {
        a_pooled_buffer_outlives_its_stream_and_device(&d);
    }
}

/// Buffers of one stream allocated and dropped on several threads (so on several pool shards),
/// after the stream and the device are dropped, over two pools (`set_pool` in between): the
/// device is freed with the last of them, and a stream that only allocated and freed lets it go
/// with its last handle.
#[test]
fn a_stream_s_buffers_on_many_threads_let_the_device_go_with_the_last() {
    let d = Device::cpu().isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.new_stream().unwrap();
    drop(d.alloc_pooled(4096, &s).unwrap());
    d.set_pool(crate::alloc::pool::PoolConfig::default().with_shards(4))
        .unwrap();
    let bufs: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| sc.spawn(|| d.alloc_pooled(4096, &s).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop((s, d));
    assert_eq!(shared.strong_count(), 1, "8 buffers are out");
    std::thread::scope(|sc| {
        for b in bufs {
            sc.spawn(move || drop(b));
        }
    });
    assert_eq!(
        shared.strong_count(),
        0,
        "the last buffer let the device go"
    );

    let d = Device::cpu().isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.new_stream().unwrap();
    let s2 = s.clone();
    drop(d.alloc_pooled(4096, &s).unwrap());
    drop(s);
    drop(d.alloc_pooled(4096, &s2).unwrap());
    drop((s2, d));
    assert_eq!(
        shared.strong_count(),
        0,
        "the pool let the stream go with its last handle"
    );
}

/// `set_pool` is refused while a buffer of a stream is out; once it is dropped the pool is
/// replaced, and dropping the stream and the device frees the device (the old pool let the
/// stream's handle go when it retired).
#[test]
fn a_refused_then_done_set_pool_leaves_nothing_kept() {
    let d = Device::cpu().isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.new_stream().unwrap();
    let buf = d.alloc_pooled(4096, &s).unwrap();
    let cfg = crate::alloc::pool::PoolConfig::default();
    assert!(d.set_pool(cfg.clone()).is_err(), "a block is out");
    drop(buf);
    d.set_pool(cfg).unwrap();
    drop((s, d));
    assert_eq!(shared.strong_count(), 0);
}

/// The last handle of a stream dropped while other threads drop its buffers: whichever comes
/// last lets the device go.
#[test]
fn the_last_stream_handle_racing_its_buffers_lets_the_device_go() {
    for _ in 0..20 {
        let d = Device::cpu().isolated();
        let shared = Arc::downgrade(&d.shared);
        let s = d.new_stream().unwrap();
        let bufs: Vec<_> = (0..6).map(|_| d.alloc_pooled(512, &s).unwrap()).collect();
        drop(d);
        std::thread::scope(|sc| {
            for b in bufs {
                sc.spawn(move || drop(b));
            }
            sc.spawn(move || drop(s));
        });
        assert_eq!(shared.strong_count(), 0);
    }
}

/// A buffer freed after its stream's last handle, on a thread that goes on (whose cache
/// of the pool would keep the block, and with it the stream's handle and the device): the
/// block goes to its shard, and the device with the last handle.
#[test]
fn a_buffer_freed_after_its_stream_stays_out_of_the_thread_cache() {
    let d = Device::cpu().isolated();
    let shared = Arc::downgrade(&d.shared);
    let s = d.new_stream().unwrap();
    // The first request makes the pool; the next ones may go through this thread's cache.
    drop(d.alloc_pooled(4096, &s).unwrap());
    drop(d.alloc_pooled(4096, &s).unwrap());
    let buf = d.alloc_pooled(4096, &s).unwrap();
    assert!(
        d.pool_stats().unwrap().thread_cache_hits > 0,
        "the thread's cache serves the stream"
    );
    drop((s, d));
    assert_eq!(shared.strong_count(), 1, "the buffer is out");
    drop(buf);
    assert_eq!(shared.strong_count(), 0, "the buffer let the device go");
}

/// The last handle of a stream dropped on another thread while this one (which goes on)
/// frees the stream's buffers: whichever comes first, no block of the stream stays in this
/// thread's cache, and the device goes.
#[test]
fn a_stream_let_go_racing_frees_into_the_thread_cache_lets_the_device_go() {
    for _ in 0..200 {
        let d = Device::cpu().isolated();
        let shared = Arc::downgrade(&d.shared);
        let s = d.new_stream().unwrap();
        drop(d.alloc_pooled(512, &s).unwrap());
        let bufs: Vec<_> = (0..4).map(|_| d.alloc_pooled(512, &s).unwrap()).collect();
        drop(d);
        std::thread::scope(|sc| {
            sc.spawn(move || drop(s));
            drop(bufs);
        });
        assert_eq!(shared.strong_count(), 0);
    }
}
