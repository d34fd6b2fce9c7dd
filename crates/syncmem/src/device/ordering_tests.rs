//! The order of commands of several streams on one buffer, on every device of every backend:
//! the buffer's note of the one stream its points are of (what a command of that stream skips
//! the lock for), and the waits across streams past it, a pooled block's inherited work
//! included; a host wait that finds the points complete forgets them.

use std::sync::atomic::Ordering::Relaxed;

use crate::device::buffer::DeviceBuffer;
use crate::Device;

/// The buffer's lock-free note of the one stream its points are of (what a command of that
/// stream skips the lock for), and the order of commands of two streams past it.
fn one_stream_points_are_known_without_the_lock(dev: &Device) {
    if dev.backend() == crate::BackendKind::Cpu {
        return; // no points on `cpu`: its work is done when a call returns
    }
    let single = |b: &DeviceBuffer| b.single.load(Relaxed);
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let mut buf = dev.alloc(64).unwrap();
    let mut other = dev.alloc(64).unwrap();
    assert_eq!(single(&buf), 0, "no point yet");
    s1.write(&mut buf, 0, &[3u8; 64]).unwrap();
    let id1 = u32::try_from(s1.id()).unwrap();
    assert_eq!(single(&buf), id1);
    // Written again and again on one stream: the point moves on that stream.
    for v in 0..5u8 {
        s1.fill(&mut buf, 0, 64, v).unwrap();
    }
    assert_eq!(single(&buf), id1);
    // Read on a second stream: points of two streams, so commands take the lock again, and
    // the second stream's read waits for the first's writes.
    s2.copy(&buf, 0, &mut other, 0, 64).unwrap();
    assert_eq!(single(&buf), crate::device::buffer::NOT_SINGLE);
    let mut back = [0u8; 64];
    s2.read(&other, 0, &mut back).unwrap();
    assert_eq!(back, [4u8; 64]);
    // A write on the second stream waits for both and leaves its own point alone.
    s2.fill(&mut buf, 0, 64, 9).unwrap();
    assert_eq!(single(&buf), u32::try_from(s2.id()).unwrap());
    s1.read(&buf, 0, &mut back).unwrap();
    assert_eq!(back, [9u8; 64]);
    // A pooled block handed out again to its stream with that stream's work maybe still in
    // flight: the new owner's first command on another stream must wait for that work, not
    // skip it for want of a point.
    const BIG: usize = 8 << 20;
    let mut first = dev.alloc_pooled(BIG, &s2).unwrap();
    s2.fill(&mut first, 0, BIG, 5).unwrap();
    drop(first);
    let mut again = dev.alloc_pooled(BIG, &s2).unwrap();
    let hint = single(&again);
    assert!(
        hint == 0 || hint == u32::try_from(s2.id()).unwrap(),
        "{hint}"
    );
    s1.fill(&mut again, 0, BIG, 7).unwrap();
    let mut big = vec![0u8; BIG];
    s1.read(&again, 0, &mut big).unwrap();
    assert!(big.iter().all(|&b| b == 7));
    assert_eq!(
        crate::device::buffer::single_hint(u64::MAX),
        crate::device::buffer::NOT_SINGLE
    );
    assert_eq!(
        crate::device::buffer::single_hint(1 << 40),
        crate::device::buffer::NOT_SINGLE
    );
    assert_eq!(crate::device::buffer::single_hint(7), 7);
}

/// A wait on the host that finds every point complete forgets them: the buffer's note goes
/// back to "no point" (a later wait and a command of any stream skip the lock), and the
/// commands after it are ordered as before.
fn a_wait_that_finds_all_work_done_forgets_it(dev: &Device) {
    let single = |b: &DeviceBuffer| b.single.load(Relaxed);
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let mut buf = dev.alloc(1 << 20).unwrap();
    let mut other = dev.alloc(1 << 20).unwrap();
    buf.wait_uses().unwrap();
    assert_eq!(single(&buf), 0, "no point yet");
    s1.fill(&mut buf, 0, 1 << 20, 1).unwrap();
    s2.copy(&buf, 0, &mut other, 0, 1 << 20).unwrap();
    if dev.backend() == crate::BackendKind::Cpu {
        assert_eq!(single(&buf), 0, "no points on `cpu`");
    } else {
        assert_eq!(single(&buf), crate::device::buffer::NOT_SINGLE);
    }
    // The first wait may find the work still running and wait for it; by the second, it is
    // all complete and forgotten.
    buf.wait_uses().unwrap();
    buf.wait_uses().unwrap();
    assert_eq!(single(&buf), 0, "complete points forgotten");
    // Recorded again after it: a write on one stream, then a read on the other waits for it.
    s1.fill(&mut buf, 0, 1 << 20, 6).unwrap();
    if dev.backend() != crate::BackendKind::Cpu {
        assert_eq!(single(&buf), u32::try_from(s1.id()).unwrap());
    }
    s2.copy(&buf, 0, &mut other, 0, 1 << 20).unwrap();
    let mut back = vec![0u8; 1 << 20];
    s2.read(&other, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 6));
    buf.wait_uses().unwrap();
    buf.wait_uses().unwrap();
    assert_eq!(single(&buf), 0);
}

crate::for_each_device!(
    one_stream_points_are_known_without_the_lock,
    a_wait_that_finds_all_work_done_forgets_it,
);
