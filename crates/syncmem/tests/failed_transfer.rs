//! Work in flight that fails, on OpenCL: a failed copy is never counted as arrived.
//!
//! A stream is blocked with an OpenCL user event (a barrier waiting on it is queued first), a
//! copy or a marker is queued behind it, and the user event is then completed with an error
//! status, which OpenCL propagates to the commands waiting on it. The next access must report
//! the failure, and the mirror the copy was filling must not be considered current.
//!
//! Kept apart from the other OpenCL tests: terminated commands may leave a queue in an
//! implementation-defined state, so each test uses its own streams.

#![cfg(feature = "opencl")]

#[path = "common/gate.rs"]
mod gate;

use gate::{device_bytes_elsewhere, freed_under_copy_out, names_the_failed_wait, rig, Gate, N};
use syncmem::synced::PendingKind;
use syncmem::Head;

fn pattern(seed: u8) -> Vec<u8> {
    (0..N).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
}

#[test]
fn failed_copy_to_host_leaves_the_host_stale() {
    let Some((_, stream, m)) = rig("failed_copy_to_host_leaves_the_host_stale") else {
        return;
    };
    let data = pattern(1);
    m.device_overwrite().unwrap().write_from(0, &data).unwrap();
    let gate = Gate::block(&stream);
    let ev = m
        .prefetch_to_host(None)
        .unwrap()
        .expect("a copy was queued");
    assert_eq!(m.head(), Head::Synced, "a copy in flight counts as done");
    gate.fail();
    assert!(ev.wait().is_err(), "the copy behind the failed gate failed");
    // The host read waits for the copy into the host, and reports its failure.
    let err = m.host().expect_err("the copy into the host failed");
    names_the_failed_wait(&err);
    // The host is not current: only the device holds the data, and nothing is in flight.
    assert_eq!(m.head(), Head::AtDevice);
    assert_eq!(m.pending().unwrap(), None);
    // The next host access copies again.
    assert_eq!(&*m.host().unwrap(), &data[..]);
    assert_eq!(m.head(), Head::Synced);
    let s = m.copy_stats();
    assert_eq!(s.device_to_host.count, 2, "the failed copy, then the retry");
}

#[test]
fn failed_copy_to_device_is_reported_once_and_redone() {
    let Some((dev, stream, m)) = rig("failed_copy_to_device_is_reported_once_and_redone") else {
        return;
    };
    let data = pattern(2);
    m.host_mut().unwrap().copy_from_slice(&data);
    let gate = Gate::block(&stream);
    m.prefetch_to_device(None)
        .unwrap()
        .expect("a copy was queued");
    gate.fail();
    // A host read does not need the copy, but it is the first access to see it settled: it
    // reports the failure, once; the failed copy does not stay pending.
    let err = m.host().expect_err("the failed copy is reported");
    names_the_failed_wait(&err);
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(m.head(), Head::AtHost, "the device mirror is not current");
    assert_eq!(&*m.host().unwrap(), &data[..]);
    // A device access uploads again.
    assert_eq!(device_bytes_elsewhere(&dev, &m), data);
    assert_eq!(m.head(), Head::Synced);
    assert_eq!(m.copy_stats().host_to_device.count, 2);
}

#[test]
fn failed_copy_to_device_taken_by_a_device_read_is_reported_by_the_next_host_write() {
    let test = "failed_copy_to_device_taken_by_a_device_read_is_reported_by_the_next_host_write";
    let Some((dev, stream, m)) = rig(test) else {
        return;
    };
    let data = pattern(5);
    m.host_mut().unwrap().copy_from_slice(&data);
    let gate = Gate::block(&stream);
    m.prefetch_to_device(None)
        .unwrap()
        .expect("a copy was queued");
    // A device read takes the copy as arrived, without a host wait (the device orders its
    // commands after the copy).
    drop(m.device().unwrap());
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(m.head(), Head::Synced);
    gate.fail();
    // The copy still reads the host mirror: a host write waits for it and reports its
    // failure; the device mirror it was filling is then stale.
    let err = m.host_mut().expect_err("the failed copy is reported");
    names_the_failed_wait(&err);
    assert_eq!(m.head(), Head::AtHost, "the device mirror is not current");
    // A device access uploads again.
    assert_eq!(device_bytes_elsewhere(&dev, &m), data);
    assert_eq!(m.copy_stats().host_to_device.count, 2);
}

#[test]
fn failed_copy_to_host_after_its_device_mirror_went_loses_the_contents_with_an_error() {
    let test = "failed_copy_to_host_after_its_device_mirror_went_loses_the_contents_with_an_error";
    let Some((_, stream, m)) = rig(test) else {
        return;
    };
    // The device mirror goes without waiting for the copy (ordered after it).
    let gate = freed_under_copy_out(&stream, &m, &pattern(6));
    assert!(!m.device_allocated());
    gate.fail();
    // The copy held the only data: the access that settles it reports the failure, and the
    // buffer then says its contents are gone instead of reading zeros.
    let err = m.host().expect_err("the failed copy is reported");
    names_the_failed_wait(&err);
    assert_eq!(m.head(), Head::Dropped);
    assert!(matches!(
        m.device().map(drop),
        Err(syncmem::Error::ContentsDropped { .. })
    ));
    // A write gives it contents again.
    m.host_overwrite().unwrap().fill(7);
    assert_eq!(&*m.host().unwrap(), &[7u8; N][..]);
}

#[test]
fn failed_copy_out_under_a_value_brought_back_behind_it_loses_the_contents_with_an_error() {
    let test =
        "failed_copy_out_under_a_value_brought_back_behind_it_loses_the_contents_with_an_error";
    let Some((_, stream, m)) = rig(test) else {
        return;
    };
    let gate = freed_under_copy_out(&stream, &m, &pattern(3));
    // Brought back behind its copy out, on the same stream: no wait.
    m.prefetch_to_device(Some(&stream))
        .unwrap()
        .expect("an upload was queued");
    gate.fail();
    // The copy out failed: the upload behind it copied no data of the buffer's, so neither
    // mirror holds it.
    let err = m.host().expect_err("the failed copy is reported");
    names_the_failed_wait(&err);
    assert_eq!(m.head(), Head::Dropped);
}

#[test]
fn failed_announced_work_is_reported() {
    let Some((dev, _, m)) = rig("failed_announced_work_is_reported") else {
        return;
    };
    let data = pattern(3);
    let other = dev.new_stream().unwrap();
    let third = dev.new_stream().unwrap();
    let gate = Gate::block(&other);
    {
        let mut g = m.device_overwrite().unwrap();
        g.write_from(0, &data).unwrap();
        // Work announced on a stream that then fails, and newer work on another stream.
        g.queued_on(&other).unwrap();
        assert_eq!(m.pending().unwrap(), Some(PendingKind::DeviceWork));
        gate.fail();
        let err = g
            .queued_on(&third)
            .expect_err("the earlier announced work failed");
        names_the_failed_wait(&err);
    }
    // The newer work is still waited for; it succeeded, so the next access succeeds.
    assert_eq!(&*m.host().unwrap(), &data[..]);
    assert_eq!(m.pending().unwrap(), None);
    assert_eq!(m.head(), Head::Synced);
}

#[test]
fn a_failed_event_says_its_command_failed() {
    let Some(dev) = syncmem::testing::opencl_or_skip("a_failed_event_says_its_command_failed")
    else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let gate = Gate::block(&stream);
    let marker = stream.record().unwrap();
    assert!(!marker.is_complete().unwrap(), "held by the gate");
    gate.fail();
    assert!(marker.wait().is_err(), "waiting on a failed command");
    let err = marker.is_complete().unwrap_err().to_string();
    assert!(
        err.contains("event command") && err.contains("ended with execution status"),
        "{err}"
    );
    assert!(
        !err.contains("clGetEventInfo"),
        "the query itself worked: {err}"
    );
}
