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
    // The compute section on cpu: the FMA peak and the cpu GEMM rows; the device rows need an
    // accelerator and say so.
    let c = &v["compute"];
    check_peak_and_gemm(c, &["cpu"]);
    assert!(c["train"].as_array().is_some_and(Vec::is_empty), "{c}");
    assert!(c["launch"].is_null());
    assert!(
        c["notes"][0].as_str().unwrap().contains("accelerator"),
        "{c}"
    );
}

/// The FMA peak is positive, and each of `devices` has one GEMM row per hidden width with
/// positive throughput; hidden 1024 has a goal and says whether it was met.
fn check_peak_and_gemm(c: &Value, devices: &[&str]) {
    let p = &c["peak"];
    for key in ["one_core_gflops", "all_cores_gflops"] {
        assert!(p[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {p}");
    }
    assert!(p["threads"].as_u64().is_some_and(|t| t >= 1));
    let rows = c["gemm"].as_array().expect("gemm rows");
    assert_eq!(rows.len(), 3 * devices.len(), "{rows:?}");
    for (r, dev) in rows.iter().zip(devices.iter().flat_map(|d| [d; 3])) {
        assert_eq!(r["device"], *dev);
        for key in [
            "forward_gflops",
            "backward_gflops",
            "gflops",
            "fraction_of_peak",
        ] {
            assert!(r[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {r}");
        }
        let has_goal = r["hidden"] == 1024;
        assert_eq!(r["goal"].is_f64(), has_goal, "{r}");
        assert_eq!(r["goal_met"].is_boolean(), has_goal, "{r}");
    }
}

#[cfg(feature = "opencl")]
#[test]
fn bench_on_opencl_compares_train_gemm_and_launch() {
    if syncmem::testing::opencl_or_skip("bench_on_opencl_compares_train_gemm_and_launch").is_none()
    {
        return;
    }
    let v: Value = common::json(&["bench", "--quick", "--device", "opencl:0", "--json"]);
    let c = &v["compute"];
    assert_eq!(c["device"], "opencl:0");
    check_peak_and_gemm(c, &["cpu", "opencl:0"]);
    let train = c["train"].as_array().expect("train rows");
    let widths: Vec<u64> = train.iter().filter_map(|r| r["hidden"].as_u64()).collect();
    assert_eq!(widths, [64, 256, 1024]);
    for r in train {
        let (cpu, dev) = (
            r["cpu_ms"].as_f64().unwrap(),
            r["device_ms"].as_f64().unwrap(),
        );
        assert!(cpu > 0.0 && dev > 0.0, "{r}");
        assert!(
            (r["ratio"].as_f64().unwrap() - dev / cpu).abs() < 1e-9,
            "{r}"
        );
        assert_eq!(r["goal"].is_f64(), r["hidden"] != 256, "{r}");
    }
    let l = &c["launch"];
    for key in ["crate_ns", "raw_wait_ns", "raw_queued_ns", "ratio"] {
        assert!(l[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {l}");
    }
    assert_eq!(c["notes"].as_array().map(Vec::len), Some(0), "{c}");
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
