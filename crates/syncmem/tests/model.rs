//! Model-based property test of `SyncedMemory`: random sequences of accesses on one buffer,
//! checked after every step against a small independent reference model of Caffe's
//! SyncedMemory (valid set, allocation flags, contents, copy counts), with two mirrors and, where
//! the device allows it, with zero-copy (one allocation for both sides; every sync counted as a
//! zero-copy sync instead of a copy).
//!
//! Runs on the `cpu` device (64 cases per mode) and on OpenCL (32 cases per mode).

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use syncmem::synced::DeviceWrite;
use syncmem::{Device, Error, Head, SyncedMemory};

// ----- the reference model ---------------------------------------------------------------------

/// What the buffer should be: which sides are current, which are allocated, the bytes, and how
/// many copies each direction made.
#[derive(Debug, Clone)]
struct Model {
    len: usize,
    host_valid: bool,
    dev_valid: bool,
    host_alloc: bool,
    dev_alloc: bool,
    data: Vec<u8>,
    h2d: u64,
    d2h: u64,
    /// Zero-copy syncs.
    mapped: u64,
    /// The buffer's first allocation will be shared by both sides (zero-copy).
    zero_copy: bool,
    /// Both sides are one allocation: syncs move no byte.
    shared: bool,
}

impl Model {
    fn new(len: usize) -> Self {
        Self::with_zero_copy(len, false)
    }

    fn with_zero_copy(len: usize, zero_copy: bool) -> Self {
        Self {
            len,
            host_valid: false,
            dev_valid: false,
            host_alloc: false,
            dev_alloc: false,
            // Zero fill on the first allocation, whichever side it is.
            data: vec![0; len],
            h2d: 0,
            d2h: 0,
            mapped: 0,
            // Empty buffers allocate nothing to share.
            zero_copy: zero_copy && len > 0,
            shared: false,
        }
    }

    /// A zero-copy buffer's first allocation, whichever side asks, is both sides'.
    fn first_allocation(&mut self) {
        if self.zero_copy && !self.host_alloc && !self.dev_alloc {
            self.shared = true;
            self.host_alloc = true;
            self.dev_alloc = true;
        }
    }

    fn head(&self) -> Head {
        match (self.host_valid, self.dev_valid) {
            (false, false) => Head::Uninitialized,
            (true, false) => Head::AtHost,
            (false, true) => Head::AtDevice,
            (true, true) => Head::Synced,
        }
    }

    /// Copies of 0 bytes are not counted; shared memory syncs instead of copying.
    fn copied_h2d(&mut self) {
        if self.shared {
            self.mapped += 1;
        } else if self.len > 0 {
            self.h2d += 1;
        }
    }

    fn copied_d2h(&mut self) {
        if self.shared {
            self.mapped += 1;
        } else if self.len > 0 {
            self.d2h += 1;
        }
    }

    /// `host()` / `host_mut()`.
    fn host_access(&mut self, write: bool) {
        self.first_allocation();
        self.host_alloc = true;
        if !self.host_valid {
            if self.dev_valid {
                self.copied_d2h();
            }
            self.host_valid = true;
        }
        if write {
            self.dev_valid = false;
        }
    }

    /// `device()` / `device_mut()`.
    fn device_access(&mut self, write: bool) {
        self.first_allocation();
        self.dev_alloc = true;
        if !self.dev_valid {
            if self.host_valid {
                self.copied_h2d();
            }
            self.dev_valid = true;
        }
        if write {
            self.host_valid = false;
        }
    }

    fn host_overwrite(&mut self, bytes: Vec<u8>) {
        self.first_allocation();
        self.host_alloc = true;
        self.host_valid = true;
        self.dev_valid = false;
        self.data = bytes;
    }

    fn device_overwrite(&mut self, bytes: Vec<u8>) {
        self.first_allocation();
        self.dev_alloc = true;
        self.dev_valid = true;
        self.host_valid = false;
        self.data = bytes;
    }

    /// `Err(())` for "uninitialized", else whether a copy was queued.
    fn prefetch_to_device(&mut self) -> Result<bool, ()> {
        if self.dev_valid {
            return Ok(false);
        }
        if !self.host_valid {
            return Err(());
        }
        self.dev_alloc = true;
        self.dev_valid = true;
        self.copied_h2d();
        Ok(true)
    }

    fn prefetch_to_host(&mut self) -> Result<bool, ()> {
        if self.host_valid {
            return Ok(false);
        }
        if !self.dev_valid {
            return Err(());
        }
        self.host_alloc = true;
        self.host_valid = true;
        self.copied_d2h();
        Ok(true)
    }

    fn set_host_data(&mut self, bytes: Vec<u8>) {
        // Adopted memory is never shared: the buffer keeps two mirrors from now on (the device
        // mirror keeps the shared memory as a mirror of its own).
        self.shared = false;
        self.zero_copy = false;
        self.host_alloc = true;
        self.host_valid = true;
        self.dev_valid = false;
        self.data = bytes;
    }
}

// ----- operations ------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// `host()`, contents checked.
    HostRead,
    /// `host_mut()`: checks the contents it sees, then writes a pattern over a sub-range.
    HostWrite {
        seed: u8,
        at: Index,
        n: Index,
    },
    /// `host_overwrite()`: writes every byte.
    HostOverwrite {
        seed: u8,
    },
    /// `device()` then `read_into`, contents checked.
    DeviceRead,
    /// `device_mut()`: checks the contents it sees, then `fill(value)`.
    DeviceFill {
        value: u8,
    },
    /// `device_mut()`: checks the contents it sees, then `write_from` over a sub-range.
    DeviceWriteFrom {
        seed: u8,
        at: Index,
        n: Index,
    },
    /// `device_overwrite()` then `write_from(0, ..)` of every byte.
    DeviceOverwrite {
        seed: u8,
    },
    PrefetchToDevice,
    PrefetchToHost,
    /// `set_host_data` with a fresh vector.
    SetHostData {
        seed: u8,
    },
}

#[derive(Debug, Clone)]
struct Step {
    op: Op,
    /// After the step, also read every side the model says is current (a read of a current
    /// side changes nothing) and compare.
    peek: bool,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::HostRead),
        2 => (any::<u8>(), any::<Index>(), any::<Index>())
            .prop_map(|(seed, at, n)| Op::HostWrite { seed, at, n }),
        1 => any::<u8>().prop_map(|seed| Op::HostOverwrite { seed }),
        2 => Just(Op::DeviceRead),
        1 => any::<u8>().prop_map(|value| Op::DeviceFill { value }),
        2 => (any::<u8>(), any::<Index>(), any::<Index>())
            .prop_map(|(seed, at, n)| Op::DeviceWriteFrom { seed, at, n }),
        1 => any::<u8>().prop_map(|seed| Op::DeviceOverwrite { seed }),
        2 => Just(Op::PrefetchToDevice),
        2 => Just(Op::PrefetchToHost),
        1 => any::<u8>().prop_map(|seed| Op::SetHostData { seed }),
    ]
}

fn case_strategy() -> impl Strategy<Value = (usize, Vec<Step>)> {
    let step = (op_strategy(), any::<bool>()).prop_map(|(op, peek)| Step { op, peek });
    // Size 0 and tiny sizes get their share (a uniform 0..=300 would almost never pick 0).
    let len = prop_oneof![1 => Just(0usize), 1 => 1usize..=16, 3 => 0usize..=300];
    (len, prop::collection::vec(step, 0..=40))
}

/// A byte pattern that differs per seed and per position.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(37)) ^ ((i >> 8) as u8))
        .collect()
}

/// A sub-range `start..start + count` of a buffer of `len` bytes (possibly empty).
fn sub_range(len: usize, at: &Index, n: &Index) -> std::ops::Range<usize> {
    if len == 0 {
        return 0..0;
    }
    let start = at.index(len);
    let count = n.index(len - start + 1);
    start..start + count
}

// ----- running a case --------------------------------------------------------------------------

fn ok<T>(r: syncmem::Result<T>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("{what}: unexpected error: {e}")))
}

/// Compares everything observable without changing the buffer's state.
fn check_state(m: &SyncedMemory, model: &Model, ctx: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(m.head(), model.head(), "{}: head", ctx);
    prop_assert_eq!(
        m.host_allocated(),
        model.host_alloc,
        "{}: host_allocated",
        ctx
    );
    prop_assert_eq!(
        m.device_allocated(),
        model.dev_alloc,
        "{}: device_allocated",
        ctx
    );
    let s = m.copy_stats();
    let len = model.len as u64;
    prop_assert_eq!(
        (s.host_to_device.count, s.host_to_device.bytes),
        (model.h2d, model.h2d * len),
        "{}: host-to-device copies",
        ctx
    );
    prop_assert_eq!(
        (s.device_to_host.count, s.device_to_host.bytes),
        (model.d2h, model.d2h * len),
        "{}: device-to-host copies",
        ctx
    );
    prop_assert_eq!(s.mapped.count, model.mapped, "{}: zero-copy syncs", ctx);
    prop_assert_eq!(
        s.device_to_device.count,
        0,
        "{}: device-to-device copies",
        ctx
    );
    Ok(())
}

fn read_device(m: &SyncedMemory, ctx: &str) -> Result<Vec<u8>, TestCaseError> {
    let g = ok(m.device(), ctx)?;
    let mut out = vec![0xA5; m.len()];
    ok(g.read_into(&mut out), ctx)?;
    Ok(out)
}

fn apply(m: &SyncedMemory, model: &mut Model, op: &Op, ctx: &str) -> Result<(), TestCaseError> {
    let len = model.len;
    match op {
        Op::HostRead => {
            let g = ok(m.host(), ctx)?;
            model.host_access(false);
            prop_assert_eq!(&g[..], &model.data[..], "{}: host contents", ctx);
        }
        Op::HostWrite { seed, at, n } => {
            let mut g = ok(m.host_mut(), ctx)?;
            model.host_access(true);
            prop_assert_eq!(
                &g[..],
                &model.data[..],
                "{}: contents seen by host_mut",
                ctx
            );
            let r = sub_range(len, at, n);
            let p = pattern(*seed, r.len());
            g[r.clone()].copy_from_slice(&p);
            model.data[r].copy_from_slice(&p);
        }
        Op::HostOverwrite { seed } => {
            let mut g = ok(m.host_overwrite(), ctx)?;
            let p = pattern(*seed, len);
            g.copy_from_slice(&p);
            model.host_overwrite(p);
        }
        Op::DeviceRead => {
            let out = read_device(m, ctx)?;
            model.device_access(false);
            prop_assert_eq!(&out[..], &model.data[..], "{}: device contents", ctx);
        }
        Op::DeviceFill { value } => {
            let mut g = device_mut_seen(m, model, ctx)?;
            ok(g.fill(*value), ctx)?;
            model.data.fill(*value);
        }
        Op::DeviceWriteFrom { seed, at, n } => {
            let mut g = device_mut_seen(m, model, ctx)?;
            let r = sub_range(len, at, n);
            let p = pattern(*seed, r.len());
            ok(g.write_from(r.start, &p), ctx)?;
            model.data[r].copy_from_slice(&p);
        }
        Op::DeviceOverwrite { seed } => {
            let mut g = ok(m.device_overwrite(), ctx)?;
            let p = pattern(*seed, len);
            ok(g.write_from(0, &p), ctx)?;
            model.device_overwrite(p);
        }
        Op::PrefetchToDevice => prefetch(m, model, true, ctx)?,
        Op::PrefetchToHost => prefetch(m, model, false, ctx)?,
        Op::SetHostData { seed } => {
            let p = pattern(*seed, len);
            ok(m.set_host_data(p.clone()), ctx)?;
            model.set_host_data(p);
        }
    }
    Ok(())
}

/// A device write guard, its contents checked against the model first (the access moved the
/// model's head as a device write does).
fn device_mut_seen<'m>(
    m: &'m SyncedMemory,
    model: &mut Model,
    ctx: &str,
) -> Result<DeviceWrite<'m>, TestCaseError> {
    let g = ok(m.device_mut(), ctx)?;
    model.device_access(true);
    let mut seen = vec![0xA5; model.len];
    ok(g.read_into(&mut seen), ctx)?;
    prop_assert_eq!(
        &seen[..],
        &model.data[..],
        "{}: contents seen by device_mut",
        ctx
    );
    Ok(g)
}

/// A prefetch to the device (or to the host): an event exactly when the model queues a copy,
/// and the model's error where it has one.
fn prefetch(
    m: &SyncedMemory,
    model: &mut Model,
    to_device: bool,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let (got, want) = if to_device {
        (m.prefetch_to_device(None), model.prefetch_to_device())
    } else {
        (m.prefetch_to_host(None), model.prefetch_to_host())
    };
    match (got, want) {
        (Ok(ev), Ok(copied)) => {
            prop_assert_eq!(
                ev.is_some(),
                copied,
                "{}: an event iff a copy was queued",
                ctx
            )
        }
        (Err(Error::InvalidState { .. }), Err(())) => {}
        (got, want) => {
            return Err(TestCaseError::fail(format!(
                "{ctx}: got {got:?}, model expects {}",
                match want {
                    Ok(true) => "Ok(Some(event))",
                    Ok(false) => "Ok(None)",
                    Err(()) => "Err(InvalidState)",
                }
            )))
        }
    }
    Ok(())
}

/// Reads every side the model says is current. Such reads copy nothing and change nothing.
fn peek(m: &SyncedMemory, model: &Model, ctx: &str) -> Result<(), TestCaseError> {
    if model.host_valid {
        let g = ok(m.host(), ctx)?;
        prop_assert_eq!(&g[..], &model.data[..], "{}: peeked host contents", ctx);
    }
    if model.dev_valid {
        let out = read_device(m, ctx)?;
        prop_assert_eq!(&out[..], &model.data[..], "{}: peeked device contents", ctx);
    }
    check_state(m, model, &format!("{ctx} (after peek)"))
}

fn run_case(
    dev: &Device,
    len: usize,
    steps: &[Step],
    zero_copy: bool,
) -> Result<(), TestCaseError> {
    let m = SyncedMemory::new(len, dev).with_zero_copy(zero_copy);
    let mut model = Model::with_zero_copy(len, zero_copy && dev.zero_copy_protocol().is_some());
    check_state(&m, &model, "fresh buffer")?;
    for (i, step) in steps.iter().enumerate() {
        let ctx = format!("step {i} ({:?}, len {len})", step.op);
        apply(&m, &mut model, &step.op, &ctx)?;
        check_state(&m, &model, &ctx)?;
        if step.peek {
            peek(&m, &model, &ctx)?;
        }
    }
    // At the end, both sides must hold the model's bytes (reads from any state).
    let ctx = format!("final host read (len {len})");
    {
        let g = ok(m.host(), &ctx)?;
        model.host_access(false);
        prop_assert_eq!(&g[..], &model.data[..], "{}", ctx);
    }
    check_state(&m, &model, &ctx)?;
    let ctx = format!("final device read (len {len})");
    let out = read_device(&m, &ctx)?;
    model.device_access(false);
    prop_assert_eq!(&out[..], &model.data[..], "{}", ctx);
    check_state(&m, &model, &ctx)?;
    ok(m.wait(), "final wait")?;
    prop_assert_eq!(ok(m.pending(), "pending")?, None);
    Ok(())
}

fn synced_memory_matches_model(dev: &Device) {
    let cases = if dev.backend() == syncmem::BackendKind::Cpu {
        64
    } else {
        32
    };
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    for zero_copy in [false, true] {
        let run = runner.run(&case_strategy(), |(len, steps)| {
            run_case(dev, len, &steps, zero_copy)
        });
        match run {
            Ok(()) => {}
            Err(TestError::Fail(why, (len, steps))) => panic!(
                "{} (zero-copy {zero_copy}): model mismatch: {why}\nminimal case: len {len}, \
                 steps:\n{steps:#?}",
                dev.label()
            ),
            Err(e) => panic!("{}: {e}", dev.label()),
        }
    }
}

/// The model itself, on a hand-checked sequence: guards against a model that agrees with a
/// wrong implementation by being equally wrong.
#[test]
fn model_follows_caffe_table() {
    let mut m = Model::new(10);
    assert_eq!(m.prefetch_to_device(), Err(()));
    m.host_access(true);
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::AtHost, 0, 0));
    m.device_access(false);
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::Synced, 1, 0));
    m.device_access(true);
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::AtDevice, 1, 0));
    m.host_access(false);
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::Synced, 1, 1));
    m.host_access(true);
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::AtHost, 1, 1));
    assert_eq!(m.prefetch_to_device(), Ok(true));
    assert_eq!(m.prefetch_to_device(), Ok(false));
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::Synced, 2, 1));
    m.device_overwrite(vec![1; 10]);
    assert_eq!(m.prefetch_to_host(), Ok(true));
    assert_eq!((m.head(), m.h2d, m.d2h), (Head::Synced, 2, 2));
    let mut z = Model::new(0);
    z.device_access(true);
    z.host_access(false);
    assert_eq!((z.head(), z.h2d, z.d2h), (Head::Synced, 0, 0));
    assert!(z.host_alloc && z.dev_alloc);
}

syncmem::for_each_device!(synced_memory_matches_model);
