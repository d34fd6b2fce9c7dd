//! Device scratch blocks: unnamed pooled device buffers (a user's temporaries), each filled
//! with its seed on one of the device's streams (queued: on a held stream it stays in flight)
//! and read back there before it is freed, here or on another thread. While the history is
//! paused (`HistoryPause`) nobody listens to the device pool, and a block freed with nothing
//! in flight waits in the freeing thread's cache for its stream's next request of its length;
//! a block with its fill in flight goes to its shard, fenced. Every block keeps its bytes
//! whatever the buffers' operations (spills under the cap, MemPool scopes, injected failures,
//! pool releases) did in between.

use std::cell::{Cell, RefCell};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use syncmem::device::DeviceBuffer;

use crate::ops::{Op, SCRATCH};
use crate::World;

/// A live device scratch block: the buffer, its seed, its stream.
type Block = (DeviceBuffer, u8, usize);

/// The live device scratch blocks, by slot.
pub struct DevScratch {
    slots: RefCell<Vec<Option<Block>>>,
    /// This test stopped the history (see `observed::pause`).
    paused: Cell<bool>,
}

impl Default for DevScratch {
    fn default() -> Self {
        DevScratch {
            slots: RefCell::new((0..SCRATCH).map(|_| None).collect()),
            paused: Cell::new(false),
        }
    }
}

/// Reads `b` back on its stream: every byte is its seed.
fn check_block(w: &World<'_>, (buf, seed, stream): &Block, at: &str) -> Result<(), TestCaseError> {
    let mut back = vec![0u8; buf.len()];
    w.streams[*stream]
        .read(buf, 0, &mut back)
        .map_err(|e| TestCaseError::fail(format!("{at}: device scratch read: {e}")))?;
    prop_assert!(
        back.iter().all(|b| b == seed),
        "{at}: a device scratch block lost its bytes"
    );
    Ok(())
}

impl DevScratch {
    /// Applies `op` when it is a device scratch operation; returns whether it was.
    pub fn applies(&self, w: &World<'_>, op: Op, at: &str) -> Result<bool, TestCaseError> {
        let mut slots = self.slots.borrow_mut();
        match op {
            Op::DevScratch {
                slot,
                len,
                seed,
                stream,
            } => {
                // The old block (if any) is checked and freed first, as a reassignment would.
                if let Some(old) = slots[slot].take() {
                    check_block(w, &old, at)?;
                }
                let s = &w.streams[stream];
                let Some(mut buf) = w.ok(at, w.dev.alloc_pooled(len, s))? else {
                    return Ok(true);
                };
                prop_assert_eq!(buf.len(), len);
                s.fill(&mut buf, 0, len, seed)
                    .map_err(|e| TestCaseError::fail(format!("{at}: device scratch fill: {e}")))?;
                slots[slot] = Some((buf, seed, stream));
            }
            Op::DevScratchFree { slot, elsewhere } => {
                if let Some(b) = slots[slot].take() {
                    check_block(w, &b, at)?;
                    if elsewhere {
                        std::thread::scope(|sc| {
                            sc.spawn(move || drop(b));
                        });
                    }
                }
            }
            Op::HistoryPause { paused } => crate::observed::pause(paused, &self.paused),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks and frees every block, and turns the history back on.
    pub fn clear(&self, w: &World<'_>, at: &str) -> Result<(), TestCaseError> {
        for b in self.slots.borrow_mut().iter_mut().filter_map(Option::take) {
            check_block(w, &b, at)?;
        }
        crate::observed::pause(false, &self.paused);
        Ok(())
    }
}
