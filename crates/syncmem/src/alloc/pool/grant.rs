//! What a pool's strategies ([`super::strategy`]) are asked for and hand out: a [`Request`]
//! and a [`Grant`]. A leaf of the pool, so that the strategies and their dispatch name it
//! without naming each other.

use std::sync::Arc;

use super::{BlockId, PendingUse, SegId, StreamId};

/// Who a block is for: the stream, the bytes asked for and the owner's name (kept with the
/// block while it is handed out, for snapshots).
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) stream: StreamId,
    pub(crate) requested: usize,
    pub(crate) owner: Option<&'a Arc<str>>,
}

/// A block handed out by a core.
pub(crate) struct Grant<V> {
    pub(crate) block: BlockId,
    pub(crate) seg: SegId,
    pub(crate) offset: usize,
    pub(crate) size: usize,
    pub(crate) zeroed: bool,
    /// The view the block kept from its last use, if its placement (segment, offset, size) has
    /// not changed since.
    pub(crate) view: Option<Box<V>>,
    /// Uses of the block still in flight, on the stream it is handed to (or complete): they
    /// go back to the pool with the block, with the new user's own.
    pub(crate) pending: Vec<PendingUse>,
    /// The block is small (the caching pool's small pool; elsewhere at most `small_size`).
    pub(crate) small: bool,
}
