//! The order of [`crate::run`]: every group of rows in turn, each step reported through the
//! progress callback, a group that fails on the device skipped with a note.

use syncmem::{Device, Result};

use crate::rows::Runs;
use crate::{
    compute, floor, heap, history, multi, replay, rows, threads, train_memory, user, zero_copy,
    BenchOptions, BenchReport, Row, BASELINES, DEVICE_RAW_GOAL, DEVICE_VIEW_NOTE, HOST_SMALL_GOAL,
    KIB, MIB, ROUND_TRIP_GOAL, STEPS,
};

/// Reports the steps of [`crate::run`].
struct Progress<'a> {
    step: usize,
    progress: &'a mut dyn FnMut(usize, &str),
}

impl Progress<'_> {
    fn next(&mut self) {
        (self.progress)(self.step, STEPS[self.step]);
        self.step += 1;
    }

    /// Reports the steps left before `end` (those of a group that did not run to its end).
    fn skip_to(&mut self, end: usize) {
        while self.step < end {
            self.next();
        }
    }
}

/// Samples and batch sizes of the rows, by how long one call takes.
#[derive(Clone, Copy)]
struct Sizes {
    samples: usize,
    few: usize,
    /// Calls of a few hundred nanoseconds.
    small: Runs,
    /// Calls of microseconds to milliseconds.
    medium: Runs,
    /// Calls of tens of milliseconds.
    large: Runs,
    /// Calls per thread of a sample of the rows with threads.
    threaded: Runs,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        let samples = if quick { 5 } else { 21 };
        let few = if quick { 3 } else { 7 };
        Sizes {
            samples,
            few,
            small: Runs {
                samples,
                batch: if quick { 200 } else { 1000 },
            },
            medium: Runs { samples, batch: 10 },
            large: Runs {
                samples: few,
                batch: 1,
            },
            // A million calls a thread per sample: the rows read the pools' steady speed.
            // With 100,000 (about 5 ms a sample), the start of the threads (their first
            // calls, one scheduled later than the other) weighed on both sides, and the rows
            // from two threads spread from 0.48 to 1.14 in one run.
            threaded: Runs {
                samples,
                batch: if quick { 20_000 } else { 1_000_000 },
            },
        }
    }
}

/// The run so far: the rows measured and the notes on those skipped.
struct Bench<'a> {
    opts: &'a BenchOptions,
    sizes: Sizes,
    p: Progress<'a>,
    /// The bench device, or why it could not be opened (opened after the host rows).
    dev: Result<Device>,
    rows: Vec<Row>,
    skipped: Vec<String>,
}

/// Runs every group of rows; see [`crate::run`].
pub(crate) fn run(
    opts: &BenchOptions,
    progress: &mut dyn FnMut(usize, &str),
) -> Result<BenchReport> {
    // A string that names no device is the caller's mistake; a device that is absent (or whose
    // backend is missing) skips its rows with a note.
    let spec: syncmem::DeviceSpec = opts.device.parse()?;
    let machine = crate::load::Machine::now();
    let sizes = Sizes::new(opts.quick);
    let mut p = Progress { step: 0, progress };
    let mut rows = Vec::new();
    host_rows(&mut p, &mut rows, sizes)?;
    let mut b = Bench {
        opts,
        sizes,
        p,
        dev: Device::open_spec(spec),
        rows,
        skipped: Vec::new(),
    };
    b.device_rows(spec);
    b.host_read_row()?;
    b.zero_copy_rows();
    b.user_kernel_rows();
    let train_memory = b.train_memory_rows();
    let multi_device = b.two_device_rows();
    b.floor_rows();
    let mut replay = Vec::new();
    for (name, text) in replay::TRACES {
        b.p.next();
        replay.extend(replay::replay_rows(name, text)?);
    }
    let notes = b.notes(&machine);
    b.p.next();
    let heap = b.heap_rows();
    let mut step = b.p.step;
    let progress = &mut b.p.progress;
    let compute = compute::run(b.dev.as_ref().ok(), &opts.device, opts.quick, &mut |name| {
        progress(step, name);
        step += 1;
    })?;
    Ok(BenchReport {
        device: opts.device.clone(),
        quick: opts.quick,
        cpus: machine.cpus,
        load_start: machine.start,
        load_end: crate::LoadAverage::read().ok(),
        rows: b.rows,
        replay,
        notes,
        skipped: b.skipped,
        train_memory,
        multi_device,
        compute,
        heap,
    })
}

/// The host pool against the system allocator, alone and from threads.
fn host_rows(p: &mut Progress, rows: &mut Vec<Row>, sizes: Sizes) -> Result<()> {
    let Sizes {
        small,
        medium,
        large,
        threaded,
        ..
    } = sizes;
    let host = [
        ("host pool 4 KiB vs malloc", 4 * KIB, 16, false, small),
        ("host pool 1 MiB", MIB, 64, false, medium),
        ("host pool 64 MiB", 64 * MIB, 64, false, medium),
        ("host pool 64 MiB touched", 64 * MIB, 64, true, large),
    ];
    p.next();
    rows.push(
        rows::host_pool_row("host pool 4 KiB", 4 * KIB, 64, false, small)?
            .with_goal(HOST_SMALL_GOAL),
    );
    for (name, bytes, align, touch, runs) in host {
        p.next();
        rows.push(rows::host_pool_row(name, bytes, align, touch, runs)?);
    }
    p.next();
    rows.extend(threads::host_pool_rows(threaded)?);
    Ok(())
}

impl Bench<'_> {
    /// The bench device's pool against the raw backend call and `Device::alloc`, round trips,
    /// its pool from threads, and with the history on: 8 steps, whether they run or not.
    fn device_rows(&mut self, spec: syncmem::DeviceSpec) {
        let after_device = self.p.step + 8;
        match &self.dev {
            Ok(d) => {
                let d = d.clone();
                if let Err(e) = self.try_device_rows(&d) {
                    self.skipped
                        .push(format!("device rows on {}: {e}", self.opts.device));
                }
            }
            Err(e) => self.skipped.push(format!(
                "device pool, round trip and user kernel rows ({spec}): {e}"
            )),
        }
        self.p.skip_to(after_device);
    }

    fn try_device_rows(&mut self, dev: &Device) -> Result<()> {
        let Sizes {
            medium,
            large,
            threaded,
            ..
        } = self.sizes;
        for bytes in [4 * KIB, 64 * MIB] {
            self.p.next();
            self.rows
                .push(rows::device_pool_row(dev, bytes, true, medium)?.with_goal(DEVICE_RAW_GOAL));
            self.p.next();
            self.rows
                .push(rows::device_pool_row(dev, bytes, false, medium)?);
        }
        for pinned in [false, true] {
            self.p.next();
            self.rows.push(
                rows::round_trip_row(dev, 64 * MIB, pinned, large)?.with_goal(ROUND_TRIP_GOAL),
            );
        }
        self.p.next();
        self.rows.extend(threads::device_pool_rows(dev, threaded)?);
        self.rows
            .extend(threads::device_pool_default_rows(dev, threaded)?);
        self.p.next();
        self.rows
            .extend(history::history_rows(dev, self.sizes.small)?);
        Ok(())
    }

    /// A host read through `SyncedMemory::host()` against indexing a slice.
    fn host_read_row(&mut self) -> Result<()> {
        self.p.next();
        self.rows.push(rows::host_read_row(Runs {
            samples: self.sizes.samples,
            batch: if self.opts.quick { 10_000 } else { 100_000 },
        })?);
        Ok(())
    }

    /// Zero-copy cycles on the bench device: 3 steps, whether they run or not.
    fn zero_copy_rows(&mut self) {
        let zero_copy_end = self.p.step + 3;
        if let Ok(d) = &self.dev {
            let d = d.clone();
            if let Err(e) = self.try_zero_copy_rows(&d) {
                self.skipped
                    .push(format!("zero-copy rows on {}: {e}", self.opts.device));
            }
        }
        self.p.skip_to(zero_copy_end);
    }

    fn try_zero_copy_rows(&mut self, d: &Device) -> Result<()> {
        let Sizes { small, large, .. } = self.sizes;
        self.p.next();
        self.rows
            .extend(zero_copy::vs_copies_row(d, 64 * MIB, large)?);
        self.p.next();
        self.rows
            .extend(zero_copy::vs_raw_map_row(d, 64 * MIB, large)?);
        self.p.next();
        self.rows.push(zero_copy::live_buffers_row(d, small)?);
        Ok(())
    }

    /// A user's kernel launched against the raw launch, and the `LeakyRelu` epoch against the
    /// built-in `Relu` net. Without the device, the note of the device rows covers these.
    fn user_kernel_rows(&mut self) {
        let device = &self.opts.device;
        self.p.next();
        if let Ok(d) = &self.dev {
            match user::launch_row(d, self.sizes.small) {
                Ok(r) => self.rows.push(r),
                Err(e) => self
                    .skipped
                    .push(format!("user kernel launch row on {device}: {e}")),
            }
        }
        self.p.next();
        if let Ok(d) = &self.dev {
            match user::epoch_rows(d, self.opts.quick) {
                Ok(r) => self.rows.extend(r),
                Err(e) => self
                    .skipped
                    .push(format!("LeakyRelu epoch rows on {device}: {e}")),
            }
        }
    }

    /// The bench device and, where it is another, `cpu`: the train rows run on both.
    fn train_devices(&self) -> Vec<Device> {
        let mut devices = vec![Device::cpu()];
        if let Ok(d) = &self.dev {
            if d.backend() != syncmem::BackendKind::Cpu {
                devices.insert(0, d.clone());
            }
        }
        devices
    }

    /// `train` with zero-copy against two mirrors, and capped against uncapped, on each train
    /// device; returns the bytes each run moved.
    fn train_memory_rows(&mut self) -> Vec<train_memory::TrainMemoryRow> {
        let devices = self.train_devices();
        let quick = self.opts.quick;
        let mut table = Vec::new();
        self.p.next();
        for d in &devices {
            match train_memory::zero_copy_rows(d, quick) {
                Ok(Some((row, t))) => {
                    self.rows.push(row);
                    table.extend(t);
                }
                Ok(None) => self.skipped.push(format!(
                    "train zero-copy rows on {}: its memory is not host memory",
                    d.label()
                )),
                Err(e) => self
                    .skipped
                    .push(format!("train zero-copy rows on {}: {e}", d.label())),
            }
        }
        self.p.next();
        for d in &devices {
            for hidden in [64, 256] {
                match train_memory::memory_cap_rows(d, quick, hidden) {
                    Ok((row, t)) => {
                        self.rows.push(row);
                        table.extend(t);
                    }
                    Err(e) => self.skipped.push(format!(
                        "train memory cap rows on {} h{hidden}: {e}",
                        d.label()
                    )),
                }
            }
        }
        self.p.next();
        for d in &devices {
            match train_memory::offload_rows(d, quick) {
                Ok((row, t)) => {
                    self.rows.push(row);
                    table.extend(t);
                }
                Err(e) => self
                    .skipped
                    .push(format!("train offload rows on {}: {e}", d.label())),
            }
            match train_memory::activation_offload_rows(d, quick) {
                Ok((row, t)) => {
                    self.rows.push(row);
                    table.extend(t);
                }
                Err(e) => self.skipped.push(format!(
                    "train activation offload rows on {}: {e}",
                    d.label()
                )),
            }
        }
        table
    }

    /// Two devices, the bench device and the next one of its backend: a copy between them,
    /// and `train` data-parallel on both against one.
    fn two_device_rows(&mut self) -> Option<multi::MultiTrainRow> {
        let second = self.dev.as_ref().ok().and_then(multi::second_device);
        self.p.next();
        match (&self.dev, &second) {
            (Ok(a), Some(b)) => match multi::copy_row(a, b, 64 * MIB, self.sizes.large) {
                Ok(r) => self.rows.push(r),
                Err(e) => self.skipped.push(format!("device to device row: {e}")),
            },
            // There is one `cpu` device: nothing to say on it; an absent device has its note.
            (Ok(a), None) if a.backend() == syncmem::BackendKind::Cpu => {}
            (Err(_), _) => {}
            (Ok(_), None) => self.skipped.push(format!(
                "device to device and two-device train rows: no second device of {}'s backend \
                 (with PoCL, POCL_DEVICES=\"pthread pthread\" gives two)",
                self.opts.device
            )),
        }
        self.p.next();
        let (Ok(a), Some(b)) = (&self.dev, &second) else {
            return None;
        };
        match multi::train_row(&[a.clone(), b.clone()], self.opts.quick) {
            Ok(r) => Some(r),
            Err(e) => {
                self.skipped.push(format!("two-device train row: {e}"));
                None
            }
        }
    }

    /// A `train` step through the crate against its kernels replayed with raw calls.
    fn floor_rows(&mut self) {
        self.p.next();
        let Ok(d) = &self.dev else {
            return;
        };
        for h in [64, 1024] {
            let runs = Runs {
                samples: self.sizes.few,
                batch: if h >= 1024 { 2 } else { 20 },
            };
            match floor::step_row(d, h, runs) {
                Ok(r) => self.rows.extend(r),
                Err(e) => self.skipped.push(format!(
                    "train step vs raw row on {}: {e}",
                    self.opts.device
                )),
            }
        }
    }

    /// What the rows compare, why the device rows miss their goal when they do, and why the
    /// load is unknown when it is.
    fn notes(&self, machine: &crate::load::Machine) -> Vec<String> {
        let mut notes: Vec<String> = BASELINES.iter().map(|s| s.to_string()).collect();
        if let Some(why) = &machine.unknown {
            notes.push(format!("the machine's load is unknown: {why}"));
        }
        if let Some(l) = machine.start.filter(|l| l.one >= 0.5 * machine.cpus as f64) {
            notes.push(format!(
                "the machine was not idle at the start (load {:.2} over the last minute on {} \
                 CPUs): other work shares the cores, which flatters the slower side of each \
                 comparison; figures to publish need an idle machine",
                l.one, machine.cpus
            ));
        }
        // The pool's own rows (the history rows have a note of their own).
        let device_miss = self.rows.iter().any(|r| {
            r.name.starts_with("device pool")
                && !r.name.contains("history")
                && r.goal_met == Some(false)
        });
        if device_miss {
            notes.push(DEVICE_VIEW_NOTE.to_string());
        }
        notes
    }

    /// Heap allocations per steady `train` step on `cpu` and the bench device, where the
    /// caller counts them.
    fn heap_rows(&mut self) -> Vec<heap::HeapRow> {
        let Some(count) = self.opts.heap_allocations else {
            self.skipped.push(
                "heap allocation rows: no allocation counter (the syncmem binary counts them)"
                    .to_string(),
            );
            return Vec::new();
        };
        let mut devices = vec![Device::cpu()];
        if let Ok(d) = &self.dev {
            if d.backend() != syncmem::BackendKind::Cpu {
                devices.push(d.clone());
            }
        }
        let mut out = Vec::new();
        for d in devices {
            match heap::heap_row(&d, count) {
                Ok(r) => out.push(r),
                Err(e) => self.skipped.push(format!("heap row on {}: {e}", d.label())),
            }
        }
        out
    }
}
