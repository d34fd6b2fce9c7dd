//! The composed model test: random programs over every feature of a buffer at once, against a
//! host model of every buffer's contents, with allocation failures injected.
//!
//! Features in one program: Caffe's four accesses and the overwrites, prefetches on two
//! streams, guards held across operations, placement pins with the host address they keep (a
//! NumPy view, a DLPack export), users' kernels, replicas on a second device, frees and reuse
//! of pool blocks, all under a memory cap that spills and refills, with zero-copy on, off and
//! with the map protocol, contents dropped (`drop_contents`: every read then fails until an
//! overwrite), buffers offloaded (`offload`: the device mirror goes, the data stays; where
//! memory is shared in place, its block stays as the host mirror, spilled in place), and
//! MemPool scopes opened and closed around them (each step checks
//! that only the innermost scope's pool, or with none open the device's, allocated), and
//! unnamed host blocks (staging buffers, served by the thread's cache of the host pool)
//! allocated, freed here or on another thread, and released with the pool's cache in between
//! (`scratch.rs`: each keeps its bytes), unnamed pooled device blocks filled on a stream and
//! freed here or on another thread, served by the thread's cache of the device pool while the
//! history is paused (`dev_scratch.rs`, `HistoryPause`), and buffers whose next host mirror
//! is set to come from the device's pinned pool or not (`PinnedHost`, at any moment), and,
//! on OpenCL, streams held for a moment so that copies stay in flight while the operations
//! after them run (`Hold`, and `MoveOut`: a value copied out, its device mirror freed under
//! the copy and maybe brought back behind it; `hold.rs`). `FailNext` makes the `n`-th
//! allocation fail ([`Device::fail_allocation`]): an operation that fails with out-of-memory
//! (injected, or the cap) must leave every buffer as it was, which is checked on the spot. The
//! always-on history records every program (but where it pauses), and an out-of-memory
//! observer runs at every failure, reading the history and snapshotting the pools in the middle
//! of the failing operation (`observed.rs`).
//!
//! Defects found where two features meet are kept here as operations; every new feature adds
//! its own. `SYNCMEM_PROPTEST_CASES` sets the number of programs per device and zero-copy
//! setting (CI runs the default; a longer local run sets more).

mod dev_scratch;
mod dropped;
mod hold;
#[path = "../common/model.rs"]
mod model;
mod observed;
mod ops;
mod scratch;
mod steps;

use model::{same, user_twice, values};
use ops::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use steps::step_one;
use syncmem::kernels;
use syncmem::synced::{DeviceRead, HostRead, PlacementPin};
use syncmem::{
    Device, MemPool, MemPoolScope, MemoryCap, PoolConfig, Stream, SyncedMemory, ZeroCopy,
};

struct Live {
    mem: SyncedMemory,
    model: Vec<f32>,
    /// The buffer's stream (an index of `World::streams`).
    stream: usize,
    /// Its contents were dropped: reads fail, `model` means nothing until an overwrite.
    dropped: bool,
}

/// A guard kept across operations, with the slot it holds.
enum Held<'a> {
    Host(usize, HostRead<'a>),
    Device(usize, #[allow(dead_code)] DeviceRead<'a>),
}

impl Held<'_> {
    fn slot(&self) -> usize {
        match self {
            Held::Host(s, _) | Held::Device(s, _) => *s,
        }
    }
}

/// A pin kept across operations: the slot, the pin, the host address it kept.
struct Kept {
    slot: usize,
    _pin: PlacementPin,
    at: usize,
}

struct World<'d> {
    dev: &'d Device,
    other: &'d Device,
    streams: &'d [Stream; 3],
    twice: kernels::UserKernel,
    /// Operations that failed with out-of-memory.
    failed: std::cell::Cell<u64>,
    /// The MemPool scopes open on the device, innermost last.
    scopes: std::cell::RefCell<Vec<(MemPoolScope, MemPool)>>,
    /// The last MemPool whose scope was closed with `keep`.
    closed: std::cell::RefCell<Option<MemPool>>,
    /// Allocations made by MemPools whose scope was closed.
    scoped: std::cell::Cell<u64>,
    /// Unnamed host blocks, allocated and freed between the buffers' operations.
    scratch: scratch::Scratch,
    /// Unnamed device blocks, likewise.
    dev_scratch: dev_scratch::DevScratch,
}

impl World<'_> {
    /// `Ok(Some(v))` on success, `Ok(None)` for an out-of-memory error (the injection is
    /// disarmed then), a test failure for any other error.
    fn ok<T>(&self, what: &str, r: syncmem::Result<T>) -> Result<Option<T>, TestCaseError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_out_of_memory() => {
                self.dev.fail_allocation(0);
                self.other.fail_allocation(0);
                self.failed.set(self.failed.get() + 1);
                Ok(None)
            }
            Err(e) => Err(TestCaseError::fail(format!("{what}: {e}"))),
        }
    }

    /// After a failed operation: the buffer still holds the model's data, on the host and on
    /// its device.
    fn as_it_was(&self, what: &str, l: &Live) -> Result<(), TestCaseError> {
        if l.dropped {
            return dropped::reads_fail(&l.mem, what);
        }
        let h = l
            .mem
            .host()
            .map_err(|e| TestCaseError::fail(format!("{what}: host read after a failure: {e}")))?;
        same(
            &format!("{what}: host after a failure"),
            h.as_slice_of::<f32>().unwrap(),
            &l.model,
        )
    }

    /// The allocations of the device's pool, of the pools of the open scopes and of the kept
    /// one.
    fn allocations(&self) -> Vec<u64> {
        let mut v = vec![self.dev.pool_stats().map_or(0, |s| s.allocations)];
        v.extend(
            self.scopes
                .borrow()
                .iter()
                .map(|(_, p)| p.stats().allocations),
        );
        v.extend(self.closed.borrow().iter().map(|p| p.stats().allocations));
        v
    }

    /// After a step that did not open or close a scope: only the innermost scope's pool
    /// allocated, or the device's when none is open.
    fn routed(&self, at: &str, before: &[u64]) -> Result<(), TestCaseError> {
        let after = self.allocations();
        let open = self.scopes.borrow().len();
        let (innermost, len) = (open, after.len());
        for i in 0..len {
            if i != innermost && before[i] != after[i] {
                return Err(TestCaseError::fail(format!(
                    "{at}: pool {i} allocated with {open} scope(s) open: {before:?} -> {after:?}"
                )));
            }
        }
        Ok(())
    }

    /// Closes every scope and drops the MemPools (their blocks stay with the buffers).
    fn close_scopes(&self) {
        for (scope, pool) in self.scopes.borrow_mut().drain(..).rev() {
            drop(scope);
            self.scoped
                .set(self.scoped.get() + pool.stats().allocations);
        }
        self.closed.borrow_mut().take();
    }

    fn device_values(&self, what: &str, l: &Live) -> Result<Vec<f32>, TestCaseError> {
        let g = l
            .mem
            .device()
            .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let mut bytes = vec![0u8; l.mem.len()];
        self.streams[2].read(g.buffer(), 0, &mut bytes).unwrap();
        Ok(values(&bytes))
    }
}

fn run(w: &World<'_>, ops: &[Op]) -> Result<(), TestCaseError> {
    // Declared before the guards, which borrow its buffers (dropped after them).
    let mut slots: Vec<Option<Live>> = (0..SLOTS).map(|_| None).collect();
    let mut held: Vec<Held<'_>> = Vec::new();
    let mut pins: Vec<Kept> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?})");
        let guarded = |slot: usize| held.iter().any(|h| h.slot() == slot);
        let pinned = |slot: usize| pins.iter().any(|p| p.slot == slot);
        // Operations that need the slot's write lock (or replace it) skip guarded slots: the
        // guards of this thread would make them fail with Busy (tested elsewhere). A pinned
        // slot is not dropped: a view keeps its buffer alive.
        let skip = match *op {
            Op::Alloc { slot, .. } | Op::Drop { slot } => guarded(slot) || pinned(slot),
            Op::HostWrite { slot, .. }
            | Op::HostOverwrite { slot, .. }
            | Op::Scale { slot, .. }
            | Op::DeviceOverwrite { slot, .. }
            | Op::UserTwice { slot }
            | Op::DropContents { slot }
            | Op::Offload { slot, .. }
            | Op::MoveOut { slot, .. }
            | Op::ReplicaScale { slot, .. } => guarded(slot),
            Op::Axpy { x, y, .. } => guarded(y) || x == y,
            _ => false,
        };
        if skip {
            continue;
        }
        if let Some(slot) = dropped::reads_dropped(*op, &slots) {
            // A read of dropped contents fails, whatever the access.
            dropped::reads_fail(&slots[slot].as_ref().unwrap().mem, &at)?;
            continue;
        }
        if w.scratch.applies(*op, &at)? || w.dev_scratch.applies(w, *op, &at)? {
            continue;
        }
        if leave_or_drop(w, &mut slots, *op, &pinned, &at)? {
            continue;
        }
        let before = w.allocations();
        step_one(w, &mut slots, &mut held, &mut pins, *op, &at)?;
        if !matches!(op, Op::OpenScope | Op::CloseScope { .. }) {
            w.routed(&at, &before)?;
        }
        w.scratch.check(&at)?;
        // What a device guard holds keeps its device mirror, whatever the pool spilled; what a
        // host guard holds keeps its bytes.
        for h in &held {
            let l = slots[h.slot()].as_ref().unwrap();
            match h {
                Held::Device(..) => prop_assert!(
                    l.mem.device_allocated(),
                    "{at}: a guarded device mirror was spilled"
                ),
                Held::Host(_, g) => same(
                    &format!("{at}: held host view"),
                    g.as_slice_of::<f32>().unwrap(),
                    &l.model,
                )?,
            }
        }
    }
    held.clear();
    w.scratch.clear("the end")?;
    w.dev_scratch.clear(w, "the end")?;
    w.close_scopes();
    w.dev.fail_allocation(0);
    w.other.fail_allocation(0);
    finally(w, &slots, &pins)?;
    pins.clear();
    Ok(())
}

/// Applies `op` when it drops a slot's contents or takes it off the device (`DropContents`,
/// `Offload`, `MoveOut`); returns whether it was one of them.
fn leave_or_drop(
    w: &World<'_>,
    slots: &mut [Option<Live>],
    op: Op,
    pinned: &dyn Fn(usize) -> bool,
    at: &str,
) -> Result<bool, TestCaseError> {
    match op {
        Op::DropContents { slot } => {
            if let Some(l) = &mut slots[slot] {
                dropped::drop_step(l, pinned(slot), at)?;
            }
        }
        Op::MoveOut {
            slot,
            stream,
            micros,
            back,
        } => {
            if let Some(l) = &slots[slot] {
                hold::move_out(w, l, (stream, micros, back), pinned(slot), at)?;
            }
        }
        Op::Offload { slot, ordered } => {
            if let Some(l) = &slots[slot] {
                dropped::offload_step(l, pinned(slot), ordered, at)?;
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Every block the device pool hands out with an owner's name is a live buffer's, one block
/// per buffer: a block a thread's cache handed from one owner to another (or from a scratch
/// block to a buffer, and back) carries the name of its owner of the moment.
fn named_blocks_are_live_buffers(
    w: &World<'_>,
    slots: &[Option<Live>],
) -> Result<(), TestCaseError> {
    let labels: std::collections::HashSet<String> = slots
        .iter()
        .flatten()
        .map(|l| l.mem.label().to_string())
        .collect();
    let mut seen = std::collections::HashSet::new();
    let snaps = w.dev.pool_snapshots();
    let device_pool = snaps.iter().filter(|s| !s.label.ends_with(" pinned"));
    for (_, b) in device_pool
        .flat_map(|s| s.blocks())
        .filter(|(_, b)| b.state == syncmem::alloc::pool::BlockState::Allocated)
    {
        if let Some(owner) = &b.owner {
            prop_assert!(
                labels.contains(owner),
                "a device block is named {owner}, no live buffer's name"
            );
            prop_assert!(
                seen.insert(owner.clone()),
                "two device blocks named {owner}"
            );
        }
    }
    Ok(())
}

/// At the end of a program: pinned views did not move, every buffer holds the model's data on
/// its device and on the host (or, dropped, refuses both reads), and the device pool names
/// live buffers' blocks only.
fn finally(w: &World<'_>, slots: &[Option<Live>], pins: &[Kept]) -> Result<(), TestCaseError> {
    named_blocks_are_live_buffers(w, slots)?;
    for p in pins {
        let l = slots[p.slot].as_ref().unwrap();
        if l.dropped {
            continue;
        }
        let h = l.mem.host().unwrap();
        prop_assert_eq!(
            h.as_ptr() as usize,
            p.at,
            "slot {}: a pinned view moved",
            p.slot
        );
    }
    for (slot, l) in slots.iter().enumerate() {
        if let Some(l) = l.as_ref().filter(|l| l.dropped) {
            dropped::reads_fail(&l.mem, &format!("final reads of slot {slot}"))?;
        } else if let Some(l) = l {
            let what = format!("final device read of slot {slot}");
            same(&what, &w.device_values(&what, l)?, &l.model)?;
            let h = l.mem.host().unwrap();
            same(
                &format!("final host read of slot {slot}"),
                h.as_slice_of::<f32>().unwrap(),
                &l.model,
            )?;
        }
    }
    Ok(())
}

/// An isolated handle of `base` with the cap and the zero-copy setting.
fn capped(base: &Device, zero_copy: ZeroCopy) -> Device {
    own(&base.isolated(), zero_copy)
}

/// `base` itself (for the registry's device, the handle the process keeps: its buffers point
/// at it and take no reference count) with the cap and the zero-copy setting: the pass with
/// zero-copy off runs on the registry's handle.
fn own(base: &Device, zero_copy: ZeroCopy) -> Device {
    base.set_zero_copy(zero_copy);
    base.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(CAP)))
        .unwrap();
    base.clone()
}

fn cases() -> u32 {
    std::env::var("SYNCMEM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Prints what a pass under `zero_copy` did; returns its device pool's statistics.
fn report(w: &World<'_>, zero_copy: ZeroCopy) -> syncmem::PoolStats {
    let s = w.dev.pool_stats().unwrap();
    eprintln!(
        "{} zero-copy {zero_copy}: {} failed operations ({} injected), {} spills, {} \
         refills, {} evictions, {} allocations in MemPool scopes, {} scratch blocks from the \
         thread's cache, {} device blocks from the thread's cache",
        w.dev.label(),
        w.failed.get(),
        w.dev.injected_failures() + w.other.injected_failures(),
        s.spills,
        s.refills,
        s.evictions,
        w.scoped.get(),
        w.scratch.thread_cache_hits(),
        s.thread_cache_hits
    );
    assert!(
        w.scratch.thread_cache_hits() > 0,
        "no scratch block came from the thread's cache"
    );
    s
}

/// Runs the model on `home` (with replicas on `other`) under every zero-copy setting.
/// Held by each backend's run: one at a time, so that a run's pause of the process's history
/// (`HistoryPause`) never lands between another run's failure and its observer.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check(home: &Device, other: &Device) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut failed = 0;
    let mut injected = 0;
    let mut spills = 0;
    let mut scoped = 0;
    let mut device_cached = 0;
    observed::observe();
    let observed_before = observed::runs();
    for zero_copy in [ZeroCopy::Auto, ZeroCopy::Off, ZeroCopy::Map] {
        let dev = if matches!(zero_copy, ZeroCopy::Off) {
            own(home, zero_copy)
        } else {
            capped(home, zero_copy)
        };
        let other = capped(other, zero_copy);
        let streams = [
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
        ];
        let w = World {
            dev: &dev,
            other: &other,
            streams: &streams,
            twice: user_twice(),
            failed: std::cell::Cell::new(0),
            scopes: Default::default(),
            closed: Default::default(),
            scoped: std::cell::Cell::new(0),
            scratch: Default::default(),
            dev_scratch: Default::default(),
        };
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&prop::collection::vec(op(), 1..80), |ops| {
            dev.fail_allocation(0);
            other.fail_allocation(0);
            let r = run(&w, &ops);
            w.close_scopes();
            r
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, ops)) => {
                panic!(
                    "{} zero-copy {zero_copy}: {why}\nminimal case: {ops:#?}",
                    dev.label()
                )
            }
            Err(e) => panic!("{} zero-copy {zero_copy}: {e}", dev.label()),
        }
        let s = report(&w, zero_copy);
        scoped += w.scoped.get();
        failed += w.failed.get();
        injected += dev.injected_failures() + other.injected_failures();
        spills += s.spills;
        device_cached += s.thread_cache_hits;
    }
    assert!(
        device_cached > 0,
        "no device scratch block came from the thread's cache"
    );
    assert!(injected > 0, "no allocation failure was injected");
    assert!(
        observed::runs() > observed_before,
        "no out-of-memory observer ran"
    );
    assert!(scoped > 0, "no allocation was made in a MemPool scope");
    assert!(failed > 0, "no operation failed");
    assert!(spills > 0, "no dirty mirror was ever spilled");
    let dropped = dropped::DROPPED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{} contents dropped", dropped);
    assert!(dropped > 0, "no buffer's contents were dropped");
    offloaded_and_parked(home);
}

/// Buffers were offloaded, and spilled in place where `home` shares memory in place.
fn offloaded_and_parked(home: &Device) {
    let offloaded = dropped::OFFLOADED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{} buffers offloaded", offloaded);
    assert!(offloaded > 0, "no buffer was offloaded");
    let parked = dropped::PARKED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{} buffers spilled in place", parked);
    let under_copy = dropped::UNDER_COPY.load(std::sync::atomic::Ordering::Relaxed);
    let under_write = dropped::UNDER_WRITE.load(std::sync::atomic::Ordering::Relaxed);
    let held = hold::HELD.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{held} streams held, {under_copy} device mirrors freed under their copy out, \
         {under_write} blocks parked under their writer"
    );
    let opencl = home.backend() == syncmem::BackendKind::OpenCl;
    if opencl {
        assert!(
            under_copy > 0,
            "no device mirror was freed under its copy out"
        );
    }
    let auto = capped(home, ZeroCopy::Auto);
    if auto.zero_copy_protocol() == Some(syncmem::ZeroCopyProtocol::InPlace) {
        assert!(parked > 0, "no buffer was spilled in place");
        if opencl {
            assert!(under_write > 0, "no block was parked under its writer");
        }
    }
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_cpu() {
    let cpu = Device::cpu();
    check(&cpu, &cpu.isolated());
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_opencl() {
    if let Some((a, b)) = syncmem::testing::two_or_skip(
        syncmem::BackendKind::OpenCl,
        "random_programs_over_every_feature_keep_the_host_model_on_opencl",
    ) {
        check(&a, &b);
    }
}

#[test]
fn random_programs_over_every_feature_keep_the_host_model_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip(
        "random_programs_over_every_feature_keep_the_host_model_on_cuda",
    ) {
        // A second CUDA device where there is one; else replicas on a second handle of it.
        let other = Device::all(syncmem::BackendKind::Cuda)
            .ok()
            .and_then(|all| all.get(1).cloned())
            .unwrap_or_else(|| dev.isolated());
        check(&dev, &other);
    }
}
