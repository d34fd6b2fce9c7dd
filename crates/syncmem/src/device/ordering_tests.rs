//! The order of commands of several streams on one buffer, on every device of every backend:
//! the buffer's note of the one stream its points are of (what a command of that stream skips
//! the lock for), and the waits across streams past it, a pooled block's inherited work
//! included.

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

crate::for_each_device!(one_stream_points_are_known_without_the_lock);
