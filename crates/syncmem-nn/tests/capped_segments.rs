//! Training under a memory cap of half the unplanned peak (no planning, no fusion: the most
//! pressure) drops and moves values every step, but makes no new segment after the first
//! step: the out-of-memory path gives back segments only when that makes room for the
//! request (no more than it needs), a victim that alone holds the request is retried at once
//! (no small values spilled on top, whose segments would go and be made again), and under a
//! cap the pool keeps the segments made for one block whole for their size, so the segments
//! the steps reuse stay cached. The first step decides whether the batches stay on the
//! device (its out-of-memory retries say they do not fit: the trainer offloads each batch
//! after its step from then on). The second step may still retry allocations, making no
//! segment: where the host shares the memory in place, the values the first step spilled
//! stayed in their blocks, and come back under the cap once the segments made meanwhile are
//! given back. From the third on, no allocation fails. And the losses are those of the
//! uncapped run, bit for bit. It runs with each zero-copy setting of the environment
//! (`SYNCMEM_ZERO_COPY`: in place, mapped, or two mirrors as on a discrete device).

use syncmem::{Device, MemoryCap};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

fn config() -> TrainConfig {
    TrainConfig::default()
        .with_epochs(2)
        .with_plan(false)
        .with_fuse(false)
}

fn losses(t: &mut Trainer, epochs: usize) -> Vec<f64> {
    (0..epochs).map(|_| t.run_epoch().unwrap().loss).collect()
}

fn check(dev: &Device) {
    let data = Dataset::spirals(300, 3, 0.2, 0);
    let cfg = config();
    let base = syncmem::alloc::pool::config::device_pool_from_env().unwrap();
    dev.set_pool(base.clone()).unwrap();
    dev.reset_peak_stats();
    let (want, peak) = {
        let mut t = Trainer::new(dev, &data, &cfg).unwrap();
        // The same steps as the capped run below: two steps, then the epochs.
        t.step(0).unwrap();
        t.step(1).unwrap();
        let l = losses(&mut t, cfg.epochs);
        (l, dev.pool_stats().unwrap().reserved.peak)
    };
    let cap = peak / 2;
    dev.set_pool(base.with_memory_cap(MemoryCap::Bytes(cap)))
        .unwrap();
    let mut t = Trainer::new(dev, &data, &cfg).unwrap();
    t.step(0).unwrap();
    let first = dev.pool_stats().unwrap();
    t.step(1).unwrap();
    let second = dev.pool_stats().unwrap();
    let got = losses(&mut t, cfg.epochs);
    let end = dev.pool_stats().unwrap();
    let spilled = t.transfers().steps.spilled;
    eprintln!(
        "{}: cap {cap} of peak {peak}: {} segments made after the first step ({} in it), {} \
         values dropped, {} spills in {} steps",
        dev.label(),
        end.backend_allocs - first.backend_allocs,
        first.backend_allocs,
        end.drops,
        spilled.count,
        t.transfers().step_count
    );
    assert!(
        spilled.count + end.drops > 0,
        "the cap must make the steps drop or spill"
    );
    assert_eq!(
        end.backend_allocs, first.backend_allocs,
        "no segment is made after the first step under the cap"
    );
    // The batches that do not fit leave after their step: the steps find room without the
    // out-of-memory path.
    assert_eq!(
        end.alloc_retries, second.alloc_retries,
        "no allocation is retried once the steps have settled"
    );
    assert_eq!(
        got, want,
        "the capped losses are the uncapped ones, bit for bit"
    );
}

#[test]
fn capped_training_on_cpu_reuses_its_segments() {
    check(&Device::cpu());
}

#[cfg(feature = "opencl")]
#[test]
fn capped_training_on_opencl_reuses_its_segments() {
    let devs = Device::all(syncmem::BackendKind::OpenCl).unwrap_or_default();
    let Some(dev) = devs.first() else {
        assert!(
            std::env::var("SYNCMEM_REQUIRE_OPENCL").as_deref() != Ok("1"),
            "SYNCMEM_REQUIRE_OPENCL=1 but no OpenCL device"
        );
        eprintln!("SKIPPED capped_training_on_opencl_reuses_its_segments: no OpenCL device");
        return;
    };
    // Two mirrors, as on a discrete GPU: the device side is what the cap limits.
    check(dev);
}

#[cfg(feature = "cuda")]
#[test]
fn capped_training_on_cuda_reuses_its_segments() {
    match Device::open("cuda:0") {
        Ok(dev) => check(&dev),
        Err(e) => {
            assert!(
                std::env::var("SYNCMEM_REQUIRE_CUDA").as_deref() != Ok("1"),
                "SYNCMEM_REQUIRE_CUDA=1 but cuda:0 did not open: {e}"
            );
            eprintln!("SKIPPED capped_training_on_cuda_reuses_its_segments: {e}");
        }
    }
}
