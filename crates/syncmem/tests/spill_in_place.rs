//! Spilling in place where memory is shared: on a device whose memory the host uses in place
//! (`cpu`, PoCL), a zero-copy buffer spilled under a cap keeps its block, which becomes its
//! host mirror: no byte is copied either way, the value stays bit for bit, the block's bytes
//! leave the cap's count (the pool's `parked_bytes`) and come back on the next device access.
//! With zero-copy off the copying spill still runs. Each test runs on `cpu` and OpenCL.

use syncmem::{
    Device, Error, Head, MemoryCap, PoolConfig, SyncedMemory, ZeroCopy, ZeroCopyProtocol,
};

const MIB: usize = 1 << 20;

/// An isolated device capped at `cap` bytes, with the zero-copy setting.
fn capped(dev: &Device, cap: usize, zero_copy: ZeroCopy) -> Device {
    let d = dev.isolated();
    d.set_zero_copy(zero_copy);
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(cap as u64)))
        .unwrap();
    d
}

/// A buffer of `len` bytes whose byte `i` is `(i * 7 + seed) % 251`, written on the device.
fn patterned(d: &Device, name: &str, len: usize, seed: usize) -> (SyncedMemory, Vec<u8>) {
    let want: Vec<u8> = (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect();
    let m = SyncedMemory::new(len, d).with_label(name);
    m.device_overwrite().unwrap().write_from(0, &want).unwrap();
    assert_eq!(m.head(), Head::AtDevice);
    (m, want)
}

fn device_bytes(m: &SyncedMemory) -> Vec<u8> {
    let mut out = vec![0u8; m.len()];
    m.device().unwrap().read_into(&mut out).unwrap();
    out
}

/// The pool's reserved bytes are the bytes charged to the cap plus the parked ones.
fn check_accounting(d: &Device, cap: usize, what: &str) {
    let s = d.pool_stats().unwrap();
    assert!(
        d.reserved_bytes() <= cap as u64,
        "{what}: over the cap: {s}"
    );
    assert_eq!(
        s.reserved.current,
        d.reserved_bytes() + s.parked_bytes,
        "{what}: {s}"
    );
}

/// A spill and the refill move no byte: the block stays where it is, the value bit for bit.
fn a_zero_copy_spill_copies_nothing(dev: &Device) {
    let d = capped(dev, 4 * MIB, ZeroCopy::Auto);
    if d.zero_copy_protocol() != Some(ZeroCopyProtocol::InPlace) {
        eprintln!("{}: memory not shared in place; skipped", d.label());
        return;
    }
    let (a, want) = patterned(&d, "a", MIB + 100, 3);
    let at = a.host().unwrap().as_ptr();
    let before = d.pool_stats().unwrap();
    assert_eq!(a.offload().unwrap(), MIB + 100);
    let s = d.pool_stats().unwrap();
    assert_eq!(s.spills - before.spills, 1, "{s}");
    assert!(s.parked_bytes >= (MIB + 100) as u64, "{s}");
    assert_eq!(
        s.allocated.current, before.allocated.current,
        "the block stays"
    );
    assert_eq!(d.reserved_bytes() + s.parked_bytes, s.reserved.current);
    assert!(!a.device_allocated());
    assert_eq!(a.head(), Head::AtHost);
    // The host reads the very block the device wrote.
    let host = a.host().unwrap();
    assert_eq!(&*host, &want[..]);
    assert_eq!(host.as_ptr(), at, "the block stays where it is");
    drop(host);
    // Back on the device: the same memory, charged again.
    assert_eq!(device_bytes(&a), want);
    assert_eq!(a.host().unwrap().as_ptr(), at);
    let s = d.pool_stats().unwrap();
    assert_eq!((s.parked_bytes, s.refills - before.refills), (0, 1), "{s}");
    assert_eq!(d.reserved_bytes(), s.reserved.current);
    let c = a.copy_stats();
    assert_eq!(
        (c.total_bytes(), c.spilled.bytes, c.refilled.bytes),
        (0, 0, 0),
        "no byte copied: {c:?}"
    );
    assert_eq!(
        (c.spilled.count, c.refilled.count),
        (1, 1),
        "a spill and a refill, in place"
    );
    // A host write to a parked block, then the device reads it: still no copy.
    a.offload().unwrap();
    a.host_mut().unwrap()[..4].copy_from_slice(&[9, 8, 7, 6]);
    let mut want = want;
    want[..4].copy_from_slice(&[9, 8, 7, 6]);
    assert_eq!(device_bytes(&a), want);
    assert_eq!(a.copy_stats().total_bytes(), 0);
    // Dropped while parked: charged again and freed.
    a.offload().unwrap();
    drop(a);
    let s = d.pool_stats().unwrap();
    assert_eq!((s.parked_bytes, s.allocated.current), (0, 0), "{s}");
    assert_eq!(d.reserved_bytes(), s.reserved.current);
}

/// With zero-copy off the spill copies the data into a host mirror of its own, as before.
fn with_zero_copy_off_the_spill_copies(dev: &Device) {
    let d = capped(dev, 4 * MIB, ZeroCopy::Off);
    let (a, want) = patterned(&d, "a", MIB, 5);
    assert_eq!(a.offload().unwrap(), MIB);
    let s = d.pool_stats().unwrap();
    assert_eq!((s.parked_bytes, s.allocated.current), (0, 0), "{s}");
    assert_eq!(a.copy_stats().spilled.bytes, MIB as u64);
    assert_eq!(device_bytes(&a), want);
    assert_eq!(a.copy_stats().refilled.bytes, MIB as u64);
}

/// Under a cap that holds three of eight buffers, buffers used in turn spill and come back:
/// the charged bytes never exceed the cap, the pool's reserved bytes are the charged plus the
/// parked ones, and every value stays bit for bit.
fn the_cap_holds_for_the_charged_bytes(dev: &Device) {
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off] {
        let cap = 3 * MIB + MIB / 2;
        let d = capped(dev, cap, zero_copy);
        let mut bufs = Vec::new();
        for i in 0..8 {
            bufs.push(patterned(&d, &format!("b{i}"), MIB - 64 * i, i));
            check_accounting(&d, cap, &format!("{zero_copy}: made b{i}"));
        }
        for round in 0..3 {
            for (i, (m, want)) in bufs.iter_mut().enumerate() {
                if (i + round) % 3 == 0 {
                    // A device write of a value that may be parked.
                    let mut g = m.device_mut().unwrap();
                    g.write_from(0, &want[..]).unwrap();
                } else {
                    assert_eq!(device_bytes(m), *want, "{zero_copy}: b{i}");
                }
                if (i + round) % 4 == 0 {
                    m.offload().unwrap();
                }
                check_accounting(&d, cap, &format!("{zero_copy}: round {round}, b{i}"));
            }
        }
        for (i, (m, want)) in bufs.iter().enumerate() {
            assert_eq!(&*m.host().unwrap(), &want[..], "{zero_copy}: b{i}");
        }
        let s = d.pool_stats().unwrap();
        let in_place = d.zero_copy_protocol() == Some(ZeroCopyProtocol::InPlace);
        assert!(s.spills > 0, "{zero_copy}: {s}");
        assert_eq!(s.parked_bytes > 0, in_place, "{zero_copy}: {s}");
        drop(bufs);
        let s = d.pool_stats().unwrap();
        assert_eq!((s.parked_bytes, s.allocated.current), (0, 0), "{s}");
        assert_eq!(d.reserved_bytes(), s.reserved.current);
    }
}

/// A parked buffer that finds no room on its next device access fails with out of memory and
/// stays as it was (parked, its value intact); once room is made it comes back.
fn no_room_leaves_a_parked_buffer_as_it_was(dev: &Device) {
    let d = capped(dev, 2 * MIB, ZeroCopy::Auto);
    if d.zero_copy_protocol() != Some(ZeroCopyProtocol::InPlace) {
        return;
    }
    let (a, want) = patterned(&d, "a", MIB, 1);
    a.offload().unwrap();
    let (b, _) = patterned(&d, "b", MIB, 2);
    let (c, _) = patterned(&d, "c", MIB, 3);
    // Guards hold b and c on the device: nothing can go.
    let gb = b.device().unwrap();
    let gc = c.device().unwrap();
    assert!(matches!(a.device(), Err(Error::OutOfMemory { .. })));
    assert_eq!(a.head(), Head::AtHost);
    assert!(!a.device_allocated());
    assert!(d.pool_stats().unwrap().parked_bytes >= MIB as u64);
    assert_eq!(&*a.host().unwrap(), &want[..]);
    check_accounting(&d, 2 * MIB, "after the refusal");
    drop((gb, gc));
    // b or c is spilled (in place) to make room.
    assert_eq!(device_bytes(&a), want);
    check_accounting(&d, 2 * MIB, "after the refill");
}

/// A parked block whose segment also holds cached free memory keeps that memory charged and
/// the segment from going: when nothing else makes room, the out-of-memory path copies the
/// parked data into a host mirror of its own and lets the block go (the spill made late).
fn a_parked_block_is_copied_out_as_a_last_resort(dev: &Device) {
    let d = capped(dev, 4 * MIB, ZeroCopy::Auto);
    if d.zero_copy_protocol() != Some(ZeroCopyProtocol::InPlace) {
        return;
    }
    // A segment of 3 MiB, cached; the 1.5 MiB buffer `a` is carved from it.
    drop(patterned(&d, "x", 3 * MIB, 0));
    let (a, want) = patterned(&d, "a", 3 * MIB / 2, 1);
    a.offload().unwrap();
    let s = d.pool_stats().unwrap();
    assert_eq!((s.parked_bytes, s.segments), (3 * MIB as u64 / 2, 1), "{s}");
    assert_eq!(a.copy_stats().spilled.bytes, 0);
    // 3.5 MiB fits under the cap only once `a`'s segment goes.
    let (c, cw) = patterned(&d, "c", 7 * MIB / 2, 2);
    let s = d.pool_stats().unwrap();
    assert_eq!(s.parked_bytes, 0, "copied out: {s}");
    assert_eq!(
        a.copy_stats().spilled.bytes,
        3 * MIB as u64 / 2,
        "the copy made late"
    );
    assert_eq!(&*a.host().unwrap(), &want[..]);
    assert_eq!(device_bytes(&c), cw);
    check_accounting(&d, 4 * MIB, "after the copy-out");
}

syncmem::for_each_device!(
    a_parked_block_is_copied_out_as_a_last_resort,
    a_zero_copy_spill_copies_nothing,
    with_zero_copy_off_the_spill_copies,
    the_cap_holds_for_the_charged_bytes,
    no_room_leaves_a_parked_buffer_as_it_was,
);
