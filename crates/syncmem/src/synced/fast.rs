//! The state lock of a buffer, and the lock-free fast path of host reads it maintains.
//!
//! A host read of a buffer whose host mirror is current with nothing in flight changes no
//! state: the slow path would lock the state only to find the host pointer. So every release
//! of the state lock publishes that pointer in an atomic (null when the host mirror is not
//! current or work is in flight), and [`CoreCell::current_host`] reads it without the lock.
//!
//! Why a published pointer is still good when a reader uses it: the reader loads it while
//! holding the shared access lock, and only a holder of the exclusive access lock (a writer)
//! ever replaces or frees the host mirror or takes its validity away. Holders of the shared
//! lock only add validity (a copy into a stale mirror) or queue a host-to-device copy, which
//! reads the host mirror and does not conflict with host reads. So a pointer published while
//! the reader holds the shared lock stays the current host mirror until its guard drops; a
//! pointer published before the reader took the lock was either published again since or
//! still describes the state at the reader's lock (the last release of the state lock
//! published the state as it then was, and the state lock serialises publications).
//! Ordering: the pointer is stored with `Release` after the bytes were written (by a blocking
//! copy, a waited transfer, or a host writer that released the access lock) and loaded with
//! `Acquire`.

use std::ops::{Deref, DerefMut};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::state::Place;
use super::{Core, HostMem};

/// The state of a buffer behind its lock, and the published host pointer.
pub(super) struct CoreCell {
    core: Mutex<Core>,
    current_host: AtomicPtr<u8>,
}

impl CoreCell {
    pub(super) fn new(core: Core) -> Self {
        let current = core.current_host();
        Self {
            core: Mutex::new(core),
            current_host: AtomicPtr::new(current),
        }
    }

    /// Locks the state; the guard republishes the host pointer when it drops.
    pub(super) fn lock(&self) -> CoreGuard<'_> {
        CoreGuard {
            guard: self.core.lock(),
            current_host: &self.current_host,
        }
    }

    /// As [`CoreCell::lock`], or `None` when the lock is held.
    pub(super) fn try_lock(&self) -> Option<CoreGuard<'_>> {
        Some(CoreGuard {
            guard: self.core.try_lock()?,
            current_host: &self.current_host,
        })
    }

    /// The host mirror when it is current and nothing is in flight, as of the last release of
    /// the state lock. Only meaningful to a caller that holds the access lock (see the module
    /// docs).
    pub(super) fn current_host(&self) -> Option<*mut u8> {
        let p = self.current_host.load(Ordering::Acquire);
        (!p.is_null()).then_some(p)
    }
}

/// The locked state. Derefs to [`Core`].
pub(super) struct CoreGuard<'a> {
    guard: MutexGuard<'a, Core>,
    current_host: &'a AtomicPtr<u8>,
}

impl Deref for CoreGuard<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.guard
    }
}

impl DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.guard
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        // Runs before the mutex guard field drops: publications happen under the lock, in the
        // order of the state changes.
        self.current_host
            .store(self.guard.current_host(), Ordering::Release);
    }
}

impl Core {
    /// The host mirror's start when it is current and nothing is in flight, else null (also
    /// for shared memory that must be mapped first: see [`super::shared`]).
    fn current_host(&self) -> *mut u8 {
        let ready = self.zc.is_none_or(|z| z.host_ready());
        match &self.host {
            Some(h) if ready && self.coh.pending().is_none() && self.coh.has(Place::Host) => {
                HostMem::ptr(h)
            }
            _ => ptr::null_mut(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, SyncedMemory};

    fn published(m: &SyncedMemory) -> bool {
        m.shared.core.current_host().is_some()
    }

    #[test]
    fn published_only_while_the_host_is_current_and_idle() {
        let m = SyncedMemory::new(64, &Device::cpu()).with_zero_copy(false);
        assert!(!published(&m), "uninitialized");
        m.host_mut().unwrap().fill(1);
        assert!(published(&m));
        m.device_mut().unwrap().fill(2).unwrap();
        assert!(!published(&m), "the device holds the newest data");
        // The slow path copies, and publishes the now current host.
        assert_eq!(&*m.host().unwrap(), &[2u8; 64][..]);
        assert!(published(&m));
        assert_eq!(m.copy_stats().device_to_host.count, 1);
        // Served by the fast path: no copy, same data.
        assert_eq!(&*m.host().unwrap(), &[2u8; 64][..]);
        assert_eq!(m.copy_stats().device_to_host.count, 1);
        m.host_mut().unwrap().fill(3);
        m.prefetch_to_device(None)
            .unwrap()
            .expect("a copy was made");
        // The cpu device copies before returning: nothing is in flight, the host stays
        // published (a real device's copy in flight is covered by tests/async_prefetch.rs).
        assert!(published(&m), "nothing in flight on the cpu device");
        m.wait().unwrap();
        assert!(published(&m));
        let mut out = [0u8; 64];
        m.device().unwrap().read_into(&mut out).unwrap();
        assert_eq!(out, [3u8; 64]);
    }

    /// Shared memory: published while the host side is current, with nothing to wait for; with
    /// the map protocol only while mapped (a device access unmaps it).
    #[test]
    fn shared_memory_is_published_only_when_the_host_may_use_it() {
        use crate::device::{ZeroCopy, ZeroCopyProtocol};
        // Isolated devices: `SYNCMEM_ZERO_COPY` may turn the shared ones off.
        let cpu = Device::cpu().isolated();
        cpu.set_zero_copy(ZeroCopy::Auto);
        let m = SyncedMemory::new(64, &cpu);
        m.host_mut().unwrap().fill(1);
        assert_eq!(m.zero_copy_protocol(), Some(ZeroCopyProtocol::InPlace));
        assert!(published(&m));
        drop(m.device().unwrap());
        assert!(published(&m), "a device read leaves the host current");
        m.device_mut().unwrap().fill(2).unwrap();
        assert!(!published(&m));
        assert_eq!(&*m.host().unwrap(), &[2u8; 64][..]);
        assert!(published(&m));
        let s = m.copy_stats();
        assert_eq!((s.total_count(), s.mapped.count), (0, 2));

        let Ok(cl) = Device::open("opencl:0") else {
            return;
        };
        let cl = cl.isolated();
        cl.set_zero_copy(ZeroCopy::Map);
        let m = SyncedMemory::new(64, &cl);
        m.host_mut().unwrap().fill(3);
        assert_eq!(m.zero_copy_protocol(), Some(ZeroCopyProtocol::Map));
        assert!(published(&m), "mapped for the host write");
        drop(m.device().unwrap());
        assert!(!published(&m), "unmapped for the device");
        assert_eq!(&*m.host().unwrap(), &[3u8; 64][..]);
        assert!(published(&m), "mapped again");
    }
}
