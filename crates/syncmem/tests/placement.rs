//! An address handed out stays valid, and an operation that fails leaves the buffer as it was:
//! placement pins against spilling, eviction, zero-copy re-sharing and adoption, and a device
//! overwrite that fails after a spill.
//!
//! Each function runs on `cpu`, on every OpenCL device and on every CUDA device (where
//! present), on an isolated device handle with a cap of two buffers, zero-copy as the device
//! allows (on by default on `cpu` and PoCL, off on a discrete GPU).

use syncmem::{Device, Error, Head, MemoryCap, PoolConfig, SyncedMemory};

/// Bytes of each buffer.
const N: usize = 64 << 10;

/// An isolated handle of `base` whose pool holds two buffers of `N` bytes.
fn capped(base: &Device) -> Device {
    let d = base.isolated();
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(2 * N as u64)))
        .unwrap();
    d
}

fn filled(dev: &Device, v: u8) -> SyncedMemory {
    let m = SyncedMemory::new(N, dev);
    m.host_mut().unwrap().fill(v);
    m
}

fn all(m: &SyncedMemory, v: u8) -> bool {
    m.host().unwrap().iter().all(|&b| b == v)
}

/// `a` holding 1s, spilled to the host by two buffers that fill the cap (left on the device,
/// not held).
fn spilled(dev: &Device) -> (SyncedMemory, SyncedMemory, SyncedMemory) {
    let a = filled(dev, 1);
    drop(a.device_mut().unwrap());
    // Nothing queued on `a` any more: the first round of spilling takes it (least recently
    // used) rather than skipping it for a buffer with no work in flight.
    dev.synchronize().unwrap();
    let b = SyncedMemory::new(N, dev);
    let c = SyncedMemory::new(N, dev);
    drop(b.device_overwrite().unwrap());
    drop(c.device_overwrite().unwrap());
    assert_eq!(
        a.head(),
        Head::AtHost,
        "a was spilled (or dropped) to make room"
    );
    (a, b, c)
}

/// A device overwrite of a spilled buffer whose allocation fails keeps the host data: the
/// buffer is as it was, and reads back.
fn a_failed_overwrite_after_a_spill_keeps_the_data(base: &Device) {
    let dev = capped(base);
    let (a, _b, _c) = spilled(&dev);
    dev.fail_allocation(1);
    let e = a.device_overwrite().unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(dev.injected_failures(), 1);
    assert_eq!(a.head(), Head::AtHost);
    assert!(all(&a, 1), "the host data survived the failed overwrite");
    // And the buffer still works: an overwrite that succeeds.
    a.device_overwrite().unwrap();
    assert_eq!(a.head(), Head::AtDevice);
}

/// A pinned buffer is not spilled: the pool fails instead, and the address read before stays
/// the buffer's, with its data. After the pin, it spills again.
fn a_pinned_buffer_is_not_spilled(base: &Device) {
    let dev = capped(base);
    let a = filled(&dev, 1);
    drop(a.device_mut().unwrap());
    let pin = a.pin_placement();
    assert_eq!(a.placement_pins(), 1);
    let at = a.host().unwrap().as_ptr();
    let b = SyncedMemory::new(N, &dev);
    let held = b.device_overwrite().unwrap();
    let c = SyncedMemory::new(N, &dev);
    let e = c.device_overwrite().unwrap_err();
    assert!(e.is_out_of_memory(), "a is pinned and b held: no room: {e}");
    assert_eq!(
        a.host().unwrap().as_ptr(),
        at,
        "a's host memory did not move"
    );
    assert!(all(&a, 1));
    drop(pin);
    assert_eq!(a.placement_pins(), 0);
    drop(c.device_overwrite().unwrap());
    drop(held);
    assert!(all(&a, 1), "spilled after the pin, with its data");
}

/// A spilled buffer brought back while pinned keeps its host mirror where it is (two
/// mirrors, not zero-copy shared memory); a device overwrite does not drop it either.
fn a_pinned_host_mirror_stays_where_it_is(base: &Device) {
    let dev = capped(base);
    let (a, b, c) = spilled(&dev);
    drop((b, c));
    let pin = a.pin_placement();
    let at = a.host().unwrap().as_ptr();
    drop(a.device().unwrap());
    assert_eq!(a.head(), Head::Synced);
    assert_eq!(a.host().unwrap().as_ptr(), at, "a device read");
    drop(a.device_mut().unwrap());
    assert_eq!(a.host().unwrap().as_ptr(), at, "a device write");
    drop(a.device_overwrite().unwrap());
    assert_eq!(a.host().unwrap().as_ptr(), at, "a device overwrite");
    assert!(all(&a, 1));
    drop(pin);
}

/// Adopting memory on either side while pinned is refused; nothing changes.
fn adopting_memory_while_pinned_is_refused(base: &Device) {
    let dev = base.isolated();
    let a = filled(&dev, 3);
    let pin = a.pin_placement();
    let e = a.set_host_data(vec![9u8; N]).unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    let e = a.set_device_data(dev.alloc(N).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    assert!(all(&a, 3));
    drop(pin);
    a.set_host_data(vec![9u8; N]).unwrap();
    assert!(all(&a, 9));
}

syncmem::for_each_device!(
    a_failed_overwrite_after_a_spill_keeps_the_data,
    a_pinned_buffer_is_not_spilled,
    a_pinned_host_mirror_stays_where_it_is,
    adopting_memory_while_pinned_is_refused,
);
