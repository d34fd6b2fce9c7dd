//! Attaching a [`Trace`] to the process's pools and streams: [`Trace::attach`],
//! [`Trace::attach_device_only`], [`Trace::attach_all`], and the whole-process recording that
//! `SYNCMEM_TRACE` asks for ([`EnvTrace`]).
//!
//! A trace is a sink of `alloc`'s event hook: attaching it adds it to the hook's list with the
//! sources it covers (one device's, the global host pool's, or all), and the guard removes it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Trace;
use crate::alloc::event::{self, Attachment, Event, Scope, Sink};
use crate::device::Device;
use crate::error::Result;

#[cfg(doc)]
use crate::error::Error;

/// The environment variable naming a file that [`EnvTrace::from_env`] records the whole process
/// into (the `syncmem` command honours it for every subcommand).
pub const TRACE_ENV: &str = "SYNCMEM_TRACE";

impl Sink for Trace {
    fn on_event(&self, source: u64, e: &Event<'_>) {
        match *e {
            Event::Pool { pool, event, .. } => self.record_pool(Some(source), pool, event),
            Event::Copy {
                device,
                stream,
                direction,
                bytes,
                peer,
            } => self.record_copy(device, stream, direction, bytes, peer),
            Event::Step(step) => self.set_step(step),
            Event::Plan { device, net, slots } => self.record_plan(device, net, slots),
        }
    }
}

/// Keeps a [`Trace`] attached; dropping it (or [`TraceGuard::detach`]) detaches the trace,
/// which keeps what it recorded.
#[must_use = "the trace is detached when the guard is dropped"]
pub struct TraceGuard {
    trace: Arc<Trace>,
    /// Detaches the trace when dropped.
    _attachment: Attachment,
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

impl std::fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceGuard")
            .field("trace", &self.trace)
            .finish()
    }
}

impl Trace {
    /// Records `device`: allocations, frees and evictions of its device pool and of its pinned
    /// host pool, every copy made by its streams, and the allocations and frees of the global
    /// host pool (the host mirrors of [`crate::SyncedMemory`]), until the guard is dropped.
    ///
    /// Pools made later ([`Device::set_pool`], a first use) are covered too. Another handle on
    /// the same hardware made by [`Device::isolated`] is a different device here. Direct
    /// allocations ([`Device::alloc`]) are not pool traffic and are not recorded.
    pub fn attach(self: &Arc<Self>, device: &Device) -> TraceGuard {
        self.attach_scope(Scope::Device {
            source: device.trace_source(),
            host: true,
        })
    }

    /// As [`Trace::attach`] without the global host pool: only `device`'s own pools and copies
    /// (other users of the host pool in the process do not show up).
    pub fn attach_device_only(self: &Arc<Self>, device: &Device) -> TraceGuard {
        self.attach_scope(Scope::Device {
            source: device.trace_source(),
            host: false,
        })
    }

    /// Records the whole process: every device's pools and copies and the global host pool,
    /// until the guard is dropped.
    pub fn attach_all(self: &Arc<Self>) -> TraceGuard {
        self.attach_scope(Scope::All)
    }

    fn attach_scope(self: &Arc<Self>, scope: Scope) -> TraceGuard {
        TraceGuard {
            trace: self.clone(),
            _attachment: event::attach(self.clone(), scope),
        }
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
