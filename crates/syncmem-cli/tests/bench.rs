//! `syncmem bench`: the JSON report has its ratio fields (no timing thresholds).

mod common;

use serde_json::Value;

#[test]
fn bench_quick_json_has_ratios() {
    let v: Value = common::json(&["bench", "--quick", "--device", "cpu", "--json"]);
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["quick"], true);
    check_machine(&v);
    let rows = v["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    for want in [
        "host pool 4 KiB",
        "host pool 4 KiB vs malloc",
        "host pool 1 MiB",
        "host pool 64 MiB",
        "host pool 64 MiB touched",
        "device pool 4 KiB",
        "device pool 4 KiB vs Device::alloc",
        "device pool 64 MiB",
        "device pool 64 MiB vs Device::alloc",
        "synced round trip 64 MiB",
        "synced round trip 64 MiB pinned",
        "host read access",
        "zero-copy cycle 64 MiB",
        "user kernel launch",
        "epoch LeakyRelu vs Relu",
        "epoch LeakyRelu vs Relu unfused",
        "epoch LeakyRelu no epilogue vs Relu",
        "256 B cycle, 100000 live buffers",
        "host pool 4 KiB, 1 thread",
        "host pool 4 KiB, 2 threads",
        "host pool 4 KiB, 8 threads",
        "device pool 4 KiB, 1 thread",
        "device pool 4 KiB, 8 threads",
        "device pool 4 KiB, 2 threads, one stream",
        "device pool 4 KiB, 8 threads, one stream",
        "device pool 4 KiB, history",
        "device pool 4 KiB, history + stacks",
        "train epoch zero-copy/off cpu",
        "train epoch capped/uncapped cpu h64",
        "train epoch capped/uncapped cpu h256",
        "train epoch adam offloaded/on device cpu",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    #[cfg(feature = "mpi")]
    check_distributed_rows(&v, &names);
    for r in rows {
        check_ratio_row(r);
    }
    // The device rows compare with the raw backend call and with Device::alloc.
    let raw = rows
        .iter()
        .find(|r| r["name"] == "device pool 4 KiB")
        .unwrap();
    assert!(
        raw["baseline"].as_str().unwrap().contains("alloc_zeroed"),
        "{raw}"
    );
    check_replay_rows(&v);
    assert!(v["notes"].as_array().is_some_and(|n| !n.is_empty()));
    assert_eq!(v["skipped"].as_array().map(Vec::len), Some(0));
    check_train_memory(&v, &["cpu"]);
    assert!(v["multi_device"].is_null(), "one cpu device");
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

/// With MPI, two ranks under mpirun add the distributed rows (skipped, with a note, only where
/// mpirun is missing, which SYNCMEM_REQUIRE_MPI=1 does not allow).
#[cfg(feature = "mpi")]
fn check_distributed_rows(v: &Value, names: &[&str]) {
    let skipped = v["skipped"].to_string().contains("distributed rows");
    assert!(
        !(skipped && std::env::var("SYNCMEM_REQUIRE_MPI").as_deref() == Ok("1")),
        "SYNCMEM_REQUIRE_MPI=1 but the distributed rows were skipped: {}",
        v["skipped"]
    );
    if skipped {
        return;
    }
    for want in [
        "all-reduce of a step's gradients, 2 ranks",
        "step h1024 overlap vs after backward",
        "step h64, 2 ranks vs 1 (batch 64)",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
}

/// The machine's CPUs and its load at the start and the end of the run (this test runs on Linux,
/// where `/proc/loadavg` exists).
fn check_machine(v: &Value) {
    assert!(v["cpus"].as_u64().is_some_and(|n| n >= 1), "{}", v["cpus"]);
    for key in ["load_start", "load_end"] {
        let l = &v[key];
        if cfg!(target_os = "linux") {
            for avg in ["one", "five", "fifteen"] {
                assert!(l[avg].as_f64().is_some_and(|x| x >= 0.0), "{key}: {l}");
            }
        } else {
            assert!(l.is_null() || l.is_object(), "{key}: {l}");
        }
    }
}

/// A row of the ratio table: its ratio is baseline / ours, within its spread; the rows of the
/// goal table have their goal, say whether the ratio of the medians meets it, and give the
/// verdict of the spread.
fn check_ratio_row(r: &Value) {
    for field in ["ratio", "ours_ns", "baseline_ns", "ratio_low", "ratio_high"] {
        let x = r[field].as_f64().unwrap_or(-1.0);
        assert!(x.is_finite() && x > 0.0, "{field} of {r}");
    }
    let ratio = r["ratio"].as_f64().unwrap();
    let want = r["baseline_ns"].as_f64().unwrap() / r["ours_ns"].as_f64().unwrap();
    assert!((ratio - want).abs() <= 1e-9 * want, "{r}");
    let (low, high) = (
        r["ratio_low"].as_f64().unwrap(),
        r["ratio_high"].as_f64().unwrap(),
    );
    assert!(
        low <= ratio && ratio <= high,
        "the ratio within its spread: {r}"
    );
    // Every row has several samples (quick: at least 3) behind its spread.
    assert!(r["samples"].as_u64().is_some_and(|n| n >= 3), "{r}");
    let name = r["name"].as_str().unwrap();
    let goal = match name {
        "host pool 4 KiB" => Some(syncmem_bench::HOST_SMALL_GOAL),
        "device pool 4 KiB" | "device pool 64 MiB" => Some(1.0),
        "synced round trip 64 MiB" | "synced round trip 64 MiB pinned" => Some(0.95),
        "user kernel launch" => Some(syncmem_bench::user::LAUNCH_GOAL),
        "device pool 4 KiB, history" => Some(syncmem_bench::history::HISTORY_GOAL),
        "epoch LeakyRelu vs Relu" => Some(syncmem_bench::user::EPOCH_GOAL),
        "zero-copy cycle 64 MiB" => Some(syncmem_bench::zero_copy::VS_COPIES_GOAL),
        "zero-copy map cycle 64 MiB" => Some(syncmem_bench::zero_copy::VS_RAW_MAP_GOAL),
        "256 B cycle, 100000 live buffers" => Some(syncmem_bench::zero_copy::LIVE_BUFFERS_GOAL),
        n if n.starts_with("host pool 4 KiB, ") || n.starts_with("device pool 4 KiB, ") => {
            (n.ends_with("thread") || n.ends_with("threads") || n.ends_with(", one stream"))
                .then_some(syncmem_bench::threads::THREADS_GOAL)
        }
        // The distributed rows (feature `mpi`): the all-reduce through the trainer's buckets
        // against a plain MPI_Allreduce of the same bytes.
        "all-reduce of a step's gradients, 2 ranks" => Some(0.9),
        n if n.starts_with("train epoch zero-copy/off ") => {
            Some(syncmem_bench::train_memory::ZERO_COPY_EPOCH_GOAL)
        }
        n if n.starts_with("train epoch capped/uncapped ") => {
            Some(syncmem_bench::train_memory::CAPPED_EPOCH_GOAL)
        }
        _ => None,
    };
    assert_eq!(r["goal"].as_f64(), goal, "{r}");
    match goal {
        Some(g) => {
            assert_eq!(r["goal_met"].as_bool(), Some(ratio >= g), "{r}");
            let verdict = if low >= g {
                "met"
            } else if high < g {
                "not met"
            } else {
                "within noise"
            };
            assert_eq!(r["verdict"], verdict, "{r}");
        }
        None => {
            assert!(r.get("goal_met").is_none(), "{r}");
            assert!(r.get("verdict").is_none(), "{r}");
        }
    }
}

/// Every trace, pool and kind is replayed, with its goal.
fn check_replay_rows(v: &Value) {
    let replay = v["replay"].as_array().expect("replay");
    assert_eq!(replay.len(), 3 * 2 * 3, "3 traces x 2 pools x 3 kinds");
    for r in replay {
        let reserved = r["peak_reserved"].as_u64().unwrap();
        let requested = r["peak_requested"].as_u64().unwrap();
        let allocated = r["peak_allocated"].as_u64().unwrap();
        assert!(reserved >= allocated && allocated >= requested, "{r}");
        let ratio = r["reserved_per_requested"].as_f64().unwrap();
        assert!(
            (ratio - reserved as f64 / requested as f64).abs() < 1e-9,
            "{r}"
        );
        let met = if r["pool"] == "host" {
            reserved <= requested + (128 << 10)
        } else {
            ratio <= 1.10
        };
        assert_eq!(r["goal_met"].as_bool(), Some(met), "{r}");
        if r["kind"] == "none" {
            assert_eq!(reserved, requested, "{r}");
        }
    }
}

/// The train memory table: per device, zero-copy and two mirrors, then capped and uncapped, with
/// the bytes each moved; every pair ends with the same loss, bit for bit.
fn check_train_memory(v: &Value, devices: &[&str]) {
    let rows = v["train_memory"].as_array().expect("train_memory rows");
    let runs: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["device"].as_str().unwrap(), r["run"].as_str().unwrap()))
        .collect();
    let mut want = Vec::new();
    for d in devices {
        want.extend(["zero-copy", "two mirrors"].map(|r| (*d, r)));
    }
    for d in devices {
        want.extend(
            ["capped h64", "uncapped h64", "capped h256", "uncapped h256"].map(|r| (*d, r)),
        );
    }
    for d in devices {
        want.extend(["adam, host", "adam, device", "acts, host", "acts, device"].map(|r| (*d, r)));
    }
    assert_eq!(runs, want);
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap();
        let run = r["run"].as_str().unwrap();
        // The host's update rounds as the device's kernels do, and offloaded activations
        // change no arithmetic: the same loss everywhere.
        assert_eq!(r["same_loss"], true, "{r}");
        match run {
            "zero-copy" => {
                // Where host and device share memory nothing is copied, in setup or per step.
                assert_eq!((f("setup_bytes"), f("step_bytes")), (0.0, 0.0), "{r}");
                assert!(f("syncs_per_step") > 0.0, "{r}");
                assert_eq!(r["no_copy_goal_met"], true, "{r}");
            }
            "two mirrors" => {
                assert!(f("setup_bytes") > 0.0 && f("step_bytes") > 0.0, "{r}");
                assert!(r.get("no_copy_goal_met").is_none(), "{r}");
            }
            capped if capped.starts_with("capped") => {
                assert!(r["cap"].as_u64().is_some_and(|c| c > 0), "{r}");
                if run == "capped h64" {
                    // Where memory is shared in place (`cpu`, PoCL) a spill copies no byte.
                    assert!(f("spills_per_step") > 0.0, "{r}");
                    assert!(f("refills_per_step") > 0.0, "{r}");
                }
            }
            "adam, host" => {
                // The gradients down and the parameters up, each step.
                assert!(f("step_bytes") > 0.0, "{r}");
            }
            "acts, host" => {
                // No cap; values leave the device (spilled in place where memory is shared
                // in place, copied out otherwise).
                assert!(r["cap"].is_null(), "{r}");
            }
            _ => {
                assert!(r["cap"].is_null(), "{r}");
                assert_eq!(f("spills_per_step"), 0.0, "{r}");
            }
        }
        assert!(f("epoch_ms") > 0.0, "{r}");
    }
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
    // Both zero-copy rows on PoCL (its memory is host memory): against two mirrors, and the
    // map protocol against the raw map/unmap calls.
    let names: Vec<&str> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for want in [
        "zero-copy cycle 64 MiB",
        "zero-copy map cycle 64 MiB",
        "train epoch zero-copy/off opencl:0",
        "train epoch capped/uncapped opencl:0 h64",
        "train epoch capped/uncapped opencl:0 h256",
        "train step vs raw h64",
        "train step vs raw h1024",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    check_train_memory(&v, &["opencl:0", "cpu"]);
    for r in v["rows"].as_array().unwrap() {
        if r["name"].as_str().unwrap().starts_with("train step vs raw") {
            let goal = r["goal"].as_f64().unwrap();
            assert!(
                (goal - syncmem_bench::floor::STEP_FLOOR_GOAL).abs() < 1e-12,
                "{r}"
            );
            assert!(r["baseline"].as_str().unwrap().contains("kernels"), "{r}");
        }
    }
    if syncmem::testing::two_or_skip(syncmem::BackendKind::OpenCl, "bench two devices").is_some() {
        check_two_devices(&v);
    }
    check_device_compute(&v["compute"]);
}

/// With a second OpenCL device: the copy between devices and data-parallel train.
#[cfg(feature = "opencl")]
fn check_two_devices(v: &Value) {
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "device to device 64 MiB")
        .expect("device to device row");
    assert!(row["ratio"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    let m = &v["multi_device"];
    assert_eq!(
        m["devices"],
        serde_json::json!(["opencl:0", "opencl:1"]),
        "{m}"
    );
    assert!(m["bytes_per_step"].as_f64().is_some_and(|b| b > 0.0), "{m}");
    assert!(
        m["loss_difference"]
            .as_f64()
            .is_some_and(|d| d.abs() < 1e-4),
        "{m}"
    );
}

/// The compute section on `opencl:0`: the GEMM rows of both devices, the train epochs against
/// `cpu`, the launch of a trivial kernel.
#[cfg(feature = "opencl")]
fn check_device_compute(c: &Value) {
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
        let ratio = r["ratio"].as_f64().unwrap();
        assert!((ratio - dev / cpu).abs() < 1e-9, "{r}");
        let (low, high) = (
            r["ratio_low"].as_f64().unwrap(),
            r["ratio_high"].as_f64().unwrap(),
        );
        assert!(low <= ratio && ratio <= high, "{r}");
        assert_eq!(r["goal"].is_f64(), r["hidden"] != 256, "{r}");
        // A ceiling: met when the whole spread is at or below it.
        if let Some(g) = r["goal"].as_f64() {
            let verdict = if high <= g {
                "met"
            } else if low > g {
                "not met"
            } else {
                "within noise"
            };
            assert_eq!(r["verdict"], verdict, "{r}");
        }
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

/// The comparison table: a header, then one row per comparison with two times, the spread of
/// the ratio (`low-high`), and its goal with the verdict, or no goal.
fn check_comparison_table(lines: &[&str], rows: &[Value]) {
    let times = ["ns", "µs", "ms", "s"];
    assert!(lines[0].starts_with("comparison") && lines[0].contains("spread"));
    for (line, row) in lines[1..=rows.len()].iter().zip(rows) {
        let name = row["name"].as_str().unwrap();
        assert!(line.starts_with(name), "{line}");
        let q = quantities(&line[name.len()..], &times);
        assert_eq!(q.len(), 2, "two times with units in {line:?}");
        let spread = line[name.len()..].split_whitespace().find(|t| {
            t.split_once('-')
                .is_some_and(|(a, b)| a.parse::<f64>().is_ok() && b.parse::<f64>().is_ok())
        });
        assert!(spread.is_some(), "a spread in {line:?}");
    }
    // The comparison rows say their goal and its verdict (timings differ between the two
    // runs, so only the kind of ending is compared), or that they have none.
    for (line, row) in lines[1..=rows.len()].iter().zip(rows) {
        if row["goal"].is_null() {
            assert!(line.ends_with("no goal"), "{line}");
        } else {
            let goal = format!("goal >= {:.2}: ", row["goal"].as_f64().unwrap());
            assert!(line.contains(&goal), "{line}");
            assert!(
                [": met", ": NOT met", ": within noise"]
                    .iter()
                    .any(|end| line.ends_with(end)),
                "{line}"
            );
        }
    }
}

#[test]
fn tables_use_human_units_and_json_raw_numbers() {
    let out = common::ok(&["bench", "--quick", "--device", "cpu"]);
    let v: Value = common::json(&["bench", "--quick", "--device", "cpu", "--json"]);
    assert!(
        !out.split_whitespace().any(|t| t == "us"),
        "`us` instead of `µs`:\n{out}"
    );
    let sizes = ["B", "KiB", "MiB", "GiB", "TiB"];
    let all: Vec<&str> = out.lines().collect();
    // The machine's load first and last.
    let first = all[0];
    assert!(
        first.starts_with("load average")
            && first.contains(" at start")
            && first.ends_with(" CPUs"),
        "{first}"
    );
    let last = all.iter().rev().find(|l| !l.is_empty()).unwrap();
    assert!(
        last.starts_with("load average") && last.contains(" at end"),
        "{last}"
    );
    let lines = &all[1..];
    check_comparison_table(lines, v["rows"].as_array().unwrap());
    // The replay table: peak reserved, requested and allocated with units, one row per trace,
    // pool and kind, each with its goal.
    let replay = v["replay"].as_array().unwrap();
    let start = lines
        .iter()
        .position(|l| l.starts_with("trace "))
        .expect("replay table");
    for (line, r) in lines[start + 2..].iter().zip(replay) {
        assert!(line.starts_with(r["trace"].as_str().unwrap()), "{line}");
        let q = quantities(line, &sizes);
        assert!(q.len() >= 3, "three sizes with units in {line:?}");
        let met = r["goal_met"].as_bool().unwrap();
        assert!(
            line.ends_with(if met { ": met" } else { ": NOT met" }),
            "{line}"
        );
        // Raw byte counts stay in the JSON output.
        assert!(
            r["peak_reserved"].is_u64() && r["peak_requested"].is_u64(),
            "{r}"
        );
    }
    // A legend line for the columns that are not obvious.
    for needle in [
        "peak requested:",
        "reserved/requested:",
        "reserved/allocated:",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(needle)),
            "{needle}\n{out}"
        );
    }
}
