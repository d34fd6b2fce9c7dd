//! What a training step is measured with, taken around the step instead of inside it: copies
//! (the stepping thread's and the process's), host waits, and copies between devices per pair.
//! Reading the counters allocates nothing, so a steady step stays free of heap allocations.

use syncmem::alloc::pairs::counts_into;
use syncmem::alloc::stats::{process_copies, thread_copies, thread_host_waits, CopyDir, CopyStats};

use super::Transfers;

/// The counters read right before a step; [`StepMeter::stop`] adds the difference after it.
pub(super) struct StepMeter {
    process: CopyStats,
    thread: CopyStats,
    waits: u64,
}

impl StepMeter {
    /// Reads the counters; with `pairs`, the copies between devices too.
    pub(super) fn start(pairs: Option<&mut PairMeter>) -> Self {
        if let Some(p) = pairs {
            counts_into(&mut p.before);
        }
        Self {
            process: process_copies(),
            thread: thread_copies(),
            waits: thread_host_waits(),
        }
    }

    /// Adds what the step did to `tr` (and to `pairs`' totals).
    pub(super) fn stop(self, tr: &mut Transfers, pairs: Option<&mut PairMeter>) {
        if let Some(p) = pairs {
            p.add_since_start();
        }
        let d = thread_copies().since(&self.thread);
        let w = thread_host_waits() - self.waits;
        tr.process_steps = add(tr.process_steps, process_copies().since(&self.process));
        tr.steps = add(tr.steps, d);
        tr.last_step = d;
        tr.max_step = max(tr.max_step, d);
        tr.step_count += 1;
        tr.waits.total += w;
        tr.waits.last_step = w;
        tr.waits.max_step = tr.waits.max_step.max(w);
    }
}

/// The copies between devices of the steps so far, per pair and route (in the order of
/// [`syncmem::alloc::pairs::pair_copies`]), with the buffers a step reads them into (kept, so a
/// step allocates nothing once the pairs are known).
#[derive(Debug, Default)]
pub(super) struct PairMeter {
    /// `(copies, bytes)` per pair over every step measured.
    pub(super) totals: Vec<(u64, u64)>,
    before: Vec<(u64, u64)>,
    after: Vec<(u64, u64)>,
}

impl PairMeter {
    fn add_since_start(&mut self) {
        counts_into(&mut self.after);
        if self.totals.len() < self.after.len() {
            self.totals.resize(self.after.len(), (0, 0));
        }
        for (i, (c, b)) in self.after.iter().enumerate() {
            let (c0, b0) = self.before.get(i).copied().unwrap_or((0, 0));
            self.totals[i].0 += c - c0;
            self.totals[i].1 += b - b0;
        }
    }
}

/// `a + b`, per direction.
pub(super) fn add(a: CopyStats, b: CopyStats) -> CopyStats {
    a.plus(&b)
}

/// The larger of `a` and `b`, per direction and field.
fn max(a: CopyStats, b: CopyStats) -> CopyStats {
    CopyStats::from_fn(|d| {
        let (x, y) = (a.get(d), b.get(d));
        CopyDir::new(x.count.max(y.count), x.bytes.max(y.bytes))
    })
}
