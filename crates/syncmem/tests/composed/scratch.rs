//! Scratch blocks: unnamed host blocks allocated and freed between the buffers' operations, as
//! a user's staging buffers are, from the process's host pool (which the buffers' host mirrors
//! share, and whose events the history records: its thread caches stand aside) or from a host
//! pool of the test's own (no one listens: its thread caches serve). The buffers' named
//! mirrors, served by the shards, empty this thread's cache of the process's pool before each
//! of their allocations; `empty_cache` empties every thread's cache, from any thread. Each
//! block keeps its pattern from its allocation to its free, whatever the buffers did in
//! between; a block that says it is zero is; the own pool's readings match its live blocks
//! exactly after every step, and the snapshots of both count every live block as allocated.

use std::cell::RefCell;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use syncmem::alloc::pool::{BlockState, HostAllocation, PoolSnapshot};
use syncmem::{HostPool, PoolConfig};

use crate::ops::{Op, SCRATCH};

/// A live scratch block: the block, its seed, whether the own pool made it.
type Block = (HostAllocation, u8, bool);

/// The live scratch blocks, by slot, and the test's own host pool.
pub struct Scratch {
    slots: RefCell<Vec<Option<Block>>>,
    own: HostPool,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            slots: RefCell::new((0..SCRATCH).map(|_| None).collect()),
            own: HostPool::new("composed scratch", PoolConfig::default()).unwrap(),
        }
    }
}

fn fill(a: &mut HostAllocation, seed: u8) {
    for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
}

fn holds(a: &HostAllocation, seed: u8) -> bool {
    a.as_slice()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == seed.wrapping_add(i as u8))
}

/// Every block of `live` is allocated in `snap` (other users of the pool only add to it).
fn shown(at: &str, snap: &PoolSnapshot, live: &[usize]) -> Result<(), TestCaseError> {
    for len in live {
        let want = live.iter().filter(|l| *l == len).count();
        let seen = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Allocated && b.requested == *len as u64)
            .count();
        prop_assert!(
            seen >= want,
            "{at}: {} has {want} live block(s) of {len} B, shows {seen}",
            snap.label
        );
    }
    Ok(())
}

impl Scratch {
    /// Applies `op` and checks every scratch block when it is a scratch operation; returns
    /// whether it was.
    pub fn applies(&self, op: Op, at: &str) -> Result<bool, TestCaseError> {
        if !matches!(
            op,
            Op::Scratch { .. } | Op::ScratchFree { .. } | Op::HostRelease { .. }
        ) {
            return Ok(false);
        }
        self.step(op, at)?;
        self.check(at)?;
        Ok(true)
    }

    /// Applies a scratch operation.
    fn step(&self, op: Op, at: &str) -> Result<(), TestCaseError> {
        let global = HostPool::global().unwrap();
        let mut slots = self.slots.borrow_mut();
        match op {
            Op::Scratch {
                slot,
                len,
                seed,
                private,
            } => {
                // The old block (if any) is freed first, as a reassignment would.
                if let Some((old, s, _)) = slots[slot].take() {
                    prop_assert!(holds(&old, s), "{at}: a scratch block lost its bytes");
                }
                let pool = if private { &self.own } else { global };
                let mut a = pool
                    .alloc(len)
                    .map_err(|e| TestCaseError::fail(format!("{at}: {e}")))?;
                prop_assert_eq!(a.len(), len);
                if a.was_zeroed() {
                    prop_assert!(
                        a.as_slice().iter().all(|&b| b == 0),
                        "{}: a block said zero holds bytes",
                        at
                    );
                }
                fill(&mut a, seed);
                slots[slot] = Some((a, seed, private));
            }
            Op::ScratchFree { slot, elsewhere } => {
                if let Some((a, seed, _)) = slots[slot].take() {
                    prop_assert!(holds(&a, seed), "{at}: a scratch block lost its bytes");
                    if elsewhere {
                        std::thread::scope(|s| {
                            s.spawn(move || drop(a));
                        });
                    }
                }
            }
            Op::HostRelease { empty } => {
                for pool in [global, &self.own] {
                    if empty {
                        pool.empty_cache();
                    } else {
                        pool.trim();
                    }
                }
                for (pool, private) in [(global, false), (&self.own, true)] {
                    let live: Vec<usize> = slots
                        .iter()
                        .flatten()
                        .filter(|b| b.2 == private)
                        .map(|b| b.0.len())
                        .collect();
                    shown(at, &pool.snapshot(), &live)?;
                }
            }
            _ => unreachable!("{op:?} is another step's"),
        }
        Ok(())
    }

    /// Every live scratch block still holds its pattern, and the own pool's readings are its
    /// live blocks, exactly.
    pub fn check(&self, at: &str) -> Result<(), TestCaseError> {
        let slots = self.slots.borrow();
        let (mut bytes, mut requested, mut blocks) = (0, 0, 0);
        for (slot, (a, seed, private)) in slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.as_ref()?)))
        {
            prop_assert!(holds(a, *seed), "{at}: scratch slot {slot} lost its bytes");
            if *private {
                bytes += a.block_size() as u64;
                requested += a.len() as u64;
                blocks += 1;
            }
        }
        let s = self.own.stats();
        prop_assert_eq!(
            (
                s.allocated.current,
                s.requested.current,
                s.block_count.current
            ),
            (bytes, requested, blocks),
            "{}: the own pool's readings",
            at
        );
        prop_assert_eq!(
            s.allocations - s.frees,
            blocks,
            "{}: allocations - frees",
            at
        );
        prop_assert!(
            s.allocated.peak >= s.allocated.current,
            "{at}: peak below current"
        );
        Ok(())
    }

    /// The own pool's allocations served by the thread's cache so far.
    pub fn thread_cache_hits(&self) -> u64 {
        self.own.stats().thread_cache_hits
    }

    /// Frees every scratch block (checking it), and gives the own pool's memory back.
    pub fn clear(&self, at: &str) -> Result<(), TestCaseError> {
        self.check(at)?;
        self.slots.borrow_mut().iter_mut().for_each(|s| *s = None);
        self.own.empty_cache();
        let s = self.own.stats();
        prop_assert_eq!(
            (
                s.allocated.current,
                s.reserved.current,
                s.thread_cached_bytes
            ),
            (0, 0, 0),
            "{}: the own pool after its last free and empty_cache",
            at
        );
        Ok(())
    }
}
