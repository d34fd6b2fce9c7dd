//! The activations offloaded between forward and backward (`TrainConfig::offload_activations`,
//! as vDNN does): training ends bit for bit where it ends with them kept on the device, the
//! device's peak in a step is lower (the training net unplanned, its dead values dropped at
//! once), and where the host uses the device's memory in place nothing is copied.

use syncmem::{BackendKind, Device, ZeroCopy};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::activations::OffloadMoves;
use syncmem_nn::train::{Optimizer, TrainConfig, Trainer};

/// What a run ends with.
struct Run {
    losses: Vec<f64>,
    params: Vec<Vec<f32>>,
    /// The device pool's peak of bytes handed out in the last epoch, less the bytes spilled in
    /// place then (`PoolStats::parked_bytes`, the host's).
    peak: u64,
    moved: Option<OffloadMoves>,
    steps: u64,
    /// The peak of bytes handed out by the device's pinned pool.
    pinned_peak: u64,
}

fn run(dev: &Device, cfg: &TrainConfig) -> Run {
    let data = Dataset::spirals(1024, 3, 0.2, 0);
    let mut t = Trainer::new(dev, &data, cfg).unwrap();
    let mut losses = Vec::new();
    for e in 0..cfg.epochs {
        if e + 1 == cfg.epochs {
            dev.reset_peak_stats();
        }
        losses.push(t.run_epoch().unwrap().loss);
    }
    let s = dev.pool_stats().unwrap();
    let params = t
        .nets()
        .params
        .iter()
        .map(|p| t.workspace().fetch::<f32>(p).unwrap())
        .collect();
    Run {
        losses,
        params,
        peak: s.allocated.peak,
        moved: t.activation_offload(),
        steps: t.transfers().step_count,
        pinned_peak: dev.pinned_pool_stats().map_or(0, |p| p.allocated.peak),
    }
}

fn check(dev: &Device) {
    for (optimizer, fuse, plan) in [
        (Optimizer::Sgd, true, true),
        (Optimizer::Adam, false, true),
        (Optimizer::Momentum, true, false),
    ] {
        // Activations outweigh the parameters (and Adam's state): narrow layers, large batches.
        let cfg = TrainConfig::default()
            .with_hidden(vec![64; 6])
            .with_batch(512)
            .with_optimizer(optimizer)
            .with_fuse(fuse)
            .with_plan(plan)
            .with_epochs(2);
        let own = || {
            let d = dev.isolated();
            d.set_zero_copy(dev.zero_copy());
            d
        };
        let kept = run(&own(), &cfg);
        let off = run(&own(), &cfg.clone().with_offload_activations(true));
        let m = off.moved.expect("the offload's counts");
        eprintln!(
            "{} {optimizer:?} fuse {fuse} plan {plan}: peak {} B kept, {} B offloaded; {m:?} \
             over {} steps",
            dev.label(),
            kept.peak,
            off.peak,
            off.steps
        );
        assert!(kept.moved.is_none());
        assert_eq!(off.losses, kept.losses, "the losses, bit for bit");
        assert_eq!(off.params, kept.params, "the parameters, bit for bit");
        assert!(m.planned > 0, "the plan moves something: {m:?}");
        assert!(m.offloads >= off.steps, "values leave every step: {m:?}");
        assert!(m.refills >= off.steps, "and come back every step: {m:?}");
        // Where the device keeps two mirrors (not on `cpu`, whose memory is the host's), the
        // values that leave land in pinned host memory; nothing else of these runs is pinned.
        let pins = dev.zero_copy_protocol().is_none() && dev.backend() != BackendKind::Cpu;
        assert_eq!(kept.pinned_peak, 0, "nothing pinned when nothing leaves");
        assert_eq!(off.pinned_peak > 0, pins, "{} B pinned", off.pinned_peak);
        if dev.zero_copy_protocol().is_none() {
            // Two mirrors: the bytes go down and up, and the device's peak falls by a good
            // part (the training net unplanned, its dead values dropped at once).
            assert!(m.bytes_down > 0 && m.bytes_up > 0, "{m:?}");
            assert!(
                off.peak < kept.peak - kept.peak / 10,
                "the device's peak falls: {} B kept, {} B offloaded",
                kept.peak,
                off.peak
            );
        }
    }
}

fn each_setting(dev: &Device) {
    check(dev);
    // As on a discrete device: two mirrors, the copies made.
    let two = dev.isolated();
    two.set_zero_copy(ZeroCopy::Off);
    check(&two);
}

#[test]
fn offloaded_activations_train_as_kept_ones_on_cpu() {
    each_setting(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn offloaded_activations_train_as_kept_ones_on_opencl() {
    let test = "offloaded_activations_train_as_kept_ones_on_opencl";
    if let Some(dev) = syncmem::testing::opencl_or_skip(test) {
        each_setting(&dev);
    }
}

/// Data-parallel training refuses the option by name.
#[test]
fn offloaded_activations_are_refused_on_several_devices() {
    let cfg = TrainConfig::default().with_offload_activations(true);
    let devs = [Device::cpu().isolated(), Device::cpu().isolated()];
    let err = Trainer::data_parallel(&devs, &Dataset::spirals(60, 3, 0.2, 0), &cfg).err();
    let err = err.expect("refused").to_string();
    assert!(err.contains("offloading the activations"), "{err}");
}
