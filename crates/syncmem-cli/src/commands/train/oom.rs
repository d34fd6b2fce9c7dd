//! `syncmem train --on-oom-dump DIR`: the ready-made out-of-memory observer, with the history
//! on, so that a run that fails for memory leaves its snapshot and its history: at the N-th
//! failure, `oom-N.txt` (the report), `oom-N.snapshot.pickle` (every pool, in PyTorch's
//! format) and `oom-N.history.jsonl` (`SYNCMEM_HISTORY` events per device, else 100000).

use std::path::Path;

use anyhow::Context as _;
use syncmem::report::{current_history, record_history, OomDump};
use syncmem::Device;

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

/// Caps the devices (`--memory-cap`) and registers the out-of-memory observer
/// (`--on-oom-dump`, on rank 0).
pub(super) fn prepare(
    args: &super::Args,
    devices: &[Device],
    root: bool,
) -> anyhow::Result<Option<OomFiles>> {
    if let Some(cap) = args.memory_cap {
        super::devices::cap_devices(devices, cap)?;
    }
    args.on_oom_dump
        .as_deref()
        .filter(|_| root)
        .map(OomFiles::new)
        .transpose()
}
