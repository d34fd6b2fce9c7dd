//! `syncmem bench`'s rows of distributed training (feature `mpi`): the parent process times
//! one rank alone, then runs `mpirun -n 2` of the hidden `syncmem bench-mpi`, whose rank 0
//! prints what the ranks measured as one JSON object.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use syncmem::Device;
use syncmem_bench::{BenchReport, Samples};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::collective::mpi::Mpi;
use syncmem_nn::train::collective::Collective;
use syncmem_nn::train::{TrainConfig, Trainer};

/// Goal of the all-reduce row: through the trainer's buckets at least this fraction of a plain
/// `MPI_Allreduce` of the same bytes.
const ALLREDUCE_GOAL: f64 = 0.9;

/// Arguments of the hidden `syncmem bench-mpi`.
#[derive(clap::Args)]
pub struct RankArgs {
    /// Fewer runs.
    #[arg(long)]
    pub quick: bool,
}

/// What rank 0 of `syncmem bench-mpi` prints.
#[derive(Serialize, Deserialize)]
struct RankFigures {
    ranks: usize,
    /// Per step at hidden 64: gradient bytes, ns in the buckets (staging and all-reduce), ns
    /// of a plain all-reduce of as many bytes from host vectors (per sample, taken in turn),
    /// ns of a whole step (per epoch).
    bytes: u64,
    buckets_ns: Vec<f64>,
    raw_ns: Vec<f64>,
    step_ns: Vec<f64>,
    /// Hidden 1024: ns per step with the buckets summed as backward writes them, and after
    /// backward (per sample, taken in turn); the exposed ns of each.
    overlap_ns: Vec<f64>,
    after_ns: Vec<f64>,
    overlap_exposed_ns: f64,
    after_exposed_ns: f64,
    buckets_h1024: usize,
}

fn data() -> Dataset {
    Dataset::spirals(1000, 3, 0.2, 0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Ns per step of each of `epochs` epochs of `t`, after one to warm up.
fn step_ns(t: &mut Trainer, epochs: usize) -> anyhow::Result<Vec<f64>> {
    t.run_epoch()?;
    let mut per_step = Vec::new();
    for _ in 0..epochs {
        let e = t.run_epoch()?;
        per_step.push(e.seconds * 1e9 / e.steps.max(1) as f64);
    }
    Ok(per_step)
}

/// `syncmem bench-mpi`: one rank of the measurement; rank 0 prints the figures.
pub fn rank(quick: bool) -> anyhow::Result<()> {
    let mpi = Arc::new(Mpi::init().context("joining the MPI job")?);
    let c: Arc<dyn Collective> = mpi.clone();
    let epochs = if quick { 3 } else { 7 };
    let cpu = [Device::cpu()];
    let mut t = Trainer::distributed(&cpu, &data(), &TrainConfig::default(), c.clone())?;
    let step = step_ns(&mut t, epochs)?;
    let s = t.comm().context("the trainer's figures")?;
    let bytes = s.bytes / s.steps.max(1);
    // A step's gradients through the buckets, and the same bytes between plain host vectors
    // (one MPI_Allreduce each), back to back, alternating.
    let n = (bytes / 4) as usize;
    let (send, mut recv) = (vec![1.0f32; n], vec![0.0f32; n]);
    let calls = if quick { 200 } else { 1000 };
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..calls {
            t.sum_gradients()?;
        }
        ours.push(start.elapsed().as_secs_f64() * 1e9 / calls as f64);
        let start = Instant::now();
        for _ in 0..calls {
            c.all_reduce_sum(&send, &mut recv)?;
        }
        raw.push(start.elapsed().as_secs_f64() * 1e9 / calls as f64);
    }
    let wide = TrainConfig::default().with_hidden(vec![1024, 1024]);
    let mut on = Trainer::distributed(&cpu, &data(), &wide, c.clone())?;
    let mut off = Trainer::distributed(&cpu, &data(), &wide.with_overlap(false), c.clone())?;
    let (mut on_ns, mut off_ns) = (Vec::new(), Vec::new());
    for _ in 0..epochs.min(5) {
        on_ns.push(median(step_ns(&mut on, 1)?));
        off_ns.push(median(step_ns(&mut off, 1)?));
    }
    let exposed = |t: &Trainer| {
        t.comm()
            .map_or(0.0, |s| s.exposed_seconds * 1e9 / s.steps.max(1) as f64)
    };
    let figures = RankFigures {
        ranks: c.size(),
        bytes,
        buckets_ns: ours,
        raw_ns: raw,
        step_ns: step,
        overlap_ns: on_ns,
        after_ns: off_ns,
        overlap_exposed_ns: exposed(&on),
        after_exposed_ns: exposed(&off),
        buckets_h1024: on.bucket_sizes().len(),
    };
    if c.rank() == 0 {
        println!("{}", serde_json::to_string(&figures)?);
    }
    Ok(())
}

/// `report` with the distributed rows: one process alone timed here, two ranks under
/// `mpirun` (skipped with a note when it is missing).
pub fn with_rows(mut report: BenchReport, quick: bool) -> anyhow::Result<BenchReport> {
    let Ok(mpirun) = which("mpirun") else {
        report
            .skipped
            .push("distributed rows: mpirun not found (scripts/setup.sh --with-mpi)".into());
        return Ok(report);
    };
    let epochs = if quick { 3 } else { 7 };
    let mut alone = Trainer::new(&Device::cpu(), &data(), &TrainConfig::default())?;
    let alone_ns = step_ns(&mut alone, epochs)?;
    drop(alone);
    let exe = std::env::current_exe().context("the syncmem binary's path")?;
    // A temporary directory of the job's own: Open MPI makes its session directory there, and
    // jobs started at the same moment in one shared directory can collide ("File exists").
    // Short, as Open MPI puts unix sockets (paths of at most 108 bytes) under it.
    let tmp = std::env::temp_dir().join(format!("smpi-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)
        .with_context(|| format!("making the MPI job's directory {}", tmp.display()))?;
    let mut cmd = Command::new(mpirun);
    cmd.args(["-n", "2", "--oversubscribe", "--bind-to", "none"])
        .arg(exe)
        .arg("bench-mpi")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("TMPDIR", &tmp);
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output();
    let _ = std::fs::remove_dir_all(&tmp);
    let out = out.context("running mpirun -n 2 syncmem bench-mpi")?;
    if !out.status.success() {
        bail!(
            "mpirun -n 2 syncmem bench-mpi failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let f: RankFigures = serde_json::from_slice(&out.stdout).context("bench-mpi's figures")?;
    report.rows.push(
        Samples::new(f.buckets_ns, f.raw_ns)
            .row(
                "all-reduce of a step's gradients, 2 ranks",
                "trainer buckets",
                "MPI_Allreduce",
            )
            .with_goal(ALLREDUCE_GOAL),
    );
    let overlap = Samples::new(f.overlap_ns, f.after_ns);
    report.rows.push(overlap.row(
        "step h1024 overlap vs after backward",
        "overlapped",
        "after",
    ));
    // Epochs of the ranks and of the process alone, paired by index (not back to back: the
    // process alone runs first).
    report.rows.push(Samples::new(f.step_ns, alone_ns).row(
        "step h64, 2 ranks vs 1 (batch 64)",
        "2 ranks",
        "1 process",
    ));
    report.notes.push(format!(
        "distributed rows (`mpirun -n {} --oversubscribe --bind-to none`, cpu, feature mpi): \
         the all-reduce row times a step's gradients ({} bytes at hidden 64) through the \
         trainer's buckets (read through the host mirrors, packed, summed in place by one \
         MPI_Allreduce, written back) against MPI_Allreduce of as many bytes between plain \
         host vectors (the Mpi collective's call, goal >= {ALLREDUCE_GOAL}); the overlap row \
         times a step at hidden 1024 ({} buckets of at most 1 MiB) summed as backward writes \
         them against after backward (waited for after the step's own work: {:.0} µs against \
         {:.0} µs); the last row is the cost of distribution on this machine (each rank \
         computes half the batch, and the ranks share its cores)",
        f.ranks,
        f.bytes,
        f.buckets_h1024,
        f.overlap_exposed_ns / 1e3,
        f.after_exposed_ns / 1e3
    ));
    Ok(report)
}

/// `name` on the PATH.
fn which(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let paths = std::env::var_os("PATH").context("PATH is not set")?;
    std::env::split_paths(&paths)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on the PATH"))
}
