//! Distributed training (`Trainer::distributed`) over ranks that are threads of this process
//! (`collective::Local`): the same seed reaches the single-process loss on the same global
//! batches, every rank holds the same parameters bit for bit, buckets split as asked, and a
//! rank whose data or seed differs is named. The same trainer over MPI processes is tested
//! by the command's tests under `mpirun` (feature `mpi`).

use std::sync::Arc;

use syncmem::{Device, Tensor};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::collective::{Collective, Local};
use syncmem_nn::train::{TrainConfig, Trainer};

/// What one rank ends with: each epoch's loss, the final evaluation, the parameters.
struct Outcome {
    losses: Vec<f64>,
    evaluation: (f64, f64),
    params: Vec<Vec<f32>>,
    buckets: Vec<usize>,
    comm: syncmem_nn::train::CommStats,
    steps_per_epoch: usize,
}

fn params(t: &Trainer) -> Vec<Vec<f32>> {
    t.nets()
        .params
        .iter()
        .map(|p| {
            let blob = t.workspace().get_blob(p).unwrap();
            let guard = blob.read();
            let values = guard
                .get::<Tensor>()
                .unwrap()
                .host::<f32>()
                .unwrap()
                .to_vec();
            values
        })
        .collect()
}

fn train_rank(c: Local, devices: Vec<Device>, data: &Dataset, cfg: &TrainConfig) -> Outcome {
    let mut t = Trainer::distributed(&devices, data, cfg, Arc::new(c)).unwrap();
    let losses = (0..cfg.epochs)
        .map(|_| t.run_epoch().unwrap().loss)
        .collect();
    let evaluation = t.evaluate().unwrap();
    Outcome {
        losses,
        evaluation,
        params: params(&t),
        buckets: t.bucket_sizes(),
        comm: t.comm().unwrap(),
        steps_per_epoch: t.batch_count(),
    }
}

/// Trains on `ranks` ranks, each on the devices `devices(rank)` gives.
fn distributed(
    ranks: usize,
    devices: impl Fn(usize) -> Vec<Device> + Sync,
    data: &Dataset,
    cfg: &TrainConfig,
) -> Vec<Outcome> {
    std::thread::scope(|s| {
        let handles: Vec<_> = Local::group(ranks)
            .into_iter()
            .map(|c| {
                let devs = devices(c.rank());
                s.spawn(move || train_rank(c, devs, data, cfg))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn single(device: &Device, data: &Dataset, cfg: &TrainConfig) -> (Vec<f64>, (f64, f64)) {
    let mut t = Trainer::new(device, data, cfg).unwrap();
    let losses = (0..cfg.epochs)
        .map(|_| t.run_epoch().unwrap().loss)
        .collect();
    (losses, t.evaluate().unwrap())
}

/// Relative difference of `a` from `b`.
fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

fn check_against_single(ranks: usize, device: &Device, cfg: &TrainConfig) {
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let (want, want_eval) = single(device, &data, cfg);
    let got = distributed(ranks, |_| vec![device.clone()], &data, cfg);
    for (r, o) in got.iter().enumerate() {
        for (e, (&l, &w)) in o.losses.iter().zip(&want).enumerate() {
            eprintln!(
                "{} ranks on {}, rank {r}, epoch {}: loss {l} vs {w} on one process \
                 (relative difference {:e})",
                ranks,
                device.label(),
                e + 1,
                rel(l, w)
            );
            assert!(rel(l, w) < 1e-5, "rank {r} epoch {}: {l} vs {w}", e + 1);
        }
        assert!(rel(o.evaluation.0, want_eval.0) < 1e-5);
        assert_eq!(
            o.params, got[0].params,
            "rank {r}'s parameters differ from rank 0's"
        );
        assert_eq!(o.comm.ranks, ranks);
        assert_eq!(o.comm.steps as usize, cfg.epochs * o.steps_per_epoch);
    }
}

#[test]
fn two_and_three_ranks_on_cpu_reach_the_single_process_loss() {
    let cfg = TrainConfig::default().with_epochs(2);
    check_against_single(2, &Device::cpu(), &cfg);
    check_against_single(3, &Device::cpu(), &cfg);
}

#[test]
fn overlap_off_and_tiny_buckets_give_the_same_training() {
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let cfg = TrainConfig::default().with_epochs(1);
    let a = distributed(2, |_| vec![Device::cpu()], &data, &cfg);
    let small = cfg.clone().with_bucket_bytes(1024).with_overlap(false);
    let b = distributed(2, |_| vec![Device::cpu()], &data, &small);
    // In the order backward writes them: fc3's weights and bias (780 bytes), fc2's weights
    // (16 KiB, alone), then fc2's bias and fc1's weights and bias (1 KiB).
    assert_eq!(a[0].buckets, [195 + 4096 + 256]);
    assert_eq!(b[0].buckets, [195, 4096, 256]);
    assert_eq!(b[0].buckets.iter().sum::<usize>(), a[0].buckets[0]);
    assert_eq!(a[0].params, b[0].params);
    assert_eq!(a[0].comm.bytes, b[0].comm.bytes);
}

#[test]
fn a_rank_with_another_seed_is_named() {
    let data = Dataset::spirals(90, 3, 0.2, 0);
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = Local::group(3)
            .into_iter()
            .map(|c| {
                let data = &data;
                s.spawn(move || {
                    let seed = if c.rank() == 2 { 7 } else { 0 };
                    let cfg = TrainConfig::default().with_seed(seed);
                    match Trainer::distributed(&[Device::cpu()], data, &cfg, Arc::new(c)) {
                        Ok(_) => String::new(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert!(
            e.contains("initial parameters of rank(s) 2 differ"),
            "every rank names rank 2: {e}"
        );
    }
}

#[test]
fn a_rank_with_no_rows_in_a_batch_still_takes_part() {
    // 5 ranks, batches of 4: rank 4 never has rows, the others one each.
    let data = Dataset::spirals(40, 2, 0.2, 0);
    let cfg = TrainConfig::default().with_batch(4).with_epochs(1);
    let (want, _) = single(&Device::cpu(), &data, &cfg);
    let got = distributed(5, |_| vec![Device::cpu()], &data, &cfg);
    for o in &got {
        assert!(
            rel(o.losses[0], want[0]) < 1e-5,
            "{} vs {}",
            o.losses[0],
            want[0]
        );
        assert_eq!(o.params, got[0].params);
    }
}

#[cfg(feature = "opencl")]
#[test]
fn ranks_on_opencl_and_with_two_devices_each_reach_the_single_process_loss() {
    let Some(devs) = opencl_devices(2) else {
        return;
    };
    let cfg = TrainConfig::default().with_epochs(2);
    check_against_single(2, &devs[0], &cfg);
    // Two ranks of two devices each (data parallel inside each rank).
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let (want, _) = single(&devs[0], &data, &cfg);
    let got = distributed(2, |_| devs.clone(), &data, &cfg);
    for o in &got {
        for (&l, &w) in o.losses.iter().zip(&want) {
            assert!(rel(l, w) < 1e-5, "{l} vs {w}");
        }
        assert_eq!(o.params, got[0].params);
    }
}

/// A rank of two devices beside a rank of one, with a gradient alone in a bucket (summed
/// straight from it when every rank has the same share of the batch): the ranks' gradients
/// are weighed alike, whatever their devices.
#[cfg(feature = "opencl")]
#[test]
fn ranks_with_different_device_counts_reach_the_single_process_loss() {
    let Some(devs) = opencl_devices(2) else {
        return;
    };
    let data = Dataset::spirals(300, 3, 0.2, 0);
    // Batches of 42 rows: 21 a rank, 11 and 10 on the devices of rank 0.
    for cfg in [
        TrainConfig::default().with_epochs(2),
        TrainConfig::default()
            .with_epochs(2)
            .with_bucket_bytes(1024),
        TrainConfig::default()
            .with_epochs(2)
            .with_bucket_bytes(1024)
            .with_batch(42),
    ] {
        let (want, _) = single(&devs[0], &data, &cfg);
        let got = distributed(
            2,
            |r| match r {
                0 => devs.clone(),
                _ => vec![devs[1].clone()],
            },
            &data,
            &cfg,
        );
        for o in &got {
            for (&l, &w) in o.losses.iter().zip(&want) {
                assert!(rel(l, w) < 1e-5, "{l} vs {w}");
            }
            assert_eq!(o.params, got[0].params);
        }
    }
}

#[cfg(feature = "opencl")]
fn opencl_devices(n: usize) -> Option<Vec<Device>> {
    let devs = syncmem::Device::all(syncmem::BackendKind::OpenCl).unwrap_or_default();
    if devs.len() >= n {
        return Some(devs.into_iter().take(n).collect());
    }
    if std::env::var("SYNCMEM_REQUIRE_OPENCL").is_ok_and(|v| v == "1") {
        panic!(
            "SYNCMEM_REQUIRE_OPENCL=1 but only {} OpenCL device(s)",
            devs.len()
        );
    }
    eprintln!("SKIPPED: {n} OpenCL devices needed, {} present", devs.len());
    None
}

/// One epoch of 2 ranks on `dev` with zero-copy set to `zc`: the sums' figures.
fn staged(dev: &Device, zc: syncmem::ZeroCopy) -> (syncmem_nn::train::CommStats, bool) {
    let d = dev.detached();
    d.set_zero_copy(zc);
    let shared = d.zero_copy_protocol().is_some();
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let cfg = TrainConfig::default().with_epochs(1);
    let got = distributed(2, |_| vec![d.clone()], &data, &cfg);
    (got[0].comm, shared)
}

/// Staging through the host mirrors moves no byte where the device's memory is host memory,
/// and one counted device-to-host copy of every gradient per step where it is not.
fn check_staging(dev: &Device) {
    for zc in [syncmem::ZeroCopy::Auto, syncmem::ZeroCopy::Off] {
        let (c, shared) = staged(dev, zc);
        let copies = c.staging_copies;
        eprintln!(
            "{} zero-copy {zc:?} (shared: {shared}): {} steps, {} bytes summed, staging copied \
             {} bytes to the host, {} to the device",
            dev.label(),
            c.steps,
            c.bytes,
            copies.device_to_host.bytes,
            copies.host_to_device.bytes
        );
        assert_eq!(copies.host_to_device.bytes, 0);
        if shared {
            assert_eq!(copies.device_to_host.bytes, 0, "{}", dev.label());
        } else {
            assert_eq!(copies.device_to_host.bytes, c.bytes, "{}", dev.label());
        }
    }
}

#[test]
fn staging_copies_nothing_where_memory_is_shared_and_counts_copies_elsewhere() {
    check_staging(&Device::cpu());
    #[cfg(feature = "opencl")]
    if let Some(devs) = opencl_devices(1) {
        check_staging(&devs[0]);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn ranks_on_cuda_stage_through_the_host_and_reach_the_single_process_loss() {
    let dev = match Device::open("cuda:0") {
        Ok(d) => d,
        Err(e) => {
            assert!(
                std::env::var("SYNCMEM_REQUIRE_CUDA").as_deref() != Ok("1"),
                "SYNCMEM_REQUIRE_CUDA=1 but cuda:0 did not open: {e}"
            );
            eprintln!("SKIPPED ranks_on_cuda_stage_through_the_host: {e}");
            return;
        }
    };
    check_staging(&dev);
    check_against_single(2, &dev, &TrainConfig::default().with_epochs(2));
}
