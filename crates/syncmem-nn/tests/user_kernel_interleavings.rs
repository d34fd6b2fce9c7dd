//! Random sequences of user-kernel launches, built-in operators, host reads and writes and
//! drops, on two streams of the OpenCL device, checked against a host model.
//!
//! The tensors live in workspace blobs, on the device's default stream (their uploads and
//! read-backs); user kernels (`kernels::launch`) and the built-in `Relu` operator (on a context
//! of its own stream) run on stream 0 or 1, reading tensors last written on the other one.
//! Tensors of two sizes are dropped with work pending and replaced, so that pooled blocks come
//! back for the next tensor of that size. A stream can be held behind an OpenCL user-event gate
//! (`Hold`), so that launches really are still queued when the next operations run; launches
//! and operator runs must return while the gates are closed (a watchdog opens them after 10 s
//! and fails the case), the host operations open them first.
//!
//! Values stay exact: the scale factors are powers of two or -1 and the axpy adds `±x`.

#![cfg(feature = "opencl")]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use syncmem::device::{Grid, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::ops::{create_operator, OperatorDef};
use syncmem::{Context, Device, Stream, Tensor, Workspace};

#[path = "../../syncmem/tests/common/gate.rs"]
mod gate;
use gate::Gate;

const SLOTS: usize = 4;
/// The two tensor sizes, in `f32` elements.
const SIZES: [usize; 2] = [1 << 10, 1 << 16];

#[derive(Debug, Clone)]
enum Op {
    /// Replaces the slot's tensor with a new one of `SIZES[size]` elements made from `seed`.
    Alloc { slot: usize, size: usize, seed: u8 },
    /// Removes the slot's tensor (dropped, possibly with work pending).
    Drop { slot: usize },
    /// Reads the slot on the host and compares it with the model.
    HostRead { slot: usize },
    /// Writes one element on the host.
    HostWrite { slot: usize, at: usize, value: i8 },
    /// `x *= a`, a user kernel on stream `stream`.
    Scale { slot: usize, stream: usize, a: f32 },
    /// `y += a * x`, a user kernel on stream `stream`.
    Axpy {
        x: usize,
        y: usize,
        stream: usize,
        a: f32,
    },
    /// The built-in `Relu` operator, in place, on a context of stream `stream`.
    Relu { slot: usize, stream: usize },
    /// Holds stream `stream` behind a gate until a host operation opens it.
    Hold { stream: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    prop_oneof![
        3 => (0..SLOTS, 0..SIZES.len(), any::<u8>())
            .prop_map(|(slot, size, seed)| Op::Alloc { slot, size, seed }),
        1 => slot.clone().prop_map(|slot| Op::Drop { slot }),
        2 => slot.clone().prop_map(|slot| Op::HostRead { slot }),
        2 => (0..SLOTS, any::<usize>(), any::<i8>())
            .prop_map(|(slot, at, value)| Op::HostWrite { slot, at, value }),
        3 => (0..SLOTS, 0..2usize, prop::sample::select(vec![2.0f32, 0.5, -1.0]))
            .prop_map(|(slot, stream, a)| Op::Scale { slot, stream, a }),
        4 => (0..SLOTS, 0..SLOTS, 0..2usize, prop::sample::select(vec![1.0f32, -1.0]))
            .prop_map(|(x, y, stream, a)| Op::Axpy { x, y, stream, a }),
        2 => (0..SLOTS, 0..2usize).prop_map(|(slot, stream)| Op::Relu { slot, stream }),
        2 => (0..2usize).prop_map(|stream| Op::Hold { stream }),
    ]
}

fn scale_kernel() -> UserKernel {
    UserKernel::new("scale_in_place").with_opencl(
        "__kernel void scale_in_place(__global float* x, uint n, float a) { \
         for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) x[i] *= a; }",
    )
}

fn axpy_kernel() -> UserKernel {
    UserKernel::new("axpy").with_opencl(
        "__kernel void axpy(const __global float* x, __global float* y, uint n, float a) { \
         for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) y[i] += a * x[i]; }",
    )
}

fn name(slot: usize) -> String {
    format!("slot{slot}")
}

/// The gates of one case, shared with its watchdog.
#[derive(Default)]
struct Gates {
    held: Mutex<[Option<Arc<Gate>>; 2]>,
    fired: AtomicBool,
}

impl Gates {
    fn hold(&self, streams: &[Stream; 2], s: usize) {
        let mut held = self.held.lock().unwrap();
        if held[s].is_none() {
            held[s] = Some(Arc::new(Gate::block(&streams[s])));
        }
    }

    fn open_all(&self) {
        for g in self.held.lock().unwrap().iter_mut() {
            if let Some(g) = g.take() {
                g.open();
            }
        }
    }

    fn fire(&self) {
        self.fired.store(true, SeqCst);
        for g in self.held.lock().unwrap().iter().flatten() {
            g.open();
        }
    }
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

struct Rig {
    dev: Device,
    streams: [Stream; 2],
    contexts: [Context; 2],
    scale: UserKernel,
    axpy: UserKernel,
}

fn run(rig: &Rig, ops: &[Op]) -> Result<(), TestCaseError> {
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
        run_ops(rig, ops, &gates, &beat)
    });
    if gates.fired.load(SeqCst) {
        return Err(TestCaseError::fail(
            "a launch or an operator waited for work held behind a gate",
        ));
    }
    result
}

fn launch_grid(n: usize) -> Grid {
    Grid::for_elements(n.min(64 * 256), 64)
}

fn run_ops(
    rig: &Rig,
    ops: &[Op],
    gates: &Gates,
    beat: &mpsc::Sender<()>,
) -> Result<(), TestCaseError> {
    syncmem_nn::register_operators().unwrap();
    let ws = Workspace::new();
    let mut model: Vec<Option<Vec<f32>>> = vec![None; SLOTS];
    for (step, op) in ops.iter().enumerate() {
        let _ = beat.send(());
        if matches!(
            op,
            Op::Alloc { .. } | Op::Drop { .. } | Op::HostRead { .. } | Op::HostWrite { .. }
        ) {
            gates.open_all();
        }
        apply(rig, &ws, &mut model, gates, step, op)?;
    }
    gates.open_all();
    for (slot, m) in model.iter().enumerate() {
        if let Some(m) = m {
            let got = ws.fetch::<f32>(&name(slot)).unwrap();
            same(&format!("final read of slot {slot}"), &got, m)?;
        }
    }
    Ok(())
}

/// Runs step `step`, `op`, of a program on `ws`, and on the model.
fn apply(
    rig: &Rig,
    ws: &Workspace,
    model: &mut [Option<Vec<f32>>],
    gates: &Gates,
    step: usize,
    op: &Op,
) -> Result<(), TestCaseError> {
    match *op {
        Op::Hold { stream } => gates.hold(&rig.streams, stream),
        Op::Alloc { slot, size, seed } => {
            let n = SIZES[size];
            let values: Vec<f32> = (0..n)
                .map(|i| f32::from((i as u8).wrapping_add(seed) % 16) - 8.0)
                .collect();
            let t = Tensor::from_slice(&[n], &values, Some(&rig.dev))
                .unwrap()
                .with_label(format!("slot {slot} (step {step})"));
            ws.feed(&name(slot), t).unwrap();
            model[slot] = Some(values);
        }
        Op::Drop { slot } => {
            if model[slot].take().is_some() {
                assert!(ws.remove_blob(&name(slot)));
            }
        }
        Op::HostRead { slot } => {
            if let Some(m) = &model[slot] {
                let got = ws.fetch::<f32>(&name(slot)).unwrap();
                same(&format!("host read, step {step}"), &got, m)?;
            }
        }
        Op::HostWrite { slot, at, value } => {
            if let Some(m) = &mut model[slot] {
                let at = at % m.len();
                m[at] = f32::from(value);
                let blob = ws.get_blob(&name(slot)).unwrap();
                let mut b = blob.write();
                let t = b.get_mut::<Tensor>().unwrap();
                t.host_mut::<f32>().unwrap()[at] = f32::from(value);
            }
        }
        Op::Scale { slot, stream, a } => {
            if let Some(m) = &mut model[slot] {
                let blob = ws.get_blob(&name(slot)).unwrap();
                let mut b = blob.write();
                let t = b.get_mut::<Tensor>().unwrap();
                let n = m.len();
                let args = [Arg::write(t), (n as u32).into(), a.into()];
                // SAFETY: the kernel's loop touches elements 0..n of a tensor of n floats.
                unsafe { kernels::launch(&rig.scale, &rig.streams[stream], launch_grid(n), &args) }
                    .unwrap();
                m.iter_mut().for_each(|v| *v *= a);
            }
        }
        Op::Axpy { x, y, stream, a } => axpy(rig, ws, model, (x, y), stream, a),
        Op::Relu { slot, stream } => {
            if let Some(m) = &mut model[slot] {
                let def = OperatorDef::new("Relu", &[&name(slot)], &[&name(slot)]);
                create_operator(&def, &rig.dev)
                    .unwrap()
                    .run(ws, &rig.contexts[stream])
                    .unwrap();
                m.iter_mut()
                    .for_each(|v| *v = if *v > 0.0 { *v } else { 0.0 });
            }
        }
    }
    Ok(())
}

/// `y += a * x` by the user kernel on stream `stream`, and on the model (nothing when `x` is
/// `y` or either slot is empty).
fn axpy(
    rig: &Rig,
    ws: &Workspace,
    model: &mut [Option<Vec<f32>>],
    (x, y): (usize, usize),
    stream: usize,
    a: f32,
) {
    if x == y || model[x].is_none() || model[y].is_none() {
        return;
    }
    let (bx, by) = (
        ws.get_blob(&name(x)).unwrap(),
        ws.get_blob(&name(y)).unwrap(),
    );
    let (gx, mut gy) = (bx.read(), by.write());
    let tx = gx.get::<Tensor>().unwrap();
    let ty = gy.get_mut::<Tensor>().unwrap();
    let xs = model[x].clone().unwrap();
    let ys = model[y].as_mut().unwrap();
    let n = xs.len().min(ys.len());
    let args = [Arg::read(tx), Arg::write(ty), (n as u32).into(), a.into()];
    // SAFETY: the kernel's loop touches elements 0..n, which both tensors hold.
    unsafe { kernels::launch(&rig.axpy, &rig.streams[stream], launch_grid(n), &args) }.unwrap();
    for (v, xv) in ys.iter_mut().zip(xs) {
        *v += a * xv;
    }
}

/// The tests of this file share the device's default stream (the tensors' uploads and
/// read-backs): one held by a gate of one test would block the other's host reads, whose
/// gates only that test opens. They run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn rig() -> Option<Rig> {
    let dev = syncmem::testing::opencl_or_skip("user kernel interleavings")?;
    let streams = [dev.new_stream().unwrap(), dev.new_stream().unwrap()];
    let contexts = [
        Context::on_stream(streams[0].clone(), 1),
        Context::on_stream(streams[1].clone(), 2),
    ];
    let (scale, axpy) = (scale_kernel(), axpy_kernel());
    scale.prepare(&dev).unwrap();
    axpy.prepare(&dev).unwrap();
    Some(Rig {
        dev,
        streams,
        contexts,
        scale,
        axpy,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn user_kernels_operators_and_host_access_match_the_model(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rig) = rig() else {
            return Ok(());
        };
        run(&rig, &ops)?;
    }
}

/// A kernel on stream 1 reads a tensor a held stream 0 is still writing, and writes one whose
/// block was freed with stream 0's work pending: neither the launches nor the operator wait,
/// and the values are the model's once the gate opens.
#[test]
fn launches_on_one_stream_follow_held_work_on_the_other() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(rig) = rig() else {
        return;
    };
    let ops = [
        Op::Alloc {
            slot: 0,
            size: 1,
            seed: 3,
        },
        Op::Alloc {
            slot: 1,
            size: 1,
            seed: 5,
        },
        Op::Hold { stream: 0 },
        Op::Scale {
            slot: 0,
            stream: 0,
            a: 2.0,
        },
        Op::Axpy {
            x: 0,
            y: 1,
            stream: 1,
            a: -1.0,
        },
        Op::Relu { slot: 1, stream: 1 },
        Op::Relu { slot: 0, stream: 0 },
        Op::HostRead { slot: 1 },
        Op::Drop { slot: 1 },
        Op::Hold { stream: 0 },
        Op::Scale {
            slot: 0,
            stream: 0,
            a: -1.0,
        },
        Op::Alloc {
            slot: 2,
            size: 1,
            seed: 7,
        },
        Op::Axpy {
            x: 0,
            y: 2,
            stream: 1,
            a: 1.0,
        },
        Op::HostRead { slot: 2 },
    ];
    run(&rig, &ops).unwrap();
}
