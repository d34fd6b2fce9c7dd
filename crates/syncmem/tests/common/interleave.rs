//! The model of the interleaving tests (interleavings.rs): random operations on buffers of an
//! OpenCL device, a host model of what each buffer must hold, gates that hold streams, and a
//! watchdog that fails an operation that waits when it should not.

// Each user of this model uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use syncmem::{kernels, Device, Stream, SyncedMemory};

use super::gate::Gate;
pub use super::model::{same, values};

/// Buffer slots the operations name.
pub const SLOTS: usize = 4;
/// The two buffer sizes, in `f32` elements: every re-allocation of a size can reuse a block.
pub const SIZES: [usize; 2] = [1 << 10, 1 << 16];

#[derive(Debug, Clone, Copy)]
pub enum Op {
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
    /// Queues the upload of the host data on stream `stream` (0 or 1), which may not be the
    /// buffer's own stream (nothing happens when the device is current).
    Prefetch { slot: usize, stream: usize },
    /// Replaces the slot's buffer with a new one of the same size on the same stream, filled
    /// from the host with `seed`-based values, and uploads it at once on stream `upload` (0 or
    /// 1): the new buffer's device mirror takes the old one's block (at once when the old work
    /// is queued on that stream), and its first command may run on the other stream.
    Recycle {
        slot: usize,
        seed: u8,
        upload: usize,
    },
    /// Holds stream `stream` (0 or 1) behind a gate until an operation that waits opens it.
    Hold { stream: usize },
}

/// Weights of the operations, in the order of [`Op`]'s variants: `Alloc`, `Drop`, `HostRead`,
/// `HostWrite`, `Scale`, `Axpy`, `DeviceRead`, `Hold`, `Prefetch`, `Recycle`.
pub type Weights = [u32; 10];

/// The mix of the property tests.
pub const MIX: Weights = [3, 1, 2, 2, 3, 4, 1, 2, 2, 2];
/// The mix of the stress run: fewer operations that wait (they open the gates), so that more
/// work is still queued when blocks are freed and handed out again.
pub const STRESS_MIX: Weights = [4, 2, 1, 1, 3, 3, 1, 3, 4, 3];

pub fn op_with(w: Weights) -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    prop_oneof![
        w[0] => (0..SLOTS, 0..SIZES.len(), 0..2usize, any::<u8>())
            .prop_map(|(slot, size, stream, seed)| Op::Alloc { slot, size, stream, seed }),
        w[1] => slot.clone().prop_map(|slot| Op::Drop { slot }),
        w[2] => slot.clone().prop_map(|slot| Op::HostRead { slot }),
        w[3] => (0..SLOTS, any::<usize>(), any::<i8>())
            .prop_map(|(slot, at, value)| Op::HostWrite { slot, at, value }),
        w[4] => (0..SLOTS, prop::sample::select(vec![2.0f32, 0.5, -1.0]))
            .prop_map(|(slot, a)| Op::Scale { slot, a }),
        w[5] => (0..SLOTS, 0..SLOTS, prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, a)| Op::Axpy { x, y, a }),
        w[6] => slot.clone().prop_map(|slot| Op::DeviceRead { slot }),
        w[7] => (0..2usize).prop_map(|stream| Op::Hold { stream }),
        w[8] => (slot.clone(), 0..2usize).prop_map(|(slot, stream)| Op::Prefetch { slot, stream }),
        w[9] => (slot, any::<u8>(), 0..2usize)
            .prop_map(|(slot, seed, upload)| Op::Recycle { slot, seed, upload }),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    op_with(MIX)
}

/// A live buffer and what it must hold.
pub struct Live {
    mem: SyncedMemory,
    model: Vec<f32>,
    stream: usize,
    /// The host holds data the device has not seen: the next device access uploads it.
    host_newer: bool,
    /// An upload of the host mirror is queued behind a closed gate: dropping the buffer waits.
    upload_held: bool,
    /// A prefetched upload is queued behind a closed gate: every access but a host read waits.
    prefetch_held: bool,
    /// The streams (0 and 1) that queued commands on this buffer since the gates last opened.
    used: [bool; 2],
}

/// The gates of one case, shared with its watchdog.
#[derive(Default)]
pub struct Gates {
    held: Mutex<[Option<Arc<Gate>>; 2]>,
    /// Streams blocked without a gate of their own: they wait, on the device, for work of a
    /// held stream (a kernel reading a buffer the held stream writes, a guard ordered after
    /// the held stream's commands on its buffer). Over-approximated: any command on a buffer
    /// a blocked stream used since the gates opened blocks the stream that queues it.
    tainted: Mutex<[bool; 2]>,
    /// The streams that used a buffer dropped since the gates last opened: a new buffer may get
    /// its block, and with it that work (over-approximated: any new buffer may).
    freed_used: Mutex<[bool; 2]>,
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
        *self.freed_used.lock().unwrap() = [false; 2];
        for l in slots.iter_mut().flatten() {
            l.upload_held = false;
            l.prefetch_held = false;
            l.used = [false; 2];
        }
    }

    /// Notes a device access of `l`, which may allocate its device mirror: the block may come
    /// with the work of a buffer dropped since the gates opened (over-approximated: any block
    /// may, and at any access, since a clean mirror evicted under a cap is allocated again).
    fn inherit(&self, l: &mut Live) {
        let f = self.freed_used.lock().unwrap();
        for t in 0..2 {
            l.used[t] |= f[t];
        }
    }

    /// Notes that a buffer is dropped (its block keeps its queued work).
    fn freed(&self, l: Option<Live>) {
        if let Some(l) = l {
            let mut f = self.freed_used.lock().unwrap();
            for t in 0..2 {
                f[t] |= l.used[t];
            }
        }
    }

    /// Opens the gates without failing the case: under a cap, an allocation may wait for queued
    /// work to free memory. The model still counts the streams as held until `open_all`.
    fn release(&self) {
        for g in self.held.lock().unwrap().iter().flatten() {
            g.open();
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
pub fn two_mut(slots: &mut [Option<Live>], x: usize, y: usize) -> (&mut Live, &mut Live) {
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
pub fn device_access(l: &mut Live, gates: &Gates) {
    if l.host_newer {
        l.host_newer = false;
        l.upload_held |= gates.is_held(l.stream);
    }
}

/// Runs `ops` with a watchdog that opens the gates if one operation takes 10 s (the case
/// fails), or, with `capped`, after a short while (an allocation may wait under the cap).
pub fn run(
    dev: &Device,
    streams: &[Stream; 3],
    ops: &[Op],
    capped: bool,
) -> Result<(), TestCaseError> {
    let gates = Gates::default();
    let result = std::thread::scope(|s| {
        let (beat, beats) = mpsc::channel::<()>();
        let watched = &gates;
        let patience = if capped {
            Duration::from_millis(25)
        } else {
            Duration::from_secs(10)
        };
        s.spawn(move || loop {
            match beats.recv_timeout(patience) {
                Ok(()) => {}
                Err(RecvTimeoutError::Timeout) if capped => watched.release(),
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

pub fn run_ops(
    dev: &Device,
    streams: &[Stream; 3],
    ops: &[Op],
    gates: &Gates,
    beat: &mpsc::Sender<()>,
) -> Result<(), TestCaseError> {
    let mut slots: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    for (step, op) in ops.iter().enumerate() {
        let _ = beat.send(());
        if must_open(op, &slots) {
            gates.open_all(&mut slots);
        }
        // A recycle is an allocation of the same size on the same stream, then a prefetch.
        let now = match *op {
            Op::Recycle { slot, seed, upload } => match &slots[slot] {
                Some(l) => vec![
                    Op::Alloc {
                        slot,
                        size: SIZES.iter().position(|&n| n == l.model.len()).unwrap(),
                        stream: l.stream,
                        seed,
                    },
                    Op::Prefetch {
                        slot,
                        stream: upload,
                    },
                ],
                None => continue,
            },
            op => vec![op],
        };
        for op in now {
            run_op(op, step, &mut slots, dev, streams, gates)?;
        }
    }
    // Every buffer still alive ends as the model says, on the device and on the host (a
    // prefetch leaves both current: a wrong device mirror would not show on the host).
    gates.open_all(&mut slots);
    check_all(&slots, streams)
}

/// Whether `op` must find the gates open: it waits (a host access, a blocking device read), or
/// it drops or touches a buffer whose held upload or prefetch it would wait for (every access
/// of a buffer but a host read waits for its prefetched upload).
fn must_open(op: &Op, slots: &[Option<Live>]) -> bool {
    let waits = matches!(
        op,
        Op::HostRead { .. } | Op::HostWrite { .. } | Op::DeviceRead { .. }
    );
    let drops = match *op {
        Op::Alloc { slot, .. } | Op::Drop { slot } | Op::Recycle { slot, .. } => slot,
        _ => usize::MAX,
    };
    let touched: &[usize] = match op {
        Op::Alloc { slot, .. }
        | Op::Drop { slot }
        | Op::HostWrite { slot, .. }
        | Op::Scale { slot, .. }
        | Op::DeviceRead { slot }
        | Op::Prefetch { slot, .. }
        | Op::Recycle { slot, .. } => std::slice::from_ref(slot),
        Op::Axpy { x, y, .. } => &[*x, *y],
        Op::HostRead { .. } | Op::Hold { .. } => &[],
    };
    let live = |i: usize| slots.get(i).and_then(Option::as_ref);
    waits
        || live(drops).is_some_and(|l| l.upload_held)
        || touched
            .iter()
            .any(|&i| live(i).is_some_and(|l| l.prefetch_held))
}

/// Every buffer, read on the device (on stream 2) and on the host, holds its model.
fn check_all(slots: &[Option<Live>], streams: &[Stream; 3]) -> Result<(), TestCaseError> {
    for (slot, l) in slots.iter().enumerate() {
        let Some(l) = l else {
            continue;
        };
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
    Ok(())
}

/// Runs one operation (a recycle arrives as its allocation and its prefetch).
pub fn run_op(
    op: Op,
    step: usize,
    slots: &mut [Option<Live>],
    dev: &Device,
    streams: &[Stream; 3],
    gates: &Gates,
) -> Result<(), TestCaseError> {
    match op {
        Op::Hold { stream } => gates.hold(streams, stream),
        Op::Recycle { .. } => unreachable!("run as an allocation and a prefetch"),
        Op::Alloc {
            slot,
            size,
            stream,
            seed,
        } => {
            gates.freed(slots[slot].take());
            slots[slot] = Some(alloc(dev, &streams[stream], stream, step, slot, size, seed));
        }
        Op::Drop { slot } => gates.freed(slots[slot].take()),
        Op::Prefetch { slot, stream } => {
            if let Some(l) = &mut slots[slot] {
                prefetch(l, &streams[stream], stream, gates);
            }
        }
        Op::HostRead { slot } => {
            if let Some(l) = &slots[slot] {
                let h = l.mem.host().unwrap();
                let got = h.as_slice_of::<f32>().unwrap();
                same(&format!("host read, step {step}"), got, &l.model)?;
            }
        }
        Op::HostWrite { slot, at, value } => {
            if let Some(l) = &mut slots[slot] {
                let at = at % l.model.len();
                l.model[at] = f32::from(value);
                l.host_newer = true;
                l.mem.host_mut().unwrap().as_mut_slice_of::<f32>().unwrap()[at] = f32::from(value);
            }
        }
        Op::Scale { slot, a } => {
            if let Some(l) = &mut slots[slot] {
                scale(l, a, gates);
            }
        }
        Op::Axpy { x, y, a } => axpy(slots, x, y, a, gates),
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
    Ok(())
}

/// A new buffer for `slot` of `SIZES[size]` elements on `stream` (number `index`), filled from
/// the host with `seed`-based values.
fn alloc(
    dev: &Device,
    stream: &Stream,
    index: usize,
    step: usize,
    slot: usize,
    size: usize,
    seed: u8,
) -> Live {
    let n = SIZES[size];
    let model: Vec<f32> = (0..n)
        .map(|i| f32::from((i as u8).wrapping_add(seed) % 16) - 8.0)
        .collect();
    // Two mirrors: the model is the copying protocol's (zero-copy buffers are the model of
    // tests/spill_model, with spills).
    let mem = SyncedMemory::new(n * 4, dev)
        .with_zero_copy(false)
        .with_stream(stream)
        .unwrap()
        .with_label(format!("slot {slot} (step {step})"));
    mem.host_overwrite()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .copy_from_slice(&model);
    Live {
        mem,
        model,
        stream: index,
        host_newer: true,
        upload_held: false,
        prefetch_held: false,
        used: [false; 2],
    }
}

/// Queues the upload of `l` on `stream` (number `index`).
fn prefetch(l: &mut Live, stream: &Stream, index: usize, gates: &Gates) {
    gates.inherit(l);
    if l.host_newer {
        // The upload follows, on the device, the other streams' work on the buffer (and its
        // block's previous owner's).
        gates.queue_on(index, &mut [&mut *l]);
        l.host_newer = false;
        let held = gates.is_held(index);
        l.upload_held |= held;
        l.prefetch_held = held;
    }
    l.mem.prefetch_to_device(Some(stream)).unwrap();
}

/// `x *= a` on the buffer's stream.
fn scale(l: &mut Live, a: f32, gates: &Gates) {
    let n = l.model.len();
    gates.inherit(l);
    gates.queue_on(l.stream, &mut [&mut *l]);
    device_access(l, gates);
    kernels::scale(n, a, &mut l.mem.device_mut().unwrap()).unwrap();
    l.model.iter_mut().for_each(|v| *v *= a);
}

/// `y += a * x` on `y`'s stream.
fn axpy(slots: &mut [Option<Live>], x: usize, y: usize, a: f32, gates: &Gates) {
    if x == y || slots[x].is_none() || slots[y].is_none() {
        return;
    }
    // The guard of `x` orders its stream after the other streams' work on `x`; the kernel runs
    // on `y`'s stream, after `x`'s writer.
    {
        let (lx, ly) = two_mut(slots, x, y);
        gates.inherit(lx);
        gates.inherit(ly);
        let (sx, sy) = (lx.stream, ly.stream);
        gates.queue_on(sx, &mut [&mut *lx]);
        gates.queue_on(sy, &mut [&mut *lx, &mut *ly]);
    }
    for i in [x, y] {
        device_access(slots[i].as_mut().unwrap(), gates);
    }
    let (Some(lx), Some(ly)) = (&slots[x], &slots[y]) else {
        return;
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
