//! Tests of the pool configuration: defaults, validation, parsing of the environment.

use super::*;

#[test]
fn defaults_start_small_and_grow_to_pytorch_and_cub() {
    let c = PoolConfig::default();
    assert_eq!(c.kind, PoolKind::Caching);
    assert_eq!((c.round, c.small_size), (512, 1 << 20));
    assert_eq!((c.small_segment, c.large_segment), (2 << 20, 20 << 20));
    assert_eq!((c.min_segment, c.segment_growth_percent), (16 << 10, 6));
    assert_eq!((c.size_class_limit, c.max_idle_percent), (1 << 20, Some(6)));
    assert_eq!(c.effective_max_cached_bytes(), u64::MAX);
    let b = PoolConfig::new(PoolKind::Binned);
    assert_eq!((b.bin_growth, b.min_bin, b.max_bin), (2, 8, 30));
    assert_eq!(b.bin_divisions, 4);
    assert_eq!(b.effective_max_cached_bytes(), 10 << 30);
    c.validate().unwrap();
    b.validate().unwrap();
}

#[test]
fn env_style_lists_parse() {
    let c = PoolConfig::from_vars(
        Some("binned"),
        Some("bin_growth=4; min_bin:2, max_bin=12,max_cached_bytes=1GiB,memory_cap=64MiB"),
    )
    .unwrap();
    assert_eq!(c.kind, PoolKind::Binned);
    assert_eq!((c.bin_growth, c.min_bin, c.max_bin), (4, 2, 12));
    assert_eq!(c.max_cached_bytes, Some(1 << 30));
    assert_eq!(c.memory_cap, Some(MemoryCap::Bytes(64 << 20)));
    let c = PoolConfig::from_vars(None, Some("max_split_size_mb:256,memory_cap=50%")).unwrap();
    assert_eq!(c.kind, PoolKind::Caching);
    assert_eq!(c.max_split_size, Some(256 << 20));
    assert_eq!(c.memory_cap, Some(MemoryCap::Fraction(0.5)));
    assert_eq!(c.memory_cap.unwrap().resolve(1000), 500);
    let c = PoolConfig::from_vars(Some("NONE"), Some("cap=0.25")).unwrap();
    assert_eq!(c.kind, PoolKind::None);
    assert_eq!(c.memory_cap, Some(MemoryCap::Fraction(0.25)));
    let c = PoolConfig::from_vars(None, Some("kind=binned,max_split_size=unlimited")).unwrap();
    assert_eq!((c.kind, c.max_split_size), (PoolKind::Binned, None));
    let c = PoolConfig::from_vars(
        None,
        Some(
            "min_segment=64k,segment_growth_percent=25,size_class_limit=0,\
             max_idle_percent=none,roundup_power2_divisions=8",
        ),
    )
    .unwrap();
    assert_eq!((c.min_segment, c.segment_growth_percent), (64 << 10, 25));
    assert_eq!((c.size_class_limit, c.max_idle_percent), (0, None));
    assert_eq!(c.bin_divisions, 8);
    let c = PoolConfig::from_vars(None, Some("max_idle_percent=10,bin_divisions=1")).unwrap();
    assert_eq!((c.max_idle_percent, c.bin_divisions), (Some(10), 1));
}

#[test]
fn bad_input_is_a_typed_error() {
    for (k, c) in [
        (Some("fancy"), None),
        (None, Some("bogus=1")),
        (None, Some("round=3")),
        (None, Some("round")),
        (None, Some("max_split_size=1MiB")),
        (None, Some("memory_cap=150%")),
        (None, Some("memory_cap=12 parsecs")),
        (None, Some("bin_growth=1")),
        (None, Some("max_bin=99")),
        (None, Some("min_bin=5,max_bin=4")),
        (None, Some("small_segment=512k")),
        (None, Some("bin_divisions=0")),
        (None, Some("bin_divisions=65")),
        (None, Some("max_idle_percent=lots")),
    ] {
        let e = PoolConfig::from_vars(k, c).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{k:?} {c:?}: {e}");
    }
}

#[test]
fn sizes_with_units() {
    assert_eq!(parse_size("512"), Ok(512));
    assert_eq!(parse_size("64k"), Ok(64 << 10));
    assert_eq!(parse_size("2 MiB"), Ok(2 << 20));
    assert_eq!(parse_size("1.5G"), Ok(3 << 29));
    assert!(parse_size("x").is_err());
    assert!(parse_size("99999999999T").is_err());
}

/// A cap of 0 is an error however it is written, as `0%` is: a pool that may hold nothing is
/// not a setting anyone means (`none` is no cap).
#[test]
fn a_zero_cap_is_an_error_in_every_spelling() {
    for c in [
        "memory_cap=0",
        "cap=0B",
        "memory_cap=0KiB",
        "memory_cap_mb=0",
        "memory_cap=0%",
    ] {
        let e = PoolConfig::from_vars(None, Some(c)).unwrap_err();
        match &e {
            Error::InvalidConfig { what, .. } => assert_eq!(what, "memory_cap", "{c}: {e}"),
            other => panic!("{c}: {other}"),
        }
    }
    let e = PoolConfig::default()
        .with_memory_cap(MemoryCap::Bytes(0))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("memory_cap"), "{e}");
    // One byte is a cap (the smallest).
    let c = PoolConfig::from_vars(None, Some("memory_cap=1")).unwrap();
    assert_eq!(c.memory_cap, Some(MemoryCap::Bytes(1)));
}

#[test]
fn preallocate_and_gc_threshold_parse_and_validate() {
    let c = PoolConfig::from_vars(
        None,
        Some("memory_cap=1GiB,preallocate=256MiB,gc_threshold=0.8"),
    )
    .unwrap();
    assert_eq!(c.preallocate, Some(Preallocation::Bytes(256 << 20)));
    assert_eq!(c.gc_threshold, Some(0.8));
    let c = PoolConfig::from_vars(None, Some("preallocate=25%")).unwrap();
    assert_eq!(c.preallocate, Some(Preallocation::Fraction(0.25)));
    assert_eq!(
        c.preallocate.unwrap().resolve(Some(400), 4000),
        100,
        "of the cap"
    );
    assert_eq!(
        c.preallocate.unwrap().resolve(None, 4000),
        1000,
        "else of the memory"
    );
    let c = PoolConfig::from_vars(None, Some("preallocate_mb=64,preallocate=none")).unwrap();
    assert_eq!(c.preallocate, None);
    for (conf, why) in [
        ("preallocate=150%", "not in (0, 100]"),
        ("preallocate=lots", "expected SIZE"),
        ("gc_threshold=1.5,memory_cap=1GiB", "not in (0, 1)"),
        ("gc_threshold=high", "not a fraction"),
        ("gc_threshold=0.5", "needs a memory cap"),
    ] {
        let e = PoolConfig::from_vars(None, Some(conf))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{conf}: {e}");
    }
    let e = PoolConfig::from_vars(Some("binned"), Some("preallocate=1MiB"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs the caching pool"), "{e}");
}

#[test]
fn an_unknown_key_lists_the_known_ones() {
    let e = PoolConfig::from_vars(None, Some("prealocate=1GiB"))
        .unwrap_err()
        .to_string();
    for key in ["memory_cap", "shards", "preallocate", "gc_threshold"] {
        assert!(e.contains(key), "{e}");
    }
}
