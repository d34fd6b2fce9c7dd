//! Allocation failures on demand, for tests of error paths (feature `testing`).
//!
//! [`Device::fail_allocation`] arms a countdown on one device: the `n`-th allocation made for
//! it from then on (device memory, pooled or direct, and the host mirrors of the buffers that
//! live on it) fails with [`crate::Error::OutOfMemory`], before the out-of-memory path runs
//! (nothing is evicted or spilled to make room: the failure reaches the caller, after the
//! out-of-memory observers, `super::on_out_of_memory`, saw it). Every operation must
//! then leave every buffer as it was; the composed model test of the crate checks that after
//! each injected failure. Without the feature the checks compile to nothing.

use crate::error::Result;

use super::Device;

/// The countdown of one device.
#[cfg(feature = "testing")]
#[derive(Default)]
pub(crate) struct Faults {
    /// 0: disarmed; `n`: the `n`-th allocation from now fails.
    countdown: std::sync::atomic::AtomicU64,
    /// Failures injected so far.
    injected: std::sync::atomic::AtomicU64,
}

#[cfg(feature = "testing")]
impl Faults {
    /// Counts one allocation down; true when it is the one to fail.
    fn fail_now(&self) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
        if self.countdown.load(Relaxed) == 0 {
            return false;
        }
        let hit = self
            .countdown
            .fetch_update(AcqRel, Acquire, |c| c.checked_sub(1))
            == Ok(1);
        if hit {
            self.injected.fetch_add(1, Relaxed);
        }
        hit
    }
}

/// Fails this allocation of `len` bytes (`what`: for whom) when the countdown of `dev` says so.
#[inline(always)]
pub(crate) fn check(dev: &Device, len: usize, what: &str) -> Result<()> {
    #[cfg(feature = "testing")]
    if dev.shared.faults.fail_now() {
        return Err(injected(dev, len, what));
    }
    let _ = (dev, len, what);
    Ok(())
}

#[cfg(feature = "testing")]
#[cold]
fn injected(dev: &Device, len: usize, what: &str) -> crate::Error {
    let report = crate::error::OomReport::new(
        dev.label(),
        len,
        format!("an injected failure of {what} (Device::fail_allocation)"),
    );
    // The failure reaches the caller as a real one does: its observers run first.
    super::notify_oom(&report);
    report.into()
}

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl Device {
    /// Makes the `n`-th allocation for this device from now fail with
    /// [`crate::Error::OutOfMemory`]
    /// (`n = 1`: the next one); `0` disarms. Counted are device memory (pooled and direct) and
    /// the host mirrors of buffers on this device. The failure reaches the caller: the
    /// out-of-memory path (eviction, spilling) does not run for it. For tests of error paths:
    /// every operation that fails must leave every buffer as it was. A handle from
    /// [`Device::isolated`] has a countdown of its own.
    pub fn fail_allocation(&self, n: u64) {
        use std::sync::atomic::Ordering::Release;
        self.shared.faults.countdown.store(n, Release);
    }

    /// How many failures [`Device::fail_allocation`] injected on this device so far.
    pub fn injected_failures(&self) -> u64 {
        use std::sync::atomic::Ordering::Acquire;
        self.shared.faults.injected.load(Acquire)
    }
}
