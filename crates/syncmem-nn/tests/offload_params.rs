//! The parameters offloaded between steps (`TrainConfig::offload_parameters`): after every
//! step the device holds none of them (their device memory is free), each step brings them up
//! layer by layer (each ahead of its first reader) and writes them back, and training ends bit for bit where it ends with the parameters kept
//! on the device (the data moves, the arithmetic does not change), with either optimizer
//! placement.

use syncmem::{BackendKind, Device, Head, ZeroCopy};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{Optimizer, TrainConfig, Trainer};

/// What a run ends with.
struct Run {
    losses: Vec<f64>,
    params: Vec<Vec<f32>>,
    /// The parameters' heads after training.
    heads: Vec<Head>,
    /// Bytes of the device pool handed out after the last step and charged to the device (a
    /// block spilled in place, where the host uses the device's memory in place, is the host's:
    /// `PoolStats::parked_bytes`).
    allocated: u64,
    /// Bytes of the parameters.
    param_bytes: u64,
    /// Bytes brought to the device and written back in the last step.
    up: u64,
    back: u64,
    /// The device pool's peak of bytes handed out in the last epoch.
    peak: u64,
    /// The moves within the steps (offloaded parameters only).
    moves: Option<syncmem_nn::train::OffloadMoves>,
    /// Per parameter: whether its host mirrors are pinned memory of the device.
    pinned: Vec<bool>,
    /// Bytes of the device's pinned pool handed out after training.
    pinned_bytes: u64,
}

fn run(dev: &Device, cfg: &TrainConfig) -> Run {
    let data = Dataset::spirals(200, 3, 0.2, 0);
    let mut t = Trainer::new(dev, &data, cfg).unwrap();
    let losses = (0..cfg.epochs)
        .map(|e| {
            if e + 1 == cfg.epochs {
                dev.reset_peak_stats();
            }
            t.run_epoch().unwrap().loss
        })
        .collect();
    let s = dev.pool_stats().unwrap();
    let allocated = s.allocated.current - s.parked_bytes;
    let last = t.transfers().last_step;
    let (mut params, mut heads, mut param_bytes) = (Vec::new(), Vec::new(), 0);
    let mut pinned = Vec::new();
    for p in &t.nets().params {
        let (head, pin) = t
            .workspace()
            .with_tensor(p, |t| {
                Ok((
                    t.synced().map(|m| m.head()),
                    t.synced().is_some_and(|m| m.pinned_host()),
                ))
            })
            .unwrap();
        heads.extend(head);
        pinned.push(pin);
        let values = t.workspace().fetch::<f32>(p).unwrap();
        param_bytes += values.len() as u64 * 4;
        params.push(values);
    }
    Run {
        losses,
        params,
        heads,
        allocated,
        param_bytes,
        up: last.host_to_device.bytes + last.refilled.bytes,
        back: last.device_to_host.bytes + last.spilled.bytes,
        peak: s.allocated.peak,
        moves: t.parameter_offload(),
        pinned,
        pinned_bytes: dev.pinned_pool_stats().map_or(0, |p| p.allocated.current),
    }
}

fn check(dev: &Device) {
    for (optimizer, on_host) in [
        (Optimizer::Sgd, false),
        (Optimizer::Adam, false),
        (Optimizer::Momentum, true),
    ] {
        let cfg = TrainConfig::default()
            .with_optimizer(optimizer)
            .with_epochs(2)
            .with_offload_optimizer(on_host);
        // Handles of their own with `dev`'s zero-copy setting (an isolated handle starts
        // with the environment's).
        let own = || {
            let d = dev.isolated();
            d.set_zero_copy(dev.zero_copy());
            d
        };
        let kept = run(&own(), &cfg);
        let off = run(&own(), &cfg.clone().with_offload_parameters(true));
        eprintln!(
            "{} {optimizer:?} (update on the host: {on_host}): {} B of parameters; after the \
             steps {} B allocated on the device kept, {} B offloaded; last step up {} B, back \
             {} B",
            dev.label(),
            off.param_bytes,
            kept.allocated,
            off.allocated,
            off.up,
            off.back
        );
        let m = off.moves.expect("the moves of offloaded parameters");
        assert!(kept.moves.is_none());
        eprintln!(
            "  peak in a step: {} B kept, {} B offloaded; moves within the steps {m:?}",
            kept.peak, off.peak
        );
        assert_eq!(off.losses, kept.losses, "the losses, bit for bit");
        // Layer by layer: every parameter the net reads is brought up ahead of its first
        // reader each step (a few before the run); with the update on the device, each goes
        // back as soon as its layer is updated (all but the last one updated).
        assert_eq!(m.planned, off.params.len(), "{m:?}");
        assert!(m.refills >= m.planned as u64, "{m:?}");
        assert_eq!(m.offloads > 0, !on_host, "{m:?}");
        assert_eq!(off.params, kept.params, "the parameters, bit for bit");
        assert!(
            off.heads.iter().all(|h| *h == Head::AtHost),
            "no parameter is on the device between steps: {:?}",
            off.heads
        );
        assert!(
            kept.allocated >= off.allocated + off.param_bytes,
            "the parameters' device memory is free between steps: {} B kept, {} B offloaded",
            kept.allocated,
            off.allocated
        );
        check_pinned(dev, on_host, &kept, &off);
        // Two mirrors (zero-copy off): the bytes go up and come back every step (with the
        // update on the host the device copies are stale: nothing comes back but the
        // gradients, as with the optimizer offloaded alone).
        if dev.zero_copy_protocol().is_none() {
            assert!(
                off.peak <= kept.peak,
                "{} B against {} B",
                off.peak,
                kept.peak
            );
            assert!(m.bytes_up > 0, "{m:?}");
            assert!(off.up >= off.param_bytes, "up {} B", off.up);
            if !on_host {
                assert!(off.back >= off.param_bytes, "back {} B", off.back);
            }
        }
    }
}

/// Where the device keeps two mirrors (not on `cpu`, whose memory is the host's), the
/// parameters offloaded and those the update on the host reads (`on_host`) keep their host
/// copies in pinned memory; elsewhere they share memory with the device, and nothing is pinned.
fn check_pinned(dev: &Device, on_host: bool, kept: &Run, off: &Run) {
    let pins = dev.zero_copy_protocol().is_none() && dev.backend() != BackendKind::Cpu;
    assert_eq!(
        off.pinned,
        vec![pins; off.pinned.len()],
        "offloaded parameters"
    );
    assert_eq!(
        kept.pinned,
        vec![pins && on_host; kept.pinned.len()],
        "kept ones"
    );
    if pins {
        assert!(
            off.pinned_bytes >= off.param_bytes,
            "the parameters' host copies are pinned: {} B of {} B",
            off.pinned_bytes,
            off.param_bytes
        );
    } else {
        assert_eq!((off.pinned_bytes, kept.pinned_bytes), (0, 0));
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
fn offloaded_parameters_train_as_kept_ones_on_cpu() {
    each_setting(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn offloaded_parameters_train_as_kept_ones_on_opencl() {
    let devs = Device::all(syncmem::BackendKind::OpenCl).unwrap_or_default();
    let Some(dev) = devs.first() else {
        assert!(
            std::env::var("SYNCMEM_REQUIRE_OPENCL").as_deref() != Ok("1"),
            "SYNCMEM_REQUIRE_OPENCL=1 but no OpenCL device"
        );
        eprintln!("SKIPPED offloaded_parameters_train_as_kept_ones_on_opencl: no OpenCL device");
        return;
    };
    each_setting(dev);
}

#[test]
fn offloaded_parameters_are_refused_on_several_devices() {
    let data = Dataset::spirals(60, 3, 0.2, 0);
    let cfg = TrainConfig::default()
        .with_epochs(1)
        .with_offload_parameters(true);
    let devs = [Device::cpu().isolated(), Device::cpu().isolated()];
    let err = Trainer::data_parallel(&devs, &data, &cfg)
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("offloading the parameters"),
        "{err}"
    );
}

/// Where the parameters outweigh the activations (wide layers, small batches), bringing them
/// in layer by layer and sending each back once its layer is updated lowers the device's peak
/// in a step: the device never holds every weight and every gradient at once.
#[test]
fn offloaded_parameters_lower_the_peak_of_a_wide_net() {
    let dev = Device::cpu().isolated();
    dev.set_zero_copy(ZeroCopy::Off);
    let own = || {
        let d = dev.isolated();
        d.set_zero_copy(ZeroCopy::Off);
        d
    };
    let cfg = TrainConfig::default()
        .with_hidden(vec![256, 256, 256])
        .with_batch(16)
        .with_epochs(2);
    let kept = run(&own(), &cfg);
    let off = run(&own(), &cfg.clone().with_offload_parameters(true));
    eprintln!(
        "{} B of parameters; peak in a step {} B kept, {} B offloaded",
        off.param_bytes, kept.peak, off.peak
    );
    assert_eq!(off.losses, kept.losses, "the losses, bit for bit");
    assert_eq!(off.params, kept.params, "the parameters, bit for bit");
    assert!(
        off.peak + off.param_bytes / 4 < kept.peak,
        "the peak falls by a good part of the parameters: {} B kept, {} B offloaded, {} B of \
         parameters",
        kept.peak,
        off.peak,
        off.param_bytes
    );
}
