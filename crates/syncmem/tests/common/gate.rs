//! An OpenCL user-event gate that holds a stream's work, and a buffer on its own stream: the
//! rig of the tests of work in flight (async_prefetch.rs, failed_transfer.rs, park_ordered.rs,
//! the composed test's hold.rs and others), with the watchdog that opens a gate a test hangs on.

// Each test file uses a part of this rig.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use opencl3::event::{create_user_event, release_event, set_user_event_status, CL_COMPLETE};
use opencl3::types::{cl_event, cl_int};
use syncmem::{Device, Stream, SyncedMemory};

/// Bytes of the buffer made by [`rig`].
pub const N: usize = 1 << 16;

/// An OpenCL user event with a barrier waiting on it queued on a stream. Its status is set once:
/// by [`Gate::open`], [`Gate::fail`], or by `Drop` (open), so no queue is left blocked.
pub struct Gate {
    event: cl_event,
    set: AtomicBool,
    /// The barrier's event, kept until the gate is dropped: PoCL propagates a failure into the
    /// barrier's event and must not find it released.
    _barrier: opencl3::event::Event,
}

// SAFETY: an OpenCL event handle may be used from any thread (all OpenCL calls used here are
// thread-safe); it is released once, in Drop.
unsafe impl Send for Gate {}
// SAFETY: as above; `&Gate` sets the event status at most once (guarded by `set`).
unsafe impl Sync for Gate {}

impl Gate {
    /// Blocks `stream`: work queued on it from now on waits until the gate is set.
    pub fn block(stream: &Stream) -> Gate {
        let queue = stream.as_opencl().expect("an OpenCL stream");
        let ctx = queue
            .context()
            .expect("clGetCommandQueueInfo(CL_QUEUE_CONTEXT)");
        let event = create_user_event(ctx).expect("clCreateUserEvent");
        // SAFETY: the wait list holds one live event, kept alive by the gate until Drop.
        let barrier = unsafe { queue.enqueue_barrier_with_wait_list(&[event]) }
            .expect("clEnqueueBarrierWithWaitList");
        queue.flush().expect("clFlush");
        Gate {
            event,
            set: AtomicBool::new(false),
            _barrier: barrier,
        }
    }

    /// Sets the user event's status once (later calls do nothing). The gate is marked set
    /// before the status is, so whoever sees the stream's work done also sees `is_open()`.
    fn set(&self, status: cl_int) {
        if !self.set.swap(true, SeqCst) {
            set_user_event_status(self.event, status).expect("clSetUserEventStatus");
        }
    }

    /// Lets the stream run.
    pub fn open(&self) {
        self.set(CL_COMPLETE);
    }

    /// Terminates the work queued behind the gate (an error status, which OpenCL propagates to
    /// the commands waiting on it).
    pub fn fail(&self) {
        self.set(-1);
    }

    /// True once the gate was opened or failed.
    pub fn is_open(&self) -> bool {
        self.set.load(SeqCst)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // Never leave a queue blocked (a failed assertion unwinds through here).
        self.open();
        // SAFETY: the one reference clCreateUserEvent gave is released once, here.
        let _ = unsafe { release_event(self.event) };
    }
}

/// Runs `body` with a watchdog that opens the gate if the test hangs (a wrongly waiting access
/// would otherwise wait forever), and a `release_later` function that opens the gate from
/// another thread after a pause.
pub fn guarded(gate: &Gate, body: impl FnOnce(&dyn Fn())) {
    std::thread::scope(|s| {
        let (done, done_rx) = mpsc::channel::<()>();
        s.spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = done_rx.recv_timeout(Duration::from_secs(30)) {
                eprintln!("watchdog: an access blocked on the closed gate; opening it");
                gate.open();
            }
        });
        let release_later = || {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                gate.open();
            });
        };
        body(&release_later);
        drop(done);
    });
}

/// A buffer of [`N`] bytes on its own stream of the OpenCL device, or `None` (skip).
pub fn rig(test: &str) -> Option<(Device, Stream, SyncedMemory)> {
    let dev = syncmem::testing::opencl_or_skip(test)?;
    let stream = dev.new_stream().unwrap();
    // Two mirrors: these tests hold copies in flight (zero-copy buffers copy nothing).
    let m = SyncedMemory::new(N, &dev)
        .with_zero_copy(false)
        .with_stream(&stream)
        .unwrap()
        .with_label(test);
    Some((dev, stream, m))
}

/// `data` written to `m`'s device mirror, then `stream` (`m`'s) blocked by a new gate and the
/// copy of `m` to the host queued behind it: a copy out held in flight until the gate opens.
pub fn copy_out_held(stream: &Stream, m: &SyncedMemory, data: &[u8]) -> Gate {
    m.device_overwrite().unwrap().write_from(0, data).unwrap();
    let gate = Gate::block(stream);
    m.prefetch_to_host(None)
        .unwrap()
        .expect("a copy was queued");
    gate
}

/// `data` written to `m`'s device mirror and copied out behind a gate (see
/// [`copy_out_held`]), and `m`'s device mirror freed ordered after the copy.
pub fn freed_under_copy_out(stream: &Stream, m: &SyncedMemory, data: &[u8]) -> Gate {
    let gate = copy_out_held(stream, m, data);
    assert_eq!(m.offload_ordered().unwrap(), N, "freed at once");
    gate
}

/// Reads the device mirror of `m` on a new stream of `dev` (not the rig's, which a gate may
/// hold).
pub fn device_bytes_elsewhere(dev: &Device, m: &SyncedMemory) -> Vec<u8> {
    let g = m.device().unwrap();
    let mut out = vec![0u8; N];
    dev.new_stream()
        .unwrap()
        .read(g.buffer(), 0, &mut out)
        .unwrap();
    out
}

/// Asserts that `err`, a failed command's report, names the backend call that saw it.
#[track_caller]
pub fn names_the_failed_wait(err: &syncmem::Error) {
    assert!(
        err.to_string().contains("clWaitForEvents"),
        "the backend call is named: {err}"
    );
}
