//! Compute rows, measured in one run: this CPU's f32 FMA peak, the GEMM throughput of the
//! `syncmem train` layers on `cpu` and on the device against that peak, the `train` epoch time
//! on the device against `cpu`, and what a trivial kernel costs through the crate against
//! plain OpenCL.

use std::fmt;
use std::time::Instant;

use serde::Serialize;

use syncmem::ops::{create_operator, Operator, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{BackendKind, Context, Device, Result, SyncedMemory, Workspace};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

use crate::peak;

/// The hidden widths of the train and GEMM rows.
pub const HIDDEN: [usize; 3] = [64, 256, 1024];
/// Samples per step, as `syncmem train`.
pub const BATCH: usize = 64;
/// Goals of `device / cpu` epoch time, by hidden width (the widths not listed have none).
pub const TRAIN_GOALS: [(usize, f64); 2] = [(64, 2.0), (1024, 1.3)];
/// Goals of GEMM throughput at hidden 1024, as a fraction of the all-cores FMA peak: `cpu`,
/// then an OpenCL device.
pub const GEMM_GOALS: (f64, f64) = (0.6, 0.4);

/// The FMA peak of this CPU.
#[derive(Debug, Clone, Serialize)]
pub struct PeakRow {
    /// The instructions used (`avx512f`, `avx2+fma`, `portable`).
    pub isa: String,
    /// Threads of the all-cores figure (the available parallelism).
    pub threads: usize,
    /// GFLOP/s of one thread.
    pub one_core_gflops: f64,
    /// GFLOP/s of `threads` threads at once.
    pub all_cores_gflops: f64,
}

/// GEMM throughput of one layer of the train MLP (`X[64, H]`, `W[H, H]`) on one device.
#[derive(Debug, Clone, Serialize)]
pub struct GemmRow {
    /// The device.
    pub device: String,
    /// Hidden width `H`.
    pub hidden: usize,
    /// `FC`: `Y = X·Wᵀ + b`, GFLOP/s.
    pub forward_gflops: f64,
    /// `FCGradient`: `dW = dYᵀ·X`, `db`, `dX = dY·W`, GFLOP/s (the column sum counted in
    /// the time, not in the flops).
    pub backward_gflops: f64,
    /// Both, GFLOP/s.
    pub gflops: f64,
    /// `gflops` as a fraction of the host's all-cores FMA peak: for the `cpu` device and for
    /// devices that run on the host's cores (PoCL); `None` for a GPU, whose peak the bench does
    /// not know.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction_of_peak: Option<f64>,
    /// The fraction to reach, if this row has a goal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
    /// Whether it was reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal_met: Option<bool>,
}

/// `syncmem train` epoch time on the device against `cpu`.
#[derive(Debug, Clone, Serialize)]
pub struct TrainRow {
    /// Hidden width of both hidden layers.
    pub hidden: usize,
    /// Median epoch on `cpu`, milliseconds.
    pub cpu_ms: f64,
    /// Median epoch on the device, milliseconds.
    pub device_ms: f64,
    /// `device_ms / cpu_ms` (below 1: the device is faster).
    pub ratio: f64,
    /// The spread of the ratio: the interquartile range of the per-epoch ratios (epochs taken
    /// in turn), widened to hold `ratio` ([`crate::spread`]).
    pub ratio_low: f64,
    /// The high end of the spread.
    pub ratio_high: f64,
    /// The ratio not to exceed, if this width has a goal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
    /// Whether the ratio of the medians stays within it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal_met: Option<bool>,
    /// The verdict of the spread: met, not met, or within noise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<crate::Verdict>,
}

/// A trivial kernel (one float scaled) through the crate against plain OpenCL.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchRow {
    /// The device.
    pub device: String,
    /// `syncmem::kernels::scale` of one `f32`, nanoseconds per call.
    pub crate_ns: f64,
    /// `clEnqueueNDRangeKernel` + `clWaitForEvents` each, nanoseconds per kernel.
    pub raw_wait_ns: f64,
    /// `clEnqueueNDRangeKernel` only, one `clFinish` per batch, nanoseconds per kernel.
    pub raw_queued_ns: f64,
    /// `crate_ns / raw_queued_ns`: what a crate call costs over a queued kernel.
    pub ratio: f64,
}

/// Everything of the compute section.
#[derive(Debug, Clone, Serialize)]
pub struct ComputeReport {
    /// The device compared with `cpu`.
    pub device: String,
    /// The FMA peak.
    pub peak: PeakRow,
    /// GEMM throughput, `cpu` rows first.
    pub gemm: Vec<GemmRow>,
    /// Epoch times (empty when the device is `cpu`).
    pub train: Vec<TrainRow>,
    /// The trivial kernel (OpenCL devices only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchRow>,
    /// Rows not run, and why.
    pub notes: Vec<String>,
}

/// Measures the FMA peak (a fraction of a second per figure; fewer rounds when `quick`).
pub fn peak_row(quick: bool) -> PeakRow {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let (iters, runs) = if quick {
        (4_000_000, 3)
    } else {
        (10_000_000, 5)
    };
    PeakRow {
        isa: peak::isa().to_string(),
        threads,
        one_core_gflops: peak::fma_peak(1, iters, runs),
        all_cores_gflops: peak::fma_peak(threads, iters, runs),
    }
}

fn put(ws: &Workspace, dev: &Device, name: &str, dims: &[usize]) -> Result<()> {
    let n: usize = dims.iter().product();
    let vals: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 13.0).collect();
    let t = Tensor::from_slice(dims, &vals, Some(dev))?;
    ws.create_blob(name)?.write().reset(t);
    Ok(())
}

/// Seconds per call of `op`: `calls` calls then a wait for the stream, median of `runs`.
fn time_op(
    op: &dyn Operator,
    ws: &Workspace,
    ctx: &Context,
    calls: usize,
    runs: usize,
) -> Result<f64> {
    op.run(ws, ctx)?;
    ctx.finish()?;
    let mut t = Vec::new();
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        for _ in 0..calls.max(1) {
            op.run(ws, ctx)?;
        }
        ctx.finish()?;
        t.push(start.elapsed().as_secs_f64() / calls.max(1) as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// GEMM throughput of one train layer of width `h` on `dev`.
///
/// # Errors
/// Device and operator errors.
pub fn gemm_row(dev: &Device, h: usize, quick: bool, peak: &PeakRow) -> Result<GemmRow> {
    syncmem_nn::register_operators()?;
    let ws = Workspace::new();
    let ctx = Context::with_seed(dev, 0)?;
    put(&ws, dev, "x", &[BATCH, h])?;
    put(&ws, dev, "w", &[h, h])?;
    put(&ws, dev, "b", &[h])?;
    put(&ws, dev, "dy", &[BATCH, h])?;
    let fc = create_operator(&OperatorDef::new("FC", &["x", "w", "b"], &["y"]), dev)?;
    let grad = OperatorDef::new("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"]);
    let grad = create_operator(&grad, dev)?;
    let flops = 2.0 * (BATCH * h * h) as f64;
    // About 0.05 s (quick) or 0.2 s of work per timed run at 100 GFLOP/s.
    let budget = if quick { 5e9 } else { 2e10 };
    let calls = ((budget / flops) as usize).clamp(1, 2000);
    let runs = if quick { 3 } else { 7 };
    let fwd = time_op(fc.as_ref(), &ws, &ctx, calls, runs)?;
    let bwd = time_op(grad.as_ref(), &ws, &ctx, calls, runs)?;
    let gflops = 3.0 * flops / (fwd + bwd) / 1e9;
    // The host's FMA peak is the limit of devices that compute on its cores: `cpu`, and an
    // OpenCL CPU device (PoCL), which shares host memory. A CUDA device has a peak of its own.
    let on_host_cores = dev.backend() == BackendKind::Cpu
        || (dev.backend() == BackendKind::OpenCl && dev.info().host_unified);
    let fraction = on_host_cores.then(|| gflops / peak.all_cores_gflops.max(1e-9));
    let goal = match (h, dev.backend()) {
        (1024, BackendKind::Cpu) => Some(GEMM_GOALS.0),
        (1024, BackendKind::OpenCl) => Some(GEMM_GOALS.1),
        _ => None,
    };
    Ok(GemmRow {
        device: dev.label().to_string(),
        hidden: h,
        forward_gflops: flops / fwd / 1e9,
        backward_gflops: 2.0 * flops / bwd / 1e9,
        gflops,
        fraction_of_peak: fraction,
        goal,
        goal_met: goal.map(|g| fraction.is_some_and(|f| f >= g)),
    })
}

/// Median epoch seconds on `cpu` and on `dev` at hidden width `h`, epochs interleaved.
///
/// # Errors
/// Training errors.
pub fn train_row(dev: &Device, h: usize, quick: bool) -> Result<TrainRow> {
    let data = Dataset::spirals(1000, 3, 0.2, 0);
    let cfg = TrainConfig::default()
        .with_hidden(vec![h, h])
        .with_batch(BATCH);
    let mut cpu = Trainer::new(&Device::cpu(), &data, &cfg)?;
    let mut other = Trainer::new(dev, &data, &cfg)?;
    // One epoch each first: kernels built, buffers allocated, caches warm.
    cpu.run_epoch()?;
    other.run_epoch()?;
    let epochs = match (quick, h >= 1024) {
        (true, true) => 2,
        (true, false) => 3,
        (false, true) => 4,
        (false, false) => 7,
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..epochs {
        a.push(cpu.run_epoch()?.seconds);
        b.push(other.run_epoch()?.seconds);
    }
    // Ratios device / cpu: the cpu is the "ours" side of the samples.
    let samples = crate::Samples::new(a, b);
    let (cpu_s, device_s) = samples.medians();
    let (cpu_ms, device_ms) = (cpu_s * 1e3, device_s * 1e3);
    let ratio = device_ms / cpu_ms.max(1e-9);
    let (ratio_low, ratio_high) = samples.spread(ratio);
    let goal = TRAIN_GOALS.iter().find(|(w, _)| *w == h).map(|&(_, g)| g);
    Ok(TrainRow {
        hidden: h,
        cpu_ms,
        device_ms,
        ratio,
        ratio_low,
        ratio_high,
        goal,
        goal_met: goal.map(|g| ratio <= g),
        verdict: goal.map(|g| crate::Verdict::of_at_most(ratio_low, ratio_high, g)),
    })
}

/// `kernels::scale` of one `f32` on `dev`, nanoseconds per call (median of `runs` runs of
/// `calls` calls, each followed by a wait for the stream).
///
/// # Errors
/// Device errors.
pub fn crate_trivial_kernel_ns(dev: &Device, calls: usize, runs: usize) -> Result<f64> {
    let buf = SyncedMemory::new(4, dev);
    let mut w = buf.device_mut()?;
    syncmem::kernels::scale::<f32>(1, 1.0, &mut w)?;
    let stream = w.stream().clone();
    stream.synchronize()?;
    let mut t = Vec::new();
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        for _ in 0..calls {
            syncmem::kernels::scale::<f32>(1, 1.0, &mut w)?;
        }
        stream.synchronize()?;
        t.push(start.elapsed().as_nanos() as f64 / calls as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// The groups of [`run`], in order.
pub const STEPS: [&str; 5] = [
    "FMA peak",
    "GEMM on cpu",
    "GEMM on the device",
    "train epochs",
    "trivial kernel",
];

/// Runs the compute rows against `dev` (`progress(name)` before each of [`STEPS`]).
///
/// # Errors
/// Errors of the `cpu` rows (the device rows are skipped with a note when they fail).
pub fn run(
    dev: Option<&Device>,
    label: &str,
    quick: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<ComputeReport> {
    let mut notes = Vec::new();
    progress(STEPS[0]);
    let peak = peak_row(quick);
    progress(STEPS[1]);
    let cpu = Device::cpu();
    let mut gemm = Vec::new();
    for h in HIDDEN {
        gemm.push(gemm_row(&cpu, h, quick, &peak)?);
    }
    let dev = dev.filter(|d| d.backend() != BackendKind::Cpu);
    let mut train = Vec::new();
    let mut launch = None;
    let Some(dev) = dev else {
        for step in &STEPS[2..] {
            progress(step);
        }
        notes.push(format!(
            "device GEMM, train and launch rows: {label} is not an accelerator device"
        ));
        return Ok(ComputeReport {
            device: label.to_string(),
            peak,
            gemm,
            train,
            launch,
            notes,
        });
    };
    progress(STEPS[2]);
    let rows: Result<Vec<GemmRow>> = HIDDEN
        .iter()
        .map(|&h| gemm_row(dev, h, quick, &peak))
        .collect();
    match rows {
        Ok(r) => gemm.extend(r),
        Err(e) => notes.push(format!("device GEMM rows on {label}: {e}")),
    }
    progress(STEPS[3]);
    for h in HIDDEN {
        match train_row(dev, h, quick) {
            Ok(r) => train.push(r),
            Err(e) => notes.push(format!("train row at hidden {h} on {label}: {e}")),
        }
    }
    progress(STEPS[4]);
    if dev.backend() == BackendKind::OpenCl {
        match launch_row(dev, quick) {
            Ok(r) => launch = Some(r),
            Err(e) => notes.push(format!("launch row on {label}: {e}")),
        }
    } else {
        notes.push(format!("launch row: plain OpenCL only, not {label}"));
    }
    Ok(ComputeReport {
        device: label.to_string(),
        peak,
        gemm,
        train,
        launch,
        notes,
    })
}

/// The launch row on an OpenCL device.
fn launch_row(dev: &Device, quick: bool) -> std::result::Result<LaunchRow, String> {
    let (calls, runs) = if quick { (200, 3) } else { (1000, 5) };
    let ours = crate_trivial_kernel_ns(dev, calls, runs).map_err(|e| e.to_string())?;
    let (wait, queued) = raw_trivial_kernel_ns(dev.info().ordinal, calls, runs)?;
    Ok(LaunchRow {
        device: dev.label().to_string(),
        crate_ns: ours,
        raw_wait_ns: wait,
        raw_queued_ns: queued,
        ratio: ours / queued.max(1e-9),
    })
}

#[cfg(feature = "opencl")]
fn raw_trivial_kernel_ns(
    ordinal: usize,
    calls: usize,
    runs: usize,
) -> std::result::Result<(f64, f64), String> {
    crate::rawcl::trivial_kernel_ns(ordinal, calls, runs)
}

#[cfg(not(feature = "opencl"))]
fn raw_trivial_kernel_ns(_: usize, _: usize, _: usize) -> std::result::Result<(f64, f64), String> {
    Err("built without the opencl feature".into())
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "",
    }
}

impl fmt::Display for ComputeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.peak;
        writeln!(
            f,
            "f32 FMA peak ({}): {:.1} GFLOP/s on one core, {:.1} GFLOP/s on {} threads",
            p.isa, p.one_core_gflops, p.all_cores_gflops, p.threads
        )?;
        writeln!(
            f,
            "{:<10} {:>6} {:>12} {:>12} {:>12} {:>8}  (FC + FCGradient at batch {BATCH}, X[{BATCH},H]·W[H,H])",
            "GEMM", "H", "forward", "backward", "both", "of peak"
        )?;
        for r in &self.gemm {
            write!(
                f,
                "{:<10} {:>6} {:>7.1} GF/s {:>7.1} GF/s {:>7.1} GF/s {:>8}",
                r.device,
                r.hidden,
                r.forward_gflops,
                r.backward_gflops,
                r.gflops,
                r.fraction_of_peak
                    .map_or_else(|| "-".to_string(), |p| format!("{:.1}%", p * 100.0))
            )?;
            if let Some(g) = r.goal {
                write!(f, "  goal >= {:.0}%: {}", g * 100.0, met(r.goal_met))?;
            }
            writeln!(f)?;
        }
        if !self.train.is_empty() {
            writeln!(
                f,
                "{:<10} {:>6} {:>11} {:>11} {:>8} {:>11}  (median epoch; ratio = {} / cpu)",
                "train", "H", "cpu", self.device, "ratio", "spread", self.device
            )?;
            for r in &self.train {
                write!(
                    f,
                    "{:<10} {:>6} {:>8.1} ms {:>8.1} ms {:>8.2} {:>11}",
                    "",
                    r.hidden,
                    r.cpu_ms,
                    r.device_ms,
                    r.ratio,
                    format!("{:.2}-{:.2}", r.ratio_low, r.ratio_high)
                )?;
                if let (Some(g), Some(v)) = (r.goal, r.verdict) {
                    write!(f, "  goal <= {g}: {}", v.text())?;
                }
                writeln!(f)?;
            }
        }
        if let Some(l) = &self.launch {
            writeln!(
                f,
                "trivial kernel on {}: crate call {:.1} µs, plain OpenCL launch + wait {:.1} µs, \
                 only queued {:.1} µs (crate / queued = {:.1})",
                l.device,
                l.crate_ns / 1e3,
                l.raw_wait_ns / 1e3,
                l.raw_queued_ns / 1e3,
                l.ratio
            )?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}
