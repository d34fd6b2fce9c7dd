//! Placement pins: an address handed out stays valid.
//!
//! A guard keeps its bytes where they are while it lives: it holds the buffer's access lock,
//! and spilling, eviction and zero-copy re-sharing only ever *try* that lock. Code that hands
//! an address out beyond a guard's life (a NumPy view, a DLPack export, a native handle given
//! to another library) pins the buffer's placement instead: while a [`PlacementPin`] lives,
//!
//! - the out-of-memory path neither spills nor evicts the buffer's device mirror;
//! - the host mirror is never replaced by zero-copy shared memory (a buffer whose device
//!   mirror is allocated while pinned keeps two mirrors, until a later access after the last
//!   pin lets it share again), and a device overwrite does not drop it;
//! - replacing either side with adopted memory ([`SyncedMemory::set_host_data`],
//!   [`SyncedMemory::set_device_data`]) is refused with [`crate::Error::Busy`].
//!
//! So the host mirror (or the shared memory) and the device mirror that exist when the pin is
//! taken, and any allocated while it lives, keep their addresses until the last pin goes. A
//! pin does not keep the buffer alive: hold the buffer (or a tensor sharing its storage) at
//! least as long as the pin.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Shared, SyncedMemory};

/// Keeps a buffer's host and device memory where they are. Made by
/// [`SyncedMemory::pin_placement`]; the pin ends when it is dropped. Pins nest: the buffer is
/// pinned while any of its pins lives.
///
/// While a pin lives, the out-of-memory path neither spills nor evicts the buffer's device
/// mirror; the host mirror is never replaced by zero-copy shared memory (a buffer brought back
/// to the device while pinned keeps two mirrors) and a device overwrite does not drop it; and
/// adopting memory on either side ([`SyncedMemory::set_host_data`],
/// [`SyncedMemory::set_device_data`], [`SyncedMemory::take_device_data`]) is refused with
/// [`crate::Error::Busy`]. So an address read after the pin was taken (a host view, a DLPack
/// export, a native handle) stays the buffer's memory until the last pin goes. A pin does not
/// keep the buffer alive: hold the buffer (or a tensor sharing its storage) at least as long.
#[must_use = "the placement is pinned only while the pin lives"]
pub struct PlacementPin {
    shared: Arc<Shared>,
}

impl SyncedMemory {
    /// Pins the buffer's placement: while the pin lives, no mirror of the buffer is moved or
    /// freed by the crate (see [`PlacementPin`]). Takes no lock and allocates nothing.
    ///
    /// ```
    /// use syncmem::{Device, SyncedMemory};
    ///
    /// let buf = SyncedMemory::new(64, &Device::cpu());
    /// buf.host_mut().unwrap().fill(1);
    /// let pin = buf.pin_placement();
    /// let at = buf.host().unwrap().as_ptr(); // an address to hand out
    /// // ... spilling, eviction and re-sharing leave it where it is ...
    /// assert_eq!(buf.host().unwrap().as_ptr(), at);
    /// drop(pin);
    /// ```
    pub fn pin_placement(&self) -> PlacementPin {
        self.shared.pins.fetch_add(1, Ordering::AcqRel);
        PlacementPin {
            shared: self.shared.clone(),
        }
    }

    /// The number of [`PlacementPin`]s alive on this buffer.
    pub fn placement_pins(&self) -> usize {
        self.shared.pins.load(Ordering::Acquire)
    }
}

impl Shared {
    /// True while a [`PlacementPin`] lives. Read under the buffer's locks by the paths that
    /// would move a mirror; a pin taken just after the check is taken on a buffer whose
    /// mirrors are about to move, as a pin taken just before the move would be after it: the
    /// addresses a pin protects are the ones read after taking it.
    pub(super) fn pinned(&self) -> bool {
        self.pins.load(Ordering::Acquire) > 0
    }
}

impl Drop for PlacementPin {
    fn drop(&mut self) {
        self.shared.pins.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for PlacementPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementPin")
            .field("buffer", &&*self.shared.settings.label)
            .field("pins", &self.shared.pins.load(Ordering::Relaxed))
            .finish()
    }
}
