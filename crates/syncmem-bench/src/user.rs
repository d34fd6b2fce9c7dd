//! The rows of kernels of the user: a trivial kernel launched through `UserKernel::launch`
//! against the same kernel enqueued with plain OpenCL on the same queue (on `cpu`: the same
//! closure called directly), and the `custom_operator` example's training epoch (`LeakyRelu`
//! as user kernels, fused by its GEMM epilogue) against the built-in `Relu` net.

use std::sync::LazyLock;
use std::time::Instant;

use syncmem::device::{Grid, KernelArg, UserKernel};
use syncmem::{BackendKind, Device, Error, Result, SyncedMemory};
use syncmem_nn::mlp::{Dataset, Mlp};
use syncmem_nn::train::{TrainConfig, Trainer};

use crate::rows::Runs;
use crate::{Row, Samples};

/// The `LeakyRelu` operators of the `custom_operator` example, as they are.
#[path = "../../syncmem-nn/examples/custom_operator/leaky_relu.rs"]
#[allow(dead_code)]
mod leaky_relu;

/// Goal of the user-kernel launch row: at most 1.2 times the plain launch (`ratio = baseline
/// / ours >= 1 / 1.2`).
pub const LAUNCH_GOAL: f64 = 1.0 / 1.2;
/// Goal of the `LeakyRelu` epoch row: at least 0.95 times the built-in `Relu` net's speed
/// (both fused).
pub const EPOCH_GOAL: f64 = 0.95;

/// `x[0] *= 1`: OpenCL C as the plain baseline builds it, and a host closure.
fn trivial() -> UserKernel {
    UserKernel::new("sm_bench_trivial")
        .with_opencl("__kernel void sm_bench_trivial(__global float* x) { x[0] *= 1.0f; }")
        .with_host(|a| {
            trivial_host(a.output::<f32>(0)?);
            Ok(())
        })
}

fn trivial_host(x: &mut [f32]) {
    if let Some(v) = x.first_mut() {
        *v *= 1.0;
    }
}

/// Nanoseconds per call of `ours` and `base` in each sample, in alternating samples of
/// `runs.batch` calls; `before` runs before each sample and `after` after it, untimed (the queue is held
/// and let through there).
fn time_queued(
    runs: Runs,
    mut ours: impl FnMut() -> Result<()>,
    mut base: impl FnMut() -> Result<()>,
    mut before: impl FnMut() -> Result<()>,
    mut after: impl FnMut() -> Result<()>,
) -> Result<Samples> {
    let batch = runs.batch.max(1);
    let mut time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        before()?;
        let start = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        let ns = start.elapsed().as_nanos() as f64 / batch as f64;
        after()?;
        Ok(ns)
    };
    time(&mut ours)?;
    time(&mut base)?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs.samples.max(1) {
        a.push(time(&mut ours)?);
        b.push(time(&mut base)?);
    }
    Ok(Samples::new(a, b))
}

fn bench_error(what: String) -> Error {
    Error::Unsupported {
        device: "bench".into(),
        what,
    }
}

/// The trivial kernel through `UserKernel::launch` (a write guard held across the calls, as an
/// operator holds its outputs) against the plain launch on the same queue: on OpenCL,
/// `clSetKernelArg` + `clEnqueueNDRangeKernel` with `opencl3`, never waited for, the queue held
/// behind a user event while a sample is timed (the host's queuing cost alone: no kernel runs
/// meanwhile); on `cpu`, the closure called on the buffer directly.
///
/// # Errors
/// Device errors; [`Error::Unsupported`] on a CUDA device (no plain baseline here).
pub fn launch_row(dev: &Device, runs: Runs) -> Result<Row> {
    let k = trivial();
    k.prepare(dev)?;
    let mem = SyncedMemory::new(4, dev);
    let mut w = mem.device_overwrite()?;
    let stream = w.stream().clone();
    let grid = Grid::linear(1, 1);
    let mut ours = || {
        let args = [KernelArg::from(&mut w)];
        // SAFETY: the kernel touches x[0] of a buffer of one float.
        unsafe { k.launch(&stream, grid, &args) }
    };
    let (samples, baseline) = match dev.backend() {
        BackendKind::Cpu => {
            let mut raw = vec![1.0f32; 1];
            let s = time_queued(
                runs,
                &mut ours,
                || {
                    trivial_host(std::hint::black_box(&mut raw));
                    Ok(())
                },
                || Ok(()),
                || Ok(()),
            )?;
            (s, "the same closure called directly")
        }
        BackendKind::OpenCl => (
            opencl_baseline(&stream, runs, &mut ours)?,
            "clSetKernelArg + clEnqueueNDRangeKernel (opencl3), same queue",
        ),
        other => {
            return Err(bench_error(format!(
                "no plain launch to compare with on {other}"
            )))
        }
    };
    Ok(samples
        .row(
            "user kernel launch",
            "UserKernel::launch (queued)",
            baseline,
        )
        .with_goal(LAUNCH_GOAL))
}

#[cfg(feature = "opencl")]
fn opencl_baseline(
    stream: &syncmem::Stream,
    runs: Runs,
    ours: &mut dyn FnMut() -> Result<()>,
) -> Result<Samples> {
    let queue = stream
        .as_opencl()
        .ok_or_else(|| bench_error("an OpenCL stream without a queue".into()))?;
    let kernel = crate::rawcl::trivial_kernel_on(queue).map_err(bench_error)?;
    // The raw side's own one-float buffer on the same device (the crate's is held by the
    // write guard).
    let scratch = stream.device().alloc(4)?;
    let buf = scratch
        .as_opencl()
        .ok_or_else(|| bench_error("an OpenCL buffer without a cl_mem".into()))?;
    // The queue is held while a sample is timed (no kernel runs then), let through after.
    let hold = std::cell::RefCell::new(None::<crate::rawcl::Hold>);
    time_queued(
        runs,
        ours,
        || crate::rawcl::enqueue_trivial(queue, &kernel, buf).map_err(bench_error),
        || {
            *hold.borrow_mut() = Some(crate::rawcl::Hold::new(queue).map_err(bench_error)?);
            Ok(())
        },
        || {
            if let Some(mut h) = hold.borrow_mut().take() {
                h.release().map_err(bench_error)?;
            }
            stream.synchronize()
        },
    )
}

#[cfg(not(feature = "opencl"))]
fn opencl_baseline(
    _: &syncmem::Stream,
    _: Runs,
    _: &mut dyn FnMut() -> Result<()>,
) -> Result<Samples> {
    Err(bench_error("built without the opencl feature".into()))
}

/// `LeakyRelu` with its epilogue declared, and the same operators as `BenchPlainLeakyRelu`
/// without one (what the example was before epilogues: nothing fuses them).
static REGISTERED: LazyLock<Result<()>> = LazyLock::new(|| {
    leaky_relu::register()?;
    leaky_relu::register_as("BenchPlainLeakyRelu", "BenchPlainLeakyReluGradient")
});

/// A trainer of the MLP of `syncmem train` with activation `act`.
fn trainer(dev: &Device, data: &Dataset, cfg: &TrainConfig, act: &str) -> Result<Trainer> {
    let widths = [data.features, cfg.hidden[0], cfg.hidden[1], data.classes];
    let mlp = Mlp::new(&widths, cfg.lr)?.with_activation(act)?;
    let nets = mlp.nets("mlp");
    Trainer::with_nets(dev, data, cfg, mlp, nets)
}

/// The `custom_operator` example's epoch (`LeakyRelu` as user kernels, declared element-wise
/// with its GEMM epilogue: fused into the `FC`s and `FCGradient`s as `Relu` is) against the
/// built-in `Relu` net as `syncmem train` runs it (fused), against the built-in net unfused,
/// and the same user operators without an epilogue (not fused) against the fused `Relu` net,
/// epochs interleaved: median epoch times.
///
/// # Errors
/// Training errors; the registration's error.
pub fn epoch_rows(dev: &Device, quick: bool) -> Result<Vec<Row>> {
    if let Err(e) = &*REGISTERED {
        return Err(bench_error(format!("registering LeakyRelu: {e}")));
    }
    let data = Dataset::spirals(1000, 3, 0.2, 0);
    let cfg = TrainConfig::default();
    let mut leaky = trainer(dev, &data, &cfg, "LeakyRelu")?;
    let mut plain = trainer(dev, &data, &cfg, "BenchPlainLeakyRelu")?;
    let mut relu = Trainer::new(dev, &data, &cfg)?;
    let mut unfused = cfg.clone();
    unfused.fuse = false;
    let mut relu_unfused = Trainer::new(dev, &data, &unfused)?;
    for t in [&mut leaky, &mut plain, &mut relu, &mut relu_unfused] {
        t.run_epoch()?; // kernels built, buffers allocated
    }
    let epochs = if quick { 3 } else { 7 };
    let (mut l, mut p, mut r, mut u) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..epochs {
        l.push(leaky.run_epoch()?.seconds * 1e9);
        p.push(plain.run_epoch()?.seconds * 1e9);
        r.push(relu.run_epoch()?.seconds * 1e9);
        u.push(relu_unfused.run_epoch()?.seconds * 1e9);
    }
    let ours = "epoch, LeakyRelu (user operator, fused by its epilogue)";
    let relu_fused = "epoch, built-in Relu (fused, as syncmem train)";
    Ok(vec![
        Samples::new(l.clone(), r.clone())
            .row("epoch LeakyRelu vs Relu", ours, relu_fused)
            .with_goal(EPOCH_GOAL),
        Samples::new(l, u).row(
            "epoch LeakyRelu vs Relu unfused",
            ours,
            "epoch, built-in Relu, --no-fuse",
        ),
        Samples::new(p, r).row(
            "epoch LeakyRelu no epilogue vs Relu",
            "epoch, LeakyRelu without an epilogue (not fused)",
            relu_fused,
        ),
    ])
}
