//! Device work is queued, not waited for: a buffer freed while kernels that use it are still
//! queued goes back to its pool, and the pool hands the block out again without the new owner
//! ever seeing (or disturbing) the old owner's work.
//!
//! "The hard way": the buffer's stream is held by an OpenCL user-event gate, so the kernels
//! cannot have run when the buffer is dropped and a new buffer of the same size is allocated
//! and written from the host. Nothing in the sequence may wait on the host (the gate is still
//! closed when it ends: a waiting call could only have returned after the watchdog opened it).
//! Once the gate opens, the old owner's result must be exact and the new buffer must hold its
//! own data.

#![cfg(feature = "opencl")]

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

#[path = "../../syncmem/tests/common/gate.rs"]
mod gate;

use gate::Gate;
use opencl3::command_queue::enqueue_fill_buffer;
use opencl3::event::release_event;
use opencl3::memory::ClMem;
// The calling thread's waits: other tests of this file run at once on other threads.
use syncmem::alloc::stats::thread_host_waits as host_waits;
use syncmem::ops::{create_operator, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{kernels, Context, Device, Stream, SyncedMemory, Workspace};

/// Elements of each buffer (4 MiB of `f32`: large enough that the scale kernels take a while).
const ELEMS: usize = 1 << 20;

/// The pool statistics and the wait counter are per device and per process: the tests of this
/// file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `body`; if it has not returned after 30 s (a call waited on the closed gate), opens the
/// gate so that it can, and the test sees `gate.is_open()`.
fn with_watchdog<R>(gate: &Gate, body: impl FnOnce() -> R) -> R {
    std::thread::scope(|s| {
        let (done, done_rx) = mpsc::channel::<()>();
        s.spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = done_rx.recv_timeout(Duration::from_secs(30)) {
                eprintln!("watchdog: a call waited on the closed gate; opening it");
                gate.open();
            }
        });
        let r = body();
        drop(done);
        r
    })
}

fn filled(dev: &Device, stream: &Stream, label: &str, value: f32) -> SyncedMemory {
    // Two mirrors: the uploads these tests hold behind gates are copies.
    let m = SyncedMemory::new(ELEMS * 4, dev)
        .with_zero_copy(false)
        .with_stream(stream)
        .unwrap()
        .with_label(label);
    m.host_mut()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .fill(value);
    m
}

fn device_values(m: &SyncedMemory) -> Vec<f32> {
    let mut bytes = vec![0u8; m.len()];
    m.device().unwrap().read_into(&mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `a` (ones) is scaled by 2 three times and added into `c` (zeros), all behind the gate; `a`
/// is dropped at once and `b` (sevens) is allocated on `b_stream` and copied to the device.
/// Returns `c` and `b` after the gate opened, and whether anything waited before that.
fn freed_while_queued(dev: &Device, b_stream_is_a_stream: bool) -> (Vec<f32>, Vec<f32>, u64) {
    let s1 = dev.new_stream().unwrap();
    let s2 = dev.new_stream().unwrap();
    let a = filled(dev, &s1, "a", 1.0);
    let c = filled(dev, &s1, "c", 0.0);
    // Both device mirrors exist before the gate closes (their first copies are not gated).
    drop(a.device().unwrap());
    drop(c.device().unwrap());
    s1.synchronize().unwrap();
    let gate = Gate::block(&s1);
    let waits = host_waits();
    let (b, waited) = with_watchdog(&gate, || {
        {
            let mut ad = a.device_mut().unwrap();
            for _ in 0..3 {
                kernels::scale(ELEMS, 2.0f32, &mut ad).unwrap();
            }
        }
        {
            let ad = a.device().unwrap();
            let mut cd = c.device_mut().unwrap();
            kernels::axpy(ELEMS, 1.0f32, &ad, &mut cd).unwrap();
        }
        drop(a);
        let b_stream = if b_stream_is_a_stream { &s1 } else { &s2 };
        let b = filled(dev, b_stream, "b", 7.0);
        drop(b.device().unwrap());
        let waited = gate.is_open();
        (b, waited)
    });
    assert!(!waited, "a call waited for the gated kernels");
    let waits = host_waits() - waits;
    gate.open();
    let c_values = c.host().unwrap().as_slice_of::<f32>().unwrap().to_vec();
    (c_values, device_values(&b), waits)
}

fn check(dev: &Device, same_stream: bool) {
    let before = dev.pool_stats().map_or(0, |s| s.cache_hits);
    let (c, b, waits) = freed_while_queued(dev, same_stream);
    let hits = dev.pool_stats().map_or(0, |s| s.cache_hits) - before;
    assert_eq!(waits, 0, "host waits counted while the gate was closed");
    assert!(c.iter().all(|&v| v == 8.0), "c = {:?}", &c[..4]);
    assert!(b.iter().all(|&v| v == 7.0), "b = {:?}", &b[..4]);
    if same_stream {
        // Work on the stream of a block's pending uses runs after them: the block of `a` is
        // handed to `b` at once.
        assert!(
            hits >= 1,
            "the freed block was not reused on its own stream"
        );
    }
}

#[test]
fn a_block_freed_with_queued_kernels_is_reused_on_its_stream_without_waiting() {
    let Some(dev) = syncmem::testing::opencl_or_skip("queued reuse, same stream") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    check(&dev, true);
}

#[test]
fn a_block_freed_with_queued_kernels_is_safe_for_another_stream() {
    let Some(dev) = syncmem::testing::opencl_or_skip("queued reuse, other stream") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    check(&dev, false);
}

/// Work a caller queues through the native queue of a device guard's stream comes after the
/// kernels of other streams that wrote the buffer: the guard makes its stream wait for them on
/// the device (nothing waits on the host).
#[test]
fn native_work_on_a_guard_stream_follows_kernels_of_other_streams() {
    syncmem_nn::register_operators().unwrap();
    let Some(dev) = syncmem::testing::opencl_or_skip("native work after other streams") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ws = Workspace::new();
    let x = Tensor::from_slice(&[ELEMS], &vec![-1.0f32; ELEMS], Some(&dev)).unwrap();
    ws.feed("x", x).unwrap();
    let other = dev.new_stream().unwrap();
    let ctx = Context::on_stream(other.clone(), 0);
    let relu = create_operator(&OperatorDef::new("Relu", &["x"], &["y"]), &dev).unwrap();
    relu.run(&ws, &ctx).unwrap();
    other.synchronize().unwrap();
    let gate = Gate::block(&other);
    let waited = with_watchdog(&gate, || {
        // y = relu(x) = 0, queued behind the gate on the context's stream.
        relu.run(&ws, &ctx).unwrap();
        ws.with_tensor("y", |t| {
            let m = t.synced().expect("y has storage");
            let g = m.device_mut()?;
            let queue = g.stream().as_opencl().expect("an OpenCL stream");
            let mem = g.buffer().as_opencl().expect("an OpenCL buffer");
            let five = 5.0f32;
            // SAFETY: the pattern outlives the call (OpenCL copies it when enqueueing); the
            // buffer is the guard's, valid for `len` bytes; the returned event is released once.
            unsafe {
                let ev = enqueue_fill_buffer(
                    queue.get(),
                    mem.get(),
                    std::ptr::from_ref(&five).cast(),
                    4,
                    0,
                    m.len(),
                    0,
                    std::ptr::null(),
                )
                .expect("clEnqueueFillBuffer");
                release_event(ev).expect("clReleaseEvent");
            }
            let filled = g.stream().record()?;
            assert!(
                !filled.is_complete()?,
                "the fill ran before the gated kernel that wrote y first"
            );
            Ok(())
        })
        .unwrap();
        gate.is_open()
    });
    assert!(!waited, "a call waited for the gated kernel");
    gate.open();
    let y = ws.fetch::<f32>("y").unwrap();
    assert!(y.iter().all(|&v| v == 5.0), "y = {:?}", &y[..4]);
}

/// Where the old owner's work came from: a crate kernel, or a command queued natively through
/// the guard's handles (the block then goes back with a fence for its stream, not a point).
#[derive(Clone, Copy, PartialEq)]
enum OldWork {
    Kernel,
    Native,
}

/// `old` (on `s1`, gated) is written on the device by `work` and dropped at once; `new`, the
/// same size on the same stream, takes its block, is written from the host and uploaded on
/// another stream `s2`. The upload must run after the old work; nothing waits on the host.
/// Returns the device contents of `new`.
fn reused_then_prefetched_elsewhere(dev: &Device, work: OldWork) -> Vec<f32> {
    let s1 = dev.new_stream().unwrap();
    let s2 = dev.new_stream().unwrap();
    let old = filled(dev, &s1, "old", 1.0);
    drop(old.device().unwrap());
    s1.synchronize().unwrap();
    let hits = dev.pool_stats().map_or(0, |s| s.cache_hits);
    let gate = Gate::block(&s1);
    let (new, waited) = with_watchdog(&gate, || {
        {
            let mut g = old.device_mut().unwrap();
            match work {
                OldWork::Kernel => kernels::scale(ELEMS, 3.0f32, &mut g).unwrap(),
                OldWork::Native => {
                    let queue = g.stream().as_opencl().expect("an OpenCL stream");
                    let mem = g.buffer().as_opencl().expect("an OpenCL buffer");
                    let three = 3.0f32;
                    // SAFETY: the pattern outlives the call (OpenCL copies it when
                    // enqueueing); the buffer is the guard's, valid for `len` bytes; the
                    // returned event is released once.
                    unsafe {
                        let ev = enqueue_fill_buffer(
                            queue.get(),
                            mem.get(),
                            std::ptr::from_ref(&three).cast(),
                            4,
                            0,
                            old.len(),
                            0,
                            std::ptr::null(),
                        )
                        .expect("clEnqueueFillBuffer");
                        release_event(ev).expect("clReleaseEvent");
                    }
                }
            }
        }
        drop(old);
        let new = filled(dev, &s1, "new", 7.0);
        new.prefetch_to_device(Some(&s2)).unwrap();
        let waited = gate.is_open();
        (new, waited)
    });
    assert!(!waited, "a call waited for the gated work");
    let reused = dev.pool_stats().map_or(0, |s| s.cache_hits) - hits;
    assert!(
        reused >= 1,
        "the freed block was not handed to the new buffer"
    );
    gate.open();
    new.wait().unwrap();
    dev.synchronize().unwrap();
    device_values(&new)
}

/// The defect this guards against: the block went to `new` at once (its own stream) and the
/// upload on `s2` ran before the old kernel, which then overwrote it (the device read 3.0).
#[test]
fn a_reused_block_orders_an_upload_on_another_stream_after_the_old_kernels() {
    let Some(dev) = syncmem::testing::opencl_or_skip("reused block, upload elsewhere") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let values = reused_then_prefetched_elsewhere(&dev, OldWork::Kernel);
    assert!(values.iter().all(|&v| v == 7.0), "new = {:?}", &values[..4]);
}

/// The same with the old owner's work queued natively on its guard's stream.
#[test]
fn a_reused_block_orders_an_upload_on_another_stream_after_old_native_work() {
    let Some(dev) = syncmem::testing::opencl_or_skip("reused block after native work") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let values = reused_then_prefetched_elsewhere(&dev, OldWork::Native);
    assert!(values.iter().all(|&v| v == 7.0), "new = {:?}", &values[..4]);
}
