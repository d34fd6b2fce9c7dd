//! `SyncedMemory::offload_ordered` of a zero-copy buffer whose memory the host uses in place
//! (PoCL): the block is parked at once while the device command that writes it is still held
//! behind a gate (see `common/gate.rs`), so the call must return with the gate closed (a
//! watchdog opens it after 30 s, and the test sees that). Host accesses and device writes then
//! wait for that command; a device read, a prefetch to the host, dropping the contents and
//! dropping the buffer do not; a failed write leaves the contents dropped.

#![cfg(feature = "opencl")]

#[path = "common/gate.rs"]
mod gate;

use gate::{device_bytes_elsewhere, guarded, Gate, N};
use syncmem::synced::PendingKind;
use syncmem::{Device, Error, Head, Stream, SyncedMemory, ZeroCopyProtocol};

/// A zero-copy buffer of [`N`] bytes on its own stream of an isolated OpenCL device, holding
/// ones, and a gate on that stream with a fill of 7 queued behind it: the buffer's last writer
/// is held. `None` (skip) without OpenCL or where memory is not shared in place.
fn held_writer(test: &str) -> Option<(Device, Stream, SyncedMemory, Gate)> {
    let dev = syncmem::testing::opencl_or_skip(test)?.isolated();
    if dev.zero_copy_protocol() != Some(ZeroCopyProtocol::InPlace) {
        eprintln!(
            "{test}: memory not shared in place on {}; skipped",
            dev.label()
        );
        return None;
    }
    let stream = dev.new_stream().unwrap();
    let m = SyncedMemory::new(N, &dev)
        .with_stream(&stream)
        .unwrap()
        .with_label(test);
    m.host_overwrite().unwrap().fill(1);
    m.device().unwrap();
    let gate = Gate::block(&stream);
    m.device_mut().unwrap().fill(7).unwrap();
    Some((dev, stream, m, gate))
}

/// Parks `m` with its writer held: no wait, the block leaves the cap's count at once.
fn park_held(dev: &Device, m: &SyncedMemory, gate: &Gate) {
    let before = dev.pool_stats().unwrap();
    assert_eq!(m.offload_ordered().unwrap(), N, "parked at once");
    assert!(!gate.is_open(), "the park waited for the device's write");
    assert!(!m.device_allocated());
    assert_eq!(m.head(), Head::AtHost);
    assert_eq!(m.pending().unwrap(), Some(PendingKind::ToHost));
    let s = dev.pool_stats().unwrap();
    assert!(s.parked_bytes >= N as u64, "{s}");
    assert_eq!(s.spills - before.spills, 1, "{s}");
    assert_eq!(
        s.allocated.current, before.allocated.current,
        "the block stays"
    );
}

#[test]
fn a_host_read_waits_for_the_write_the_park_did_not() {
    let test = "a_host_read_waits_for_the_write_the_park_did_not";
    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        release_later();
        let host = m.host().unwrap();
        assert!(gate.is_open(), "a host read did not wait for the write");
        assert!(host.iter().all(|&b| b == 7), "the device's write is read");
    });
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(m.copy_stats().total_bytes(), 0, "nothing copied");
}

#[test]
fn a_device_read_after_the_park_does_not_wait_on_the_host() {
    let test = "a_device_read_after_the_park_does_not_wait_on_the_host";
    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        let g = m.device().unwrap();
        assert!(!gate.is_open(), "a device read waited on the host");
        assert!(m.device_allocated(), "the block is the device mirror again");
        drop(g);
        assert_eq!(dev.pool_stats().unwrap().parked_bytes, 0);
        // Another stream's read is ordered after the held write on the device.
        release_later();
        assert!(device_bytes_elsewhere(&dev, &m).iter().all(|&b| b == 7));
        // The host still waits for the write (done now) and reads it.
        assert!(m.host().unwrap().iter().all(|&b| b == 7));
    });
    assert_eq!(m.pending().unwrap(), None);
    let c = m.copy_stats();
    assert_eq!((c.spilled.count, c.refilled.count), (1, 1), "{c:?}");
    assert_eq!(c.total_bytes(), 0, "nothing copied: {c:?}");
}

#[test]
fn a_host_write_and_a_device_write_wait_for_it() {
    let test = "a_host_write_and_a_device_write_wait_for_it";
    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        release_later();
        m.host_mut().unwrap()[0] = 3;
        assert!(
            gate.is_open(),
            "a host write did not wait for the device's write"
        );
    });
    let host = m.host().unwrap();
    assert_eq!((host[0], host[1], host[N - 1]), (3, 7, 7));
    drop(host);

    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        release_later();
        m.device_mut().unwrap().fill(5).unwrap();
        assert!(
            gate.is_open(),
            "a device write did not settle the pending park"
        );
    });
    assert!(m.host().unwrap().iter().all(|&b| b == 5));
}

#[test]
fn a_prefetch_to_the_host_and_dropped_contents_do_not_wait() {
    let test = "a_prefetch_to_the_host_and_dropped_contents_do_not_wait";
    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        // The host is current once the write ends: nothing to queue, nothing to wait for.
        assert!(m.prefetch_to_host(None).unwrap().is_none());
        assert!(!gate.is_open(), "a prefetch to the host waited");
        // Nobody reads what the write leaves: the contents go without a wait...
        m.drop_contents().unwrap();
        assert!(!gate.is_open(), "dropping the contents waited");
        assert_eq!(m.head(), Head::Dropped);
        assert_eq!(m.pending().unwrap(), None);
        // ...and a host write of the block still waits for the device's commands on it.
        release_later();
        m.host_overwrite().unwrap().fill(4);
        assert!(
            gate.is_open(),
            "a host write did not wait for the device's write"
        );
    });
    assert!(m.host().unwrap().iter().all(|&b| b == 4));
}

#[test]
fn a_buffer_dropped_after_the_park_does_not_wait() {
    let test = "a_buffer_dropped_after_the_park_does_not_wait";
    let Some((dev, stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |release_later| {
        park_held(&dev, &m, &gate);
        drop(m);
        assert!(
            !gate.is_open(),
            "dropping the buffer waited for the device's write"
        );
        // Its block went back to the pool ordered after the write: a new buffer of the same
        // size on the same stream, written by the host, waits for it.
        let again = SyncedMemory::new(N, &dev).with_stream(&stream).unwrap();
        release_later();
        again.host_overwrite().unwrap().fill(2);
        assert!(
            gate.is_open(),
            "a host write reused a block still being written"
        );
    });
}

#[test]
fn a_failed_write_leaves_the_contents_dropped() {
    let test = "a_failed_write_leaves_the_contents_dropped";
    let Some((dev, _stream, m, gate)) = held_writer(test) else {
        return;
    };
    guarded(&gate, |_| {
        park_held(&dev, &m, &gate);
        gate.fail();
        let first = m.host().map(|h| h[0]);
        assert!(first.is_err(), "the failed write is reported: {first:?}");
        assert!(
            matches!(m.host().map(|h| h[0]), Err(Error::ContentsDropped { .. })),
            "the bytes the write left are not served"
        );
        assert_eq!(m.head(), Head::Dropped);
        // Written whole, the buffer is good again.
        m.host_overwrite().unwrap().fill(9);
        assert!(m.host().unwrap().iter().all(|&b| b == 9));
    });
}
