//! Two devices: a 64 MiB copy from one device to another through a buffer's replica (one
//! device command where the devices share a context) against the same bytes through the host
//! (a blocking read into host memory and a blocking write from it), and `syncmem train`
//! data-parallel on two devices against one.

use serde::Serialize;
use syncmem::alloc::pairs::PairCopies;
use syncmem::{Device, Result, SyncedMemory};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

use crate::rows::median;
use crate::rows::{compare, Runs};
use crate::{size_name, Row};

/// The second device of `dev`'s backend, if there is one.
pub fn second_device(dev: &Device) -> Option<Device> {
    Device::all(dev.backend())
        .ok()?
        .into_iter()
        .find(|d| !d.same(dev))
}

/// A copy of `bytes` from `a` to `b`: a buffer written on `a` (its replica on `b` stale) read
/// on `b`, waited for, against a blocking read from a buffer of `a` into host memory and a
/// blocking write of it into a buffer of `b`.
///
/// # Errors
/// Device errors.
pub fn copy_row(a: &Device, b: &Device, bytes: usize, runs: Runs) -> Result<Row> {
    let m = SyncedMemory::new(bytes, a);
    m.device_mut()?.fill(1)?;
    let sb = b.default_stream()?;
    let sa = a.default_stream()?;
    let src = a.alloc(bytes)?;
    let mut dst = b.alloc(bytes)?;
    let mut host = vec![0u8; bytes];
    let direct = b.copies_directly_from(a);
    let samples = compare(
        runs,
        || {
            // A write on `a` (nothing queued): `b`'s replica is stale again.
            drop(m.device_mut()?);
            drop(m.device_on(b)?);
            sb.synchronize()
        },
        || {
            sa.read(&src, 0, &mut host)?;
            sb.write(&mut dst, 0, &host)
        },
    )?;
    Ok(samples.row(
        &format!("device to device {}", size_name(bytes)),
        &format!(
            "{} -> {} through a replica ({})",
            a.label(),
            b.label(),
            if direct {
                "one device copy"
            } else {
                "through the host"
            }
        ),
        "blocking read into host memory + blocking write",
    ))
}

/// Data-parallel training on two devices against one, epochs interleaved.
#[derive(Debug, Clone, Serialize)]
pub struct MultiTrainRow {
    /// The devices of the data-parallel run (the first also runs alone).
    pub devices: Vec<String>,
    /// Median epoch on the first device alone, milliseconds.
    pub one_ms: f64,
    /// Median epoch data-parallel, milliseconds.
    pub many_ms: f64,
    /// `one_ms / many_ms` (below 1: the data-parallel epoch is slower).
    pub ratio: f64,
    /// Copies between devices per step, per pair.
    pub pairs: Vec<PairCopies>,
    /// Bytes copied between devices per step, all pairs.
    pub bytes_per_step: f64,
    /// Final epoch loss data-parallel minus alone.
    pub loss_difference: f64,
}

/// `syncmem train` (default net) on `devices[0]` alone and data-parallel on `devices`.
///
/// # Errors
/// Training errors.
pub fn train_row(devices: &[Device], quick: bool) -> Result<MultiTrainRow> {
    let cfg = TrainConfig::default();
    let data = Dataset::spirals(1000, 3, 0.2, cfg.seed);
    let mut one = Trainer::new(&devices[0], &data, &cfg)?;
    let mut many = Trainer::data_parallel(devices, &data, &cfg)?;
    one.run_epoch()?;
    many.run_epoch()?;
    let epochs = if quick { 3 } else { 9 };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut la, mut lb) = (0.0, 0.0);
    for _ in 0..epochs {
        let e = one.run_epoch()?;
        a.push(e.seconds * 1e3);
        la = e.loss;
        let e = many.run_epoch()?;
        b.push(e.seconds * 1e3);
        lb = e.loss;
    }
    let (one_ms, many_ms) = (median(a), median(b));
    let steps = many.transfers().step_count.max(1) as f64;
    let mut pairs = many.pair_transfers();
    for p in &mut pairs {
        // Per step.
        p.count = (p.count as f64 / steps).round() as u64;
        p.bytes = (p.bytes as f64 / steps).round() as u64;
    }
    let bytes_per_step = pairs.iter().map(|p| p.bytes as f64).sum();
    Ok(MultiTrainRow {
        devices: devices.iter().map(|d| d.label().to_string()).collect(),
        one_ms,
        many_ms,
        ratio: one_ms / many_ms.max(1e-9),
        pairs,
        bytes_per_step,
        loss_difference: lb - la,
    })
}
