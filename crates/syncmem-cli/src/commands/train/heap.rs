//! Heap allocations counted around the training steps.

/// Heap allocations of the training steps, as the hooks around each step saw them.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HeapSteps {
    pub(super) steps: u64,
    pub(super) first: u64,
    /// Over the steps after the first.
    pub(super) rest: u64,
    pub(super) max_rest: u64,
}

impl HeapSteps {
    /// One step's allocations.
    pub(super) fn record(&mut self, n: u64) {
        if self.steps == 0 {
            self.first = n;
        } else {
            self.rest += n;
            self.max_rest = self.max_rest.max(n);
        }
        self.steps += 1;
    }
}
