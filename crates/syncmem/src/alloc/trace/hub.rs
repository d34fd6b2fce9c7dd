//! The process-wide trace hook: which [`Trace`]s are attached, and to what.
//!
//! Every device has a *trace source* (a number of its own, so that two handles on the same
//! hardware made by `Device::isolated` stay apart), and so does the global host pool
//! (source 0). The process's own pools (each device's device pool and pinned pool, the
//! global host pool) are marked with their source when they are made, so a trace attached to a
//! device also sees a pool that `Device::set_pool` puts in place later. Copies are reported
//! by the stream that makes them, with the stream's device.
//!
//! # Cost
//!
//! Nothing is reported while no trace is attached: a copy or a pool event then costs one
//! relaxed load of an [`AtomicBool`] and a predicted branch. With traces attached, a report
//! takes a shared read lock on the list of attachments and the lock of each trace that covers
//! the source.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

use super::Trace;
use crate::alloc::pool::{PoolEvent, StreamId};
use crate::alloc::stats::Direction;
use crate::error::Result;

#[cfg(doc)]
use crate::error::Error;

/// The trace source of the global host pool ([`crate::alloc::pool::HostPool::global`]).
pub(crate) const HOST_SOURCE: u64 = 0;

/// The environment variable naming a file that [`EnvTrace::from_env`] records the whole process
/// into (the `syncmem` command honours it for every subcommand).
pub const TRACE_ENV: &str = "SYNCMEM_TRACE";

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(HOST_SOURCE + 1);
static NEXT_ATTACHMENT: AtomicU64 = AtomicU64::new(0);
/// True while at least one trace is attached: the fast-path flag.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static ATTACHED: RwLock<Vec<Attachment>> = RwLock::new(Vec::new());

/// A new device trace source.
pub(crate) fn new_source() -> u64 {
    NEXT_SOURCE.fetch_add(1, Relaxed)
}

/// What an attached trace records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every device and the host pool.
    All,
    /// One device (its pools and copies), and the host pool when `host`.
    Device { source: u64, host: bool },
}

impl Scope {
    fn covers(self, source: u64) -> bool {
        match self {
            Scope::All => true,
            Scope::Device { source: s, host } => s == source || (host && source == HOST_SOURCE),
        }
    }
}

struct Attachment {
    id: u64,
    scope: Scope,
    trace: Arc<Trace>,
}

/// True when some trace is attached (one relaxed atomic load).
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Relaxed)
}

/// Reports a copy made by stream `stream` of the device labelled `label`, of trace source
/// `source`.
pub(crate) fn copy(
    source: u64,
    label: &str,
    stream: StreamId,
    direction: Direction,
    bytes: usize,
    peer: Option<&str>,
) {
    for a in ATTACHED.read().iter().filter(|a| a.scope.covers(source)) {
        a.trace.record_copy(label, stream, direction, bytes, peer);
    }
}

/// Marks step `step` on every trace attached to trace source `source` (see
/// [`Trace::set_step`]).
pub(crate) fn mark_step(source: u64, step: Option<u64>) {
    for a in ATTACHED.read().iter().filter(|a| a.scope.covers(source)) {
        a.trace.set_step(step);
    }
}

/// Reports an event of the process pool `label` of trace source `source`. Called with the
/// pool's lock held.
pub(crate) fn pool_event(source: u64, label: &str, event: &PoolEvent) {
    for a in ATTACHED.read().iter().filter(|a| a.scope.covers(source)) {
        a.trace.record_pool(Some(source), label, event);
    }
}

fn attach(trace: &Arc<Trace>, scope: Scope) -> TraceGuard {
    let id = NEXT_ATTACHMENT.fetch_add(1, Relaxed);
    let mut list = ATTACHED.write();
    list.push(Attachment {
        id,
        scope,
        trace: trace.clone(),
    });
    ACTIVE.store(true, Relaxed);
    TraceGuard {
        id,
        trace: trace.clone(),
    }
}

/// Keeps a [`Trace`] attached; dropping it (or [`TraceGuard::detach`]) detaches the trace,
/// which keeps what it recorded.
#[must_use = "the trace is detached when the guard is dropped"]
pub struct TraceGuard {
    id: u64,
    trace: Arc<Trace>,
}

impl TraceGuard {
    /// The attached trace.
    pub fn trace(&self) -> &Arc<Trace> {
        &self.trace
    }

    /// Detaches the trace and returns it.
    pub fn detach(self) -> Arc<Trace> {
        self.trace.clone()
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        let mut list = ATTACHED.write();
        list.retain(|a| a.id != self.id);
        ACTIVE.store(!list.is_empty(), Relaxed);
    }
}

impl std::fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceGuard")
            .field("trace", &self.trace)
            .finish()
    }
}

impl Trace {
    /// Records one device's trace source (`source`, see the module docs), with the global host
    /// pool when `host`, until the guard is dropped. The device layer's `Trace::attach` and
    /// `Trace::attach_device_only` call it with the device's source.
    pub(crate) fn attach_source(self: &Arc<Self>, source: u64, host: bool) -> TraceGuard {
        attach(self, Scope::Device { source, host })
    }

    /// Records the whole process: every device's pools and copies and the global host pool,
    /// until the guard is dropped.
    pub fn attach_all(self: &Arc<Self>) -> TraceGuard {
        attach(self, Scope::All)
    }
}

/// A whole-process recording requested by [`TRACE_ENV`] (`SYNCMEM_TRACE=FILE`), saved as JSON
/// lines by [`EnvTrace::finish`].
///
/// Rust runs no destructors at process exit, so a library cannot save a trace "at exit" by
/// itself: a program opts in by calling [`EnvTrace::from_env`] at the start of `main` and
/// [`EnvTrace::finish`] at the end. If the value is dropped without `finish` (an early return),
/// the trace is saved then, and a failure is written to standard error, the only place left to
/// report it.
#[derive(Debug)]
pub struct EnvTrace {
    path: PathBuf,
    guard: Option<TraceGuard>,
}

impl EnvTrace {
    /// Starts recording the whole process when [`TRACE_ENV`] names a file (`None` when it is
    /// unset or empty). The file is written (empty) at once, so a bad path fails early.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn from_env() -> Result<Option<EnvTrace>> {
        match std::env::var_os(TRACE_ENV) {
            Some(p) if !p.is_empty() => Self::start(Path::new(&p)).map(Some),
            _ => Ok(None),
        }
    }

    /// Starts recording the whole process into `path`, written (empty) at once; both writes go
    /// through [`crate::file::write_atomic`] (a symbolic link is followed; a directory, a
    /// device node, a FIFO or a socket is refused).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn start(path: &Path) -> Result<EnvTrace> {
        crate::file::write_atomic(path, |_| Ok(()))?;
        let trace = Arc::new(Trace::new());
        Ok(EnvTrace {
            path: path.to_path_buf(),
            guard: Some(trace.attach_all()),
        })
    }

    /// The file the trace goes to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The trace recorded so far.
    pub fn trace(&self) -> Option<&Arc<Trace>> {
        self.guard.as_ref().map(TraceGuard::trace)
    }

    /// Detaches the trace and saves it; returns the number of events written.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn finish(mut self) -> Result<usize> {
        self.save()
    }

    fn save(&mut self) -> Result<usize> {
        match self.guard.take() {
            Some(g) => {
                let trace = g.detach();
                trace.save_file(&self.path)?;
                Ok(trace.len())
            }
            None => Ok(0),
        }
    }
}

impl Drop for EnvTrace {
    fn drop(&mut self) {
        if let Err(e) = self.save() {
            eprintln!("syncmem: {TRACE_ENV}: the trace was not saved: {e}");
        }
    }
}
