//! The write path of the rings for events made as values (by a pool with an observer or with
//! sinks attached, or rare ones) and copies: each encoded as words into the next slot of the
//! thread's ring of its source, through the hot path ([`super::hot`]).

use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use super::hot::{record_alloc, record_free, record_words, AllocRecord};
use super::{cold, slots, Names};
use crate::alloc::event::{PoolEvent, StreamId};
use crate::alloc::stats::Direction;

/// The labels of pools and devices, numbered for the whole process (a pool takes its number
/// when it is made: the write path stores it as it is).
static LABELS: LazyLock<Mutex<Names>> = LazyLock::new(Mutex::default);

/// The number of the pool or device label `label`, for the whole process.
pub(crate) fn label_key(label: &str) -> u32 {
    LABELS.lock().id(label)
}

/// Every label numbered ([`label_key`]): number `n` is at `n - 1`.
pub(super) fn labels() -> Vec<Arc<str>> {
    LABELS.lock().list.clone()
}

/// Records pool event `e` of `source`, from the pool labelled `label` (its [`label_key`]),
/// with its shard's `order`, into this thread's ring (the way of a pool with an observer or
/// with sinks attached, which made the event anyway).
pub(crate) fn record_pool(
    generation: u64,
    source: u64,
    label: u32,
    e: &PoolEvent,
    order: (u64, u64),
) {
    let word = slots::order_word(order.0, order.1);
    let (kind, w) = match e {
        PoolEvent::Alloc {
            requested,
            size,
            cache_hit,
            block,
            stream,
            segment,
            offset,
            owner,
        } => {
            let a = AllocRecord {
                requested: *requested,
                size: *size,
                cache_hit: *cache_hit,
                block: *block,
                stream: *stream,
                segment: *segment,
                offset: *offset,
                owner: owner.as_ref(),
            };
            record_alloc(generation, source, label, (word, 0), a.owner, || a);
            return;
        }
        PoolEvent::Free { size, block } => {
            // In its shard's order, which places it: no clock read for it.
            let mark = super::hot::own_mark();
            record_free(generation, source, label, (word, 0, mark), (*size, *block));
            return;
        }
        // Words 3 to 11.
        PoolEvent::SegmentAlloc {
            bytes,
            segment,
            stream,
        } => (
            slots::SEGMENT_ALLOC,
            [0, 0, 0, 0, *bytes as u64, 0, *stream, *segment, 0],
        ),
        PoolEvent::SegmentFree { bytes, segment } => (
            slots::SEGMENT_FREE,
            [0, 0, 0, 0, *bytes as u64, 0, 0, *segment, 0],
        ),
        PoolEvent::Evict { label, bytes } => (
            slots::EVICT,
            [
                0,
                0,
                u64::from(cold::text_id(label)),
                0,
                *bytes as u64,
                0,
                0,
                0,
                0,
            ],
        ),
        PoolEvent::OutOfMemory { requested } => {
            (slots::OOM, [0, 0, 0, *requested as u64, 0, 0, 0, 0, 0])
        }
    };
    let w = [word, 0, w[2], w[3], w[4], w[5], w[6], w[7], w[8]];
    record_words(generation, source, kind, label, w);
}

/// Records a copy into this thread's ring.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_copy(
    generation: u64,
    source: u64,
    device: &str,
    stream: StreamId,
    direction: Direction,
    bytes: usize,
    peer: Option<&str>,
) {
    let label = label_key(device);
    let peer = peer.map_or(0, label_key);
    let w = [
        0,
        0,
        0,
        stream,
        slots::direction_code(direction),
        bytes as u64,
        u64::from(peer),
        0,
        0,
    ];
    record_words(generation, source, slots::COPY, label, w);
}
