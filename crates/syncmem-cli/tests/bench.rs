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

/// `(number, unit)` pairs of `line` whose unit is one of `units`.
fn quantities<'a>(line: &'a str, units: &[&str]) -> Vec<(f64, &'a str)> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    tokens
        .windows(2)
        .filter(|w| units.contains(&w[1]))
        .filter_map(|w| Some((w[0].parse::<f64>().ok()?, w[1])))
        .collect()
}

#[test]
fn tables_use_human_units_and_json_raw_numbers() {
    let out = common::ok(&["bench", "--quick", "--device", "cpu"]);
    let v: Value = common::json(&["bench", "--quick", "--device", "cpu", "--json"]);
    assert!(
        !out.split_whitespace().any(|t| t == "us"),
        "`us` instead of `µs`:\n{out}"
    );
    let times = ["ns", "µs", "ms", "s"];
    let sizes = ["B", "KiB", "MiB", "GiB", "TiB"];
    let lines: Vec<&str> = out.lines().collect();
    let rows = v["rows"].as_array().unwrap();
    // The comparison table: a header, then one row per comparison with two times.
    for (line, row) in lines[1..=rows.len()].iter().zip(rows) {
        let name = row["name"].as_str().unwrap();
        assert!(line.starts_with(name), "{line}");
        let q = quantities(&line[name.len()..], &times);
        assert_eq!(q.len(), 2, "two times with units in {line:?}");
    }
    // The replay table: peak reserved and peak allocated with units, one row per pool kind.
    let replay = v["replay"].as_array().unwrap();
    let start = lines
        .iter()
        .position(|l| l.starts_with("pool kind"))
        .expect("replay table");
    for (line, r) in lines[start + 1..].iter().zip(replay) {
        assert!(line.starts_with(r["kind"].as_str().unwrap()), "{line}");
        let q = quantities(line, &sizes);
        assert_eq!(q.len(), 2, "two sizes with units in {line:?}");
        // Raw byte counts stay in the JSON output.
        assert!(
            r["peak_reserved"].is_u64() && r["peak_allocated"].is_u64(),
            "{r}"
        );
    }
}
