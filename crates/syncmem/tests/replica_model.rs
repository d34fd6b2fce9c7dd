//! Random reads, writes and overwrites of buffers on the host and on three devices (the home
//! OpenCL device, a second OpenCL device of its context, and `cpu`), with zero-copy on, off and
//! with the map protocol, against a host model of every buffer's contents. Device writes are
//! queued kernels (PoCL runs them asynchronously), so copies between devices really have to be
//! ordered after them. Besides the values, every read where the place already held a current
//! copy must copy nothing.
//!
//! Needs two OpenCL devices (`POCL_DEVICES="pthread pthread"`); a failure when
//! `SYNCMEM_REQUIRE_OPENCL` is set and the second is missing.

#![cfg(feature = "opencl")]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use syncmem::{kernels, BackendKind, Device, Head, SyncedMemory, ZeroCopy};

const SLOTS: usize = 3;
/// Elements (`f32`) of each buffer.
const N: usize = 256;

/// Where an access happens: 0 the host, 1 the home device, 2 the second OpenCL device, 3 `cpu`.
type Place = usize;

#[derive(Debug, Clone, Copy)]
enum Op {
    Read {
        slot: usize,
        place: Place,
    },
    /// One element set from the host, or (devices) `x *= a` by a queued kernel.
    Write {
        slot: usize,
        place: Place,
        at: usize,
        value: i8,
    },
    /// Every byte set to `value` (host: a fill of the host slice; devices: a device fill).
    Overwrite {
        slot: usize,
        place: Place,
        value: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let place = 0..4usize;
    prop_oneof![
        4 => (slot.clone(), place.clone()).prop_map(|(slot, place)| Op::Read { slot, place }),
        4 => (slot.clone(), place.clone(), 0..N, -3i8..4).prop_map(|(slot, place, at, value)| {
            Op::Write { slot, place, at, value }
        }),
        // Bytes up to 0x40 make finite floats (no NaN whose bits could differ).
        1 => (slot, place, 0u8..0x40)
            .prop_map(|(slot, place, value)| Op::Overwrite { slot, place, value }),
    ]
}

fn as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Whether `place` holds a current copy of `m` now.
fn current(m: &SyncedMemory, devs: &[Device; 3], place: Place) -> bool {
    match place {
        0 => matches!(m.head(), Head::AtHost | Head::Synced),
        p => m.is_current_on(&devs[p - 1]),
    }
}

fn read(m: &SyncedMemory, devs: &[Device; 3], place: Place) -> Vec<u8> {
    match place {
        0 => m.host().unwrap().to_vec(),
        p => {
            let g = m.device_on(&devs[p - 1]).unwrap();
            let mut out = vec![0u8; m.len()];
            g.read_into(&mut out).unwrap();
            out
        }
    }
}

fn run(devs: &[Device; 3], ops: &[Op]) -> Result<(), TestCaseError> {
    // Every element non-zero at first, so that a scale on any device changes every one.
    let first: Vec<f32> = (0..N).map(|i| (i % 7) as f32 + 1.0).collect();
    let bufs: Vec<SyncedMemory> = (0..SLOTS)
        .map(|_| {
            let m = SyncedMemory::new(N * 4, &devs[0]);
            m.host_overwrite()
                .unwrap()
                .as_mut_slice_of::<f32>()
                .unwrap()
                .copy_from_slice(&first);
            m
        })
        .collect();
    let mut model = vec![to_bytes(&first); SLOTS];
    for (step, &op) in ops.iter().enumerate() {
        match op {
            Op::Read { slot, place } => {
                check_read(&bufs[slot], devs, place, &model[slot], step, op)?;
            }
            Op::Write {
                slot,
                place,
                at,
                value,
            } => model[slot] = write(&bufs[slot], devs, place, at, value, &model[slot]),
            Op::Overwrite { slot, place, value } => {
                let m = &bufs[slot];
                if place == 0 {
                    m.host_overwrite().unwrap().fill(value);
                } else {
                    m.device_overwrite_on(&devs[place - 1])
                        .unwrap()
                        .fill(value)
                        .unwrap();
                }
                model[slot] = vec![value; N * 4];
            }
        }
    }
    for (slot, m) in bufs.iter().enumerate() {
        for place in [3, 2, 1, 0] {
            prop_assert_eq!(
                &read(m, devs, place),
                &model[slot],
                "final {} {}",
                slot,
                place
            );
        }
    }
    Ok(())
}

/// A read at `place` finds the model's bytes, copies nothing where a current copy was, and
/// leaves a current copy there.
fn check_read(
    m: &SyncedMemory,
    devs: &[Device; 3],
    place: Place,
    want: &[u8],
    step: usize,
    op: Op,
) -> Result<(), TestCaseError> {
    let was_current = current(m, devs, place);
    let before = m.copy_stats();
    let got = read(m, devs, place);
    prop_assert_eq!(&got[..], want, "step {}: {:?}", step, op);
    if was_current {
        let copied = m.copy_stats().since(&before).total_count();
        prop_assert_eq!(copied, 0, "step {}: {:?} copied a current copy", step, op);
    }
    prop_assert!(
        current(m, devs, place),
        "step {}: {:?} left it stale",
        step,
        op
    );
    Ok(())
}

/// A write at `place`: one element on the host, a scale of every element on a device; returns
/// the model's bytes after it.
fn write(
    m: &SyncedMemory,
    devs: &[Device; 3],
    place: Place,
    at: usize,
    value: i8,
    model: &[u8],
) -> Vec<u8> {
    let mut v = as_f32(model);
    if place == 0 {
        let mut g = m.host_mut().unwrap();
        g.as_mut_slice_of::<f32>().unwrap()[at] = f32::from(value);
        v[at] = f32::from(value);
    } else {
        // A factor that changes every element (not 0 or 1).
        let a = [-2.0, -1.0, 2.0, 3.0][value.rem_euclid(4) as usize];
        kernels::scale(N, a, &mut m.device_mut_on(&devs[place - 1]).unwrap()).unwrap();
        v.iter_mut().for_each(|x| *x *= a);
    }
    to_bytes(&v)
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

#[test]
fn random_programs_on_three_devices_keep_the_host_model() {
    let Some((a, b)) = syncmem::testing::two_or_skip(BackendKind::OpenCl, "replica model") else {
        return;
    };
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let devs = [a.isolated(), b.isolated(), Device::cpu()];
        devs[0].set_zero_copy(zero_copy);
        devs[1].set_zero_copy(zero_copy);
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        match runner.run(&prop::collection::vec(op(), 1..50), |ops| run(&devs, &ops)) {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => {
                panic!("zero-copy {zero_copy}: {why}\nminimal case: {ops:#?}")
            }
            Err(e) => panic!("zero-copy {zero_copy}: {e}"),
        }
    }
}
