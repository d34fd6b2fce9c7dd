//! Random nets under random memory caps: an MLP of random widths and batch, planned or not,
//! fused or not, trained for an epoch under a cap between about half and all of its uncapped
//! peak, with the schedule ordering what leaves the device (Belady), ends with every loss and
//! every parameter equal to the uncapped run's, bit for bit. A cap too small for one
//! operator's working set is an out-of-memory error, never a wrong value. The capped run may
//! also move the activations to the host between forward and backward, or the parameters
//! between steps (`TrainConfig::offload_activations`, `offload_parameters`), on a device whose
//! host uses its memory in place or with two mirrors: the values stay those of the uncapped
//! run that keeps everything on the device.

use proptest::prelude::*;
use syncmem::{Device, Error, MemoryCap, Tensor};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

/// Each epoch's loss and every parameter's values after them.
type Outcome = (Vec<f64>, Vec<Vec<f32>>);

fn train(dev: &Device, data: &Dataset, cfg: &TrainConfig) -> syncmem::Result<Outcome> {
    let mut t = Trainer::new(dev, data, cfg)?;
    let mut losses = Vec::new();
    for _ in 0..cfg.epochs {
        losses.push(t.run_epoch()?.loss);
    }
    let mut params = Vec::new();
    for p in &t.nets().params {
        let blob = t.workspace().get_blob(p)?;
        let guard = blob.read();
        let values = guard.get::<Tensor>()?.host::<f32>()?.to_vec();
        params.push(values);
    }
    Ok((losses, params))
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(16, |n: u32| n.min(256))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn capped_training_ends_as_uncapped_training(
        hidden in prop::sample::select(vec![4usize, 16, 48, 64]),
        batch in prop::sample::select(vec![7usize, 32, 64]),
        plan in any::<bool>(),
        fuse in any::<bool>(),
        percent in 45u64..100,
        activations in any::<bool>(),
        parameters in any::<bool>(),
        two_mirrors in any::<bool>(),
    ) {
        // A device of its own: the cap and zero-copy are its settings alone.
        let dev = Device::cpu().detached();
        if two_mirrors {
            dev.set_zero_copy(syncmem::ZeroCopy::Off);
        }
        let data = Dataset::spirals(60, 3, 0.2, 1);
        let cfg = TrainConfig::default()
            .with_hidden(vec![hidden, hidden])
            .with_batch(batch)
            .with_epochs(1)
            .with_plan(plan)
            .with_fuse(fuse);
        let base = syncmem::alloc::pool::config::device_pool_from_env().unwrap();
        dev.set_pool(base.clone()).unwrap();
        dev.reset_peak_stats();
        let want = train(&dev, &data, &cfg).unwrap();
        let peak = dev.pool_stats().unwrap().reserved.peak;
        let cap = (peak * percent / 100).max(1);
        dev.set_pool(base.with_memory_cap(MemoryCap::Bytes(cap))).unwrap();
        let moved = cfg
            .clone()
            .with_offload_activations(activations)
            .with_offload_parameters(parameters);
        let how = format!(
            "hidden {hidden} batch {batch} plan {plan} fuse {fuse} activations {activations} \
             parameters {parameters} two mirrors {two_mirrors}"
        );
        match train(&dev, &data, &moved) {
            Ok(got) => {
                eprintln!("{how}: cap {cap} of peak {peak}: same");
                prop_assert_eq!(got, want, "cap {} of peak {}", cap, peak)
            }
            // Too small for one operator's working set: refused, never wrong.
            Err(Error::OperatorFailed { error, .. })
                if matches!(*error, Error::OutOfMemory { .. }) => {
                    eprintln!("{how}: cap {cap} of peak {peak}: {error}");
                }
            Err(Error::OutOfMemory { .. }) => {}
            Err(e) => prop_assert!(false, "cap {} of peak {}: {}", cap, peak, e),
        }
    }
}
