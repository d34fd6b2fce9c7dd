//! `syncmem bench`: the JSON report has its ratio fields (no timing thresholds).

mod common;

use serde_json::Value;

#[test]
fn bench_quick_json_has_ratios() {
    let v: Value = common::json(&["bench", "--quick", "--device", "cpu", "--json"]);
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["quick"], true);
    let rows = v["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    for want in [
        "host pool 4 KiB",
        "host pool 1 MiB",
        "host pool 64 MiB",
        "device pool 4 KiB",
        "device pool 64 MiB",
        "synced round trip 64 MiB",
        "host read access",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for r in rows {
        for field in ["ratio", "ours_ns", "baseline_ns"] {
            let x = r[field].as_f64().unwrap_or(-1.0);
            assert!(x.is_finite() && x > 0.0, "{field} of {r}");
        }
    }
    let trip = rows
        .iter()
        .find(|r| r["name"] == "synced round trip 64 MiB")
        .unwrap();
    assert!(trip["goal"].as_f64().is_some());
    assert!(trip["goal_met"].is_boolean());
    let replay = v["replay"].as_array().expect("replay");
    assert_eq!(replay.len(), 3);
    for r in replay {
        let reserved = r["peak_reserved"].as_u64().unwrap();
        let allocated = r["peak_allocated"].as_u64().unwrap();
        assert!(reserved >= allocated, "{r}");
        assert!(r["ratio"].as_f64().unwrap() >= 1.0);
    }
    assert_eq!(v["skipped"].as_array().map(Vec::len), Some(0));
}
