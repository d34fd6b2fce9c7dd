//! Random programs under a memory cap small enough that the device pool must spill all the
//! time: host and device reads, writes and overwrites, uploads and read-backs queued on either
//! of two streams, drops and re-allocations, with zero-copy on, off and with the map protocol,
//! against a host model of every buffer's contents.
//!
//! Guards are held across operations: a buffer a device guard holds must keep its device mirror
//! (never spilled), and every value read back must be the model's (a spill written back before
//! the queued work on the buffer ended would leave a stale value). PoCL runs the queued
//! kernels asynchronously, so work really is in flight when the pool looks for room.

#![cfg(feature = "opencl")]

#[path = "../common/model.rs"]
mod model;

mod found;
mod ops;

use model::{pattern, same, values};
use ops::{op, Op};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use syncmem::synced::{DeviceRead, HostRead};
use syncmem::{kernels, Device, MemoryCap, PoolConfig, Stream, SyncedMemory, ZeroCopy};

/// Buffer slots.
const SLOTS: usize = 8;
/// Buffer sizes in `f32` elements (16 KiB and 64 KiB).
const SIZES: [usize; 2] = [1 << 12, 1 << 14];
/// The cap: four of the largest buffers, the most an operation can hold at once (two guards
/// kept across operations, and the two buffers of an axpy); eight live ones do not fit.
const CAP: u64 = 4 * (1 << 14) * 4;

struct Live {
    mem: SyncedMemory,
    model: Vec<f32>,
}

/// A guard kept across operations, with the slot it holds.
enum Held<'a> {
    Host(usize, HostRead<'a>),
    Device(usize, #[allow(dead_code)] DeviceRead<'a>),
}

impl Held<'_> {
    fn slot(&self) -> usize {
        match self {
            Held::Host(s, _) | Held::Device(s, _) => *s,
        }
    }
}

/// The buffers of a program, each with its host model, on `dev`; stream 2 reads back.
struct Buffers<'d> {
    dev: &'d Device,
    streams: &'d [Stream; 3],
    slots: Vec<Option<Live>>,
}

/// Runs `ops` and checks every buffer against its model after each step and at the end.
fn run(dev: &Device, streams: &[Stream; 3], ops: &[Op]) -> Result<(), TestCaseError> {
    // Declared before the guards, which borrow its buffers (dropped after them).
    let mut b = Buffers {
        dev,
        streams,
        slots: (0..SLOTS).map(|_| None).collect(),
    };
    let mut held: Vec<Held<'_>> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = |what: &str| format!("{what}, step {step} ({op:?})");
        if skipped(*op, &held) {
            continue;
        }
        match *op {
            Op::Guard { slot, device } => b.guard(&mut held, slot, device),
            Op::Release => drop(held.pop()),
            op => b.apply(step, op, &at)?,
        }
        b.check_held(&held, &at)?;
    }
    held.clear();
    b.check_all()
}

/// Operations that need the slot's write lock (or replace it) skip guarded slots: the guards
/// of this thread would make them fail with Busy (tested elsewhere).
fn skipped(op: Op, held: &[Held<'_>]) -> bool {
    let guarded = |slot: usize| held.iter().any(|h| h.slot() == slot);
    match op {
        Op::Alloc { slot, .. }
        | Op::Drop { slot }
        | Op::HostWrite { slot, .. }
        | Op::HostOverwrite { slot, .. }
        | Op::Scale { slot, .. }
        | Op::DeviceOverwrite { slot, .. } => guarded(slot),
        Op::Axpy { x, y, .. } => x == y || guarded(y),
        Op::Guard { .. } => held.len() >= 2,
        _ => false,
    }
}

impl Buffers<'_> {
    /// Applies `op` (not a guard's) to the buffers and their models.
    fn apply(
        &mut self,
        step: usize,
        op: Op,
        at: &dyn Fn(&str) -> String,
    ) -> Result<(), TestCaseError> {
        match op {
            Op::Alloc {
                slot,
                size,
                stream,
                seed,
            } => self.alloc(step, slot, SIZES[size], stream, seed),
            Op::Drop { slot } => self.slots[slot] = None,
            Op::HostRead { slot } => return self.host_read(slot, at),
            Op::HostWrite { slot, at: i, value } => self.host_write(slot, i, value),
            Op::HostOverwrite { slot, seed } => self.host_overwrite(slot, seed),
            Op::Scale { slot, a } => self.scale(slot, a),
            Op::Axpy { x, y, a } => self.axpy(x, y, a),
            Op::DeviceOverwrite { slot, value } => self.device_overwrite(slot, value),
            Op::DeviceRead { slot } => return self.device_read(slot, at),
            Op::Prefetch {
                slot,
                stream,
                to_device,
            } => self.prefetch(slot, stream, to_device),
            Op::Guard { .. } | Op::Release => {}
        }
        Ok(())
    }

    fn alloc(&mut self, step: usize, slot: usize, n: usize, stream: usize, seed: u8) {
        self.slots[slot] = None;
        let model = pattern(n, seed);
        let mem = SyncedMemory::new(n * 4, self.dev)
            .with_stream(&self.streams[stream])
            .unwrap()
            .with_label(format!("slot {slot} (step {step})"));
        mem.host_overwrite()
            .unwrap()
            .as_mut_slice_of::<f32>()
            .unwrap()
            .copy_from_slice(&model);
        self.slots[slot] = Some(Live { mem, model });
    }

    fn host_read(&self, slot: usize, at: &dyn Fn(&str) -> String) -> Result<(), TestCaseError> {
        let Some(l) = &self.slots[slot] else {
            return Ok(());
        };
        let h = l.mem.host().unwrap();
        same(&at("host read"), h.as_slice_of::<f32>().unwrap(), &l.model)
    }

    fn host_write(&mut self, slot: usize, i: usize, value: i8) {
        if let Some(l) = &mut self.slots[slot] {
            let i = i % l.model.len();
            l.model[i] = f32::from(value);
            l.mem.host_mut().unwrap().as_mut_slice_of::<f32>().unwrap()[i] = f32::from(value);
        }
    }

    fn host_overwrite(&mut self, slot: usize, seed: u8) {
        if let Some(l) = &mut self.slots[slot] {
            l.model = pattern(l.model.len(), seed);
            l.mem
                .host_overwrite()
                .unwrap()
                .as_mut_slice_of::<f32>()
                .unwrap()
                .copy_from_slice(&l.model);
        }
    }

    fn scale(&mut self, slot: usize, a: f32) {
        if let Some(l) = &mut self.slots[slot] {
            let n = l.model.len();
            kernels::scale(n, a, &mut l.mem.device_mut().unwrap()).unwrap();
            l.model.iter_mut().for_each(|v| *v *= a);
        }
    }

    fn axpy(&mut self, x: usize, y: usize, a: f32) {
        let (Some(lx), Some(ly)) = (&self.slots[x], &self.slots[y]) else {
            return;
        };
        let n = lx.model.len().min(ly.model.len());
        {
            let xd = lx.mem.device().unwrap();
            let mut yd = ly.mem.device_mut().unwrap();
            kernels::axpy(n, a, &xd, &mut yd).unwrap();
        }
        let xs = lx.model[..n].to_vec();
        let ly = self.slots[y].as_mut().unwrap();
        for (v, xv) in ly.model.iter_mut().zip(xs) {
            *v += a * xv;
        }
    }

    fn device_overwrite(&mut self, slot: usize, value: u8) {
        if let Some(l) = &mut self.slots[slot] {
            l.mem.device_overwrite().unwrap().fill(value).unwrap();
            let b = f32::from_ne_bytes([value; 4]);
            l.model.iter_mut().for_each(|v| *v = b);
        }
    }

    fn device_read(&self, slot: usize, at: &dyn Fn(&str) -> String) -> Result<(), TestCaseError> {
        let Some(l) = &self.slots[slot] else {
            return Ok(());
        };
        let g = l.mem.device().unwrap();
        let mut bytes = vec![0u8; l.mem.len()];
        self.streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
        same(&at("device read"), &values(&bytes), &l.model)
    }

    fn prefetch(&self, slot: usize, stream: usize, to_device: bool) {
        let Some(l) = &self.slots[slot] else {
            return;
        };
        let stream = Some(&self.streams[stream]);
        if to_device {
            l.mem.prefetch_to_device(stream).unwrap();
        } else {
            l.mem.prefetch_to_host(stream).unwrap();
        }
    }

    /// Keeps a guard of `slot` in `held` until a `Release`.
    fn guard<'a>(&self, held: &mut Vec<Held<'a>>, slot: usize, device: bool) {
        let Some(l) = self.slots[slot].as_ref() else {
            return;
        };
        // SAFETY: the borrow outlives this call: the buffers outlive `held` (declared first,
        // dropped after it), `slots` never grows (its buffers stay where they are), and a slot a
        // guard holds is never replaced or dropped while the guard lives (those operations skip
        // it: see `skipped`).
        let l: &'a Live = unsafe { &*std::ptr::from_ref(l) };
        held.push(if device {
            Held::Device(slot, l.mem.device().unwrap())
        } else {
            Held::Host(slot, l.mem.host().unwrap())
        });
    }

    /// What a device guard holds keeps its device mirror, whatever the pool spilled; what a
    /// host guard holds keeps its bytes.
    fn check_held(
        &self,
        held: &[Held<'_>],
        at: &dyn Fn(&str) -> String,
    ) -> Result<(), TestCaseError> {
        for h in held {
            let l = self.slots[h.slot()].as_ref().unwrap();
            match h {
                Held::Device(..) => prop_assert!(
                    l.mem.device_allocated(),
                    "{}",
                    at("a guarded device mirror was spilled")
                ),
                Held::Host(_, g) => same(
                    &at("held host view"),
                    g.as_slice_of::<f32>().unwrap(),
                    &l.model,
                )?,
            }
        }
        Ok(())
    }

    /// Every buffer, read on the device and on the host, holds its model.
    fn check_all(&self) -> Result<(), TestCaseError> {
        for (slot, l) in self.slots.iter().enumerate() {
            let Some(l) = l else {
                continue;
            };
            let mut bytes = vec![0u8; l.mem.len()];
            self.streams[2]
                .read(l.mem.device().unwrap().buffer(), 0, &mut bytes)
                .unwrap();
            same(
                &format!("final device read of slot {slot}"),
                &values(&bytes),
                &l.model,
            )?;
            let h = l.mem.host().unwrap();
            same(
                &format!("final host read of slot {slot}"),
                h.as_slice_of::<f32>().unwrap(),
                &l.model,
            )?;
        }
        Ok(())
    }
}

/// An isolated OpenCL device with the cap and the zero-copy setting.
fn device(base: &Device, zero_copy: ZeroCopy) -> Device {
    let d = base.isolated();
    d.set_zero_copy(zero_copy);
    d.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(CAP)))
        .unwrap();
    d
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(160)
}

/// Three streams of `dev`: two for the buffers, one to read back on.
fn streams(dev: &Device) -> [Stream; 3] {
    [
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    ]
}

#[test]
fn random_programs_under_a_cap_keep_the_host_model() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model") else {
        return;
    };
    let mut spills = 0;
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let dev = device(&base, zero_copy);
        let streams = streams(&dev);
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&prop::collection::vec(op(), 1..60), |ops| {
            run(&dev, &streams, &ops)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => {
                panic!("zero-copy {zero_copy}: {why}\nminimal case: {ops:#?}")
            }
            Err(e) => panic!("zero-copy {zero_copy}: {e}"),
        }
        // The cap made room: by dropping clean mirrors (two mirrors) or spilling.
        let s = dev.pool_stats().unwrap();
        assert!(
            s.spills + s.evictions > 0,
            "zero-copy {zero_copy}: the cap forced nothing: {s}"
        );
        spills += s.spills;
        eprintln!(
            "zero-copy {zero_copy}: {} spills, {} refills, {} evictions, {} OOMs",
            s.spills, s.refills, s.evictions, s.ooms
        );
    }
    assert!(spills > 0, "no dirty mirror was ever spilled");
}
