//! The tests of [`super`]: gauges, derived figures, the text and JSON forms.

use super::*;

#[test]
fn gauge_tracks_peak_and_resets() {
    let mut g = Gauge::default();
    g.add(10);
    g.add(5);
    g.sub(12);
    assert_eq!((g.current, g.peak), (3, 15));
    assert_eq!((g.allocated, g.freed), (15, 12), "cumulative");
    g.reset_peak();
    assert_eq!(g.peak, 3);
    assert_eq!(g.allocated, 15, "a peak reset keeps the cumulative figures");
    g.sub(3);
    assert_eq!((g.current, g.freed), (0, 15));
}

#[test]
fn fragmentation_and_hit_rate() {
    let mut s = PoolStats {
        label: "x".into(),
        kind: PoolKind::Caching,
        allocated: Gauge::default(),
        requested: Gauge::default(),
        reserved: Gauge::default(),
        inactive_split: Gauge::default(),
        small: SizeStats::default(),
        large: SizeStats::default(),
        small_size: 1 << 20,
        segments: 0,
        block_count: Gauge::default(),
        segment_count: Gauge::default(),
        allocations: 0,
        frees: 0,
        cache_hits: 0,
        thread_cache_hits: 0,
        thread_cached_bytes: 0,
        backend_allocs: 0,
        backend_frees: 0,
        free_bytes: 0,
        largest_free_block: 0,
        alloc_retries: 0,
        ooms: 0,
        evictions: 0,
        evicted_bytes: 0,
        spills: 0,
        spilled_bytes: 0,
        refills: 0,
        refilled_bytes: 0,
        drops: 0,
        dropped_bytes: 0,
        gc_releases: 0,
        gc_released_bytes: 0,
        preallocated_bytes: 0,
        parked_bytes: 0,
        cap: None,
        direct_bytes: 0,
    };
    assert_eq!(s.fragmentation(), 0.0);
    assert_eq!(s.hit_rate(), 0.0);
    s.free_bytes = 4096;
    s.largest_free_block = 1024;
    assert!((s.fragmentation() - 0.75).abs() < 1e-12);
    s.largest_free_block = 4096;
    assert_eq!(s.fragmentation(), 0.0);
    s.allocations = 4;
    s.cache_hits = 3;
    assert!((s.hit_rate() - 0.75).abs() < 1e-12);
    let text = s.to_string();
    assert!(text.contains("pool x (caching)"), "{text}");
    assert!(text.contains("75 %"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(json["label"], "x");
    assert_eq!(json["kind"], "caching");
    assert_eq!(json["cap"], serde_json::Value::Null);
    assert_eq!(json["allocated"]["peak"], 0);
    assert_eq!(json["free_bytes"], 4096);
    assert_eq!(json["fragmentation"], 0.0);
    assert_eq!(json["cache_hits"], 3);
}
