//! Owners a pool keeps for the leases of a stream (`Pool::alloc_with`).
//!
//! A caller whose leases each need an owner alive (the device layer: the handle of the stream a
//! buffer was allocated on, which holds the device) can give that owner to the pool once per
//! stream instead of taking a reference count per lease: threads allocating at once, each on a
//! stream of its own, then write no shared counter and take no locked instruction beyond the
//! shard's lock, under which the pool counts the stream's leases.
//!
//! Each shard keeps, per stream, the owner and the number of its leases handed out. The owner
//! stays after the count falls to zero (the next lease of the stream takes no reference count
//! either) until the caller releases the stream (`Pool::release_stream`); from then on
//! it goes with the stream's last lease given back. A retired pool (which hands out nothing
//! more) lets every owner go at once: none of its leases is out.
//!
//! Owners are dropped outside the shard's lock, and after the shard is last touched: an owner
//! may hold what holds the pool.

use std::sync::Arc;

use super::StreamId;

/// An owner a pool keeps alive for a stream's leases (see `Pool::alloc_with`).
pub(crate) type Keep = Arc<dyn Send + Sync>;

/// The owner kept for one stream in one shard.
struct Kept {
    stream: StreamId,
    keep: Keep,
    /// Leases of the stream handed out by the shard.
    out: usize,
    /// The caller released the stream: the owner goes with the last lease.
    released: bool,
}

/// The owners a shard keeps, one per stream (few streams use a pool: a short list).
#[derive(Default)]
pub(super) struct KeptList {
    list: Vec<Kept>,
}

impl KeptList {
    /// Counts a lease handed out for `stream`, taking the stream's owner from `make` when the
    /// shard keeps none.
    #[inline]
    pub(super) fn lend(&mut self, stream: StreamId, make: &dyn Fn() -> Keep) {
        match self.list.iter_mut().find(|k| k.stream == stream) {
            Some(k) => {
                k.out += 1;
                // A stream allocating again is not released (its caller still holds it).
                k.released = false;
            }
            None => self.list.push(Kept {
                stream,
                keep: make(),
                out: 1,
                released: false,
            }),
        }
    }

    /// Counts a lease of `stream` given back; returns the stream's owner when the stream was
    /// released and this was its last lease (to drop once the shard is no longer touched).
    #[inline]
    pub(super) fn give_back(&mut self, stream: StreamId) -> Option<Keep> {
        let i = self.list.iter().position(|k| k.stream == stream);
        debug_assert!(
            i.is_some(),
            "a kept lease of stream {stream} with no owner kept"
        );
        let i = i?;
        let k = &mut self.list[i];
        debug_assert!(
            k.out > 0,
            "more leases of stream {stream} given back than lent"
        );
        k.out = k.out.saturating_sub(1);
        (k.out == 0 && k.released).then(|| self.list.swap_remove(i).keep)
    }

    /// The caller let `stream` go: returns its owner when none of its leases is out, else
    /// marks it to go with the last.
    pub(super) fn release(&mut self, stream: StreamId) -> Option<Keep> {
        let i = self.list.iter().position(|k| k.stream == stream)?;
        let k = &mut self.list[i];
        k.released = true;
        (k.out == 0).then(|| self.list.swap_remove(i).keep)
    }

    /// Takes every owner whose stream has no lease out (all of them in a pool with nothing
    /// handed out), into `into`.
    pub(super) fn take_idle(&mut self, into: &mut Vec<Keep>) {
        let mut i = 0;
        while i < self.list.len() {
            if self.list[i].out == 0 {
                into.push(self.list.swap_remove(i).keep);
            } else {
                i += 1;
            }
        }
    }

    /// The address of the owner kept for `stream`.
    #[cfg(debug_assertions)]
    pub(super) fn owner_of(&self, stream: StreamId) -> Option<*const ()> {
        let k = self.list.iter().find(|k| k.stream == stream)?;
        Some(Arc::as_ptr(&k.keep).cast::<()>())
    }

    /// Streams with an owner kept, each with its leases out (for tests).
    #[cfg(test)]
    pub(super) fn counts(&self) -> Vec<(StreamId, usize, bool)> {
        self.list
            .iter()
            .map(|k| (k.stream, k.out, k.released))
            .collect()
    }
}
