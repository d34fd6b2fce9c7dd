//! MemPool scopes on several threads at once never mix allocations: random interleavings of
//! threads opening and closing scopes of two MemPools, allocating, and freeing each other's
//! blocks, against a model of which pool each block belongs to, checked after every step by
//! every pool's statistics (allocations, frees, bytes requested now).
//!
//! The threads run for real, taking turns in the order the program gives (one step at a time,
//! so that the statistics read between steps are exact).

use std::sync::{Condvar, Mutex};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use syncmem::{Device, DeviceBuffer, MemPool, MemPoolScope, PoolConfig, PoolStats};

const THREADS: usize = 3;
/// The MemPools of a program (pool 0 is the device's own).
const MEM_POOLS: usize = 2;
const SIZES: [usize; 5] = [1, 700, 4096, 100_000, 3 << 20];

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Opens a scope of MemPool `n` on the thread.
    Open(usize),
    /// Closes the thread's innermost scope.
    Close,
    /// Allocates a block of `SIZES[n]` bytes.
    Alloc(usize),
    /// Frees the `k`-th block alive (modulo their number), whichever thread allocated it.
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..MEM_POOLS).prop_map(Op::Open),
        1 => Just(Op::Close),
        4 => (0..SIZES.len()).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
    ]
}

/// What each pool should read: allocations, frees, bytes requested now.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Expected {
    allocations: u64,
    frees: u64,
    requested: u64,
}

/// The state the threads share: whose turn it is, the blocks alive (with their pool and size),
/// and the model.
struct Shared {
    step: usize,
    alive: Vec<(DeviceBuffer, usize, usize)>,
    model: [Expected; MEM_POOLS + 1],
    failed: Option<String>,
}

struct Run<'a> {
    dev: &'a Device,
    pools: &'a [MemPool],
    program: &'a [(usize, Op)],
    shared: Mutex<Shared>,
    turn: Condvar,
}

impl Run<'_> {
    /// The statistics of pool `i` (0: the device's).
    fn stats(&self, i: usize) -> PoolStats {
        match i {
            0 => self.dev.pool_stats().expect("made with the MemPools"),
            i => self.pools[i - 1].stats(),
        }
    }

    /// Thread `me`'s part of the program.
    fn thread(&self, me: usize) {
        let stream = self.dev.default_stream().unwrap();
        let mut scopes: Vec<(MemPoolScope, usize)> = Vec::new();
        loop {
            let mut sh = self.shared.lock().unwrap();
            while sh.step < self.program.len() && self.program[sh.step].0 != me {
                sh = self.turn.wait(sh).unwrap();
            }
            if sh.step >= self.program.len() {
                return;
            }
            let op = self.program[sh.step].1;
            if let Err(why) = self.apply(&mut sh, &mut scopes, &stream, op) {
                sh.failed = Some(format!("step {} (thread {me}, {op:?}): {why}", sh.step));
                sh.step = self.program.len();
            } else {
                sh.step += 1;
            }
            self.turn.notify_all();
        }
    }

    fn apply(
        &self,
        sh: &mut Shared,
        scopes: &mut Vec<(MemPoolScope, usize)>,
        stream: &syncmem::Stream,
        op: Op,
    ) -> Result<(), String> {
        match op {
            Op::Open(n) => scopes.push((self.pools[n].scope(), n + 1)),
            Op::Close => drop(scopes.pop()),
            Op::Alloc(n) => {
                let size = SIZES[n];
                let pool = scopes.last().map_or(0, |&(_, p)| p);
                let buf = self
                    .dev
                    .alloc_pooled(size, stream)
                    .map_err(|e| e.to_string())?;
                let m = &mut sh.model[pool];
                m.allocations += 1;
                m.requested += size as u64;
                sh.alive.push((buf, pool, size));
            }
            Op::Free(k) => {
                if !sh.alive.is_empty() {
                    let at = k % sh.alive.len();
                    let (buf, pool, size) = sh.alive.swap_remove(at);
                    drop(buf);
                    let m = &mut sh.model[pool];
                    m.frees += 1;
                    m.requested -= size as u64;
                }
            }
        }
        self.check(&sh.model)
    }

    /// Every pool reads what the model says.
    fn check(&self, model: &[Expected]) -> Result<(), String> {
        for (i, want) in model.iter().enumerate() {
            let s = self.stats(i);
            let got = Expected {
                allocations: s.allocations,
                frees: s.frees,
                requested: s.requested.current,
            };
            if got != *want {
                return Err(format!(
                    "pool {i} ({}) reads {got:?}, expected {want:?}",
                    s.label
                ));
            }
        }
        Ok(())
    }
}

/// Runs `program` on a fresh isolated copy of `base`, its threads taking turns.
fn run(base: &Device, program: &[(usize, Op)]) -> Result<(), TestCaseError> {
    let dev = base.isolated();
    let pools: Vec<MemPool> = (0..MEM_POOLS)
        .map(|_| MemPool::new(&dev, PoolConfig::default()).unwrap())
        .collect();
    let r = Run {
        dev: &dev,
        pools: &pools,
        program,
        shared: Mutex::new(Shared {
            step: 0,
            alive: Vec::new(),
            model: Default::default(),
            failed: None,
        }),
        turn: Condvar::new(),
    };
    std::thread::scope(|t| {
        for me in 0..THREADS {
            let r = &r;
            t.spawn(move || r.thread(me));
        }
    });
    let mut sh = std::mem::replace(
        &mut *r.shared.lock().unwrap(),
        Shared {
            step: 0,
            alive: Vec::new(),
            model: Default::default(),
            failed: None,
        },
    );
    if let Some(why) = sh.failed.take() {
        return Err(TestCaseError::fail(why));
    }
    // Every block freed at the end goes back to its own pool too.
    let model =
        std::mem::take(&mut sh.alive)
            .into_iter()
            .fold(sh.model, |mut m, (buf, pool, size)| {
                drop(buf);
                m[pool].frees += 1;
                m[pool].requested -= size as u64;
                m
            });
    r.check(&model).map_err(TestCaseError::fail)
}

fn check_device(dev: &Device, cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let programs = prop::collection::vec((0..THREADS, op()), 1..60);
    if let Err(e) = runner.run(&programs, |program| run(dev, &program)) {
        panic!("{}: {e}", dev.label());
    }
}

#[test]
fn scopes_on_several_threads_never_mix_allocations_on_cpu() {
    check_device(&Device::cpu(), 64);
}

#[test]
fn scopes_on_several_threads_never_mix_allocations_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip(
        "scopes_on_several_threads_never_mix_allocations_on_opencl",
    ) {
        check_device(&dev, 16);
    }
}

#[test]
fn scopes_on_several_threads_never_mix_allocations_on_cuda() {
    if let Some(dev) =
        syncmem::testing::cuda_or_skip("scopes_on_several_threads_never_mix_allocations_on_cuda")
    {
        check_device(&dev, 16);
    }
}
