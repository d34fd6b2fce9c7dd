//! Prefetch on a second stream: while the device works on one batch, the next batch is copied
//! up, and finished results are copied back, on a copy stream of their own (Caffe's
//! `async_gpu_push`, plus the way back).
//!
//! ```sh
//! cargo run -p syncmem --example prefetch             # first accelerator, else cpu
//! cargo run -p syncmem --example prefetch -- cpu      # or opencl:0, cuda:0
//! ```
//!
//! `prefetch_to_device` queues the copy and returns at once; the buffer remembers the copy in
//! flight. An access that conflicts with it (a device access, a host write) first waits for
//! it, a host read does not; no access copies the data a second time.
//!
//! Where the device's memory is host memory (the cpu, PoCL) buffers share one allocation by
//! default and there is nothing to prefetch; this example turns zero-copy off to show the
//! copies a discrete GPU makes.

use syncmem::synced::PendingKind;
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

const BATCHES: usize = 4;
const BYTES: usize = 8 << 20;

fn main() -> syncmem::Result<()> {
    let dev = pick_device()?;
    println!("device {dev}: {}", dev.info().name);
    // Two mirrors even where the device could share host memory: there is data to copy.
    dev.set_zero_copy(ZeroCopy::Off);
    // The buffers work on the device's default stream; copies go on a second one.
    let copy_stream = dev.new_stream()?;

    // Batches loaded on the host (a data loader would fill them).
    let mut batches = Vec::new();
    for k in 0..BATCHES {
        let b = SyncedMemory::new(BYTES, &dev).with_label(format!("batch {k}"));
        b.host_mut()?.fill(k as u8);
        batches.push(b);
    }

    // Start the first upload before the loop.
    batches[0].prefetch_to_device(Some(&copy_stream))?;
    for k in 0..BATCHES {
        let batch = &batches[k];
        // Queue the next upload first, so that it overlaps this batch's work.
        if let Some(next) = batches.get(k + 1) {
            let event = next.prefetch_to_device(Some(&copy_stream))?;
            assert!(event.is_some(), "the host was newer: a copy was queued");
            // The head already reads synced; the copy may still be in flight.
            assert_eq!(next.head(), Head::Synced);
            // A host read does not conflict with an upload: it does not wait for it.
            assert_eq!(next.host()?[0], (k + 1) as u8);
        }

        // Device work on this batch: waits for its upload if still in flight, copies nothing.
        let before = batch.copy_stats();
        let in_flight = batch.pending()? == Some(PendingKind::ToDevice);
        batch.device_mut()?.fill(100 + k as u8)?;
        let copies = batch.copy_stats().since(&before);
        assert_eq!(
            copies.total_count(),
            0,
            "the prefetched data was used as it is"
        );
        println!(
            "batch {k}: upload {} when the device work started; the work made no copy",
            if in_flight {
                "still in flight"
            } else {
                "already done"
            }
        );

        // Results back to the host on the copy stream; nothing waits for them here.
        batch.prefetch_to_host(Some(&copy_stream))?;
    }

    // Host reads wait for the copies back (if still in flight) and copy nothing more.
    for (k, batch) in batches.iter().enumerate() {
        assert!(batch.host()?.iter().all(|&b| b == 100 + k as u8));
        let c = batch.copy_stats();
        println!(
            "batch {k}: {} copy host->device, {} device->host ({} bytes each way), head {}",
            c.host_to_device.count,
            c.device_to_host.count,
            BYTES,
            batch.head().as_str()
        );
        assert_eq!((c.host_to_device.count, c.device_to_host.count), (1, 1));
        assert_eq!(batch.head(), Head::Synced);
    }
    Ok(())
}
