//! `syncmem train --on-oom-dump DIR`: the ready-made out-of-memory observer, with the history
//! on, so that a run that fails for memory leaves its snapshot and its history.

use std::path::Path;

use anyhow::Context as _;
use syncmem::report::{current_history, record_history, OomDump};

/// Events kept per device when `--on-oom-dump` turns the history on (`SYNCMEM_HISTORY` not
/// set).
pub(super) const DEFAULT_HISTORY: usize = 100_000;

/// The observer of the run; when dropped after a failure it says on standard error what it
/// wrote.
pub(super) struct OomFiles(OomDump);

impl OomFiles {
    /// Registers the observer writing into `dir`, with the history on.
    pub(super) fn new(dir: &Path) -> anyhow::Result<OomFiles> {
        if current_history().is_none() {
            record_history(Some(DEFAULT_HISTORY));
        }
        let dump = OomDump::new(dir).with_context(|| format!("--on-oom-dump {}", dir.display()))?;
        Ok(OomFiles(dump))
    }
}

impl Drop for OomFiles {
    fn drop(&mut self) {
        let d = &self.0;
        if d.failures() == 0 {
            return;
        }
        eprintln!(
            "syncmem: out of memory {} time(s); written into {}:",
            d.failures(),
            d.dir().display()
        );
        for f in d.files() {
            eprintln!("  {}", f.display());
        }
        if let Some(e) = d.error() {
            eprintln!("syncmem: --on-oom-dump: a file was not written: {e}");
        }
        eprintln!(
            "the history opens with `syncmem trace view FILE`; \
             `syncmem trace export-torch --at oom FILE` writes it for PyTorch's memory viewer"
        );
    }
}
