//! Reports of memory traffic: recording it, saving and loading it, replaying it against any
//! pool, its timeline and its export to PyTorch's memory tools.
//!
//! The pools and streams below publish their events through one leaf hook of `alloc` (an
//! event type and a list of sinks); this layer installs its traces there and never reaches
//! into a pool. Nothing below it names it.
//!
//! # Recording
//!
//! A [`Trace`] records, per device:
//!
//! - every block allocation and free of a pool (bytes asked for, a block id of its own, the
//!   stream, the pool's label: `opencl:0`, `opencl:0 pinned`, `host`; the label of the buffer
//!   that owns the block; where the block lies: its segment, offset and rounded size);
//! - every segment a pool takes from and gives back to the backend (a segment id of its own,
//!   bytes, the stream of the allocation that made it);
//! - every copy between host and device memory made by a [`crate::Stream`] (direction, bytes,
//!   the stream and its device);
//! - every clean device mirror dropped to make room under memory pressure (the buffer's label,
//!   bytes, the device);
//! - every allocation a pool refused for good, out of memory (bytes asked for, the pool's
//!   label).
//!
//! Every event carries a [`Stamp`]: microseconds since the trace began (a monotonic clock) and
//! the step the program was in, when it marks steps ([`Trace::set_step`];
//! [`crate::Device::mark_trace_step`] marks them on every trace recording a device, as the
//! training loop does).
//!
//! Record a whole program with [`Trace::attach`] (one device, its pinned pool and the host
//! pool), [`Trace::attach_device_only`] or [`Trace::attach_all`] (every device): each returns a
//! [`TraceGuard`] that detaches on drop. While no trace is attached, the hook costs one relaxed
//! atomic load per copy or pool event. A [`Trace`] is also a
//! [`PoolObserver`](crate::alloc::pool::PoolObserver) for any single pool
//! ([`crate::alloc::pool::Pool::set_observer`]); [`EnvTrace`] records the process into the file
//! named by `SYNCMEM_TRACE`.
//!
//! # Always-on history
//!
//! [`record_history`] (or `SYNCMEM_HISTORY=N`, [`history_from_env`]) keeps the newest `N`
//! events of every device in a ring of its own, off by default: PyTorch's
//! `_record_memory_history(max_entries=N)`. [`History::trace`] reads them as a [`Trace`] at
//! any moment, so every view, replay and export takes them.
//!
//! [`OomDump`] is the ready-made observer of out-of-memory failures
//! ([`crate::device::on_out_of_memory`]): at each failure it writes the report, a snapshot of
//! every pool in PyTorch's format and the history into a directory.
//!
//! # Files, views and replays
//!
//! Save a trace as JSON lines ([`Trace::save`], [`Trace::save_file`]), load it back
//! ([`Trace::load`], [`Trace::load_file`]; files written before copies, evictions, segments,
//! owners and times were recorded still load: what they lack is absent), turn it into a
//! timeline of memory over time ([`timeline::Timeline`]) or into a snapshot that PyTorch's
//! memory tools open ([`torch`]), and replay it ([`replay_with`]) with
//! one fresh pool per recorded device, of any [`crate::PoolConfig`], optionally under a memory cap, to
//! compare how much memory each pool kind would reserve for the same program, how often it
//! would call the backend, and where it would run out of memory. [`Trace::synthetic`] makes a
//! deterministic training-loop-like trace.
//!
//! ```
//! use std::sync::Arc;
//! use syncmem::report::{replay_with, ReplayOptions, Trace};
//! use syncmem::{Device, PoolConfig, PoolKind, SyncedMemory};
//!
//! let dev = Device::cpu();
//! let trace = Arc::new(Trace::new());
//! {
//!     let _guard = trace.attach_device_only(&dev);
//!     // Two mirrors (no zero-copy), so that the device access copies.
//!     let m = SyncedMemory::new(4096, &dev).with_zero_copy(false);
//!     m.host_mut().unwrap().fill(7);
//!     drop(m.device().unwrap()); // one host-to-device copy
//! } // detached here
//! let s = trace.summary();
//! assert_eq!(s.copies.host_to_device.count, 1);
//! assert_eq!(s.copies.host_to_device.bytes, 4096);
//!
//! // Save, load, and replay on a binned pool with a 1 MiB cap per device.
//! let mut file = Vec::new();
//! trace.save(&mut file).unwrap();
//! let back = Trace::load(&file[..]).unwrap();
//! let opts = ReplayOptions::new().with_cap(Some(1 << 20));
//! let r = replay_with(&back, &PoolConfig::new(PoolKind::Binned), &opts).unwrap();
//! let cpu = r.device("cpu").unwrap();
//! assert_eq!(cpu.ooms, 0);
//! assert!(cpu.peak_reserved >= cpu.peak_allocated && cpu.peak_allocated >= 4096);
//! assert_eq!(r.total.copies.host_to_device.bytes, 4096);
//! ```

mod attach;
mod event;
mod file;
mod frames;
mod history;
mod lost;
mod oom_dump;
mod pickle;
mod replay;
mod summary;
pub mod timeline;
pub mod torch;
mod trace;

pub use attach::{EnvTrace, TraceGuard, TRACE_ENV};
pub use event::{Place, Stamp, TraceEvent, MAX_EVENT_BYTES, MAX_LINE_BYTES};
pub use frames::{
    current_op, op_scope, set_trace_stacks, trace_stacks, Frame, OpScope, TRACE_STACKS_ENV,
};
pub use history::{current_history, history_from_env, record_history, History, HISTORY_ENV};
pub use oom_dump::OomDump;
pub use replay::{
    replay, replay_with, DeviceReplay, ReplayOptions, ReplayReport, ReplaySummary, MAX_REPLAY_BYTES,
};
pub use summary::TraceSummary;
pub use trace::Trace;

#[cfg(test)]
mod tests;
