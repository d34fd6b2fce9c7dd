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
//!
//! A buffer is *dead* when its next use overwrites it whole before anything reads it: its
//! blob is internal to the net (not an external input or output, not kept: nothing outside
//! the run reads it) and the next operator to use it has it as an output only, and says it
//! writes such outputs whole ([`Operator::overwrites_outputs`]). A use by the running operator
//! counts as a read (it may have written the output already). The out-of-memory path frees a
//! dead buffer's device mirror without a write-back ([`crate::SyncedMemory::drop_contents`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::device::{Device, NextUse};
use crate::ops::Operator;
use crate::tensor::Tensor;
use crate::workspace::Workspace;

/// One use of a buffer: the operator's index, and whether it overwrites the buffer whole
/// without reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Use {
    op: u32,
    overwrite: bool,
}

/// The uses of one buffer, and whether every blob naming it is internal to the net.
#[derive(Default)]
struct Uses {
    list: SmallVec<[Use; 4]>,
    internal: bool,
}

/// Which operators use which buffer, and the operator running now.
pub(super) struct Schedule {
    /// Buffer key -> its uses, in order.
    uses: HashMap<usize, Uses>,
    len: usize,
    at: AtomicUsize,
}

impl Schedule {
    /// The schedule of `ops` over the buffers `ws` holds now; `internal`: the net's blobs
    /// nothing outside a run reads.
    fn read(ops: &[Box<dyn Operator>], ws: &Workspace, internal: &BTreeSet<String>) -> Schedule {
        let mut uses: HashMap<usize, Uses> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let def = op.def();
            let overwrites = op.overwrites_outputs();
            for (j, name) in def.inputs.iter().chain(&def.outputs).enumerate() {
                let Some(key) = buffer_key(ws, name) else {
                    continue;
                };
                let is_input = j < def.inputs.len();
                let overwrite = overwrites && !is_input && !def.inputs.contains(name);
                let entry = uses.entry(key).or_insert_with(|| Uses {
                    list: SmallVec::new(),
                    internal: true,
                });
                entry.internal &= internal.contains(name);
                match entry.list.last_mut() {
                    Some(u) if u.op == i as u32 => u.overwrite &= overwrite,
                    _ => entry.list.push(Use {
                        op: i as u32,
                        overwrite,
                    }),
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

/// The key of the buffer of blob `name` in `ws`, when it holds a tensor with storage.
fn buffer_key(ws: &Workspace, name: &str) -> Option<usize> {
    let blob = ws.try_get_blob(name)?;
    let guard = blob.read_recursive();
    guard
        .get::<Tensor>()
        .ok()
        .and_then(Tensor::synced)
        .map(crate::SyncedMemory::key)
}

impl NextUse for Schedule {
    fn next_use(&self, key: usize) -> Option<usize> {
        let uses = &self.uses.get(&key)?.list;
        let at = self.at.load(Relaxed);
        let next = match uses.iter().find(|u| u.op as usize >= at) {
            Some(u) => u.op as usize - at,
            // Not again in this run: its first use in the next.
            None => uses
                .first()
                .map_or(usize::MAX, |u| u.op as usize + self.len - at),
        };
        Some(next)
    }

    fn is_dead(&self, key: usize) -> bool {
        let Some(uses) = self.uses.get(&key).filter(|u| u.internal) else {
            return false;
        };
        let at = self.at.load(Relaxed);
        // The next use, in this run or (none left) the first of the next; one by the running
        // operator is not known to be over.
        let next = uses
            .list
            .iter()
            .find(|u| u.op as usize >= at)
            .or(uses.list.first());
        next.is_some_and(|u| u.overwrite && u.op as usize != at)
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
        internal: &BTreeSet<String>,
    ) -> Option<Installed<'a>> {
        device.memory_cap()?;
        let schedule = Arc::new(Schedule::read(ops, ws, internal));
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

    /// Uses of one buffer: `(op, overwrite)`.
    fn uses(list: &[(u32, bool)], internal: bool) -> Uses {
        Uses {
            list: list
                .iter()
                .map(|&(op, overwrite)| Use { op, overwrite })
                .collect(),
            internal,
        }
    }

    #[test]
    fn next_uses_count_on_into_the_next_run() {
        let mut map = HashMap::new();
        map.insert(1usize, uses(&[(0, false), (5, false)], true));
        map.insert(2usize, uses(&[(3, false)], true));
        let s = Schedule {
            uses: map,
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

    #[test]
    fn dead_until_overwritten_and_only_inside_the_net() {
        let mut map = HashMap::new();
        // Written by 1, read by 4 (an activation): dead after 4 until the next run's 1.
        map.insert(1usize, uses(&[(1, true), (4, false)], true));
        // The same, but an external output: never dead.
        map.insert(2usize, uses(&[(1, true), (4, false)], false));
        // Read by 0, overwritten by 2 in the run, read by 3.
        map.insert(3usize, uses(&[(0, false), (2, true), (3, false)], true));
        let s = Schedule {
            uses: map,
            len: 6,
            at: AtomicUsize::new(0),
        };
        // Before 1 writes it: dead (the next use overwrites it). Buffer 3 is read by 0, which
        // runs now.
        assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
        s.at(1);
        // 1 runs now and may have written it already.
        assert!(!s.is_dead(1) && s.is_dead(3));
        s.at(2);
        assert!(!s.is_dead(1) && !s.is_dead(3));
        s.at(5);
        // Past its last read: dead until the next run's write; never for the external one.
        assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
        assert!(
            !s.is_dead(9),
            "a buffer the net does not use is not known dead"
        );
    }
}
