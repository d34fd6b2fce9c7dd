//! Dead values under a memory cap: while a net runs on a capped device, the device mirror of a
//! blob internal to the net whose next use overwrites it whole (an activation after its last
//! read, a gradient after the update) goes without a write-back. The losses stay those of the
//! uncapped run, bit for bit; what was dropped reads as an error naming the blob, never as
//! stale or zero values; external outputs and parameters read as ever.

use syncmem::{Device, Error, Head, MemoryCap, Tensor};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

/// The spirals, and one epoch with no planning and no fusion (the most values dropped).
fn data_and_config() -> (Dataset, TrainConfig) {
    let cfg = TrainConfig::default()
        .with_epochs(1)
        .with_plan(false)
        .with_fuse(false);
    (Dataset::spirals(300, 3, 0.2, 0), cfg)
}

fn check(dev: &Device) {
    let (data, cfg) = data_and_config();
    let base = syncmem::alloc::pool::config::device_pool_from_env().unwrap();
    dev.set_pool(base.clone()).unwrap();
    dev.reset_peak_stats();
    let want = Trainer::new(dev, &data, &cfg)
        .unwrap()
        .run_epoch()
        .unwrap()
        .loss;
    let peak = dev.pool_stats().unwrap().reserved.peak;
    dev.set_pool(base.with_memory_cap(MemoryCap::Bytes(peak / 2)))
        .unwrap();
    let mut t = Trainer::new(dev, &data, &cfg).unwrap();
    let got = t.run_epoch().unwrap().loss;
    assert_eq!(
        got.to_bits(),
        want.to_bits(),
        "the capped loss is the uncapped one"
    );
    let s = dev.pool_stats().unwrap();
    let steps = t.transfers().step_count as f64;
    eprintln!(
        "{}: {:.1} dead mirrors dropped per step ({:.0} B), {:.1} spilled ({:.0} B)",
        dev.label(),
        s.drops as f64 / steps,
        s.dropped_bytes as f64 / steps,
        s.spills as f64 / steps,
        s.spilled_bytes as f64 / steps
    );
    assert!(s.drops > 0, "dead values are dropped, not spilled");
    assert!(
        s.dropped_bytes > s.spilled_bytes,
        "most of what leaves the device is dead: {} dropped, {} spilled",
        s.dropped_bytes,
        s.spilled_bytes
    );
    let ws = t.workspace();
    let train = &t.nets().train;
    let (inputs, outputs) = (train.inputs(), train.outputs());
    let mut dropped = 0;
    for name in ws.blobs() {
        let blob = ws.get_blob(&name).unwrap();
        let guard = blob.read();
        let Ok(tensor) = guard.get::<Tensor>() else {
            continue;
        };
        if tensor.head() != Some(Head::Dropped) {
            continue;
        }
        dropped += 1;
        assert!(
            !inputs.contains(&name) && !outputs.contains(&name),
            "{name}: only blobs internal to the net are dropped"
        );
        match tensor.host::<f32>() {
            Err(Error::ContentsDropped { buffer, .. }) => assert!(buffer.contains(&name)),
            other => panic!("{name}: a read of dropped contents gave {other:?}"),
        };
    }
    assert!(dropped > 0, "some internal blob ends the run dropped");
    for p in t.nets().params.iter().chain(&outputs) {
        let values = ws.fetch::<f32>(p).unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "{p} reads");
    }
    // The next epoch writes the dropped blobs again before reading them.
    t.run_epoch().unwrap();
}

#[test]
fn dead_values_are_dropped_on_cpu() {
    check(&Device::cpu().detached());
}

#[cfg(feature = "opencl")]
#[test]
fn dead_values_are_dropped_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("dead_values_are_dropped_on_opencl") {
        check(&dev.isolated());
    }
}

/// The blobs of `t`'s workspace whose tensor ends the run dropped.
fn dropped_blobs(t: &Trainer) -> Vec<String> {
    let ws = t.workspace();
    ws.blobs()
        .into_iter()
        .filter(|name| {
            let blob = ws.get_blob(name).unwrap();
            let guard = blob.read();
            guard
                .get::<Tensor>()
                .is_ok_and(|t| t.head() == Some(Head::Dropped))
        })
        .collect()
}

/// Without a cap, dead values stay unless the net was built to drop them
/// (`NetOptions::drop_dead`, which offloaded activations turn on): then the device's peak in
/// a step is lower and the losses are the same.
#[test]
fn dead_values_are_dropped_without_a_cap_when_asked() {
    let (data, cfg) = data_and_config();
    let run = |cfg: &TrainConfig| {
        let dev = Device::cpu().detached();
        dev.set_zero_copy(syncmem::ZeroCopy::Off);
        let mut t = Trainer::new(&dev, &data, cfg).unwrap();
        // A net's first run meets its outputs before they have storage: the second epoch's
        // peak is the steady one.
        t.run_epoch().unwrap();
        dev.reset_peak_stats();
        let loss = t.run_epoch().unwrap().loss;
        let peak = dev.pool_stats().unwrap().allocated.peak;
        (loss, peak, dropped_blobs(&t))
    };
    let (loss, peak, dropped) = run(&cfg);
    assert!(dropped.is_empty(), "no cap, nothing dropped: {dropped:?}");
    let (loss_d, peak_d, dropped_d) = run(&cfg.clone().with_offload_activations(true));
    eprintln!("peak {peak} B kept, {peak_d} B dropping dead values; dropped {dropped_d:?}");
    assert_eq!(loss_d.to_bits(), loss.to_bits());
    assert!(!dropped_d.is_empty(), "dead values dropped");
    assert!(peak_d < peak, "{peak_d} B against {peak} B");
}

/// A net's first run under a cap makes its activations and gradients as it goes: its schedule
/// does not know them, so they stay on the device after their last use. The next run drops
/// those that are dead then (their first use in the run overwrites them) before its first
/// operator, instead of at its first allocations that fail: with two mirrors the second step
/// retries no allocation.
#[test]
fn dead_values_the_first_run_made_go_before_the_next_run() {
    let dev = Device::cpu().detached();
    dev.set_zero_copy(syncmem::ZeroCopy::Off);
    let (data, cfg) = data_and_config();
    let base = syncmem::alloc::pool::config::device_pool_from_env().unwrap();
    dev.set_pool(base.clone()).unwrap();
    let peak = {
        let mut t = Trainer::new(&dev, &data, &cfg).unwrap();
        t.run_epoch().unwrap();
        dev.pool_stats().unwrap().reserved.peak
    };
    let cap = peak / 2;
    dev.set_pool(base.with_memory_cap(MemoryCap::Bytes(cap)))
        .unwrap();
    let mut t = Trainer::new(&dev, &data, &cfg).unwrap();
    t.step(0).unwrap();
    // The internal blobs whose first use in a run writes them, large enough to be dropped at
    // once under the cap (a 32nd of it), and on the device after the first run.
    let net = t.train_net();
    let def = net.run_def();
    let (inputs, outputs) = (t.nets().train.inputs(), t.nets().train.outputs());
    let ws = t.workspace();
    let on_device = |name: &str| {
        let blob = ws.get_blob(name).unwrap();
        let guard = blob.read();
        let tensor = guard.get::<Tensor>().unwrap();
        matches!(tensor.head(), Some(Head::AtDevice | Head::Synced))
            && tensor.nbytes() as u64 >= cap / 32
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut dead = Vec::new();
    for op in &def.ops {
        for name in op.outputs.iter().filter(|n| !op.inputs.contains(n)) {
            let internal = !inputs.contains(name) && !outputs.contains(name);
            if internal && !seen.contains(name) && on_device(name) {
                dead.push(name.clone());
            }
        }
        seen.extend(op.inputs.iter().chain(&op.outputs).cloned());
    }
    assert!(
        !dead.is_empty(),
        "the first run leaves dead values on the device"
    );
    let retries = dev.pool_stats().unwrap().alloc_retries;
    let first = &def.ops[0].outputs;
    net.run_observed(ws, net.context(), |i, _| {
        if i == 0 {
            for name in dead.iter().filter(|n| !first.contains(n)) {
                let blob = ws.get_blob(name).unwrap();
                let head = blob.read().get::<Tensor>().unwrap().head();
                assert_eq!(head, Some(Head::Dropped), "{name} after the first operator");
            }
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(
        dev.pool_stats().unwrap().alloc_retries,
        retries,
        "the second run finds room without the out-of-memory path"
    );
}
