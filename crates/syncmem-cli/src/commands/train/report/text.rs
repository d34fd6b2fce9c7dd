//! The text form of the report of `syncmem train`.

use syncmem::alloc::stats::human_bytes;

use super::{Dir, Report};

fn fmt_dir(d: Dir) -> String {
    fmt_count(d, "copies")
}

/// `d` as "N <what> BYTES": copies for the copy directions, syncs for zero-copy syncs (no byte
/// is copied by those).
fn fmt_count(d: Dir, what: &str) -> String {
    format!("{:>6} {what} {:>11}", d.count, human_bytes(d.bytes))
}

impl Report {
    /// Prints the text form.
    pub(crate) fn print_human(&self) -> anyhow::Result<()> {
        self.print_results()?;
        self.print_blobs()?;
        self.print_transfers()?;
        self.print_waits_and_memory()?;
        self.print_planning()?;
        match &self.distributed {
            Some(d) => d.print(),
            None => Ok(()),
        }
    }

    /// The final loss and accuracy, on the training data and the held-out set.
    fn print_results(&self) -> anyhow::Result<()> {
        let r = self;
        let last = r.epochs.last().map_or(0.0, |e| e.seconds);
        let mean = r.epochs.iter().map(|e| e.seconds).sum::<f64>() / r.epochs.len().max(1) as f64;
        outln!(
            "\nfinal: accuracy {:.1}%, loss {:.4} over all {} samples; {:.2} s in total, \
         {mean:.3} s per epoch (last {last:.3} s)",
            r.final_.accuracy * 100.0,
            r.final_.loss,
            r.data.samples,
            r.seconds
        );
        if let Some(h) = &r.held_out {
            outln!(
                "held out: accuracy {:.1}%, loss {:.4} over the {} samples of the {}, never \
                 trained on",
                h.accuracy * 100.0,
                h.loss,
                h.samples,
                match h.fraction {
                    Some(f) => format!("validation split ({f} of the data)"),
                    None => format!("test data in {}", h.source),
                }
            );
        }
        Ok(())
    }

    /// Each blob: type, dims, bytes, capacity, head, and the copies of its buffer.
    fn print_blobs(&self) -> anyhow::Result<()> {
        let r = self;
        outln!("\nblobs ({}): where each lives", r.device);
        outln!(
            "  {:<18} {:<5} {:<10} {:>10} {:>10}  {:<7} {:>6} {:>6} {:>6}",
            "name",
            "type",
            "dims",
            "bytes",
            "capacity",
            "head",
            "h->d",
            "d->h",
            "mapped"
        );
        for b in &r.blobs {
            outln!(
                "  {:<18} {:<5} {:<10} {:>10} {:>10}  {:<7} {:>6} {:>6} {:>6}",
                b.name,
                b.dtype.unwrap_or("-"),
                format!("{:?}", b.dims),
                b.bytes,
                b.capacity,
                b.head,
                b.host_to_device.count,
                b.device_to_host.count,
                b.mapped.count
            );
        }
        if r.settings.offload_optimizer {
            outln!(
                "  (--offload optimizer: the optimizer's state lives on the host, on the update's \
                 own cpu device, not on {}; its head above is its place there)",
                r.device
            );
        }
        if r.settings.offload_parameters {
            outln!(
                "  (--offload parameters: the parameters leave {} after each step; their head \
                 above is where they are between steps)",
                r.device
            );
        }
        Ok(())
    }

    /// Copies by phase, between devices, and spills and refills under a cap.
    fn print_transfers(&self) -> anyhow::Result<()> {
        let r = self;
        let t = &r.transfers;
        outln!("\ntransfers ({} steps)", t.steps);
        for (what, c) in [
            ("setup", t.setup),
            ("training", t.training),
            ("per step", t.per_step),
            ("worst step", t.max_step),
            ("evaluation", t.eval),
            ("process, steps", t.process_training),
            ("process, all", t.process),
        ] {
            outln!(
                "  {what:<15} host->device {}   device->host {}   zero-copy syncs {}",
                fmt_dir(c.host_to_device),
                fmt_dir(c.device_to_host),
                fmt_count(c.mapped, "syncs")
            );
        }
        if !r.device_pairs.is_empty() {
            outln!("\nbetween devices, per step ({} devices)", r.devices.len());
            for p in &r.device_pairs {
                outln!(
                    "  {} -> {} {:<12} {:>6.2} copies {:>11}",
                    p.from,
                    p.to,
                    if p.direct { "(direct)" } else { "(via host)" },
                    p.count_per_step,
                    human_bytes(p.bytes_per_step.round() as u64)
                );
            }
        }
        for (what, moves) in [
            ("activations", &r.activations),
            ("parameters", &r.parameters),
        ] {
            let Some(a) = moves else { continue };
            outln!(
                "\n{what} offloaded ({} blob(s) planned): {:.2} values a step left the device \
                 ({} released), {} down and {} up a step; {} of {} copies to the device done \
                 before their reader",
                a.planned,
                a.offloads_per_step,
                human_bytes(a.released_bytes_per_step.round() as u64),
                human_bytes(a.down_bytes_per_step.round() as u64),
                human_bytes(a.up_bytes_per_step.round() as u64),
                a.refills - a.not_ready.min(a.refills),
                a.refills
            );
        }
        let m = &r.memory_cap;
        if let Some(cap) = m.cap {
            outln!(
                "\nmemory cap {}: {} spills ({}/step, {} per step) and {} refills ({}/step, {} \
                 per step) during the steps",
                human_bytes(cap),
                m.spills,
                format_args!("{:.2}", m.spills_per_step),
                human_bytes(m.spilled_bytes_per_step as u64),
                m.refills,
                format_args!("{:.2}", m.refills_per_step),
                human_bytes(m.refilled_bytes_per_step as u64)
            );
        }
        Ok(())
    }

    /// Host waits and heap allocations per step, memory per device, the pool's summary.
    fn print_waits_and_memory(&self) -> anyhow::Result<()> {
        let r = self;
        let (w, h) = (&r.waits, &r.heap_allocations);
        outln!(
            "\nhost waits on the device: {:.2} per step (worst step {}, {} in all)",
            w.per_step,
            w.max_step,
            w.total
        );
        outln!(
            "heap allocations: {:.2} per step after the first (worst {}; first step {})",
            h.per_step,
            h.max_step,
            h.first_step
        );

        outln!("\nmemory (peak since training started)");
        for m in &r.memory {
            outln!(
                "  {:<20} in use {:>11}   peak {:>11}",
                m.label,
                human_bytes(m.in_use),
                human_bytes(m.peak)
            );
        }
        if let Some(s) = &r.memory_summary {
            outln!("\nmemory summary of the device pool (peaks since training started)");
            out!("{s}");
        }
        Ok(())
    }

    /// What memory planning saved, and the parameters saved by `--save`.
    fn print_planning(&self) -> anyhow::Result<()> {
        let r = self;
        let p = &r.planning;
        let pct = if p.unplanned_peak > 0 {
            100.0 * p.saved as f64 / p.unplanned_peak as f64
        } else {
            0.0
        };
        outln!(
            "\nmemory planning ({}): one step peaks at {} of tensors without planning, {} with \
         ({} saved, {pct:.0}%): {} intermediate blobs share {} buffers; device allocator peak \
         {} vs {}",
            if p.enabled { "on" } else { "off" },
            human_bytes(p.unplanned_peak),
            human_bytes(p.planned_peak),
            human_bytes(p.saved),
            p.planned_blobs,
            p.slots,
            human_bytes(p.device_peak_unplanned),
            human_bytes(p.device_peak_planned),
        );
        for (slot, blobs) in &p.shared {
            outln!("  {slot:<12} holds {}", blobs.join(", "));
        }
        if let Some(saved) = &r.saved {
            outln!(
                "\nsaved {} parameter tensors to {} ({})",
                saved.tensors.len(),
                saved.file,
                saved.tensors.join(", ")
            );
        }
        Ok(())
    }
}
