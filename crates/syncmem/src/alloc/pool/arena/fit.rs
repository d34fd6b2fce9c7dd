//! Best fit: the free block of the arena that serves a request (usable by its stream), and,
//! for a request that orders itself after other streams' device commands, one those commands
//! still use.

use super::{pool_index, Arena, KEEP_WHOLE};
use crate::alloc::pool::grant::{Grant, Request};
use crate::alloc::pool::{orderable, usable_by, BlockId, PendingUse};

impl<V> Arena<V> {
    /// The best-fit free block for `rounded` bytes usable by `req`'s stream, carved; with
    /// `keep_whole`, wholly free segments of at least [`KEEP_WHOLE`] times `rounded` are passed
    /// over (see [`Arena::find`]).
    pub(super) fn best_fit(
        &mut self,
        rounded: usize,
        req: Request<'_>,
        keep_whole: bool,
    ) -> Option<Grant<V>> {
        let id = self.best_fit_id(rounded, keep_whole, |p| usable_by(p, req.stream))?;
        Some(self.carve(id, rounded, req))
    }

    /// The best-fit free block for `rounded` bytes whose uses in flight `fits` (see
    /// [`Arena::best_fit`]).
    #[inline(always)]
    fn best_fit_id(
        &self,
        rounded: usize,
        keep_whole: bool,
        fits: impl Fn(&[PendingUse]) -> bool,
    ) -> Option<BlockId> {
        let small = rounded <= self.small_size;
        let whole_from = rounded.saturating_mul(KEEP_WHOLE);
        for &(size, id) in self.free[pool_index(small)].range((rounded, 0)..) {
            if let Some(m) = self.max_split {
                // Small requests never take oversize blocks; big ones take them only when
                // little is wasted (the sets are ordered, so nothing later fits either).
                if rounded < m && size >= m {
                    break;
                }
                if rounded >= m && size >= rounded.saturating_add(self.max_non_split_rounding) {
                    break;
                }
            }
            let b = &self.blocks[id];
            if keep_whole && size >= whole_from && b.fitted && !b.is_split() {
                continue;
            }
            if fits(&b.pending) {
                return Some(id);
            }
        }
        None
    }

    /// [`Arena::find`] missed: the best-fit free block for `rounded` bytes among those whose
    /// uses in flight are all commands of devices' queues (or done), for a request that orders
    /// its first command after them on the device
    /// ([`crate::backend::RawStorage::orders_reuse`]). The exact-size lists are merged back
    /// first, so that their blocks are seen. Asked before a new segment is made.
    #[cold]
    #[inline(never)]
    pub(crate) fn find_ordered(
        &mut self,
        rounded: usize,
        req: Request<'_>,
        keep_whole: bool,
    ) -> Option<Grant<V>> {
        if !self.front.is_empty() {
            self.flush_front();
        }
        let id = self.best_fit_id(rounded, keep_whole, orderable)?;
        Some(self.carve(id, rounded, req))
    }
}
