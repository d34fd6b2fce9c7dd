//! The composed model test: random programs over every feature of a buffer at once, against a
//! host model of every buffer's contents, with allocation failures injected.
//!
//! Features in one program: Caffe's four accesses and the overwrites, prefetches on two
//! streams, guards held across operations, placement pins with the host address they keep (a
//! NumPy view, a DLPack export), users' kernels, replicas on a second device, frees and reuse
//! of pool blocks, all under a memory cap that spills and refills, with zero-copy on, off and
//! with the map protocol. `FailNext` makes the `n`-th allocation fail
//! ([`Device::fail_allocation`]): an operation that fails with out-of-memory (injected, or the
//! cap) must leave every buffer as it was, which is checked on the spot.
//!
//! Defects found where two features meet are kept here as operations; every new feature adds
//! its own. `SYNCMEM_PROPTEST_CASES` sets the number of programs per device and zero-copy
//! setting (CI runs the default; a longer local run sets more).

#[path = "../common/model.rs"]
mod model;
mod ops;

use model::{pattern, same, user_twice, values};
use ops::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use syncmem::kernels::{self, Arg, Grid};
use syncmem::synced::{DeviceRead, HostRead, PlacementPin};
use syncmem::{Device, MemoryCap, PoolConfig, Stream, SyncedMemory, ZeroCopy};

struct Live {
    mem: SyncedMemory,
    model: Vec<f32>,
    /// The buffer's stream (an index of `World::streams`).
    stream: usize,
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

/// A pin kept across operations: the slot, the pin, the host address it kept.
struct Kept {
    slot: usize,
    _pin: PlacementPin,
    at: usize,
}

struct World<'d> {
    dev: &'d Device,
    other: &'d Device,
    streams: &'d [Stream; 3],
    twice: kernels::UserKernel,
    /// Operations that failed with out-of-memory.
    failed: std::cell::Cell<u64>,
}

impl World<'_> {
    /// `Ok(Some(v))` on success, `Ok(None)` for an out-of-memory error (the injection is
    /// disarmed then), a test failure for any other error.
    fn ok<T>(&self, what: &str, r: syncmem::Result<T>) -> Result<Option<T>, TestCaseError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_out_of_memory() => {
                self.dev.fail_allocation(0);
                self.other.fail_allocation(0);
                self.failed.set(self.failed.get() + 1);
                Ok(None)
            }
            Err(e) => Err(TestCaseError::fail(format!("{what}: {e}"))),
        }
    }

    /// After a failed operation: the buffer still holds the model's data, on the host and on
    /// its device.
    fn as_it_was(&self, what: &str, l: &Live) -> Result<(), TestCaseError> {
        let h = l
            .mem
            .host()
            .map_err(|e| TestCaseError::fail(format!("{what}: host read after a failure: {e}")))?;
        same(
            &format!("{what}: host after a failure"),
            h.as_slice_of::<f32>().unwrap(),
            &l.model,
        )
    }

    fn device_values(&self, what: &str, l: &Live) -> Result<Vec<f32>, TestCaseError> {
        let g = l
            .mem
            .device()
            .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let mut bytes = vec![0u8; l.mem.len()];
        self.streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
        Ok(values(&bytes))
    }
}

fn run(w: &World<'_>, ops: &[Op]) -> Result<(), TestCaseError> {
    // Declared before the guards, which borrow its buffers (dropped after them).
    let mut slots: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    let mut held: Vec<Held<'_>> = Vec::new();
    let mut pins: Vec<Kept> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?})");
        let guarded = |slot: usize| held.iter().any(|h| h.slot() == slot);
        let pinned = |slot: usize| pins.iter().any(|p| p.slot == slot);
        // Operations that need the slot's write lock (or replace it) skip guarded slots: the
        // guards of this thread would make them fail with Busy (tested elsewhere). A pinned
        // slot is not dropped: a view keeps its buffer alive.
        let skip = match *op {
            Op::Alloc { slot, .. } | Op::Drop { slot } => guarded(slot) || pinned(slot),
            Op::HostWrite { slot, .. }
            | Op::HostOverwrite { slot, .. }
            | Op::Scale { slot, .. }
            | Op::DeviceOverwrite { slot, .. }
            | Op::UserTwice { slot }
            | Op::ReplicaScale { slot, .. } => guarded(slot),
            Op::Axpy { x, y, .. } => guarded(y) || x == y,
            _ => false,
        };
        if skip {
            continue;
        }
        step_one(w, &mut slots, &mut held, &mut pins, *op, &at)?;
        // What a device guard holds keeps its device mirror, whatever the pool spilled; what a
        // host guard holds keeps its bytes.
        for h in &held {
            let l = slots[h.slot()].as_ref().unwrap();
            match h {
                Held::Device(..) => prop_assert!(
                    l.mem.device_allocated(),
                    "{at}: a guarded device mirror was spilled"
                ),
                Held::Host(_, g) => same(
                    &format!("{at}: held host view"),
                    g.as_slice_of::<f32>().unwrap(),
                    &l.model,
                )?,
            }
        }
    }
    held.clear();
    w.dev.fail_allocation(0);
    w.other.fail_allocation(0);
    for p in &pins {
        let l = slots[p.slot].as_ref().unwrap();
        let h = l.mem.host().unwrap();
        prop_assert_eq!(
            h.as_ptr() as usize,
            p.at,
            "slot {}: a pinned view moved",
            p.slot
        );
    }
    pins.clear();
    for (slot, l) in slots.iter().enumerate() {
        if let Some(l) = l {
            let what = format!("final device read of slot {slot}");
            same(&what, &w.device_values(&what, l)?, &l.model)?;
            let h = l.mem.host().unwrap();
            same(
                &format!("final host read of slot {slot}"),
                h.as_slice_of::<f32>().unwrap(),
                &l.model,
            )?;
        }
    }
    Ok(())
}

fn step_one<'s>(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    held: &mut Vec<Held<'s>>,
    pins: &mut Vec<Kept>,
    op: Op,
    at: &str,
) -> Result<(), TestCaseError> {
    match op {
        Op::Alloc {
            slot,
            size,
            stream,
            seed,
        } => {
            slots[slot] = None;
            let n = SIZES[size];
            let model = pattern(n, seed);
            let mem = SyncedMemory::new(n * 4, w.dev)
                .with_stream(&w.streams[stream])
                .unwrap()
                .with_label(format!("slot {slot} ({at})"));
            let written = mem.host_overwrite().map(|mut h| {
                h.as_mut_slice_of::<f32>().unwrap().copy_from_slice(&model);
            });
            if w.ok(at, written)?.is_some() {
                slots[slot] = Some(Live { mem, model, stream });
            }
        }
        Op::Drop { slot } => slots[slot] = None,
        Op::HostRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.host())? {
                    Some(h) => same(at, h.as_slice_of::<f32>().unwrap(), &l.model)?,
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::HostWrite { slot, at: i, value } => {
            if let Some(l) = &mut slots[slot] {
                let i = i % l.model.len();
                match w.ok(at, l.mem.host_mut())? {
                    Some(mut h) => {
                        h.as_mut_slice_of::<f32>().unwrap()[i] = f32::from(value);
                        l.model[i] = f32::from(value);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::HostOverwrite { slot, seed } => {
            if let Some(l) = &mut slots[slot] {
                match w.ok(at, l.mem.host_overwrite())? {
                    Some(mut h) => {
                        l.model = pattern(l.model.len(), seed);
                        h.as_mut_slice_of::<f32>()
                            .unwrap()
                            .copy_from_slice(&l.model);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Scale { slot, a } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                match w.ok(at, l.mem.device_mut())? {
                    Some(mut g) => {
                        kernels::scale(n, a, &mut g).unwrap();
                        l.model.iter_mut().for_each(|v| *v *= a);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Axpy { x, y, a } => {
            let (Some(lx), Some(ly)) = (&slots[x], &slots[y]) else {
                return Ok(());
            };
            let n = lx.model.len().min(ly.model.len());
            let done = {
                match w.ok(at, lx.mem.device())? {
                    None => false,
                    Some(xd) => match w.ok(at, ly.mem.device_mut())? {
                        None => false,
                        Some(mut yd) => {
                            kernels::axpy(n, a, &xd, &mut yd).unwrap();
                            true
                        }
                    },
                }
            };
            if !done {
                w.as_it_was(at, lx)?;
                w.as_it_was(at, ly)?;
                return Ok(());
            }
            let xs = lx.model[..n].to_vec();
            let ly = slots[y].as_mut().unwrap();
            for (v, xv) in ly.model.iter_mut().zip(xs) {
                *v += a * xv;
            }
        }
        Op::DeviceOverwrite { slot, value } => {
            if let Some(l) = &mut slots[slot] {
                match w.ok(at, l.mem.device_overwrite())? {
                    Some(mut g) => {
                        g.fill(value).unwrap();
                        let b = f32::from_ne_bytes([value; 4]);
                        l.model.iter_mut().for_each(|v| *v = b);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::DeviceRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.device())? {
                    Some(g) => {
                        let mut bytes = vec![0u8; l.mem.len()];
                        w.streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
                        same(at, &values(&bytes), &l.model)?;
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Prefetch {
            slot,
            stream,
            to_device,
        } => {
            if let Some(l) = &slots[slot] {
                let s = Some(&w.streams[stream]);
                let r = if to_device {
                    l.mem.prefetch_to_device(s)
                } else {
                    l.mem.prefetch_to_host(s)
                };
                if w.ok(at, r)?.is_none() {
                    w.as_it_was(at, l)?;
                }
            }
        }
        Op::Guard { slot, device } => {
            if held.len() >= 2 {
                return Ok(());
            }
            let Some(l) = slots[slot].as_ref() else {
                return Ok(());
            };
            // SAFETY: the borrow outlives this call: `slots` outlives `held` (declared first in
            // `run`, dropped after it), and a slot a guard holds is never replaced or dropped
            // while the guard lives (those operations skip it), so the buffer stays where it
            // is for as long as the guard.
            let l: &'s Live = unsafe { &*std::ptr::from_ref(l) };
            let g = if device {
                w.ok(at, l.mem.device())?.map(|g| Held::Device(slot, g))
            } else {
                w.ok(at, l.mem.host())?.map(|g| Held::Host(slot, g))
            };
            match g {
                Some(g) => held.push(g),
                None => w.as_it_was(at, l)?,
            }
        }
        Op::Release => {
            held.pop();
        }
        Op::Pin { slot } => {
            if pins.len() >= 2 {
                return Ok(());
            }
            if let Some(l) = &slots[slot] {
                let pin = l.mem.pin_placement();
                match w.ok(at, l.mem.host())? {
                    // The address a view would keep: read after the pin is taken.
                    Some(h) => {
                        let at = h.as_ptr() as usize;
                        pins.push(Kept {
                            slot,
                            _pin: pin,
                            at,
                        })
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::Unpin => {
            pins.pop();
        }
        Op::ViewRead { slot } => {
            let Some(p) = pins.iter().find(|p| p.slot == slot) else {
                return Ok(());
            };
            let l = slots[slot].as_ref().unwrap();
            if let Some(h) = w.ok(at, l.mem.host())? {
                prop_assert_eq!(h.as_ptr() as usize, p.at, "{}: the pinned view moved", at);
                same(at, h.as_slice_of::<f32>().unwrap(), &l.model)?;
            } else {
                w.as_it_was(at, l)?;
            }
        }
        Op::UserTwice { slot } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                let stream = &w.streams[l.stream];
                let args = [Arg::write(&l.mem), (n as u32).into()];
                // SAFETY: `twice` touches elements 0..n of the buffer, which holds n floats.
                let r =
                    unsafe { kernels::launch(&w.twice, stream, Grid::for_elements(n, 64), &args) };
                match w.ok(at, r)? {
                    Some(()) => l.model.iter_mut().for_each(|v| *v *= 2.0),
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::ReplicaRead { slot } => {
            if let Some(l) = &slots[slot] {
                match w.ok(at, l.mem.device_on(w.other))? {
                    Some(g) => {
                        let mut bytes = vec![0u8; l.mem.len()];
                        let s = w.other.default_stream().unwrap();
                        s.read(g.buffer(), 0, &mut bytes).unwrap();
                        same(at, &values(&bytes), &l.model)?;
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::ReplicaScale { slot, a } => {
            if let Some(l) = &mut slots[slot] {
                let n = l.model.len();
                match w.ok(at, l.mem.device_mut_on(w.other))? {
                    Some(mut g) => {
                        kernels::scale(n, a, &mut g).unwrap();
                        l.model.iter_mut().for_each(|v| *v *= a);
                    }
                    None => w.as_it_was(at, l)?,
                }
            }
        }
        Op::FailNext { n } => {
            w.dev.fail_allocation(n);
            w.other.fail_allocation(n);
        }
    }
    Ok(())
}

/// An isolated handle of `base` with the cap and the zero-copy setting.
fn capped(base: &Device, zero_copy: ZeroCopy) -> Device {
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
        .unwrap_or(256)
}

/// Runs the model on `home` (with replicas on `other`) under every zero-copy setting.
fn check(home: &Device, other: &Device) {
    let mut failed = 0;
    let mut injected = 0;
    let mut spills = 0;
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let dev = capped(home, zero_copy);
        let other = capped(other, zero_copy);
        let streams = [
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
        ];
        let w = World {
            dev: &dev,
            other: &other,
            streams: &streams,
            twice: user_twice(),
            failed: std::cell::Cell::new(0),
        };
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&prop::collection::vec(op(), 1..80), |ops| {
            dev.fail_allocation(0);
            other.fail_allocation(0);
            run(&w, &ops)
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => {
                panic!(
                    "{} zero-copy {zero_copy}: {why}\nminimal case: {ops:#?}",
                    dev.label()
                )
            }
            Err(e) => panic!("{} zero-copy {zero_copy}: {e}", dev.label()),
        }
        let s = dev.pool_stats().unwrap();
        eprintln!(
            "{} zero-copy {zero_copy}: {} failed operations ({} injected), {} spills, {} \
             refills, {} evictions",
            dev.label(),
            w.failed.get(),
            dev.injected_failures() + other.injected_failures(),
            s.spills,
            s.refills,
            s.evictions
        );
        failed += w.failed.get();
        injected += dev.injected_failures() + other.injected_failures();
        spills += s.spills;
    }
    assert!(injected > 0, "no allocation failure was injected");
    assert!(failed > 0, "no operation failed");
    assert!(spills > 0, "no dirty mirror was ever spilled");
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_cpu() {
    let cpu = Device::cpu();
    check(&cpu, &cpu.isolated());
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_opencl() {
    if let Some((a, b)) = syncmem::testing::two_or_skip(
        syncmem::BackendKind::OpenCl,
        "random_programs_over_every_feature_keep_the_host_model_on_opencl",
    ) {
        check(&a, &b);
    }
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip(
        "random_programs_over_every_feature_keep_the_host_model_on_cuda",
    ) {
        // A second CUDA device where there is one; else replicas on a second handle of it.
        let other = Device::all(syncmem::BackendKind::Cuda)
            .ok()
            .and_then(|all| all.get(1).cloned())
            .unwrap_or_else(|| dev.isolated());
        check(&dev, &other);
    }
}
