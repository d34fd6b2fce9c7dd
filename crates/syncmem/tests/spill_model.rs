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

#[path = "common/model.rs"]
mod model;

use model::{pattern, same, values};
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

#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc {
        slot: usize,
        size: usize,
        stream: usize,
        seed: u8,
    },
    Drop {
        slot: usize,
    },
    HostRead {
        slot: usize,
    },
    HostWrite {
        slot: usize,
        at: usize,
        value: i8,
    },
    HostOverwrite {
        slot: usize,
        seed: u8,
    },
    /// `x *= a` on the device, on the buffer's stream.
    Scale {
        slot: usize,
        a: f32,
    },
    /// `y += a * x` on `y`'s stream.
    Axpy {
        x: usize,
        y: usize,
        a: f32,
    },
    /// Overwrites every element on the device (a fill).
    DeviceOverwrite {
        slot: usize,
        value: u8,
    },
    DeviceRead {
        slot: usize,
    },
    Prefetch {
        slot: usize,
        stream: usize,
        to_device: bool,
    },
    /// Keeps a host (or device) read guard of the slot until `Release`.
    Guard {
        slot: usize,
        device: bool,
    },
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    let slot = || 0..SLOTS;
    prop_oneof![
        3 => (slot(), 0..SIZES.len(), 0..2usize, any::<u8>())
            .prop_map(|(slot, size, stream, seed)| Op::Alloc { slot, size, stream, seed }),
        1 => slot().prop_map(|slot| Op::Drop { slot }),
        2 => slot().prop_map(|slot| Op::HostRead { slot }),
        2 => (slot(), any::<usize>(), any::<i8>())
            .prop_map(|(slot, at, value)| Op::HostWrite { slot, at, value }),
        1 => (slot(), any::<u8>()).prop_map(|(slot, seed)| Op::HostOverwrite { slot, seed }),
        3 => (slot(), prop::sample::select(vec![2.0f32, 0.5, -1.0]))
            .prop_map(|(slot, a)| Op::Scale { slot, a }),
        3 => (slot(), slot(), prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, a)| Op::Axpy { x, y, a }),
        1 => (slot(), 0u8..8).prop_map(|(slot, value)| Op::DeviceOverwrite { slot, value }),
        2 => slot().prop_map(|slot| Op::DeviceRead { slot }),
        2 => (slot(), 0..2usize, any::<bool>())
            .prop_map(|(slot, stream, to_device)| Op::Prefetch { slot, stream, to_device }),
        1 => (slot(), any::<bool>()).prop_map(|(slot, device)| Op::Guard { slot, device }),
        1 => Just(Op::Release),
    ]
}

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

fn run(dev: &Device, streams: &[Stream; 3], ops: &[Op]) -> Result<(), TestCaseError> {
    // Declared before the guards, which borrow its buffers (dropped after them).
    let mut slots: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    let mut held: Vec<Held<'_>> = Vec::new();
    let guarded = |held: &[Held<'_>], slot: usize| held.iter().any(|h| h.slot() == slot);
    for (step, op) in ops.iter().enumerate() {
        let at = |what: &str| format!("{what}, step {step} ({op:?})");
        // Operations that need the slot's write lock (or replace it) skip guarded slots; the
        // guards of this thread would make them fail with Busy (tested elsewhere).
        match *op {
            Op::Alloc { slot, .. }
            | Op::Drop { slot }
            | Op::HostWrite { slot, .. }
            | Op::HostOverwrite { slot, .. }
            | Op::Scale { slot, .. }
            | Op::DeviceOverwrite { slot, .. }
                if guarded(&held, slot) =>
            {
                continue
            }
            Op::Axpy { y, .. } if guarded(&held, y) => continue,
            _ => {}
        }
        match *op {
            Op::Alloc {
                slot,
                size,
                stream,
                seed,
            } => {
                slots[slot] = None;
                let n = SIZES[size];
                let model = pattern(n, seed);
                let mem = SyncedMemory::new(n * 4, dev)
                    .with_stream(&streams[stream])
                    .unwrap()
                    .with_label(format!("slot {slot} (step {step})"));
                mem.host_overwrite()
                    .unwrap()
                    .as_mut_slice_of::<f32>()
                    .unwrap()
                    .copy_from_slice(&model);
                slots[slot] = Some(Live { mem, model });
            }
            Op::Drop { slot } => slots[slot] = None,
            Op::HostRead { slot } => {
                if let Some(l) = &slots[slot] {
                    let h = l.mem.host().unwrap();
                    same(&at("host read"), h.as_slice_of::<f32>().unwrap(), &l.model)?;
                }
            }
            Op::HostWrite { slot, at: i, value } => {
                if let Some(l) = &mut slots[slot] {
                    let i = i % l.model.len();
                    l.model[i] = f32::from(value);
                    l.mem.host_mut().unwrap().as_mut_slice_of::<f32>().unwrap()[i] =
                        f32::from(value);
                }
            }
            Op::HostOverwrite { slot, seed } => {
                if let Some(l) = &mut slots[slot] {
                    l.model = pattern(l.model.len(), seed);
                    l.mem
                        .host_overwrite()
                        .unwrap()
                        .as_mut_slice_of::<f32>()
                        .unwrap()
                        .copy_from_slice(&l.model);
                }
            }
            Op::Scale { slot, a } => {
                if let Some(l) = &mut slots[slot] {
                    let n = l.model.len();
                    kernels::scale(n, a, &mut l.mem.device_mut().unwrap()).unwrap();
                    l.model.iter_mut().for_each(|v| *v *= a);
                }
            }
            Op::Axpy { x, y, a } => {
                if x == y {
                    continue;
                }
                let (Some(lx), Some(ly)) = (&slots[x], &slots[y]) else {
                    continue;
                };
                let n = lx.model.len().min(ly.model.len());
                {
                    let xd = lx.mem.device().unwrap();
                    let mut yd = ly.mem.device_mut().unwrap();
                    kernels::axpy(n, a, &xd, &mut yd).unwrap();
                }
                let xs = lx.model[..n].to_vec();
                let ly = slots[y].as_mut().unwrap();
                for (v, xv) in ly.model.iter_mut().zip(xs) {
                    *v += a * xv;
                }
            }
            Op::DeviceOverwrite { slot, value } => {
                if let Some(l) = &mut slots[slot] {
                    l.mem.device_overwrite().unwrap().fill(value).unwrap();
                    let b = f32::from_ne_bytes([value; 4]);
                    l.model.iter_mut().for_each(|v| *v = b);
                }
            }
            Op::DeviceRead { slot } => {
                if let Some(l) = &slots[slot] {
                    let g = l.mem.device().unwrap();
                    let mut bytes = vec![0u8; l.mem.len()];
                    streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
                    same(&at("device read"), &values(&bytes), &l.model)?;
                }
            }
            Op::Prefetch {
                slot,
                stream,
                to_device,
            } => {
                if let Some(l) = &slots[slot] {
                    if to_device {
                        l.mem.prefetch_to_device(Some(&streams[stream])).unwrap();
                    } else {
                        l.mem.prefetch_to_host(Some(&streams[stream])).unwrap();
                    }
                }
            }
            Op::Guard { slot, device } => {
                if held.len() >= 2 {
                    continue;
                }
                let Some(l) = slots[slot].as_ref() else {
                    continue;
                };
                // SAFETY: the borrow outlives this iteration: `slots` outlives `held`
                // (declared first, dropped after it), and a slot a guard holds is never
                // replaced or dropped while the guard lives (those operations skip it above),
                // so the buffer stays where it is for as long as the guard.
                let l: &Live = unsafe { &*std::ptr::from_ref(l) };
                held.push(if device {
                    Held::Device(slot, l.mem.device().unwrap())
                } else {
                    Held::Host(slot, l.mem.host().unwrap())
                });
            }
            Op::Release => {
                held.pop();
            }
        }
        // What a device guard holds keeps its device mirror, whatever the pool spilled; what a
        // host guard holds keeps its bytes.
        for h in &held {
            let l = slots[h.slot()].as_ref().unwrap();
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
    }
    held.clear();
    for (slot, l) in slots.iter().enumerate() {
        if let Some(l) = l {
            let mut bytes = vec![0u8; l.mem.len()];
            streams[2]
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
    }
    Ok(())
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

#[test]
fn random_programs_under_a_cap_keep_the_host_model() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model") else {
        return;
    };
    let mut spills = 0;
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let dev = device(&base, zero_copy);
        let streams = [
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
        ];
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

/// A case the property test found: with two mirrors, the pool failed although a clean mirror
/// no guard held (and a stale one) could have been dropped.
#[test]
fn a_found_case_with_two_mirrors() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model, found case") else {
        return;
    };
    let dev = device(&base, ZeroCopy::Off);
    let streams = [
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    ];
    let ops = [
        Op::DeviceRead { slot: 2 },
        Op::HostWrite {
            slot: 1,
            at: 17477444433381155742,
            value: 48,
        },
        Op::Guard {
            slot: 5,
            device: true,
        },
        Op::DeviceRead { slot: 4 },
        Op::Scale { slot: 7, a: 0.5 },
        Op::Scale { slot: 0, a: 0.5 },
        Op::Alloc {
            slot: 3,
            size: 1,
            stream: 1,
            seed: 187,
        },
        Op::Prefetch {
            slot: 3,
            stream: 1,
            to_device: false,
        },
        Op::HostWrite {
            slot: 2,
            at: 16195540195430635671,
            value: -104,
        },
        Op::HostRead { slot: 6 },
        Op::DeviceRead { slot: 3 },
        Op::Prefetch {
            slot: 2,
            stream: 1,
            to_device: false,
        },
        Op::Prefetch {
            slot: 5,
            stream: 0,
            to_device: false,
        },
        Op::Alloc {
            slot: 7,
            size: 1,
            stream: 1,
            seed: 198,
        },
        Op::DeviceRead { slot: 4 },
        Op::Alloc {
            slot: 6,
            size: 0,
            stream: 1,
            seed: 121,
        },
        Op::Alloc {
            slot: 0,
            size: 1,
            stream: 1,
            seed: 166,
        },
        Op::Drop { slot: 1 },
        Op::Axpy {
            x: 6,
            y: 6,
            a: -1.0,
        },
        Op::HostRead { slot: 3 },
        Op::Alloc {
            slot: 1,
            size: 1,
            stream: 1,
            seed: 104,
        },
        Op::Prefetch {
            slot: 0,
            stream: 1,
            to_device: true,
        },
        Op::HostWrite {
            slot: 7,
            at: 9614069386335630893,
            value: -72,
        },
        Op::Guard {
            slot: 6,
            device: true,
        },
        Op::DeviceRead { slot: 2 },
        Op::Alloc {
            slot: 5,
            size: 0,
            stream: 1,
            seed: 185,
        },
        Op::Scale { slot: 0, a: -1.0 },
        Op::Guard {
            slot: 1,
            device: true,
        },
        Op::HostWrite {
            slot: 5,
            at: 8892928699882156549,
            value: -86,
        },
        Op::HostRead { slot: 6 },
        Op::Scale { slot: 2, a: -1.0 },
        Op::Scale { slot: 1, a: 2.0 },
        Op::Axpy {
            x: 5,
            y: 7,
            a: -1.0,
        },
        Op::Release,
        Op::Scale { slot: 4, a: 0.5 },
        Op::HostWrite {
            slot: 0,
            at: 3979312645902168649,
            value: 83,
        },
        Op::Guard {
            slot: 6,
            device: true,
        },
        Op::HostRead { slot: 5 },
        Op::Alloc {
            slot: 5,
            size: 1,
            stream: 1,
            seed: 8,
        },
        Op::Alloc {
            slot: 4,
            size: 1,
            stream: 1,
            seed: 52,
        },
        Op::HostOverwrite { slot: 2, seed: 238 },
        Op::Prefetch {
            slot: 7,
            stream: 0,
            to_device: false,
        },
        Op::Alloc {
            slot: 6,
            size: 0,
            stream: 1,
            seed: 52,
        },
        Op::DeviceOverwrite { slot: 2, value: 2 },
        Op::HostWrite {
            slot: 3,
            at: 13120408832017867155,
            value: 111,
        },
        Op::Drop { slot: 4 },
        Op::Alloc {
            slot: 6,
            size: 0,
            stream: 1,
            seed: 203,
        },
        Op::Release,
        Op::Axpy {
            x: 5,
            y: 3,
            a: -1.0,
        },
        Op::Axpy { x: 4, y: 2, a: 1.0 },
        Op::Axpy {
            x: 2,
            y: 7,
            a: -1.0,
        },
        Op::Release,
        Op::DeviceOverwrite { slot: 4, value: 7 },
    ];
    run(&dev, &streams, &ops).unwrap();
}

/// A case the property test found: with zero-copy, a host view of a spilled buffer was freed
/// under its guard when a device read on the same thread moved the data into shared memory.
#[test]
fn a_found_case_with_zero_copy() {
    let Some(base) = syncmem::testing::opencl_or_skip("spill model, zero-copy case") else {
        return;
    };
    let dev = device(&base, ZeroCopy::Auto);
    let streams = [
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    ];
    let ops = [
        Op::Alloc {
            slot: 3,
            size: 0,
            stream: 1,
            seed: 49,
        },
        Op::Guard {
            slot: 6,
            device: false,
        },
        Op::Alloc {
            slot: 0,
            size: 0,
            stream: 0,
            seed: 198,
        },
        Op::Alloc {
            slot: 5,
            size: 1,
            stream: 0,
            seed: 62,
        },
        Op::HostOverwrite { slot: 4, seed: 51 },
        Op::Scale { slot: 7, a: -1.0 },
        Op::HostWrite {
            slot: 3,
            at: 14561089530153548858,
            value: 18,
        },
        Op::HostOverwrite { slot: 7, seed: 142 },
        Op::HostRead { slot: 1 },
        Op::HostOverwrite { slot: 2, seed: 1 },
        Op::Release,
        Op::Alloc {
            slot: 7,
            size: 1,
            stream: 1,
            seed: 238,
        },
        Op::Guard {
            slot: 1,
            device: true,
        },
        Op::HostWrite {
            slot: 4,
            at: 7024755581130613340,
            value: 96,
        },
        Op::DeviceOverwrite { slot: 2, value: 6 },
        Op::Drop { slot: 2 },
        Op::Axpy { x: 4, y: 2, a: 1.0 },
        Op::Axpy {
            x: 5,
            y: 4,
            a: -1.0,
        },
        Op::DeviceRead { slot: 2 },
        Op::Axpy { x: 3, y: 0, a: 1.0 },
        Op::Alloc {
            slot: 6,
            size: 1,
            stream: 0,
            seed: 103,
        },
        Op::Prefetch {
            slot: 2,
            stream: 0,
            to_device: true,
        },
        Op::Scale { slot: 1, a: 2.0 },
        Op::HostWrite {
            slot: 2,
            at: 6285705539075717315,
            value: 125,
        },
        Op::Prefetch {
            slot: 0,
            stream: 0,
            to_device: false,
        },
        Op::Scale { slot: 0, a: -1.0 },
        Op::DeviceRead { slot: 2 },
        Op::Drop { slot: 1 },
        Op::DeviceRead { slot: 0 },
        Op::DeviceRead { slot: 0 },
        Op::HostRead { slot: 1 },
        Op::Release,
        Op::Axpy { x: 2, y: 4, a: 1.0 },
        Op::Alloc {
            slot: 6,
            size: 1,
            stream: 1,
            seed: 214,
        },
        Op::Alloc {
            slot: 7,
            size: 1,
            stream: 0,
            seed: 32,
        },
        Op::DeviceRead { slot: 7 },
        Op::DeviceRead { slot: 1 },
        Op::Alloc {
            slot: 0,
            size: 1,
            stream: 0,
            seed: 95,
        },
        Op::HostOverwrite { slot: 4, seed: 243 },
        Op::HostRead { slot: 0 },
        Op::Alloc {
            slot: 7,
            size: 0,
            stream: 0,
            seed: 35,
        },
        Op::HostRead { slot: 5 },
        Op::DeviceRead { slot: 4 },
        Op::Axpy {
            x: 4,
            y: 6,
            a: -1.0,
        },
        Op::HostWrite {
            slot: 2,
            at: 16199026695163719472,
            value: 71,
        },
        Op::Release,
        Op::Alloc {
            slot: 2,
            size: 1,
            stream: 1,
            seed: 58,
        },
        Op::HostWrite {
            slot: 3,
            at: 4858432362331682890,
            value: 43,
        },
        Op::Scale { slot: 1, a: 0.5 },
        Op::Alloc {
            slot: 7,
            size: 1,
            stream: 0,
            seed: 238,
        },
        Op::Alloc {
            slot: 3,
            size: 0,
            stream: 1,
            seed: 193,
        },
        Op::Prefetch {
            slot: 0,
            stream: 0,
            to_device: false,
        },
        Op::Prefetch {
            slot: 7,
            stream: 0,
            to_device: false,
        },
        Op::Scale { slot: 6, a: 2.0 },
        Op::Scale { slot: 5, a: 2.0 },
        Op::HostRead { slot: 6 },
        Op::Guard {
            slot: 7,
            device: false,
        },
        Op::Axpy { x: 7, y: 0, a: 1.0 },
    ];
    run(&dev, &streams, &ops).unwrap();
}
