//! [`OomDump`]: the ready-made out-of-memory observer, which writes what a user needs to see a
//! failure: the report, a snapshot of every pool in PyTorch's format, and the history.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::history::current_history;
use super::torch::TorchSnapshot;
use crate::alloc::pool::{HostPool, MemorySnapshot};
use crate::device::{on_out_of_memory, OomObserverHandle};
use crate::error::{Error, OomReport, Result};

/// What the observer wrote, and the first error it met.
#[derive(Debug, Default)]
struct Written {
    failures: usize,
    files: Vec<PathBuf>,
    error: Option<String>,
}

/// An out-of-memory observer ([`crate::device::on_out_of_memory`]) that, at the `n`th failure,
/// writes into its directory:
///
/// - `oom-N.txt`: the report, as the error's message;
/// - `oom-N.snapshot.pickle`: every pool's segments and blocks at the failure, in PyTorch's
///   snapshot format ([`TorchSnapshot::from_snapshot`]; `pytorch.org/memory_viz` opens it);
/// - `oom-N.history.jsonl`: the events kept by the [`super::History`] recording now (when one
///   records: [`super::record_history`], `SYNCMEM_HISTORY`), a trace file that ends with the
///   failure (`syncmem trace view`, `syncmem trace export-torch --at oom`).
///
/// It stays registered until dropped. Writing runs on the failing thread before the error
/// returns; a file that cannot be written is skipped and the error kept ([`OomDump::error`]).
#[derive(Debug)]
pub struct OomDump {
    dir: PathBuf,
    written: Arc<Mutex<Written>>,
    _handle: OomObserverHandle,
}

impl OomDump {
    /// Registers the observer, writing into `dir` (made if missing).
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be made.
    pub fn new(dir: &Path) -> Result<OomDump> {
        std::fs::create_dir_all(dir).map_err(|error| Error::Io {
            op: "create directory",
            path: dir.to_path_buf(),
            error,
        })?;
        let written = Arc::new(Mutex::new(Written::default()));
        let (w, d) = (written.clone(), dir.to_path_buf());
        let handle = on_out_of_memory(move |report| dump(&d, &w, report));
        Ok(OomDump {
            dir: dir.to_path_buf(),
            written,
            _handle: handle,
        })
    }

    /// The directory written into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Failures seen so far.
    pub fn failures(&self) -> usize {
        self.written.lock().failures
    }

    /// The files written so far, in order.
    pub fn files(&self) -> Vec<PathBuf> {
        self.written.lock().files.clone()
    }

    /// The first error met writing a file, if any.
    pub fn error(&self) -> Option<String> {
        self.written.lock().error.clone()
    }
}

/// Every segment and block of the process's pools now (as `crate::memory_snapshot`).
fn pools_now() -> MemorySnapshot {
    let mut pools: Vec<_> = HostPool::global_if_initialised()
        .map(HostPool::snapshot)
        .into_iter()
        .collect();
    for d in crate::device::registry_discovered() {
        pools.extend(d.pool_snapshots());
    }
    MemorySnapshot { pools }
}

/// Writes the files of failure `report` into `dir`.
fn dump(dir: &Path, written: &Mutex<Written>, report: &OomReport) {
    let n = {
        let mut w = written.lock();
        w.failures += 1;
        w.failures
    };
    let mut results: Vec<(PathBuf, Result<()>)> = Vec::new();
    let text = dir.join(format!("oom-{n}.txt"));
    let message = format!("{}\n", Error::from(report.clone()));
    let r = crate::file::write_atomic(&text, |out| out.write_all(message.as_bytes()));
    results.push((text, r));
    let snap = dir.join(format!("oom-{n}.snapshot.pickle"));
    let r = TorchSnapshot::from_snapshot(&pools_now()).save_file(&snap);
    results.push((snap, r));
    if let Some(h) = current_history() {
        let file = dir.join(format!("oom-{n}.history.jsonl"));
        let r = h.save_file(&file);
        results.push((file, r));
    }
    let mut w = written.lock();
    for (path, r) in results {
        match r {
            Ok(()) => w.files.push(path),
            Err(e) => {
                w.error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}
