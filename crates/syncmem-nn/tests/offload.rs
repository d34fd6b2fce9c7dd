//! The optimizer offloaded to the host (`TrainConfig::offload_optimizer`): the state never
//! reaches the device, the device holds less, each step moves the gradients down and the
//! parameters up, and training ends where training with the update on the device does, bit
//! for bit: the device's update kernels round every operation as the host's update does.

use syncmem::Device;
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{Optimizer, TrainConfig, Trainer};

/// Losses of each epoch, every parameter after them, the device's peak reserved bytes, and the
/// bytes copied per step.
struct Run {
    losses: Vec<f64>,
    params: Vec<Vec<f32>>,
    peak: u64,
    bytes_per_step: f64,
    param_bytes: usize,
    /// Host waits of the last step (the stepping thread's).
    waits: u64,
}

fn run(dev: &Device, optimizer: Optimizer, offload: bool) -> Run {
    // A handle of its own with `dev`'s zero-copy setting (an isolated handle starts with the
    // environment's).
    let own = dev.isolated();
    own.set_zero_copy(dev.zero_copy());
    let dev = own;
    let data = Dataset::spirals(200, 3, 0.2, 0);
    let cfg = TrainConfig::default()
        .with_optimizer(optimizer)
        .with_epochs(3)
        .with_offload_optimizer(offload);
    let mut t = Trainer::new(&dev, &data, &cfg).unwrap();
    assert_eq!(t.update_device().is_some(), offload);
    let losses = (0..cfg.epochs)
        .map(|_| t.run_epoch().unwrap().loss)
        .collect();
    let mut params = Vec::new();
    let mut param_bytes = 0;
    for p in &t.nets().params {
        let values = t.workspace().fetch::<f32>(p).unwrap();
        param_bytes += values.len() * 4;
        params.push(values);
    }
    let tr = t.transfers();
    Run {
        losses,
        params,
        peak: dev.pool_stats().unwrap().reserved.peak,
        bytes_per_step: tr.steps.total_bytes() as f64 / tr.step_count as f64,
        param_bytes,
        waits: tr.waits.last_step,
    }
}

fn check(dev: &Device) {
    for optimizer in [Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adam] {
        let on = run(dev, optimizer, false);
        let off = run(dev, optimizer, true);
        eprintln!(
            "{} {optimizer:?}: device peak {} B on the device, {} B offloaded; {:.0} B copied \
             per step offloaded ({} B of parameters); losses {:?} / {:?}",
            dev.label(),
            on.peak,
            off.peak,
            off.bytes_per_step,
            off.param_bytes,
            on.losses,
            off.losses
        );
        assert_eq!(off.losses, on.losses, "{optimizer:?}: the same losses");
        assert_eq!(off.params, on.params, "{optimizer:?}: the same parameters");
        // With two mirrors: the loss's read, and the gradients' copies down waited for once
        // (not once per gradient). Shared memory mapped for the host waits for each map.
        if dev.zero_copy_protocol().is_none() {
            assert!(
                off.waits <= 2,
                "{optimizer:?}: {} host waits a step",
                off.waits
            );
        }
        if optimizer != Optimizer::Sgd {
            assert!(
                off.peak < on.peak,
                "{optimizer:?}: the state is off the device ({} < {})",
                off.peak,
                on.peak
            );
        }
        // Gradients down and parameters up, once each a step: at least 2 x the parameters
        // (plus the batch's labels and scalars read back). Where the device keeps two mirrors
        // (SYNCMEM_ZERO_COPY=off, a discrete GPU) each goes through the buffer's host mirror
        // on its way to or from the host device's replica: a second, host-side copy, counted
        // too.
        let copies = if dev.zero_copy_protocol().is_some() {
            2.0
        } else {
            4.0
        };
        assert!(
            off.bytes_per_step >= 2.0 * off.param_bytes as f64,
            "{optimizer:?}: {} B a step",
            off.bytes_per_step
        );
        assert!(
            off.bytes_per_step < copies * off.param_bytes as f64 + 4096.0,
            "{optimizer:?}: nothing but gradients and parameters move ({} B a step)",
            off.bytes_per_step
        );
    }
}

#[test]
fn offloaded_optimizers_train_as_on_the_device_on_cpu() {
    check(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn offloaded_optimizers_train_as_on_the_device_on_opencl() {
    let test = "offloaded_optimizers_train_as_on_the_device_on_opencl";
    if let Some(dev) = syncmem::testing::opencl_or_skip(test) {
        check(&dev);
        // As on a discrete device: two mirrors, the copies made.
        let two = dev.isolated();
        two.set_zero_copy(syncmem::ZeroCopy::Off);
        check(&two);
    }
}

#[test]
fn an_offloaded_optimizer_is_refused_on_several_devices() {
    let cpu = Device::cpu();
    let data = Dataset::spirals(20, 3, 0.2, 0);
    let cfg = TrainConfig::default().with_offload_optimizer(true);
    let Err(e) = Trainer::data_parallel(&[cpu.isolated(), cpu.isolated()], &data, &cfg) else {
        panic!("data-parallel training with an offloaded optimizer was built");
    };
    assert!(e.to_string().contains("offloading the optimizer"), "{e}");
}
