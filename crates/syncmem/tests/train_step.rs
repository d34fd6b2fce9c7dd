//! What one training step costs, counted by the process-wide counters (copies, host waits):
//! the tests of this file run one at a time, so that nothing else counts meanwhile.

use std::sync::Mutex;

use syncmem::net::memory::blob_report;
use syncmem::net::mlp::Dataset;
use syncmem::net::train::{TrainConfig, Trainer};
use syncmem::{Device, Head};

static SERIAL: Mutex<()> = Mutex::new(());

/// Per step: no host-to-device copy, exactly the loss and the accuracy come back, and the host
/// waits once (on a device that runs asynchronously).
fn one_step_copies_only_two_scalars(dev: &Device) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = TrainConfig {
        hidden: vec![32, 32],
        epochs: 3,
        batch: 32,
        lr: 0.5,
        seed: 5,
        plan: true,
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(dev, &Dataset::spirals(64, 3, 0.2, 11), &cfg).unwrap();
    let weights_before: Vec<_> = blob_report(t.workspace())
        .into_iter()
        .filter(|b| b.name.starts_with("fc") && !b.name.ends_with("_grad"))
        .map(|b| (b.name, b.copies))
        .collect();
    assert_eq!(weights_before.len(), 6);
    for i in 0..t.batch_count() {
        t.step(i).unwrap();
        let s = t.transfers().last_step;
        assert_eq!(s.host_to_device.count, 0, "step {i}: {s:?}");
        assert_eq!(s.device_to_device.count, 0, "step {i}: {s:?}");
        assert_eq!((s.device_to_host.count, s.device_to_host.bytes), (2, 8));
        // One host wait per step where the device runs asynchronously (the accuracy's read;
        // the loss's copy was queued before it), none on `cpu`.
        let waits = u64::from(dev.backend() != syncmem::BackendKind::Cpu);
        assert_eq!(t.transfers().waits.last_step, waits, "step {i}");
    }
    let tr = t.transfers();
    assert_eq!(tr.step_count as usize, t.batch_count());
    assert_eq!(tr.max_step.host_to_device.count, 0);
    assert_eq!(tr.steps.device_to_host.count, 2 * tr.step_count);
    assert_eq!(tr.waits.max_step, tr.waits.last_step);
    let report = blob_report(t.workspace());
    for (name, copies) in &weights_before {
        let now = report.iter().find(|b| &b.name == name).unwrap();
        assert_eq!(&now.copies, copies, "{name} was copied during training");
        assert_eq!(now.head, Some(Head::AtDevice), "{name} lives on the device");
    }
    let loss = report.iter().find(|b| b.name == "loss").unwrap();
    assert_eq!(loss.head, Some(Head::Synced));
}

syncmem::for_each_device!(one_step_copies_only_two_scalars);
