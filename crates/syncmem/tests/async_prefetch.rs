//! Copies in flight, on OpenCL: an access that conflicts with a prefetch waits for it, and an
//! access that does not conflict does not wait. A device access meeting a copy to the device
//! does not wait on the host either: the device orders its commands after the copy.
//!
//! The buffer's stream is blocked with an OpenCL user event (a barrier waiting on it is queued
//! first), so a prefetch queued after it cannot start until the test opens the gate. A
//! non-conflicting access must return while the gate is still closed (if it waited, only the
//! watchdog could open the gate, and the test sees that); a conflicting access must return
//! only after another thread opened the gate (the gate is marked open before its event is
//! completed, so a return before that proves the access did not wait).
//!
//! The gate is opened on every path (by the test, by the watchdog, or by its `Drop` during
//! unwinding), so no queue is left blocked.

#![cfg(feature = "opencl")]

#[path = "common/gate.rs"]
mod gate;

use gate::{device_bytes_elsewhere, freed_under_copy_out, guarded, rig, Gate, N};
use syncmem::synced::PendingKind;
use syncmem::{Head, SyncedMemory};

fn pattern(seed: u8) -> Vec<u8> {
    (0..N).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
}

#[test]
fn to_device_host_read_and_device_read_do_not_wait() {
    let Some((dev, stream, m)) = rig("to_device_host_read_and_device_read_do_not_wait") else {
        return;
    };
    let data = pattern(1);
    m.host_mut().unwrap().copy_from_slice(&data);
    let gate = Gate::block(&stream);
    let ev = m
        .prefetch_to_device(None)
        .unwrap()
        .expect("a copy was queued");
    guarded(&gate, |release_later| {
        assert!(
            !ev.is_complete().unwrap(),
            "the copy is queued behind the closed gate"
        );
        assert_eq!(m.head(), Head::Synced, "a copy in flight counts as done");
        assert_eq!(m.pending().unwrap(), Some(PendingKind::ToDevice));
        // Non-conflicting: a host read, and a prefetch to the (current) host.
        assert_eq!(&*m.host().unwrap(), &data[..]);
        assert!(m.prefetch_to_host(None).unwrap().is_none());
        assert!(
            !gate.is_open(),
            "a host read waited for the host-to-device copy"
        );
        assert_eq!(m.pending().unwrap(), Some(PendingKind::ToDevice));
        // A device read takes the copy as arrived without a host wait: the device orders
        // every command on the buffer after it.
        let g = m.device().unwrap();
        assert!(
            !gate.is_open(),
            "a device read waited on the host for the copy in flight"
        );
        assert_eq!(
            m.pending().unwrap(),
            None,
            "the device took the copy as arrived"
        );
        assert_eq!(m.head(), Head::Synced);
        drop(g);
        // A read of the device mirror on another stream waits for the copy on the device:
        // it returns the copied bytes once the gate opens, not what the block held before.
        release_later();
        assert_eq!(device_bytes_elsewhere(&dev, &m), data);
        assert!(gate.is_open());
        let g = m.device().unwrap();
        let mut out = vec![0u8; N];
        g.read_into(&mut out).unwrap();
        assert_eq!(out, data);
    });
    assert!(ev.is_complete().unwrap());
    assert_eq!(m.pending().unwrap(), None);
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (1, 0));
}

#[test]
fn to_device_host_write_waits() {
    let Some((dev, stream, m)) = rig("to_device_host_write_waits") else {
        return;
    };
    let data = pattern(2);
    m.host_mut().unwrap().copy_from_slice(&data);
    let gate = Gate::block(&stream);
    m.prefetch_to_device(None)
        .unwrap()
        .expect("a copy was queued");
    guarded(&gate, |release_later| {
        assert_eq!(&*m.host().unwrap(), &data[..]);
        assert!(
            !gate.is_open(),
            "a host read waited for the host-to-device copy"
        );
        // The copy reads the host mirror: a host write must wait until it is done.
        release_later();
        let mut h = m.host_mut().unwrap();
        assert!(
            gate.is_open(),
            "a host write did not wait for the copy reading the host"
        );
        h.fill(0xEE);
    });
    assert_eq!(m.head(), Head::AtHost);
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(device_bytes_elsewhere(&dev, &m), vec![0xEE; N]);
    assert_eq!(m.copy_stats().host_to_device.count, 2);
}

#[test]
fn to_host_device_read_does_not_wait_host_read_does() {
    let Some((dev, stream, m)) = rig("to_host_device_read_does_not_wait_host_read_does") else {
        return;
    };
    let data = pattern(3);
    m.device_overwrite().unwrap().write_from(0, &data).unwrap();
    let gate = Gate::block(&stream);
    let ev = m
        .prefetch_to_host(None)
        .unwrap()
        .expect("a copy was queued");
    guarded(&gate, |release_later| {
        assert!(
            !ev.is_complete().unwrap(),
            "the copy is queued behind the closed gate"
        );
        assert_eq!(m.head(), Head::Synced);
        assert_eq!(m.pending().unwrap(), Some(PendingKind::ToHost));
        // Non-conflicting: a device read (checked on another stream), a prefetch to the device.
        assert_eq!(device_bytes_elsewhere(&dev, &m), data);
        assert!(m.prefetch_to_device(None).unwrap().is_none());
        assert!(
            !gate.is_open(),
            "a device read waited for the device-to-host copy"
        );
        assert_eq!(m.pending().unwrap(), Some(PendingKind::ToHost));
        // Conflicting: a host read waits for the copy into the host.
        release_later();
        let h = m.host().unwrap();
        assert!(
            gate.is_open(),
            "a host read did not wait for the copy into the host"
        );
        assert_eq!(&*h, &data[..]);
    });
    assert!(ev.is_complete().unwrap());
    assert_eq!(m.pending().unwrap(), None);
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (0, 1));
}

#[test]
fn an_ordered_offload_under_a_copy_to_the_host_does_not_wait() {
    let Some((dev, stream, m)) = rig("an_ordered_offload_under_a_copy_to_the_host_does_not_wait")
    else {
        return;
    };
    let data = pattern(6);
    // The device mirror goes at once, its block back to the pool ordered after the copy that
    // still reads it: no host wait.
    let gate = freed_under_copy_out(&stream, &m, &data);
    guarded(&gate, |release_later| {
        assert!(
            !gate.is_open(),
            "offload waited for the device-to-host copy"
        );
        assert!(!m.device_allocated());
        assert_eq!(m.pending().unwrap(), Some(PendingKind::ToHost));
        assert_eq!(m.head(), Head::AtHost, "the copy in flight counts as done");
        // Another buffer written on another stream meanwhile does not get the block the copy
        // still reads (else the copy would read its bytes).
        let other = SyncedMemory::new(N, &dev).with_zero_copy(false);
        other.device_overwrite().unwrap().fill(0xFF).unwrap();
        assert!(
            !gate.is_open(),
            "an allocation elsewhere waited for the copy"
        );
        // The host read waits for the copy, which brings the data.
        release_later();
        let h = m.host().unwrap();
        assert!(gate.is_open(), "a host read did not wait for the copy");
        assert_eq!(&*h, &data[..]);
    });
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(device_bytes_elsewhere(&dev, &m), data);
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (1, 1));
}

#[test]
fn a_value_freed_under_its_copy_out_comes_back_on_that_stream_without_a_wait() {
    let test = "a_value_freed_under_its_copy_out_comes_back_on_that_stream_without_a_wait";
    let Some((dev, stream, m)) = rig(test) else {
        return;
    };
    let data = pattern(7);
    let gate = freed_under_copy_out(&stream, &m, &data);
    guarded(&gate, |release_later| {
        // Brought back on the stream of the copy out: the upload is queued behind it.
        let ev = m
            .prefetch_to_device(Some(&stream))
            .unwrap()
            .expect("an upload was queued");
        assert!(
            !gate.is_open(),
            "the prefetch waited for the copy to the host"
        );
        assert!(m.device_allocated());
        assert!(!ev.is_complete().unwrap());
        assert_eq!(m.head(), Head::Synced);
        // A device read takes it without a host wait; a read of the device mirror on another
        // stream waits for the upload on the device, and gets the data.
        drop(m.device().unwrap());
        assert!(!gate.is_open(), "a device read waited on the host");
        release_later();
        assert_eq!(device_bytes_elsewhere(&dev, &m), data);
        // The host waits for its own copy.
        assert_eq!(&*m.host().unwrap(), &data[..]);
    });
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(m.head(), Head::Synced);
    // One copy each way: out, and back behind it.
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (1, 1));
}

#[test]
fn to_host_device_write_waits() {
    let Some((dev, stream, m)) = rig("to_host_device_write_waits") else {
        return;
    };
    let data = pattern(4);
    m.device_overwrite().unwrap().write_from(0, &data).unwrap();
    let gate = Gate::block(&stream);
    m.prefetch_to_host(None)
        .unwrap()
        .expect("a copy was queued");
    guarded(&gate, |release_later| {
        assert_eq!(device_bytes_elsewhere(&dev, &m), data);
        assert!(
            !gate.is_open(),
            "a device read waited for the device-to-host copy"
        );
        // The copy reads the device mirror: a device write must wait until it is done.
        release_later();
        let mut g = m.device_mut().unwrap();
        assert!(
            gate.is_open(),
            "a device write did not wait for the copy reading the device"
        );
        g.fill(0x5A).unwrap();
    });
    assert_eq!(m.head(), Head::AtDevice);
    assert_eq!(&*m.host().unwrap(), &[0x5Au8; N][..]);
    let s = m.copy_stats();
    assert_eq!((s.host_to_device.count, s.device_to_host.count), (0, 2));
}
