//! `syncmem train --snapshot FILE`: one memory snapshot, taken after the step at which the
//! device pool's peak (allocated or reserved bytes) last rose.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;
use syncmem::{Device, MemorySnapshot};

/// What `--snapshot` writes.
#[derive(Serialize)]
struct File<'a> {
    /// The device trained on.
    device: &'a str,
    /// The step after which the snapshot was taken (counted over all epochs from 1; 0: after
    /// training, when the device pool was never used).
    step: u64,
    #[serde(flatten)]
    snapshot: &'a MemorySnapshot,
}

/// Watches the device pool's peaks after each step and keeps the snapshot of the step that
/// raised them last.
pub(super) struct PeakSnapshot {
    path: PathBuf,
    device: Device,
    /// (allocated, reserved) peaks when the kept snapshot was taken.
    peak: (u64, u64),
    steps: u64,
    taken: Option<(u64, MemorySnapshot)>,
}

impl PeakSnapshot {
    /// Checks that `path` can be written (a regular file or a new one, in a directory that
    /// exists) before training.
    pub(super) fn new(path: &Path, device: &Device) -> anyhow::Result<Self> {
        syncmem::file::check_target(path)
            .with_context(|| format!("--snapshot {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            device: device.clone(),
            peak: (0, 0),
            steps: 0,
            taken: None,
        })
    }

    /// After a step: reads the device pool's peaks (a lock, no walk) and takes a snapshot of
    /// every pool when one of them rose.
    pub(super) fn after_step(&mut self) {
        self.steps += 1;
        let Some(s) = self.device.pool_stats() else {
            return;
        };
        let peak = (s.allocated.peak, s.reserved.peak);
        if self.taken.is_none() || peak.0 > self.peak.0 || peak.1 > self.peak.1 {
            self.peak = peak;
            self.taken = Some((self.steps, syncmem::memory_snapshot()));
        }
    }

    /// Writes the snapshot kept (one taken now when none was).
    pub(super) fn write(self) -> anyhow::Result<()> {
        let (step, snapshot) = self
            .taken
            .unwrap_or_else(|| (0, syncmem::memory_snapshot()));
        let file = File {
            device: self.device.label(),
            step,
            snapshot: &snapshot,
        };
        syncmem::file::write_atomic(&self.path, |w| {
            serde_json::to_writer(w, &file).map_err(std::io::Error::from)
        })
        .with_context(|| format!("--snapshot {}", self.path.display()))
    }
}
