//! Snapshots and summaries of pools on fake segments: segments and blocks add up to the
//! statistics, blocks name their owners and show their state, the summary shows the figures.

use std::sync::Arc;

use super::{fake, pool, pytorch, Fake, Flag, KIB, MIB};
use crate::alloc::pool::{
    BlockState, Fence, Gauge, MemorySnapshot, MemorySummary, Pool, PoolConfig, PoolKind,
    PoolSnapshot, SizeClass,
};

/// Checks that the snapshot adds up to its statistics, and returns it.
fn consistent(p: &Pool<Fake>) -> PoolSnapshot {
    let s = p.snapshot();
    let st = &s.stats;
    let reserved: u64 = s.segments.iter().map(|g| g.size).sum();
    assert_eq!(reserved, st.reserved.current, "segments add up to reserved");
    assert_eq!(s.segments.len() as u64, st.segments);
    assert_eq!(s.bytes_in(BlockState::Allocated), st.allocated.current);
    assert_eq!(
        s.bytes_in(BlockState::Free) + s.bytes_in(BlockState::Pending),
        st.free_bytes
    );
    let requested: u64 = s.blocks().map(|(_, b)| b.requested).sum();
    assert_eq!(requested, st.requested.current);
    for g in &s.segments {
        let tiled: u64 = g.blocks.iter().map(|b| b.size).sum();
        assert_eq!(tiled, g.size, "blocks tile segment {}", g.id);
        let mut at = 0;
        for b in &g.blocks {
            assert_eq!(b.offset, at, "blocks in address order");
            at += b.size;
        }
    }
    // Inactive split: free blocks of segments that hold more than one block.
    let split: u64 = s
        .segments
        .iter()
        .filter(|g| g.blocks.len() > 1)
        .map(|g| g.bytes_in(BlockState::Free) + g.bytes_in(BlockState::Pending))
        .sum();
    assert_eq!(split, st.inactive_split.current, "inactive split bytes");
    for (class, size) in [(SizeClass::Small, &st.small), (SizeClass::Large, &st.large)] {
        let segs = s.segments.iter().filter(|g| g.class == class);
        let bytes: u64 = segs.clone().map(|g| g.size).sum();
        assert_eq!(bytes, size.reserved.current, "{class:?} reserved");
        let alloc: u64 = segs.map(|g| g.bytes_in(BlockState::Allocated)).sum();
        assert_eq!(alloc, size.allocated.current, "{class:?} allocated");
    }
    s
}

#[test]
fn snapshots_add_up_for_every_kind() {
    for cfg in [
        PoolConfig::default(),
        pytorch(),
        PoolConfig::new(PoolKind::Binned),
        PoolConfig::new(PoolKind::None),
    ] {
        let kind = cfg.kind;
        let p = pool(cfg);
        let owner: Arc<str> = "fc1_w".into();
        let a = p.alloc_labelled(3000, 1, &fake, Some(&owner)).unwrap();
        let b = p.alloc(5 * MIB, 2, &fake).unwrap();
        let c = p.alloc(700, 1, &fake).unwrap();
        let d = p.alloc(40 * KIB, 1, &fake).unwrap();
        drop(c);
        let s = consistent(&p);
        let named: Vec<_> = s
            .blocks()
            .filter(|(_, b)| b.owner.as_deref() == Some("fc1_w"))
            .collect();
        assert_eq!(named.len(), 1, "{kind}: one block names its owner");
        let (_, blk) = named[0];
        assert_eq!(
            (blk.state, blk.requested, blk.stream),
            (BlockState::Allocated, 3000, 1)
        );
        assert_eq!(
            s.blocks()
                .filter(|(_, b)| b.state == BlockState::Allocated && b.stream == 2)
                .count(),
            1,
            "{kind}: the stream of each block"
        );
        drop((a, b, d));
        let s = consistent(&p);
        assert!(
            s.blocks()
                .all(|(_, b)| b.owner.is_none() && b.requested == 0),
            "{kind}: freed blocks name no owner"
        );
        p.empty_cache();
        assert!(consistent(&p).segments.is_empty());
    }
}

#[test]
fn a_block_freed_with_work_in_flight_is_pending() {
    let p = pool(PoolConfig::default());
    let mut a = p.alloc(4096, 1, &fake).unwrap();
    let _b = p.alloc(4096, 1, &fake).unwrap();
    let fence = Arc::new(Flag::default());
    a.add_pending(1, fence.clone());
    drop(a);
    let s = consistent(&p);
    let states: Vec<_> = s.blocks().map(|(_, b)| b.state).collect();
    assert_eq!(
        states,
        [BlockState::Pending, BlockState::Allocated, BlockState::Free]
    );
    fence.wait();
    let s = consistent(&p);
    assert_eq!(s.blocks().next().unwrap().1.state, BlockState::Free);
}

#[test]
fn inactive_split_follows_splits_and_merges() {
    let p = pool(pytorch());
    let a = p.alloc(KIB, 1, &fake).unwrap();
    let b = p.alloc(KIB, 1, &fake).unwrap();
    let st = consistent(&p).stats;
    assert_eq!(st.inactive_split.current, (2 * MIB - 2 * KIB) as u64);
    drop(a);
    let st = consistent(&p).stats;
    assert_eq!(st.inactive_split.current, (2 * MIB - KIB) as u64);
    drop(b);
    let st = consistent(&p).stats;
    assert_eq!(st.inactive_split.current, 0, "one whole free segment again");
    assert_eq!(st.inactive_split.peak, (2 * MIB - KIB) as u64);
    assert_eq!(st.small.inactive_split, st.inactive_split);
    assert_eq!(st.large.inactive_split, Gauge::default());
    // Cumulative: every byte counted in was counted out.
    assert_eq!(
        st.inactive_split.allocated - st.inactive_split.freed,
        st.inactive_split.current
    );
}

#[test]
fn blocks_and_segments_are_counted_with_peaks() {
    let g = |current, peak, allocated, freed| Gauge {
        current,
        peak,
        allocated,
        freed,
    };
    let p = pool(pytorch());
    let a = p.alloc(KIB, 1, &fake).unwrap();
    let b = p.alloc(KIB, 1, &fake).unwrap();
    let c = p.alloc(3 * MIB, 1, &fake).unwrap();
    drop(a);
    drop(b);
    let st = consistent(&p).stats;
    assert_eq!(st.block_count, g(1, 3, 3, 2), "blocks: one left of three");
    assert_eq!(st.small.block_count, g(0, 2, 2, 2));
    assert_eq!(st.large.block_count, g(1, 1, 1, 0));
    assert_eq!(st.block_count.allocated, st.allocations);
    assert_eq!(st.block_count.freed, st.frees);
    // Idle segments are kept (this configuration): a 2 MiB and a 20 MiB one.
    assert_eq!(st.segment_count, g(2, 2, 2, 0));
    assert_eq!(st.segment_count.current, st.segments);
    assert_eq!(st.small.segment_count.current, st.small.segments);
    p.empty_cache();
    let st = p.stats();
    assert_eq!(
        st.segment_count,
        g(1, 2, 2, 1),
        "the free small segment went back"
    );
    assert_eq!(st.small.segment_count, g(0, 1, 1, 1));
    // A peak reset brings the count peaks down to what is held now.
    p.reset_peak();
    let st = p.stats();
    assert_eq!(st.block_count, g(1, 1, 3, 2));
    assert_eq!(st.small.block_count.peak, 0);
    assert_eq!(st.segment_count, g(1, 1, 2, 1));
    let d = p.alloc(KIB, 1, &fake).unwrap();
    assert_eq!(p.stats().block_count.peak, 2);
    drop((c, d));
}

#[test]
fn the_summary_shows_the_statistics() {
    let p = pool(PoolConfig::default());
    let a = p.alloc(3000, 1, &fake).unwrap();
    let b = p.alloc(3 * MIB, 1, &fake).unwrap();
    drop(a);
    let _c = p.alloc(100, 1, &fake).unwrap();
    p.reset_peak();
    let st = p.stats();
    let sum: MemorySummary = st.summary();
    assert_eq!(sum.allocated.all, st.allocated);
    assert_eq!(sum.allocated.small, st.small.allocated);
    assert_eq!(sum.allocated.large, st.large.allocated);
    assert_eq!(sum.requested.all, st.requested);
    assert_eq!(sum.reserved.large, st.large.reserved);
    assert_eq!(sum.inactive_split.all, st.inactive_split);
    assert_eq!(
        (sum.segments.all, sum.segments.small, sum.segments.large),
        (st.segments, st.small.segments, st.large.segments)
    );
    assert_eq!(sum.allocations, 3);
    assert_eq!(sum.frees, 1);
    // Small and large add up to all (current and cumulative; peaks need not).
    for s in [
        sum.allocated,
        sum.requested,
        sum.reserved,
        sum.inactive_split,
    ] {
        assert_eq!(s.all.current, s.small.current + s.large.current);
        assert_eq!(s.all.allocated, s.small.allocated + s.large.allocated);
        assert_eq!(s.all.freed, s.small.freed + s.large.freed);
    }
    assert_eq!(sum.allocated.large.current, 3 * MIB as u64);
    assert_eq!(sum.allocated.small.allocated, 3072 + 512);
    assert_eq!(sum.allocated.small.freed, 3072);
    let text = sum.to_string();
    let human = crate::alloc::stats::human_bytes;
    for (name, g) in [
        ("allocated bytes", st.allocated),
        ("requested bytes", st.requested),
        ("reserved bytes", st.reserved),
        ("inactive split bytes", st.inactive_split),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no {name} row in\n{text}"));
        let cells: Vec<&str> = line[24..]
            .trim_end_matches('|')
            .split("  ")
            .filter(|c| !c.trim().is_empty())
            .map(str::trim)
            .collect();
        let want = [g.current, g.peak, g.allocated, g.freed].map(human);
        assert_eq!(cells, want, "{name}: {line}");
    }
    for legend in [
        "inactive split bytes",
        "allocated, freed",
        "small, large blocks",
    ] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(legend)),
            "a legend line for {legend}:\n{text}"
        );
    }
    // The table's lines line up; the legend stays within 80 columns.
    let table: Vec<usize> = text
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.chars().count())
        .collect();
    assert!(table.iter().all(|&n| n == table[0]), "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    let back: MemorySummary = serde_json::from_str(&sum.to_json()).unwrap();
    assert_eq!(back, sum);
    drop(b);
}

#[test]
fn snapshots_round_trip_through_json() {
    let p = pool(PoolConfig::default());
    let owner: Arc<str> = "x".into();
    let _a = p.alloc_labelled(1000, 3, &fake, Some(&owner)).unwrap();
    let _b = p.alloc(12 * MIB, 3, &fake).unwrap();
    let snap = MemorySnapshot {
        pools: vec![consistent(&p)],
    };
    let json = snap.to_json();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let blocks = &v["pools"][0]["segments"][0]["blocks"];
    assert_eq!(blocks[0]["state"], "allocated");
    assert_eq!(blocks[0]["owner"], "x");
    assert_eq!(blocks[1]["state"], "free");
    assert_eq!(v["pools"][0]["kind"], "caching");
    let back: MemorySnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    let second = snap.pools[0].segments[1].id;
    assert!(
        snap.to_string().contains(&format!("segment {second}")),
        "{snap}"
    );
}
