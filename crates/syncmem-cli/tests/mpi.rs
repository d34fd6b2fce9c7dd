//! `syncmem train` under `mpirun` (feature `mpi`): 2 and 3 ranks (oversubscribed, unbound)
//! on `cpu` and on OpenCL reach the single-process loss on the same global batches; a rank
//! that fails (a missing data file, out of memory, killed) ends the whole job within seconds,
//! named in the output, never a hang; a checkpoint is written once. Without `mpirun` the tests
//! skip, unless `SYNCMEM_REQUIRE_MPI=1` (CI) makes that a failure.

#![cfg(feature = "mpi")]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `mpirun` on the PATH, or `None` (skipping, unless MPI is required).
fn mpirun() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("SYNCMEM_REQUIRE_MPI").as_deref() != Ok("1"),
            "SYNCMEM_REQUIRE_MPI=1 but mpirun is not on the PATH (scripts/setup.sh --with-mpi)"
        );
        eprintln!("SKIPPED: mpirun not found (scripts/setup.sh --with-mpi installs Open MPI)");
    }
    found
}

/// Waits for `child` at most `limit`; kills it (and fails) past that: a hang is a failure.
fn wait_bounded(job: Job, limit: Duration, what: &str) -> (Output, Duration) {
    let Job { mut child, _tmp } = job;
    let start = Instant::now();
    loop {
        if child.try_wait().expect("poll mpirun").is_some() {
            let out = child.wait_with_output().expect("mpirun's output");
            return (out, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("mpirun's output");
            panic!(
                "{what}: still running after {limit:?} (a hang)\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temporary directory of one job, removed when dropped. Open MPI makes its session
/// directory under `TMPDIR`; jobs started at the same moment by tests running in parallel
/// could collide there ("File exists") when they share one.
struct SessionDir(PathBuf);

impl SessionDir {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // Short: Open MPI puts unix sockets under it, whose paths are limited to 108 bytes.
        let dir = std::env::temp_dir().join(format!(
            "smpi-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("the job's temporary directory");
        Self(dir)
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `mpirun`, with its temporary directory.
struct Job {
    child: Child,
    _tmp: SessionDir,
}

/// `mpirun -n ranks` of `sh -c script` (which runs `$SYNCMEM` with the rank in `$RANK`), or of
/// `syncmem args` when `script` is empty, with a temporary directory of its own.
fn launch(mpirun: &PathBuf, ranks: usize, args: &[&str], script: &str) -> Job {
    let tmp = SessionDir::new();
    let mut c = Command::new(mpirun);
    c.args([
        "-n",
        &ranks.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if script.is_empty() {
        c.arg(env!("CARGO_BIN_EXE_syncmem")).args(args);
    } else {
        c.args(["sh", "-c", script]);
    }
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("SYNCMEM", env!("CARGO_BIN_EXE_syncmem"))
        .env("TMPDIR", &tmp.0)
        .env_remove("SYNCMEM_TRACE")
        .env_remove("SYNCMEM_ZERO_COPY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Job {
        child: c.spawn().expect("start mpirun"),
        _tmp: tmp,
    }
}

fn epochs_losses(report: &Value) -> Vec<f64> {
    report["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e["loss"].as_f64().unwrap())
        .collect()
}

/// Trains with `ranks` ranks and with one process on the same arguments; compares the losses.
fn same_loss_as_one_process(mpirun: &PathBuf, ranks: usize, args: &[&str]) {
    let one = common::run_env(
        &[args, &["--json"]].concat(),
        &[("POCL_DEVICES", "pthread pthread")],
    );
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let one: Value = serde_json::from_slice(&one.stdout).unwrap();
    let child = launch(mpirun, ranks, &[args, &["--json"]].concat(), "");
    let (out, took) = wait_bounded(child, Duration::from_secs(120), "training");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{ranks} ranks: {stderr}");
    // Rank 0 alone prints the report.
    let many: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(many["distributed"]["ranks"], ranks);
    for (e, (a, b)) in epochs_losses(&many)
        .iter()
        .zip(epochs_losses(&one))
        .enumerate()
    {
        let rel = (a - b).abs() / b;
        eprintln!(
            "{ranks} ranks {args:?}, epoch {}: loss {a} vs {b} on one process, relative \
             difference {rel:e} ({took:?})",
            e + 1
        );
        assert!(rel < 1e-5, "{ranks} ranks, epoch {}: {a} vs {b}", e + 1);
    }
    let d = &many["distributed"];
    let (bytes, steps) = (
        d["bytes_per_step"].as_f64().unwrap(),
        d["steps"].as_u64().unwrap(),
    );
    assert_eq!(steps, many["epochs"].as_array().unwrap().len() as u64 * 47);
    // fc1 2x64+64, fc2 64x64+64, fc3 64x3+3 floats.
    assert_eq!(bytes, 4.0 * (192.0 + 4160.0 + 195.0));
}

#[test]
fn two_and_three_ranks_on_cpu_reach_the_single_process_loss() {
    let Some(m) = mpirun() else { return };
    let args = ["train", "--device", "cpu", "--epochs", "2"];
    same_loss_as_one_process(&m, 2, &args);
    same_loss_as_one_process(&m, 3, &args);
    // 1 KiB buckets: the 16 KiB `fc2_w` alone in one, summed in place in the gradient itself
    // where every rank has the same share (2 ranks), packed where shares differ (3 ranks).
    let small = [&args[..], &["--bucket-size", "1KiB"]].concat();
    same_loss_as_one_process(&m, 2, &small);
    same_loss_as_one_process(&m, 3, &small);
}

#[cfg(feature = "opencl")]
#[test]
fn two_and_three_ranks_on_opencl_reach_the_single_process_loss() {
    let Some(m) = mpirun() else { return };
    if syncmem::Device::all(syncmem::BackendKind::OpenCl).map_or(0, |d| d.len()) == 0 {
        assert!(std::env::var("SYNCMEM_REQUIRE_OPENCL").as_deref() != Ok("1"));
        eprintln!("SKIPPED: no OpenCL device");
        return;
    }
    same_loss_as_one_process(&m, 2, &["train", "--device", "opencl:0", "--epochs", "2"]);
    same_loss_as_one_process(&m, 3, &["train", "--device", "opencl:0", "--epochs", "2"]);
    // Two devices: each of 2 ranks takes one (against one process data-parallel on both).
    let two = ["train", "--device", "opencl:0,opencl:1", "--epochs", "2"];
    same_loss_as_one_process(&m, 2, &two);
}

/// Runs a job where rank 1 does `bad` and the others train long; requires the job to end
/// non-zero within `limit`, with `expect` in its output.
fn job_fails(mpirun: &PathBuf, bad: &str, expect: &[&str]) {
    let good = "exec \"$SYNCMEM\" train --device cpu --epochs 100000";
    let script = format!("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then {bad}; else {good}; fi");
    let child = launch(mpirun, 2, &[], &script);
    let (out, took) = wait_bounded(child, Duration::from_secs(60), bad);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{bad}: ended in {took:?}");
    assert!(!out.status.success(), "{bad}: the job succeeded\n{all}");
    for e in expect {
        assert!(all.contains(e), "{bad}: {e:?} not in the output:\n{all}");
    }
}

#[test]
fn a_rank_whose_data_is_missing_ends_the_job_naming_it() {
    let Some(m) = mpirun() else { return };
    job_fails(
        &m,
        "exec \"$SYNCMEM\" train --device cpu --data /nonexistent/data.safetensors",
        &["rank 1 of 2 failed", "/nonexistent/data.safetensors"],
    );
}

#[test]
fn a_rank_out_of_memory_ends_the_job_naming_it() {
    let Some(m) = mpirun() else { return };
    job_fails(
        &m,
        "exec \"$SYNCMEM\" train --device cpu --memory-cap 4KiB --epochs 100000",
        &["rank 1 of 2 failed", "out of memory"],
    );
}

#[test]
fn a_killed_rank_ends_the_job() {
    let Some(m) = mpirun() else { return };
    // The rank kills itself once training is under way.
    job_fails(
        &m,
        "(sleep 2; kill -9 $$) & exec \"$SYNCMEM\" train --device cpu --epochs 100000",
        &["signal 9"],
    );
}

#[test]
fn ranks_with_different_data_are_named_and_the_checkpoint_is_written_once() {
    let Some(m) = mpirun() else { return };
    let dir = std::env::temp_dir().join(format!("syncmem-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Different seeds: rank 1's initial parameters and data differ from rank 0's.
    job_fails(
        &m,
        "exec \"$SYNCMEM\" train --device cpu --seed 5",
        &["rank(s) 1 differ from rank 0"],
    );
    let ckpt = dir.join("params.safetensors");
    let child = launch(
        &m,
        2,
        &[
            "train",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--save",
            ckpt.to_str().unwrap(),
        ],
        "",
    );
    let (out, _) = wait_bounded(child, Duration::from_secs(60), "--save");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // One report, one save line: rank 0's.
    assert_eq!(text.matches("final: accuracy").count(), 1, "{text}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["params.safetensors"], "no temporary file left");
    std::fs::remove_dir_all(&dir).unwrap();
}
