//! The ids of a pool's blocks and segments, and the hash of the maps keyed by them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A block's id in its shard.
pub(crate) type BlockId = u64;
/// A segment's id in its shard.
pub(crate) type SegId = u64;

/// Hashes the pools' own integer ids (block and segment ids) with one multiply (the `FxHash`
/// step). The ids are made by the pool, never by an adversary, so SipHash's protection buys
/// nothing, and with several lookups per allocation and free it was the largest cost of a
/// cache hit.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

const ID_HASH_K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(ID_HASH_K);
    }
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and the tag from the top 7: fold the
        // well-mixed high half into the low one.
        self.0 ^ (self.0 >> 32)
    }
}

/// A map keyed by pool ids ([`BlockId`], [`SegId`]).
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
