//! What one training step costs (copies, host waits), as the trainer counts it: the copies and
//! waits of the thread that runs the step, whatever other threads do meanwhile.

use std::sync::{Barrier, Mutex};

use syncmem::net::memory::blob_report;
use syncmem::{Device, Head};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

static SERIAL: Mutex<()> = Mutex::new(());

/// The host waits of one step: one read (a blocking copy) behind every kernel of the step on
/// a device that runs asynchronously, none on `cpu`. Zero-copy waits for the step's last kernel
/// only if it has not finished yet (at most one); the map protocol also maps each batch's
/// labels for the loss's host-side check the first time they are used (at most two).
fn assert_waits(dev: &Device, got: u64, what: &str) {
    let waits = u64::from(dev.backend() != syncmem::BackendKind::Cpu);
    match dev.zero_copy_protocol() {
        None => assert_eq!(got, waits, "{what}"),
        Some(syncmem::ZeroCopyProtocol::InPlace) => assert!(got <= waits, "{what}: {got} waits"),
        Some(_) => assert!(got <= 2 * waits, "{what}: {got} waits"),
    }
}

/// Per step: no host-to-device copy, exactly the loss and the accuracy come back, and the host
/// waits once (on a device that runs asynchronously).
fn one_step_copies_only_two_scalars(dev: &Device) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = TrainConfig::default()
        .with_hidden(vec![32, 32])
        .with_epochs(3)
        .with_batch(32)
        .with_lr(0.5)
        .with_seed(5)
        .with_plan(true);
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
        // Exactly the loss and the accuracy come back, side by side (the fused loss writes
        // them together): one 8-byte copy, or, where host and device share memory, one
        // zero-copy sync and no copy.
        syncmem::testing::assert_syncs(dev, &s, 0, 1, &format!("step {i}"));
        assert_eq!(s.device_to_device.count, 0, "step {i}: {s:?}");
        assert_eq!(
            s.device_to_host.bytes + s.mapped.bytes,
            8,
            "step {i}: {s:?}"
        );
        // One host wait per step where the device runs asynchronously (the accuracy's read;
        // the loss's copy was queued before it), none on `cpu`.
        let got = t.transfers().waits.last_step;
        assert_waits(dev, got, &format!("step {i}"));
    }
    let tr = t.transfers();
    assert_eq!(tr.step_count as usize, t.batch_count());
    assert_eq!(tr.max_step.host_to_device.count, 0);
    syncmem::testing::assert_syncs(dev, &tr.steps, 0, tr.step_count, "all steps");
    assert_waits(dev, tr.waits.max_step, "the most waits of a step");
    let report = blob_report(t.workspace());
    for (name, copies) in &weights_before {
        let now = report.iter().find(|b| &b.name == name).unwrap();
        assert_eq!(&now.copies, copies, "{name} was copied during training");
        assert_eq!(now.head, Some(Head::AtDevice), "{name} lives on the device");
    }
    let both = report
        .iter()
        .find(|b| b.name == "loss_and_accuracy")
        .unwrap();
    assert_eq!(both.head, Some(Head::Synced));
}

syncmem::for_each_device!(
    one_step_copies_only_two_scalars,
    two_trainers_in_two_threads_count_their_own_copies
);

/// Two trainers stepping at the same time in two threads each count exactly their own copies
/// and waits: 1 device-to-host copy and no upload per step, one wait on an asynchronous
/// device. (They were counted from the process's counters, so a step showed the other
/// trainer's copies too.) A third thread copies on the device meanwhile, counted by neither.
fn two_trainers_in_two_threads_count_their_own_copies(dev: &Device) {
    let cfg = TrainConfig::default()
        .with_hidden(vec![16])
        .with_epochs(1)
        .with_batch(16)
        .with_seed(3);
    let data = Dataset::spirals(256, 3, 0.2, 7);
    let start = Barrier::new(3);
    let busy = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|s| {
        let trainers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut t = Trainer::new(dev, &data, &cfg).unwrap();
                    start.wait();
                    for round in 0..4 {
                        for i in 0..t.batch_count() {
                            t.step(i).unwrap();
                            let step = t.transfers().last_step;
                            let what = format!("round {round} step {i}");
                            syncmem::testing::assert_syncs(dev, &step, 0, 1, &what);
                            assert_eq!(step.device_to_device.count, 0, "{what}");
                            assert_eq!(step.device_to_host.bytes + step.mapped.bytes, 8);
                            assert_waits(dev, t.transfers().waits.last_step, &what);
                        }
                    }
                    t.transfers()
                })
            })
            .collect();
        s.spawn(|| {
            let m = syncmem::SyncedMemory::new(64, dev);
            start.wait();
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                m.host_mut().unwrap().fill(1);
                drop(m.device().unwrap());
            }
        });
        let results: Vec<_> = trainers.into_iter().map(|t| t.join()).collect();
        // The copying thread stops before any result is checked (a failed check unwinds).
        busy.store(false, std::sync::atomic::Ordering::Relaxed);
        for r in results {
            let tr = r.unwrap_or_else(|e| std::panic::resume_unwind(e));
            syncmem::testing::assert_syncs(dev, &tr.steps, 0, tr.step_count, "all steps");
        }
    });
}
