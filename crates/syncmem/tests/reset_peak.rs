//! `syncmem::reset_peak_stats`: every peak that `syncmem::stats` reads (host memory, the host
//! pool, each device's memory, pinned memory and pools) comes down to the current value, and
//! the cumulative counts stay. Its own test binary: the counters are process-wide, and a test
//! running beside it would move them.

use syncmem::{Device, HostPool, Snapshot, SyncedMemory};

const MIB: usize = 1 << 20;

/// Every (label, current, peak) pair of a reading: memory spaces, then pools.
fn peaks(s: &Snapshot) -> Vec<(String, u64, u64)> {
    let spaces = std::iter::once(&s.host)
        .chain(&s.devices)
        .map(|m| (m.label.clone(), m.in_use, m.peak));
    let pools = s.pools.iter().flat_map(|p| {
        [
            (format!("{} allocated", p.label), p.allocated),
            (format!("{} requested", p.label), p.requested),
            (format!("{} reserved", p.label), p.reserved),
            (format!("{} blocks", p.label), p.block_count),
            (format!("{} segments", p.label), p.segment_count),
            (format!("{} small allocated", p.label), p.small.allocated),
            (format!("{} large allocated", p.label), p.large.allocated),
        ]
        .map(|(l, g)| (l, g.current, g.peak))
    });
    spaces.chain(pools).collect()
}

#[test]
fn reset_peak_stats_brings_every_peak_down_to_the_current_value() {
    let dev = Device::cpu();
    let host = HostPool::global().unwrap();
    // Peaks above what is held afterwards: host memory and a device mirror, then freed.
    {
        // Two mirrors: host memory of their own (zero-copy buffers allocate none).
        let buf = SyncedMemory::new(4 * MIB, &dev).with_zero_copy(false);
        buf.host_mut().unwrap().fill(1);
        drop(buf.device().unwrap());
        let _more = host.alloc(2 * MIB).unwrap();
    }
    let kept = SyncedMemory::new(MIB, &dev).with_zero_copy(false);
    kept.host_mut().unwrap().fill(2);

    let before = syncmem::stats();
    let high: Vec<_> = peaks(&before)
        .into_iter()
        .filter(|(_, cur, peak)| peak > cur)
        .map(|(l, _, _)| l)
        .collect();
    for label in [
        "host",
        "cpu",
        "host allocated",
        "cpu allocated",
        "host blocks",
    ] {
        assert!(
            high.iter().any(|l| l == label),
            "{label}: the peak should be above the current value before the reset: {before:#?}"
        );
    }

    syncmem::reset_peak_stats();
    let after = syncmem::stats();
    for (label, current, peak) in peaks(&after) {
        assert_eq!(peak, current, "{label}: the peak after a reset");
    }
    assert!(
        after.host.in_use >= MIB as u64,
        "what is held stays counted"
    );
    // Cumulative counts are kept.
    assert_eq!(after.host.allocs, before.host.allocs);
    assert_eq!(after.copies, before.copies);
    for (b, a) in before.pools.iter().zip(&after.pools) {
        assert_eq!(
            (
                a.allocations,
                a.allocated.allocated,
                a.block_count.allocated
            ),
            (
                b.allocations,
                b.allocated.allocated,
                b.block_count.allocated
            ),
            "{}",
            a.label
        );
    }

    // Peaks rise again from there.
    let more = SyncedMemory::new(MIB, &dev).with_zero_copy(false);
    more.host_mut().unwrap().fill(3);
    let again = syncmem::stats();
    assert!(again.host.peak >= after.host.in_use + MIB as u64);
    drop((kept, more));
}
