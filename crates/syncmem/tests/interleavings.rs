//! Random interleavings of queued kernels, host reads, host writes, drops and re-allocations,
//! on one and on two streams of the OpenCL device, checked against a host model.
//!
//! Kernels are queued and never waited for, blocks freed with work pending go back to the
//! device pool and come out again for the next buffer of that size, and kernels on one stream
//! read buffers last written on the other: every value read back must still be the model's.
//!
//! A stream can be held by an OpenCL user-event gate (`Hold`), so that kernels and copies are
//! really still queued when the next operations run. Operations that must wait for the device
//! (host reads and writes, blocking device reads, dropping a buffer whose upload is held) open
//! the gates first; every other operation must return while the gates are closed: a watchdog
//! opens them if an operation blocks for 10 s, and the case fails.
//! Values stay exact: the scale factors are powers of two or -1 and `axpy` adds `±x`, so a fused
//! multiply-add and a separate multiply and add round the same way.

#![cfg(feature = "opencl")]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use syncmem::{kernels, Device, Stream, SyncedMemory};

#[path = "common/gate.rs"]
mod gate;
use gate::Gate;

/// Buffer slots the operations name.
const SLOTS: usize = 4;
/// The two buffer sizes, in `f32` elements: every re-allocation of a size can reuse a block.
const SIZES: [usize; 2] = [1 << 10, 1 << 16];

#[derive(Debug, Clone)]
enum Op {
    /// Replaces the slot with a new buffer of `SIZES[size]` on stream `stream`, filled from the
    /// host with `seed`-based values (the old buffer is dropped, possibly with work pending).
    Alloc {
        slot: usize,
        size: usize,
        stream: usize,
        seed: u8,
    },
    /// Drops the slot's buffer.
    Drop { slot: usize },
    /// Reads the slot's buffer on the host and compares it with the model.
    HostRead { slot: usize },
    /// Writes one element on the host.
    HostWrite { slot: usize, at: usize, value: i8 },
    /// `x *= a` on the device, queued on the buffer's stream.
    Scale { slot: usize, a: f32 },
    /// `y += a * x` on the device, queued on `y`'s stream (`x` may be on the other one).
    Axpy { x: usize, y: usize, a: f32 },
    /// Reads the device mirror with a blocking read on a third stream.
    DeviceRead { slot: usize },
    /// Holds stream `stream` (0 or 1) behind a gate until an operation that waits opens it.
    Hold { stream: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    prop_oneof![
        3 => (0..SLOTS, 0..SIZES.len(), 0..2usize, any::<u8>())
            .prop_map(|(slot, size, stream, seed)| Op::Alloc { slot, size, stream, seed }),
        1 => slot.clone().prop_map(|slot| Op::Drop { slot }),
        2 => slot.clone().prop_map(|slot| Op::HostRead { slot }),
        2 => (0..SLOTS, any::<usize>(), any::<i8>())
            .prop_map(|(slot, at, value)| Op::HostWrite { slot, at, value }),
        3 => (0..SLOTS, prop::sample::select(vec![2.0f32, 0.5, -1.0]))
            .prop_map(|(slot, a)| Op::Scale { slot, a }),
        4 => (0..SLOTS, 0..SLOTS, prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, a)| Op::Axpy { x, y, a }),
        1 => slot.prop_map(|slot| Op::DeviceRead { slot }),
        2 => (0..2usize).prop_map(|stream| Op::Hold { stream }),
    ]
}

/// A live buffer and what it must hold.
struct Live {
    mem: SyncedMemory,
    model: Vec<f32>,
    stream: usize,
    /// The host holds data the device has not seen: the next device access uploads it.
    host_newer: bool,
    /// An upload of the host mirror is queued behind a closed gate: dropping the buffer waits.
    upload_held: bool,
    /// The streams (0 and 1) that queued commands on this buffer since the gates last opened.
    used: [bool; 2],
}

/// The gates of one case, shared with its watchdog.
#[derive(Default)]
struct Gates {
    held: Mutex<[Option<Arc<Gate>>; 2]>,
    /// Streams blocked without a gate of their own: they wait, on the device, for work of a
    /// held stream (a kernel reading a buffer the held stream writes, a guard ordered after
    /// the held stream's commands on its buffer). Over-approximated: any command on a buffer
    /// a blocked stream used since the gates opened blocks the stream that queues it.
    tainted: Mutex<[bool; 2]>,
    fired: AtomicBool,
}

impl Gates {
    fn hold(&self, streams: &[Stream; 3], s: usize) {
        let mut held = self.held.lock().unwrap();
        if held[s].is_none() {
            held[s] = Some(Arc::new(Gate::block(&streams[s])));
        }
    }

    fn is_held(&self, s: usize) -> bool {
        self.held.lock().unwrap()[s].is_some() || self.tainted.lock().unwrap()[s]
    }

    /// Notes commands queued on stream `s` that touch `lives`: `s` is blocked from now on if
    /// one of them has work on a blocked stream.
    fn queue_on(&self, s: usize, lives: &mut [&mut Live]) {
        let blocked = lives
            .iter()
            .any(|l| (0..2).any(|t| l.used[t] && self.is_held(t)));
        if blocked {
            self.tainted.lock().unwrap()[s] = true;
        }
        for l in lives.iter_mut() {
            l.used[s] = true;
        }
    }

    /// Opens every gate (an operation that waits for the device comes next).
    fn open_all(&self, slots: &mut [Option<Live>]) {
        for g in self.held.lock().unwrap().iter_mut() {
            if let Some(g) = g.take() {
                g.open();
            }
        }
        *self.tainted.lock().unwrap() = [false; 2];
        for l in slots.iter_mut().flatten() {
            l.upload_held = false;
            l.used = [false; 2];
        }
    }

    /// The watchdog's way out: opens the gates from another thread.
    fn fire(&self) {
        self.fired.store(true, SeqCst);
        for g in self.held.lock().unwrap().iter().flatten() {
            g.open();
        }
    }
}

/// The live buffers of two different slots, both present.
fn two_mut(slots: &mut [Option<Live>], x: usize, y: usize) -> (&mut Live, &mut Live) {
    let (lo, hi) = (x.min(y), x.max(y));
    let (a, b) = slots.split_at_mut(hi);
    let (l, h) = (a[lo].as_mut().unwrap(), b[0].as_mut().unwrap());
    if x < y {
        (l, h)
    } else {
        (h, l)
    }
}

/// Notes a device access of `l`: an upload is queued if the host was newer.
fn device_access(l: &mut Live, gates: &Gates) {
    if l.host_newer {
        l.host_newer = false;
        l.upload_held |= gates.is_held(l.stream);
    }
}

fn values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn same(what: &str, got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{what}: element {i} is {} where the model has {}",
            got[i], want[i]
        )));
    }
    Ok(())
}

/// Runs `ops` with a watchdog that opens the gates if one operation takes 10 s.
fn run(dev: &Device, streams: &[Stream; 3], ops: &[Op]) -> Result<(), TestCaseError> {
    let gates = Gates::default();
    let result = std::thread::scope(|s| {
        let (beat, beats) = mpsc::channel::<()>();
        let watched = &gates;
        s.spawn(move || loop {
            match beats.recv_timeout(Duration::from_secs(10)) {
                Ok(()) => {}
                Err(RecvTimeoutError::Timeout) => break watched.fire(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
        });
        run_ops(dev, streams, ops, &gates, &beat)
    });
    if gates.fired.load(SeqCst) {
        return Err(TestCaseError::fail(
            "an operation waited for work held behind a gate",
        ));
    }
    result
}

fn run_ops(
    dev: &Device,
    streams: &[Stream; 3],
    ops: &[Op],
    gates: &Gates,
    beat: &mpsc::Sender<()>,
) -> Result<(), TestCaseError> {
    let mut slots: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    for (step, op) in ops.iter().enumerate() {
        let _ = beat.send(());
        let waits = matches!(
            op,
            Op::HostRead { .. } | Op::HostWrite { .. } | Op::DeviceRead { .. }
        );
        let drops = match *op {
            Op::Alloc { slot, .. } | Op::Drop { slot } => slot,
            _ => usize::MAX,
        };
        if waits
            || slots
                .get(drops)
                .and_then(Option::as_ref)
                .is_some_and(|l| l.upload_held)
        {
            gates.open_all(&mut slots);
        }
        match *op {
            Op::Hold { stream } => gates.hold(streams, stream),
            Op::Alloc {
                slot,
                size,
                stream,
                seed,
            } => {
                slots[slot] = None;
                let n = SIZES[size];
                let model: Vec<f32> = (0..n)
                    .map(|i| f32::from((i as u8).wrapping_add(seed) % 16) - 8.0)
                    .collect();
                let mem = SyncedMemory::new(n * 4, dev)
                    .with_stream(&streams[stream])
                    .unwrap()
                    .with_label(format!("slot {slot} (step {step})"));
                mem.host_overwrite()
                    .unwrap()
                    .as_mut_slice_of::<f32>()
                    .unwrap()
                    .copy_from_slice(&model);
                slots[slot] = Some(Live {
                    mem,
                    model,
                    stream,
                    host_newer: true,
                    upload_held: false,
                    used: [false; 2],
                });
            }
            Op::Drop { slot } => slots[slot] = None,
            Op::HostRead { slot } => {
                if let Some(l) = &slots[slot] {
                    let h = l.mem.host().unwrap();
                    same(
                        &format!("host read, step {step}"),
                        h.as_slice_of::<f32>().unwrap(),
                        &l.model,
                    )?;
                }
            }
            Op::HostWrite { slot, at, value } => {
                if let Some(l) = &mut slots[slot] {
                    let at = at % l.model.len();
                    l.model[at] = f32::from(value);
                    l.host_newer = true;
                    l.mem.host_mut().unwrap().as_mut_slice_of::<f32>().unwrap()[at] =
                        f32::from(value);
                }
            }
            Op::Scale { slot, a } => {
                if let Some(l) = &mut slots[slot] {
                    let n = l.model.len();
                    gates.queue_on(l.stream, &mut [&mut *l]);
                    device_access(l, gates);
                    kernels::scale(n, a, &mut l.mem.device_mut().unwrap()).unwrap();
                    l.model.iter_mut().for_each(|v| *v *= a);
                }
            }
            Op::Axpy { x, y, a } => {
                if x == y {
                    continue;
                }
                if slots[x].is_none() || slots[y].is_none() {
                    continue;
                }
                // The guard of `x` orders its stream after the other streams' work on `x`;
                // the kernel runs on `y`'s stream, after `x`'s writer.
                {
                    let (lx, ly) = two_mut(&mut slots, x, y);
                    let (sx, sy) = (lx.stream, ly.stream);
                    gates.queue_on(sx, &mut [&mut *lx]);
                    gates.queue_on(sy, &mut [&mut *lx, &mut *ly]);
                }
                for i in [x, y] {
                    device_access(slots[i].as_mut().unwrap(), gates);
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
            Op::DeviceRead { slot } => {
                if let Some(l) = &slots[slot] {
                    let g = l.mem.device().unwrap();
                    let mut bytes = vec![0u8; l.mem.len()];
                    streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
                    same(
                        &format!("device read, step {step}"),
                        &values(&bytes),
                        &l.model,
                    )?;
                }
            }
        }
    }
    // Every buffer still alive ends as the model says.
    gates.open_all(&mut slots);
    for (slot, l) in slots.iter().enumerate() {
        if let Some(l) = l {
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn queued_work_matches_the_host_model(ops in prop::collection::vec(op(), 1..40)) {
        let Some(dev) = syncmem::testing::opencl_or_skip("queued interleavings") else {
            return Ok(());
        };
        let streams = [
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
        ];
        run(&dev, &streams, &ops)?;
    }
}

/// A stream that waits on the device for a held stream holds what is queued on it after: the
/// upload of a new buffer on it is behind the gate, so dropping that buffer waits (the model
/// opens the gates first; before the model knew it, this case tripped the watchdog).
#[test]
fn a_stream_waiting_for_a_held_stream_holds_its_later_uploads() {
    let Some(dev) = syncmem::testing::opencl_or_skip("queued interleavings") else {
        return;
    };
    let streams = [
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    ];
    let ops = [
        Op::Hold { stream: 0 },
        Op::Alloc {
            slot: 0,
            size: 0,
            stream: 0,
            seed: 1,
        },
        Op::Scale { slot: 0, a: 2.0 },
        Op::Alloc {
            slot: 1,
            size: 0,
            stream: 1,
            seed: 2,
        },
        Op::Axpy { x: 0, y: 1, a: 1.0 },
        Op::Alloc {
            slot: 2,
            size: 0,
            stream: 1,
            seed: 3,
        },
        Op::Scale { slot: 2, a: 2.0 },
        Op::Drop { slot: 2 },
        Op::HostRead { slot: 1 },
    ];
    run(&dev, &streams, &ops).unwrap();
}
