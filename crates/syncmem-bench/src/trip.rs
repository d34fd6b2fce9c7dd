//! The synced round-trip rows: a `SyncedMemory` host -> device -> host round trip against
//! blocking `Stream::write` + `Stream::read` of the same bytes, both sides through the same
//! memory.
//!
//! A 64 MiB copy runs at the speed of the memory behind it: two raw round trips of one process
//! over two pairs of buffers allocated alike (a host block and a device buffer each) differ by
//! up to 10-15%, steadily over the run, and which pair is the faster one changes from run to
//! run (on PoCL the device buffer decides it: swapping the device buffers between the two sides
//! flips the ratio, swapping the host blocks does not). A row whose two sides own different
//! memory measures that draw, not syncmem. So the row allocates two pairs, and in each sample
//! the synced buffer adopts one pair ([`SyncedMemory::set_device_data`],
//! [`SyncedMemory::set_host_ptr`]) while the raw side copies through the other, and then the
//! other way round: each side's sample is one round trip on each pair. The hand-over happens
//! between the timed calls; the timed synced call is the same whether the buffer owns its
//! mirrors or adopted them (the same accessors, the same two copies, no allocation).

use std::hint::black_box;
use std::time::Instant;

use syncmem::alloc::HostBlock;
use syncmem::device::PinnedBuffer;
use syncmem::{Device, DeviceBuffer, Error, Result, SyncedMemory, ZeroCopy};

use crate::rows::Runs;
use crate::{size_name, Row, Samples};

/// Host memory of one pair: pageable (the host allocator's) or pinned (the device's).
enum Host {
    Pageable(HostBlock),
    Pinned(PinnedBuffer),
}

impl Host {
    fn new(dev: &Device, bytes: usize, pinned: bool) -> Result<Self> {
        Ok(if pinned {
            Host::Pinned(dev.alloc_pinned(bytes)?)
        } else {
            Host::Pageable(HostBlock::zeroed(bytes)?)
        })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Host::Pageable(h) => h.as_mut_slice(),
            Host::Pinned(p) => p.as_mut_slice(),
        }
    }
}

/// The two pairs of memory and the synced buffer that holds one of them at a time.
struct Trip {
    /// Declared first: dropped before the host blocks whose memory it may hold.
    buf: SyncedMemory,
    hosts: [Host; 2],
    /// The device buffers; `None` for the one the synced buffer holds.
    devs: [Option<DeviceBuffer>; 2],
    /// The pair the synced buffer holds.
    lent: usize,
}

impl Trip {
    fn new(dev: &Device, bytes: usize, pinned: bool) -> Result<Self> {
        let mut trip = Trip {
            buf: SyncedMemory::new(bytes, dev).with_pinned_host(pinned),
            hosts: [
                Host::new(dev, bytes, pinned)?,
                Host::new(dev, bytes, pinned)?,
            ],
            devs: [Some(dev.alloc(bytes)?), Some(dev.alloc(bytes)?)],
            lent: 0,
        };
        trip.lend(0)?;
        Ok(trip)
    }

    /// Hands pair `i` to the synced buffer (taking back the device buffer it held), its host
    /// memory current and its device memory stale, as after a host write.
    fn lend(&mut self, i: usize) -> Result<()> {
        if let Some(d) = self.buf.take_device_data()? {
            self.devs[self.lent] = Some(d);
        }
        let dev = self.devs[i].take().ok_or_else(|| Error::InvalidState {
            op: "round trip row",
            buffer: self.buf.label().to_string(),
            reason: "the device buffer to lend is held by the synced buffer".into(),
        })?;
        self.buf.set_device_data(dev)?;
        let host = self.hosts[i].as_mut_slice();
        // SAFETY: the host memory of pair `i` lives in `self.hosts` until `self.buf` is dropped
        // (declared first, so dropped first), initialised (zeroed or pinned memory), and nothing
        // else uses it until the next `lend` replaces it: the raw side only copies through the
        // pair the synced buffer does not hold.
        unsafe { self.buf.set_host_ptr(host.as_mut_ptr(), host.len())? };
        self.lent = i;
        Ok(())
    }

    /// The synced round trip on the pair it holds: nanoseconds.
    fn synced(&self) -> Result<f64> {
        let bytes = self.buf.len();
        let start = Instant::now();
        self.buf.host_mut()?[0] = 1;
        drop(black_box(self.buf.device()?));
        drop(black_box(self.buf.device_mut()?));
        black_box(self.buf.host()?[bytes - 1]);
        Ok(start.elapsed().as_nanos() as f64)
    }

    /// The raw round trip on the pair the synced buffer does not hold: nanoseconds.
    fn raw(&mut self, stream: &syncmem::Stream) -> Result<f64> {
        let i = 1 - self.lent;
        let (host, dev) = (&mut self.hosts[i], &mut self.devs[i]);
        let dev = dev.as_mut().ok_or_else(|| Error::InvalidState {
            op: "round trip row",
            buffer: self.buf.label().to_string(),
            reason: "the raw side's device buffer is lent".into(),
        })?;
        let start = Instant::now();
        let host = host.as_mut_slice();
        host[0] = 1;
        stream.write(dev, 0, host)?;
        stream.read(dev, 0, host)?;
        black_box(&host);
        Ok(start.elapsed().as_nanos() as f64)
    }
}

/// A `SyncedMemory` round trip (host write, `device()` copies up, `device_mut()` marks the
/// device current, `host()` copies back) vs blocking `Stream::write` + `Stream::read` from host
/// memory of the same kind: pageable memory of the host allocator, or (`pinned`) the device's
/// pinned memory on both sides. Both sides copy through the same two pairs of memory in turn
/// (see the module's note): a sample of each side is `runs.batch` round trips on each pair,
/// after one unrecorded sample.
///
/// # Errors
/// Allocation or transfer errors.
pub fn round_trip_row(dev: &Device, bytes: usize, pinned: bool, runs: Runs) -> Result<Row> {
    let dev = dev.isolated();
    // Two mirrors, so that the row measures the copies (the zero-copy rows measure sharing).
    dev.set_zero_copy(ZeroCopy::Off);
    let stream = dev.default_stream()?;
    let mut trip = Trip::new(&dev, bytes, pinned)?;
    let calls = 2 * runs.batch.max(1);
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for sample in 0..=runs.samples.max(1) {
        let (mut o, mut b) = (0.0, 0.0);
        for _ in 0..calls {
            o += trip.synced()?;
            b += trip.raw(&stream)?;
            trip.lend(1 - trip.lent)?;
        }
        if sample > 0 {
            ours.push(o / calls as f64);
            base.push(b / calls as f64);
        }
    }
    let size = size_name(bytes);
    let (name, ours_name, base_name) = if pinned {
        (
            format!("synced round trip {size} pinned"),
            "SyncedMemory (pinned host) host->device->host",
            "Stream::write + read, pinned host memory",
        )
    } else {
        (
            format!("synced round trip {size}"),
            "SyncedMemory host->device->host",
            "Stream::write + read, HostBlock memory",
        )
    };
    Ok(Samples::new(ours, base).row(&name, ours_name, base_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_start(h: &Host) -> *const u8 {
        match h {
            Host::Pageable(b) => b.as_ptr(),
            Host::Pinned(p) => p.as_slice().as_ptr(),
        }
    }

    #[test]
    fn each_side_copies_through_each_pair_in_turn() {
        let dev = Device::cpu().isolated();
        dev.set_zero_copy(ZeroCopy::Off);
        let stream = dev.default_stream().unwrap();
        for pinned in [false, true] {
            let mut trip = Trip::new(&dev, 4096, pinned).unwrap();
            for (n, i) in [0, 1, 0, 1].into_iter().enumerate() {
                assert_eq!(trip.lent, i);
                // The synced buffer works on pair `i`'s host memory; the raw side on the other.
                assert_eq!(
                    trip.buf.host().unwrap().as_ptr(),
                    host_start(&trip.hosts[i])
                );
                assert!(trip.devs[i].is_none() && trip.devs[1 - i].is_some());
                trip.synced().unwrap();
                // A real round trip: one upload and one read-back of every byte per call.
                let c = trip.buf.copy_stats();
                let round_trips = n as u64 + 1;
                assert_eq!(c.host_to_device.count, round_trips, "{c:?}");
                assert_eq!(c.device_to_host.count, round_trips, "{c:?}");
                assert_eq!(c.device_to_host.bytes, 4096 * round_trips, "{c:?}");
                trip.raw(&stream).unwrap();
                trip.lend(1 - i).unwrap();
            }
        }
    }
}
