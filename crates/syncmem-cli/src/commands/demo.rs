//! `syncmem demo`: Caffe's canonical SyncedMemory sequence, replayed on a real device.

use anyhow::{bail, ensure, Context as _};
use serde::Serialize;
use syncmem::alloc::stats::human_bytes;
use syncmem::{BackendKind, CopyStats, Device, DeviceSpec, Direction, SyncedMemory};

/// Default buffer size: 1 MiB.
const DEFAULT_BYTES: usize = 1 << 20;

/// Arguments of `syncmem demo`.
#[derive(clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// Device to run on: `cpu`, `opencl:N` or `cuda:N`. Default: the first OpenCL device, else
    /// the first CUDA device (`cpu` runs the same code path, host memory standing in for
    /// device memory).
    #[arg(long, value_name = "D", value_parser = crate::args::device)]
    pub device: Option<DeviceSpec>,

    /// Print one JSON array of the nine steps instead of the table (schema: see `--help`).
    #[arg(long)]
    pub json: bool,

    /// Size of the buffer: bytes, or with a binary unit (`4096`, `64KiB`, `1MiB`).
    #[arg(
        long,
        value_name = "SIZE",
        default_value_t = DEFAULT_BYTES,
        value_parser = crate::args::buffer_size,
        allow_negative_numbers = true
    )]
    pub bytes: usize,
}

const AFTER_HELP: &str = "\
The sequence (Caffe's SyncedMemory test): the host is filled first (step 0, mutable_cpu_data),
then steps 1-9 call gpu_data, cpu_data, mutable_gpu_data, mutable_gpu_data, cpu_data, gpu_data,
mutable_cpu_data, mutable_gpu_data, mutable_cpu_data. Each mutable_gpu_data writes on the device
(a fill), step 7 writes a new pattern on the host, and the host bytes seen at steps 5 and 9
must equal what the device wrote (and at step 2, the step-0 pattern), or the command fails.
The transfer of each step is read from the buffer's copy counters, not assumed. Where host and
device share memory (zero-copy, the default on the cpu device and on CPU OpenCL devices such as
PoCL; SYNCMEM_ZERO_COPY=off turns it off), the steps that copy with two mirrors show \"mapped\":
the stale side was made current without a copy.

Human output: a header naming the device and how its buffers share memory, a table of steps
0-9, the buffer's copies and zero-copy syncs, then the process's memory and copy statistics.

JSON output (--json): one array of exactly nine objects, steps 1-9 (step 0 is not included):
  {\"step\": integer 1-9,
   \"call\": \"gpu_data\" | \"cpu_data\" | \"mutable_gpu_data\" | \"mutable_cpu_data\",
   \"copy\": \"none\" | \"host_to_device\" | \"device_to_host\" | \"mapped\",
   \"bytes\": integer   bytes copied (or synced, for \"mapped\") by the step (0 for \"none\"),
   \"head\": \"uninitialized\" | \"host\" | \"device\" | \"synced\"   head after the step}";

/// Caffe's accessors (the variant names are Caffe's method names).
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    CpuData,
    MutableCpuData,
    GpuData,
    MutableGpuData,
}

impl Call {
    fn as_str(self) -> &'static str {
        match self {
            Call::CpuData => "cpu_data",
            Call::MutableCpuData => "mutable_cpu_data",
            Call::GpuData => "gpu_data",
            Call::MutableGpuData => "mutable_gpu_data",
        }
    }
}

/// Steps 1-9 of Caffe's table (step 0, the initial host fill, is done separately).
const SEQUENCE: [Call; 9] = [
    Call::GpuData,
    Call::CpuData,
    Call::MutableGpuData,
    Call::MutableGpuData,
    Call::CpuData,
    Call::GpuData,
    Call::MutableCpuData,
    Call::MutableGpuData,
    Call::MutableCpuData,
];

/// One row of the result.
#[derive(Serialize)]
struct Step {
    step: usize,
    call: &'static str,
    copy: String,
    bytes: u64,
    head: &'static str,
    /// What the demo did with the access (human output only).
    #[serde(skip)]
    action: String,
}

/// What the host should hold: a byte pattern that differs per step, so a stale or shifted copy
/// cannot pass for a fresh one.
fn host_pattern(step: usize, i: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(step * 17) % 251) as u8
}

/// The byte the device writes at `step`.
fn device_value(step: usize) -> u8 {
    0xD0 | step as u8
}

/// Names the copy made between two readings of the buffer's counters, and its bytes.
fn copy_between(before: &CopyStats, after: &CopyStats) -> (String, u64) {
    let delta = after.since(before);
    let mut names = Vec::new();
    let mut bytes = 0;
    for d in [
        Direction::HostToDevice,
        Direction::DeviceToHost,
        Direction::DeviceToDevice,
        Direction::Mapped,
    ] {
        let c = delta.get(d);
        if c.count > 0 {
            names.push(d.as_str());
            bytes += c.bytes;
        }
    }
    if names.is_empty() {
        ("none".to_string(), 0)
    } else {
        (names.join("+"), bytes)
    }
}

/// Checks that `bytes` equals `expected(i)` everywhere, naming the first difference.
fn check_bytes(bytes: &[u8], what: &str, expected: impl Fn(usize) -> u8) -> anyhow::Result<()> {
    if let Some((i, (&got, want))) = bytes
        .iter()
        .zip((0..bytes.len()).map(&expected))
        .enumerate()
        .find(|(_, (got, want))| **got != *want)
    {
        bail!(
            "data check failed: {what}: byte {i} of {} is {got:#04x}, expected {want:#04x}",
            bytes.len()
        );
    }
    Ok(())
}

/// The device of `--device`, or the default one.
fn pick_device(spec: Option<DeviceSpec>) -> anyhow::Result<Device> {
    if let Some(s) = spec {
        return Device::open_spec(s).with_context(|| format!("cannot open device {s}"));
    }
    let mut why = Vec::new();
    for backend in [BackendKind::OpenCl, BackendKind::Cuda] {
        match Device::all(backend) {
            Ok(list) => match list.into_iter().next() {
                Some(d) => return Ok(d),
                None => why.push(format!("{backend}: no devices found")),
            },
            Err(e) => why.push(e.to_string()),
        }
    }
    bail!(
        "no OpenCL or CUDA device found, only the CPU is present ({}). \
         Run `syncmem demo --device cpu` to run the same code path with host memory \
         standing in for device memory, or see `syncmem devices`.",
        why.join("; ")
    )
}

/// Runs one accessor of the sequence and returns what it did.
fn run_step(buf: &SyncedMemory, step: usize, call: Call) -> anyhow::Result<String> {
    let action = match call {
        Call::GpuData => {
            let _read = buf.device()?;
            "read on the device".to_string()
        }
        Call::MutableGpuData => {
            let mut w = buf.device_mut()?;
            let v = device_value(step);
            w.fill(v)?;
            format!("device write: fill {v:#04x}")
        }
        Call::CpuData => {
            let r = buf.host()?;
            match step {
                // After the two device writes (steps 3 and 4): the host must see step 4's.
                5 => {
                    let v = device_value(4);
                    check_bytes(&r, "cpu_data after the device writes", |_| v)?;
                    format!("host read: all {v:#04x}, as the device wrote")
                }
                // After the upload of step 1: the host still holds step 0's pattern.
                _ => {
                    check_bytes(&r, "cpu_data after the upload", |i| host_pattern(0, i))?;
                    "host read: step 0's pattern".to_string()
                }
            }
        }
        Call::MutableCpuData => {
            let mut w = buf.host_mut()?;
            match step {
                // The end: the host must see the device write of step 8.
                9 => {
                    let v = device_value(8);
                    check_bytes(&w, "mutable_cpu_data after the last device write", |_| v)?;
                    format!("host bytes checked: all {v:#04x}, as the device wrote")
                }
                _ => {
                    for (i, b) in w.iter_mut().enumerate() {
                        *b = host_pattern(step, i);
                    }
                    "host write: pattern".to_string()
                }
            }
        }
    };
    Ok(action)
}

/// Runs `syncmem demo`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.bytes > 0, "--bytes must be at least 1 byte");
    let device = pick_device(args.device)?;
    let buf = SyncedMemory::new(args.bytes, &device).with_label("demo");

    let mut steps = Vec::with_capacity(SEQUENCE.len() + 1);
    let calls = std::iter::once(Call::MutableCpuData).chain(SEQUENCE);
    for (step, call) in calls.enumerate() {
        let before = buf.copy_stats();
        let action = run_step(&buf, step, call)
            .with_context(|| format!("step {step} ({}) on {device}", call.as_str()))?;
        let (copy, bytes) = copy_between(&before, &buf.copy_stats());
        steps.push(Step {
            step,
            call: call.as_str(),
            copy,
            bytes,
            head: buf.head().as_str(),
            action,
        });
    }

    if args.json {
        return super::print_json(&steps[1..]);
    }

    let info = device.info();
    outln!(
        "syncmem demo on {device}: {} ({}), buffer of {} bytes ({})",
        info.name,
        info.vendor,
        args.bytes,
        human_bytes(args.bytes as u64)
    );
    let sharing = match buf.zero_copy_protocol() {
        Some(p) => format!("zero-copy ({p}): host and device share the buffer's memory"),
        None => "two mirrors: transfers are copies".to_string(),
    };
    outln!("Caffe's SyncedMemory sequence; step 0 puts the data at the host; {sharing}.");
    outln!();
    outln!(
        "{:>4}  {:<16}  {:<14}  {:>12}  {:<13}  what the demo did",
        "step",
        "call",
        "copy",
        "bytes",
        "head after"
    );
    for s in &steps {
        outln!(
            "{:>4}  {:<16}  {:<14}  {:>12}  {:<13}  {}",
            s.step,
            s.call,
            s.copy,
            s.bytes,
            s.head,
            s.action
        );
    }
    outln!();
    outln!("data check: the host saw every device write (steps 5 and 9): ok");
    let s = buf.copy_stats();
    outln!(
        "this buffer: {} copies ({}), {} zero-copy syncs ({})",
        s.total_count(),
        human_bytes(s.total_bytes()),
        s.mapped.count,
        human_bytes(s.mapped.bytes)
    );
    outln!();
    outln!("memory and copies in this process (buffer still alive):");
    out!("{}", syncmem::stats());
    Ok(())
}
