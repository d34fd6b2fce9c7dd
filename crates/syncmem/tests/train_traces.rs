//! Replays of allocation traces recorded from `syncmem train` (one epoch, hidden widths 64, 256
//! and 1024, on `cpu` and `opencl:0`; `tests/fixtures/traces/`), checking how much memory each
//! pool kind reserves for what the program asked for. Ratios only, never timings.
//!
//! - Device pools: peak reserved / peak requested at most 1.10.
//! - Host pools: peak reserved at most 128 KiB beyond the peak requested.
//!
//! The files were written by `syncmem trace record --device D --epochs 1 --hidden H --out F`.

use std::path::PathBuf;

use syncmem::report::{replay_with, ReplayOptions, ReplayReport, Trace, TraceEvent};
use syncmem::{PoolConfig, PoolKind};

const KIB: u64 = 1 << 10;
const MIB: usize = 1 << 20;

/// The most a device pool may reserve per byte the program asked for.
const DEVICE_RATIO: f64 = 1.10;
/// The most a host pool may reserve beyond what the program asked for.
const HOST_SLACK: u64 = 128 * KIB;

const FILES: [&str; 6] = [
    "train-h64-cpu.jsonl",
    "train-h64-opencl0.jsonl",
    "train-h256-cpu.jsonl",
    "train-h256-opencl0.jsonl",
    "train-h1024-cpu.jsonl",
    "train-h1024-opencl0.jsonl",
];

fn load(name: &str) -> Trace {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "traces",
        name,
    ]
    .iter()
    .collect();
    Trace::load_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn is_host(label: &str) -> bool {
    label == "host" || label.ends_with(" pinned")
}

/// Replays `trace` on `config` and returns each recorded pool's report.
fn replay(trace: &Trace, config: &PoolConfig) -> Vec<(String, ReplayReport)> {
    replay_with(trace, config, &ReplayOptions::default())
        .unwrap()
        .devices
        .into_iter()
        .map(|d| (d.device, d.report))
        .collect()
}

/// The pools of `trace` that break the bounds under `config`, as readable lines.
fn over_bounds(name: &str, trace: &Trace, config: &PoolConfig) -> Vec<String> {
    let mut bad = Vec::new();
    for (label, r) in replay(trace, config) {
        let ok = if is_host(&label) {
            r.peak_reserved <= r.peak_requested + HOST_SLACK
        } else {
            r.reserved_per_requested() <= DEVICE_RATIO
        };
        if !ok {
            bad.push(format!(
                "{name} {label} {}: reserved {} for {} requested ({:.3})",
                config.kind,
                r.peak_reserved,
                r.peak_requested,
                r.reserved_per_requested()
            ));
        }
    }
    bad
}

#[test]
fn the_traces_are_what_train_records() {
    for name in FILES {
        let t = load(name);
        let s = t.summary();
        let device = if name.contains("opencl0") {
            "opencl:0"
        } else {
            "cpu"
        };
        let mut want = [device.to_string(), "host".to_string()];
        want.sort();
        assert_eq!(s.devices, want, "{name}");
        assert_eq!(s.allocs, s.frees, "{name}: everything allocated is freed");
        assert!(
            s.allocs > 100 && s.copies.total_count() > 100,
            "{name}: {s:?}"
        );
        // The hidden width shows in the sizes: the second layer's f32 weights are H x H.
        let h: usize = name.split('-').nth(1).unwrap()[1..].parse().unwrap();
        let weights = t.with_events(|ev| {
            ev.iter().any(|e| {
                matches!(e, TraceEvent::Alloc { size, device: d, .. }
                    if *size == h * h * 4 && d == device)
            })
        });
        assert!(weights, "{name}: no {h} x {h} weights");
    }
}

#[test]
fn every_pool_kind_stays_within_the_bounds() {
    let mut bad = Vec::new();
    for name in FILES {
        let t = load(name);
        for kind in [PoolKind::Caching, PoolKind::Binned, PoolKind::None] {
            bad.extend(over_bounds(name, &t, &PoolConfig::new(kind)));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn what_is_requested_does_not_depend_on_the_pool() {
    for name in FILES {
        let t = load(name);
        let none = replay(&t, &PoolConfig::new(PoolKind::None));
        for (label, r) in &none {
            assert!(r.peak_requested > 0, "{name} {label}");
            assert_eq!(r.peak_reserved, r.peak_requested, "{name} {label}");
            assert_eq!(r.reserved_per_requested(), 1.0);
        }
        for kind in [PoolKind::Caching, PoolKind::Binned] {
            let other = replay(&t, &PoolConfig::new(kind));
            for ((l1, a), (l2, b)) in none.iter().zip(&other) {
                assert_eq!(l1, l2);
                assert_eq!(a.peak_requested, b.peak_requested, "{name} {l1} {kind}");
                assert_eq!(a.allocations, b.allocations, "{name} {l1} {kind}");
                assert!(
                    b.reserved_per_requested() >= b.overhead(),
                    "{name} {l1} {kind}"
                );
            }
        }
    }
}

#[test]
fn fixed_segments_and_cub_bins_break_the_bounds() {
    // The bounds are not vacuous: PyTorch's fixed 2 MiB / 20 MiB segments and CUB's bins of
    // 8x reserve far more than these programs ask for.
    let pytorch = PoolConfig::new(PoolKind::Caching)
        .with_segment_growth(20 * MIB, 0)
        .with_size_class_limit(0)
        .with_max_idle_percent(None);
    let cub = PoolConfig::new(PoolKind::Binned)
        .with_bins(8, 3, 10)
        .with_max_idle_percent(None);
    for cfg in [pytorch, cub] {
        let bad: Vec<String> = FILES
            .iter()
            .flat_map(|name| over_bounds(name, &load(name), &cfg))
            .collect();
        assert!(bad.len() >= 3, "{}: {bad:?}", cfg.kind);
    }
}
