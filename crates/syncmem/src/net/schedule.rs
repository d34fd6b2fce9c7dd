//! A net's schedule as the out-of-memory path sees it: while a net runs on a device with a
//! memory cap, the device knows which operator uses which buffer next, and drops or spills
//! first the mirrors the net does not use, then those it uses furthest ahead (Belady's rule),
//! instead of the least recently used ([`crate::device::NextUse`]).
//!
//! The schedule is read from the workspace when the run starts: the buffers of every blob an
//! operator reads or writes, by operator. A blob whose tensor has no storage yet (an output on
//! a net's first run) is not known then; its buffer is ordered as one the net does not use
//! until the next run. Uses count on into the next run (a training step repeats), so a
//! parameter read by the first operator is "soon" when the last one runs. With no cap the run
//! reads nothing and installs nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::device::{Device, NextUse};
use crate::ops::Operator;
use crate::tensor::Tensor;
use crate::workspace::Workspace;

/// Which operators use which buffer, and the operator running now.
pub(super) struct Schedule {
    /// Buffer key -> the indices of the operators using it, in order.
    uses: HashMap<usize, SmallVec<[u32; 4]>>,
    len: usize,
    at: AtomicUsize,
}

impl Schedule {
    /// The schedule of `ops` over the buffers `ws` holds now.
    fn read(ops: &[Box<dyn Operator>], ws: &Workspace) -> Schedule {
        let mut uses: HashMap<usize, SmallVec<[u32; 4]>> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let def = op.def();
            for name in def.inputs.iter().chain(&def.outputs) {
                let Some(blob) = ws.try_get_blob(name) else {
                    continue;
                };
                let guard = blob.read_recursive();
                let Some(key) = guard
                    .get::<Tensor>()
                    .ok()
                    .and_then(Tensor::synced)
                    .map(crate::SyncedMemory::key)
                else {
                    continue;
                };
                let list = uses.entry(key).or_default();
                if list.last() != Some(&(i as u32)) {
                    list.push(i as u32);
                }
            }
        }
        Schedule {
            uses,
            len: ops.len(),
            at: AtomicUsize::new(0),
        }
    }

    /// Operator `i` runs now.
    pub(super) fn at(&self, i: usize) {
        self.at.store(i, Relaxed);
    }
}

impl NextUse for Schedule {
    fn next_use(&self, key: usize) -> Option<usize> {
        let uses = self.uses.get(&key)?;
        let at = self.at.load(Relaxed);
        let next = match uses.iter().find(|&&u| u as usize >= at) {
            Some(&u) => u as usize - at,
            // Not again in this run: its first use in the next.
            None => uses
                .first()
                .map_or(usize::MAX, |&u| u as usize + self.len - at),
        };
        Some(next)
    }
}

/// A schedule installed on a device for one run; the one it replaced goes back when dropped.
pub(super) struct Installed<'a> {
    device: &'a Device,
    previous: Option<Arc<dyn NextUse>>,
    pub(super) schedule: Arc<Schedule>,
}

impl<'a> Installed<'a> {
    /// Reads and installs the schedule of `ops` on `device`, when the device has a memory cap
    /// (without one nothing is evicted, and the run reads nothing).
    pub(super) fn on_capped(
        device: &'a Device,
        ops: &[Box<dyn Operator>],
        ws: &Workspace,
    ) -> Option<Installed<'a>> {
        device.memory_cap()?;
        let schedule = Arc::new(Schedule::read(ops, ws));
        let previous = device.swap_next_use(Some(schedule.clone()));
        Some(Installed {
            device,
            previous,
            schedule,
        })
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.device.swap_next_use(self.previous.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_uses_count_on_into_the_next_run() {
        let mut uses = HashMap::new();
        uses.insert(1usize, SmallVec::from_slice(&[0u32, 5]));
        uses.insert(2usize, SmallVec::from_slice(&[3u32]));
        let s = Schedule {
            uses,
            len: 8,
            at: AtomicUsize::new(0),
        };
        assert_eq!(
            (s.next_use(1), s.next_use(2), s.next_use(3)),
            (Some(0), Some(3), None)
        );
        s.at(4);
        assert_eq!((s.next_use(1), s.next_use(2)), (Some(1), Some(7)));
        s.at(6);
        // Buffer 1 next at operator 0 of the next run.
        assert_eq!(s.next_use(1), Some(2));
    }
}
