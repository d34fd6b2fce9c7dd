//! Training with momentum and Adam (`TrainConfig::with_optimizer`): both train the spirals at
//! least as well as SGD at their default settings; their state lives in the workspace beside
//! each parameter, on its device; data-parallel training on two OpenCL devices and distributed
//! training over ranks that are threads reach the single-device loss with Adam; ranks whose
//! optimizers differ are named.

use std::sync::Arc;

use syncmem::{Device, Tensor, Workspace};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::collective::{Collective, Local};
use syncmem_nn::train::{Optimizer, TrainConfig, Trainer};

/// The host values of tensor `name` of `ws`, and its dims.
fn tensor(ws: &Workspace, name: &str) -> (Vec<f32>, Vec<usize>) {
    let blob = ws.get_blob(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let guard = blob.read();
    let t = guard.get::<Tensor>().unwrap();
    let values = t.host::<f32>().unwrap().to_vec();
    (values, t.dims().to_vec())
}

/// Final accuracy and loss over the training set after `cfg.epochs` epochs.
fn train(device: &Device, data: &Dataset, cfg: &TrainConfig) -> (f64, f64) {
    let mut t = Trainer::new(device, data, cfg).unwrap();
    for _ in 0..cfg.epochs {
        t.run_epoch().unwrap();
    }
    let (loss, accuracy) = t.evaluate().unwrap();
    (accuracy, loss)
}

/// The spirals of `syncmem train` (three arms of 1000 points) for seeds 0, 1 and 2, ten epochs
/// (a third of the default run: the optimizers differ most early) at each optimizer's default
/// learning rate: the mean accuracy of momentum and of Adam is at least SGD's. (At the default
/// 30 epochs all three end above 99% and within a few samples of each other.)
#[test]
fn momentum_and_adam_train_the_spirals_as_well_as_sgd_or_better() {
    let cpu = Device::cpu();
    let mean = |optimizer: Optimizer| {
        let (mut accuracy, mut loss) = (0.0, 0.0);
        for seed in 0..3 {
            let data = Dataset::spirals(1000, 3, 0.2, seed);
            let cfg = TrainConfig::default()
                .with_epochs(10)
                .with_seed(seed)
                .with_optimizer(optimizer);
            let (a, l) = train(&cpu, &data, &cfg);
            eprintln!(
                "{optimizer} at lr {}, seed {seed}: accuracy {a:.4}, loss {l:.4}",
                cfg.lr
            );
            accuracy += a / 3.0;
            loss += l / 3.0;
        }
        (accuracy, loss)
    };
    let sgd = mean(Optimizer::Sgd);
    for optimizer in [Optimizer::Momentum, Optimizer::Adam] {
        let (accuracy, loss) = mean(optimizer);
        eprintln!(
            "{optimizer}: mean accuracy {accuracy:.4}, loss {loss:.4}; sgd {:.4}, {:.4}",
            sgd.0, sgd.1
        );
        assert!(
            accuracy >= sgd.0,
            "{optimizer}: mean accuracy {accuracy} below sgd's {}",
            sgd.0
        );
        assert!(accuracy > 0.98, "{optimizer}: {accuracy}");
    }
}

#[test]
fn the_state_lives_beside_each_parameter_and_moves() {
    let data = Dataset::spirals(100, 3, 0.2, 0);
    let cpu = Device::cpu();
    for (optimizer, suffixes) in [
        (Optimizer::Momentum, &["_momentum"][..]),
        (Optimizer::Adam, &["_m", "_v"][..]),
    ] {
        let cfg = TrainConfig::default()
            .with_epochs(1)
            .with_optimizer(optimizer);
        let mut t = Trainer::new(&cpu, &data, &cfg).unwrap();
        let types: Vec<&str> = t
            .nets()
            .train
            .ops
            .iter()
            .map(|o| o.op_type.as_str())
            .collect();
        assert!(types.contains(&optimizer.op_type()), "{types:?}");
        assert!(!types.contains(&"SGD"), "{types:?}");
        let params = t.nets().params.clone();
        for p in &params {
            let (_, dims) = tensor(t.workspace(), p);
            for s in suffixes {
                let (values, sdims) = tensor(t.workspace(), &format!("{p}{s}"));
                assert_eq!(sdims, dims, "{p}{s}");
                assert!(values.iter().all(|&v| v == 0.0), "{p}{s} starts at zero");
            }
        }
        t.step(0).unwrap();
        for p in &params {
            for s in suffixes {
                let (values, _) = tensor(t.workspace(), &format!("{p}{s}"));
                assert!(values.iter().any(|&v| v != 0.0), "{p}{s} after a step");
            }
        }
        assert_eq!(optimizer.state_suffixes(), suffixes);
    }
}

/// Loss of the last of `epochs` epochs.
#[cfg(feature = "opencl")]
fn last_loss(t: &mut Trainer, epochs: usize) -> f64 {
    (0..epochs)
        .map(|_| t.run_epoch().unwrap().loss)
        .last()
        .unwrap()
}

#[cfg(feature = "opencl")]
#[test]
fn adam_on_two_opencl_devices_reaches_the_single_device_loss() {
    use syncmem::BackendKind;
    let Some((a, b)) = syncmem::testing::two_or_skip(BackendKind::OpenCl, "data parallel, adam")
    else {
        return;
    };
    let data = Dataset::spirals(300, 3, 0.2, 0);
    for optimizer in [Optimizer::Adam, Optimizer::Momentum] {
        let cfg = TrainConfig::default()
            .with_epochs(3)
            .with_optimizer(optimizer);
        let mut one = Trainer::new(&a, &data, &cfg).unwrap();
        let mut two = Trainer::data_parallel(&[a.clone(), b.clone()], &data, &cfg).unwrap();
        let (l1, l2) = (last_loss(&mut one, 3), last_loss(&mut two, 3));
        eprintln!(
            "{optimizer}: loss {l2} on two devices, {l1} on one (difference {:e})",
            l2 - l1
        );
        assert!((l2 - l1).abs() < 1e-4, "{optimizer}: {l2} vs {l1}");
        let (e1, e2) = (one.evaluate().unwrap().0, two.evaluate().unwrap().0);
        assert!(
            (e2 - e1).abs() < 1e-4,
            "{optimizer}: evaluation {e2} vs {e1}"
        );
        // The state lives once, in the trainer's workspace, on the first device, and holds
        // what one device's training gives.
        for p in &two.nets().params {
            for s in optimizer.state_blobs(p) {
                {
                    let blob = two.workspace().get_blob(&s).unwrap();
                    let guard = blob.read();
                    let m = guard.get::<Tensor>().unwrap().synced().unwrap();
                    assert!(m.target().unwrap().same(&a), "{s}");
                    assert!(m.replica_devices().is_empty(), "{s} is read only there");
                }
                let (got, want) = (tensor(two.workspace(), &s).0, tensor(one.workspace(), &s).0);
                assert!(got.iter().any(|&v| v != 0.0), "{s} was updated");
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                assert!(worst < 1e-5, "{s}: {worst} from one device's");
            }
        }
    }
}

/// Trains on `ranks` ranks that are threads of this process, each on `cpu`; returns each
/// rank's epoch losses and parameters.
fn distributed(ranks: usize, data: &Dataset, cfg: &TrainConfig) -> Vec<(Vec<f64>, Vec<f32>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = Local::group(ranks)
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut t =
                        Trainer::distributed(&[Device::cpu()], data, cfg, Arc::new(c)).unwrap();
                    let losses = (0..cfg.epochs)
                        .map(|_| t.run_epoch().unwrap().loss)
                        .collect();
                    let params = t
                        .nets()
                        .params
                        .iter()
                        .flat_map(|p| tensor(t.workspace(), p).0)
                        .collect();
                    (losses, params)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn distributed_adam_reaches_the_single_process_loss() {
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let cfg = TrainConfig::default()
        .with_epochs(2)
        .with_optimizer(Optimizer::Adam);
    let mut one = Trainer::new(&Device::cpu(), &data, &cfg).unwrap();
    let want: Vec<f64> = (0..cfg.epochs)
        .map(|_| one.run_epoch().unwrap().loss)
        .collect();
    let ranks = distributed(2, &data, &cfg);
    for (r, (losses, params)) in ranks.iter().enumerate() {
        for (e, (&l, &w)) in losses.iter().zip(&want).enumerate() {
            eprintln!(
                "adam, rank {r}, epoch {}: loss {l} vs {w} on one process",
                e + 1
            );
            assert!(
                (l - w).abs() < 1e-4 * w,
                "rank {r} epoch {}: {l} vs {w}",
                e + 1
            );
        }
        assert_eq!(
            params, &ranks[0].1,
            "rank {r}'s parameters differ from rank 0's"
        );
    }
}

#[test]
fn a_rank_with_another_optimizer_is_named() {
    let data = Dataset::spirals(30, 3, 0.2, 0);
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = Local::group(2)
            .into_iter()
            .map(|c| {
                let data = &data;
                s.spawn(move || {
                    let optimizer = [Optimizer::Adam, Optimizer::Momentum][c.rank()];
                    // The same learning rate: only the optimizer differs.
                    let cfg = TrainConfig::default()
                        .with_optimizer(optimizer)
                        .with_lr(0.01);
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
        assert!(e.contains("rank(s) 1") && e.contains("optimizer"), "{e}");
    }
}
