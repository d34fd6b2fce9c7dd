//! How a [`DeviceBuffer`] gives its memory back: dropped, or emptied and kept for the next
//! mirror of its buffer on the default stream ([`DeviceBuffer::release_memory`],
//! [`DeviceBuffer::pooled_default_into`]: no handle of the device taken and given back, no
//! buffer moved, as a value dropped under a cap and made again at the next step does).

use std::sync::Arc;

use super::{inherit_pending, single_hint, DeviceBuffer, Origin, Release};
use crate::alloc::pool::{Lease, StreamId};
use crate::backend::dispatch::RawMem;
use crate::device::stream::{StreamFence, UnboundStream};
use crate::device::Device;
use crate::error::Result;

impl DeviceBuffer {
    /// [`DeviceBuffer::pooled_default`] into `shell` when it is an empty buffer of `device`
    /// left by [`DeviceBuffer::release_memory`] (`None` returned: no handle of the device
    /// taken, none given back, nothing moved), else into a new buffer, returned.
    pub(crate) fn pooled_default_into(
        device: &Device,
        len: usize,
        owner: Option<&Arc<str>>,
        shell: &mut DeviceBuffer,
    ) -> Result<Option<Self>> {
        if len == 0 || !shell.is_shell_of(device) {
            return Self::pooled_default(device, len, owner).map(Some);
        }
        Self::check_request(device, len)?;
        let memory = &device.shared.memory;
        match memory.lease_default(device, len, owner) {
            Some(lease) => {
                shell.refill_default(len, lease?);
                Ok(None)
            }
            None => memory.alloc_pooled_bound(device, len, owner).map(Some),
        }
    }

    /// Whether this is an empty buffer holding `device`'s own handle (see
    /// [`DeviceBuffer::release_memory`]).
    fn is_shell_of(&self, device: &Device) -> bool {
        matches!(*self.origin, Origin::Empty) && self.device.is_device() && self.device.same(device)
    }

    /// Makes this empty buffer (see [`DeviceBuffer::is_shell_of`]) the buffer of `lease`, a
    /// block of `len` bytes of its device's default stream, as
    /// [`DeviceBuffer::from_pool_default`] makes one.
    fn refill_default(&mut self, len: usize, lease: Lease<RawMem, RawMem>) {
        debug_assert!(lease.view().is_some(), "a device pool lease holds its view");
        // Empty since `release_memory` (see `free_memory`): written only for a block that
        // comes with work in flight (the drop of an empty list costs about 30 instructions).
        debug_assert!(
            self.uses.get_mut().owns_nothing(),
            "an empty buffer has no uses"
        );
        if lease.pending().next().is_some() {
            *self.uses.get_mut() = inherit_pending(&lease);
            *self.single.get_mut() = single_hint(self.uses.get_mut().single_stream());
        }
        self.len = len;
        *self.exposed.get_mut() = false;
        *self.origin = Origin::Pooled {
            lease,
            release: Release::RecordDefault,
        };
    }

    /// Frees the memory as dropping the buffer does, keeping the buffer as an empty one for
    /// [`DeviceBuffer::pooled_default_into`]; returns whether it did: only a buffer holding
    /// its device's own handle (one pointing at a stream's handle gives it up with its
    /// block) is kept, and is left as it was otherwise.
    pub(crate) fn release_memory(&mut self) -> bool {
        if !self.device.is_device() {
            return false;
        }
        self.free_memory();
        // A block given back to a cache left `Empty` already; one not cached goes back here.
        if !matches!(*self.origin, Origin::Empty) {
            *self.origin = Origin::Empty;
        }
        self.len = 0;
        *self.exposed.get_mut() = false;
        self.counted = None;
        true
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.free_memory();
        self.drop_origin();
    }
}

impl DeviceBuffer {
    /// Gives the memory back: the body of `Drop::drop` (a pooled block not cached is given
    /// back when `origin` is dropped or replaced, after this).
    #[inline(always)]
    fn free_memory(&mut self) {
        if let Some(counted) = self.counted {
            self.device.shared.mem.on_free(counted, self.len);
        }
        // Dropped at the end of this function (`self.uses` is never dropped; what is left in
        // it is empty).
        let mut uses = {
            let u = self.uses.get_mut();
            (!u.owns_nothing()).then(|| std::mem::take(u))
        };
        // No point is left: the next owner's first command takes no lock.
        *self.single.get_mut() = 0;
        match &mut *self.origin {
            Origin::Empty => {}
            Origin::Direct(_) => {
                // The allocation goes first, then its bytes are given back to the cap.
                drop(std::mem::replace(&mut *self.origin, Origin::Empty));
                self.device.shared.memory.uncharge(self.len);
            }
            Origin::Pooled { lease, release } => {
                // The commands recorded on the block and not known complete: reusable at once
                // by their own streams, by the others once they are done. A block with none
                // goes back with no fence at all (no allocation, nothing to wait for).
                if let Some(uses) = uses.as_mut().filter(|u| !u.is_empty()) {
                    uses.prune();
                    for p in uses.points() {
                        lease.add_pending_at(p.id, p.queue(), p.seq);
                    }
                }
                // Work queued on the buffer's own stream outside the crate (through a native
                // handle handed out) is covered by a fence recorded there when another stream
                // wants the block. The cpu backend finishes every operation before returning:
                // nothing is ever in flight there.
                let stream = match release {
                    Release::Idle => None,
                    Release::Record(s) => Some(&*s),
                    Release::RecordOwn => self.device.stream(),
                    Release::RecordDefault => self.device.default_unbound(),
                };
                if *self.exposed.get_mut() {
                    if let Some(s) = stream.filter(|s| !s.is_cpu()) {
                        lease.add_pending(s.id(), Arc::new(StreamFence::new(s)));
                    }
                }
                // The view stays with the block for its next user.
                if let Some(view) = lease.view_mut() {
                    view.recycle();
                }
                // An idle block's stream is not known here: to its shard.
                let stream = stream.map_or(StreamId::MAX, UnboundStream::id);
                let Some(state) = lease.may_cache() else {
                    // The lease gives the block back when the field is dropped, after this.
                    return;
                };
                // The block, taken where it lies (`Empty` left), unless it goes back to its
                // shard whole: then when the field is dropped, after this.
                let Some((slim, mark, release)) = self.take_cached(stream) else {
                    return;
                };
                // Into this thread's cache when it may go there, unless the stream the pool
                // keeps for it was let go: that answer is read with the cache's flag held,
                // while the block (still out) keeps the stream's handle alive.
                let on = self.device.lent();
                slim.give_back(state, mark, || on.is_none_or(|o| !o.is_released()));
                // A stream's handle (`Release::Record`) goes after its block.
                drop(release);
            }
        }
    }
}
