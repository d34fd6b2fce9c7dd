//! `Hold`: a stream of the device held for a moment (OpenCL: a barrier waiting on a user
//! event, completed by a timer thread), so that the copies and commands queued on it meanwhile
//! are still in flight when the operations that follow meet them: a prefetch not landed when
//! its buffer is offloaded, read, written or spilled; an upload queued behind a copy out. A
//! host wait on the held stream lasts until the timer opens it. Nothing on other backends.

use std::sync::atomic::AtomicU64;

use syncmem::Stream;

/// Streams held so far (by every program of the process).
pub static HELD: AtomicU64 = AtomicU64::new(0);

/// Holds `stream` for `micros` microseconds, where its device is an OpenCL one.
#[cfg(feature = "opencl")]
pub fn hold(stream: &Stream, micros: u64) {
    use std::sync::Arc;
    use std::time::Duration;

    #[path = "../common/gate.rs"]
    mod gate;

    if stream.as_opencl().is_none() {
        return;
    }
    let g = Arc::new(gate::Gate::block(stream));
    HELD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_micros(micros));
        g.open();
    });
}

/// Holds nothing: no OpenCL backend in this build.
#[cfg(not(feature = "opencl"))]
pub fn hold(_: &Stream, _: u64) {}

/// `MoveOut`: what a program that takes a value out of the device and brings it back does
/// (see `syncmem-nn`'s moves), with the copies held in flight: `stream` held for `micros`,
/// the slot's copy to the host queued on it, its device mirror freed ordered after that copy
/// (`offload_ordered`), and with `back` its upload queued on the same stream behind it. Memory
/// shared in place has no copy: a write of the slot is held on its own stream instead, and
/// the block is parked under it. The operations that follow meet the copies in flight; the data stays the model's (later reads
/// check it). A pinned slot refuses the offload (`Busy`); an out-of-memory leaves the slot as
/// it was.
pub fn move_out(
    w: &super::World<'_>,
    l: &super::Live,
    (stream, micros, back): (usize, u64, bool),
    pinned: bool,
    at: &str,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::test_runner::TestCaseError;
    use syncmem::Error;

    if l.dropped {
        return Ok(());
    }
    let s = &w.streams[stream];
    hold(s, micros);
    // Memory shared in place copies nothing: its last device writer is what is in flight,
    // and the offload parks the block under it. One is held on the slot's own stream (`x *=
    // 1`, which keeps the model's values).
    let in_place = l.mem.zero_copy_protocol() == Some(syncmem::ZeroCopyProtocol::InPlace);
    if in_place {
        hold(&w.streams[l.stream], micros);
        match w.ok(at, l.mem.device_mut())? {
            Some(mut g) => syncmem::kernels::scale(l.model.len(), 1.0f32, &mut g).unwrap(),
            None => return w.as_it_was(at, l),
        }
    }
    if w.ok(at, l.mem.prefetch_to_host(Some(s)))?.is_none() && !in_place {
        return w.as_it_was(at, l);
    }
    match (l.mem.offload_ordered(), pinned) {
        (Ok(_), false) => super::dropped::count_under_work(l, in_place),
        (Err(Error::Busy { .. }), true) => return Ok(()),
        (r, _) => {
            return Err(TestCaseError::fail(format!(
                "{at}: offload_ordered (pinned {pinned}): {r:?}"
            )))
        }
    }
    if back && w.ok(at, l.mem.prefetch_to_device(Some(s)))?.is_none() {
        return w.as_it_was(at, l);
    }
    Ok(())
}
