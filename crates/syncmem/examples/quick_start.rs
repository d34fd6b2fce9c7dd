//! Quick start: one buffer mirrored on the host and a device, through Caffe's nine-step
//! `SyncedMemory` sequence, with the copies each step makes printed and checked.
//!
//! ```sh
//! cargo run -p syncmem --example quick_start             # first accelerator, else cpu
//! cargo run -p syncmem --example quick_start -- cpu      # or opencl:0, cuda:0
//! ```
//!
//! A `SyncedMemory` allocates each side when it is first used and copies only when the side
//! asked for is stale. Its head says which side is current. Caffe's accessors are
//! `host()` (`cpu_data`), `host_mut()` (`mutable_cpu_data`), `device()` (`gpu_data`) and
//! `device_mut()` (`mutable_gpu_data`); each returns a guard that borrows the buffer.
//!
//! The table is walked twice: with two mirrors (zero-copy off, as on a discrete GPU), then,
//! where the device's memory is host memory, on one shared allocation that copies nothing.

use syncmem::{Device, Head, SyncedMemory, ZeroCopy};

/// The device named by the first argument (`cpu`, `opencl:0`, `cuda:0`), else the first
/// accelerator (an OpenCL device, else a CUDA one), else the cpu (host memory standing in for
/// device memory).
fn pick_device() -> syncmem::Result<Device> {
    match std::env::args().nth(1) {
        Some(spec) => Device::open(&spec),
        None => Ok(Device::first_accelerator().unwrap_or_else(Device::cpu)),
    }
}

const BYTES: usize = 1 << 20;

/// The four accessors: `host()`, `host_mut()`, `device()`, `device_mut()`.
#[derive(Clone, Copy)]
enum Call {
    HostRead,
    HostWrite,
    DeviceRead,
    DeviceWrite,
}

impl Call {
    /// Caffe's name of the accessor.
    fn caffe_name(self) -> &'static str {
        match self {
            Call::HostRead => "cpu_data",
            Call::HostWrite => "mutable_cpu_data",
            Call::DeviceRead => "gpu_data",
            Call::DeviceWrite => "mutable_gpu_data",
        }
    }
}

/// Caffe's table: the call of each step, the copy it makes (host to device, device to host)
/// and the head after it.
const STEPS: [(Call, (u64, u64), Head); 9] = [
    (Call::DeviceRead, (1, 0), Head::Synced),
    (Call::HostRead, (0, 0), Head::Synced),
    (Call::DeviceWrite, (0, 0), Head::AtDevice),
    (Call::DeviceWrite, (0, 0), Head::AtDevice),
    (Call::HostRead, (0, 1), Head::Synced),
    (Call::DeviceRead, (0, 0), Head::Synced),
    (Call::HostWrite, (0, 0), Head::AtHost),
    (Call::DeviceWrite, (1, 0), Head::AtDevice),
    (Call::HostWrite, (0, 1), Head::AtHost),
];

fn main() -> syncmem::Result<()> {
    let dev = pick_device()?;
    let info = dev.info();
    println!("device {dev}: {} ({})", info.name, info.vendor);

    // Caffe's table as a discrete GPU runs it: two mirrors, copies between them. Where the
    // device's memory is host memory (the cpu, PoCL, integrated GPUs) syncmem shares one
    // allocation between the sides by default; zero-copy off keeps two mirrors there too.
    let setting = dev.zero_copy();
    dev.set_zero_copy(ZeroCopy::Off);
    let two_mirrors = walk(&dev);
    dev.set_zero_copy(setting);
    let (up, down, bytes) = two_mirrors?;
    println!("two mirrors: {up} copies host->device, {down} device->host, {bytes} bytes moved");
    assert_eq!((up, down), (2, 2));

    // The same nine steps with the device's own setting: where it shares memory, no step
    // copies anything and every side still reads the last value written.
    if let Some(protocol) = dev.zero_copy_protocol() {
        println!("\nzero-copy ({protocol:?}): the same steps on one shared allocation");
        let (up, down, bytes) = walk(&dev)?;
        println!("zero-copy: {up} copies host->device, {down} device->host, {bytes} bytes moved");
        assert_eq!((up, down, bytes), (0, 0, 0));
    }
    Ok(())
}

/// Caffe's nine steps on a new buffer, each step's copies and head printed and checked
/// against Caffe's table (no copy at all when the buffer is zero-copy; the heads are the same).
/// Returns the copies up, the copies down and the bytes moved.
fn walk(dev: &Device) -> syncmem::Result<(u64, u64, u64)> {
    let zero_copy = dev.zero_copy_protocol().is_some();
    // Nothing is allocated yet.
    let buf = SyncedMemory::new(BYTES, dev).with_label("quick start");
    assert_eq!(buf.head(), Head::Uninitialized);

    // Step 0: write on the host (allocates the host mirror; zeros until written).
    buf.host_mut()?.fill(1);
    println!(
        "step 0  mutable_cpu_data  head {:<8}  (filled with 1)",
        buf.head().as_str()
    );

    // The value every byte holds: whichever side wrote last, the other side sees it.
    let mut expected = 1;
    for (i, (call, (up, down), head)) in STEPS.into_iter().enumerate() {
        let before = buf.copy_stats();
        match call {
            // Each guard is dropped at the end of its arm: a guard holds the buffer's lock.
            Call::HostRead => assert!(buf.host()?.iter().all(|&b| b == expected)),
            Call::HostWrite => {
                let mut host = buf.host_mut()?;
                assert!(host.iter().all(|&b| b == expected));
                expected = 2;
                host.fill(expected);
            }
            Call::DeviceRead => drop(buf.device()?),
            // Device work, here a fill on the buffer's stream.
            Call::DeviceWrite => {
                expected = 10 + i as u8;
                buf.device_mut()?.fill(expected)?;
            }
        }
        let copies = buf.copy_stats().since(&before);
        let (h2d, d2h) = (copies.host_to_device.count, copies.device_to_host.count);
        println!(
            "step {}  {:<16}  head {:<8}  copies host->device {h2d}, device->host {d2h}",
            i + 1,
            call.caffe_name(),
            buf.head().as_str()
        );
        if zero_copy {
            assert_eq!((h2d, d2h), (0, 0), "copies of step {}", i + 1);
        } else {
            assert_eq!((h2d, d2h), (up, down), "copies of step {}", i + 1);
        }
        // The head follows Caffe's table either way: it says which side wrote last.
        assert_eq!(buf.head(), head, "head after step {}", i + 1);
    }
    // The last write (step 9, on the host) is what both sides read.
    assert!(buf.host()?.iter().all(|&b| b == expected));

    let total = buf.copy_stats();
    Ok((
        total.host_to_device.count,
        total.device_to_host.count,
        total.host_to_device.bytes + total.device_to_host.bytes,
    ))
}
