//! Caffe2-style contexts: a device, a stream, and a random generator with a settable seed.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::device::{Device, Event, Stream};
use crate::error::Result;

/// A device, one of its streams, and a random generator (Caffe2's `CPUContext` /
/// `CUDAContext`). Each context has its own generator; equal seeds give equal sequences.
pub struct Context {
    device: Device,
    stream: Stream,
    seed: u64,
    rng: Mutex<StdRng>,
}

impl Context {
    /// A context on `device`'s default stream, seeded from [`random_seed`].
    ///
    /// # Errors
    /// A backend error when the device's default stream cannot be created.
    pub fn new(device: &Device) -> Result<Self> {
        Self::with_seed(device, random_seed())
    }

    /// A context on `device`'s default stream with a fixed seed.
    ///
    /// # Errors
    /// As [`Context::new`].
    pub fn with_seed(device: &Device, seed: u64) -> Result<Self> {
        Ok(Self::on_stream(device.default_stream()?, seed))
    }

    /// A context on a given stream with a fixed seed.
    pub fn on_stream(stream: Stream, seed: u64) -> Self {
        Self {
            device: stream.device().clone(),
            stream,
            seed,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The seed the generator started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The context's random generator (Caffe2's `RandGenerator`).
    pub fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock()
    }

    /// Restarts the generator from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.seed = seed;
        *self.rng.get_mut() = StdRng::seed_from_u64(seed);
    }

    /// Records an event on the context's stream.
    ///
    /// # Errors
    /// A backend error.
    pub fn record(&self) -> Result<Event> {
        self.stream.record()
    }

    /// Makes the context's stream wait for `event`.
    ///
    /// # Errors
    /// A backend error.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.stream.wait_for(event)
    }

    /// Blocks until the context's stream is idle (Caffe2's `FinishDeviceComputation`).
    ///
    /// # Errors
    /// A backend error, including one from earlier asynchronous work.
    pub fn finish(&self) -> Result<()> {
        self.stream.synchronize()
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device.label())
            .field("seed", &self.seed)
            .finish()
    }
}

/// A fresh seed: a process-wide counter mixed with the process id and the time (Caffe2's
/// `RandomNumberSeed`). Unique on a best-effort basis.
pub fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let pid = u64::from(std::process::id());
    (n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ (pid.wrapping_mul(0xBF58_476D_1CE4_E5B9)) ^ t
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn same_seed_same_sequence_per_context() {
        let d = Device::cpu();
        let a = Context::with_seed(&d, 42).unwrap();
        let b = Context::with_seed(&d, 42).unwrap();
        let c = Context::with_seed(&d, 43).unwrap();
        let xs: Vec<u32> = (0..8).map(|_| a.rng().random()).collect();
        let ys: Vec<u32> = (0..8).map(|_| b.rng().random()).collect();
        let zs: Vec<u32> = (0..8).map(|_| c.rng().random()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert_eq!(a.seed(), 42);
    }

    #[test]
    fn reseed_restarts_the_sequence() {
        let mut a = Context::with_seed(&Device::cpu(), 7).unwrap();
        let first: u64 = a.rng().random();
        a.reseed(7);
        assert_eq!(first, a.rng().random::<u64>());
    }

    #[test]
    fn random_seeds_differ() {
        assert_ne!(random_seed(), random_seed());
    }

    #[test]
    fn finish_and_events_on_cpu() {
        let ctx = Context::new(&Device::cpu()).unwrap();
        let e = ctx.record().unwrap();
        ctx.wait_event(&e).unwrap();
        ctx.finish().unwrap();
        assert!(e.is_complete().unwrap());
    }
}
