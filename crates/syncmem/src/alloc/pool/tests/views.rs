//! Tests of the views a pool keeps with its blocks: made once per placement, never stale.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::{check, pytorch, Fake, KIB, MIB};
use crate::alloc::pool::{Budget, Lease, Pool, PoolConfig, PoolKind, RawStorage};
use crate::error::Result;

/// A view as a backend would make it: the segment, offset and length it covers, and the
/// number of the view (in the order made).
#[derive(Debug)]
struct View {
    seg: usize,
    offset: usize,
    len: usize,
    serial: u64,
    live: Arc<AtomicUsize>,
}

impl Drop for View {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A storage of fake segments that counts the views it makes and those still alive.
#[derive(Default)]
struct Counting {
    made: AtomicU64,
    live: Arc<AtomicUsize>,
}

impl Counting {
    fn made(&self) -> u64 {
        self.made.load(Ordering::SeqCst)
    }
    fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl RawStorage for Counting {
    type Segment = Fake;
    type View = View;

    fn alloc(&self, bytes: usize) -> Result<Fake> {
        Ok(Fake(bytes))
    }

    fn view(&self, segment: &Arc<Fake>, offset: usize, len: usize) -> Result<View> {
        let serial = self.made.fetch_add(1, Ordering::SeqCst) + 1;
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(View {
            seg: Arc::as_ptr(segment) as usize,
            offset,
            len,
            serial,
            live: self.live.clone(),
        })
    }
}

fn viewed(cfg: PoolConfig) -> Arc<Pool<Fake, View>> {
    Pool::new(
        "views",
        cfg,
        Arc::new(Budget::new(None)),
        isize::MAX as usize,
    )
    .unwrap()
}

/// The lease's view, checked to describe exactly its block.
fn view_of(l: &Lease<Fake, View>) -> &View {
    let v = l.view().expect("a lease holds its block's view");
    assert_eq!(
        (v.seg, v.offset, v.len),
        (
            std::ptr::from_ref(l.segment()) as usize,
            l.offset(),
            l.block_size()
        ),
        "the view covers the block"
    );
    v
}

#[test]
fn a_cached_block_hands_out_the_view_it_kept() {
    for (cfg, small, large) in [
        (PoolConfig::default(), 4000, 64 * MIB),
        (PoolConfig::new(PoolKind::Binned), 4000, 64 * MIB),
        // No exact-size lists: blocks go through the best-fit arena.
        (pytorch(), 4000, 64 * MIB),
    ] {
        for bytes in [small, large] {
            let s = Counting::default();
            let p = viewed(cfg.clone());
            let a = p.alloc(bytes, 1, &s).unwrap();
            // A neighbour in use, so that the freed block never merges with free space.
            let guard = p.alloc(bytes, 1, &s).unwrap();
            let first = view_of(&a).serial;
            drop(a);
            for _ in 0..3 {
                let b = p.alloc(bytes, 1, &s).unwrap();
                assert_eq!(view_of(&b).serial, first, "{bytes} bytes: the same view");
            }
            assert_eq!(
                s.made(),
                2,
                "{bytes} bytes: no view made for a cached block"
            );
            check(&p);
            assert_eq!(s.live(), 2, "the view waits with its block");
            drop(guard);
            p.empty_cache();
            assert_eq!(s.live(), 0, "views go with their segments");
        }
    }
}

#[test]
fn a_split_or_merge_drops_the_views_it_makes_stale() {
    let s = Counting::default();
    // Every free is merged at once: the split and merge rules are visible.
    let p = viewed(pytorch());
    let a = p.alloc(KIB, 1, &s).unwrap();
    let b = p.alloc(KIB, 1, &s).unwrap();
    let (va, vb) = (view_of(&a).serial, view_of(&b).serial);
    assert_eq!(s.made(), 2);
    // `a` has no free neighbour: it keeps its placement and its view.
    drop(a);
    let a = p.alloc(KIB, 1, &s).unwrap();
    assert_eq!(view_of(&a).serial, va);
    // `b` merges with the free rest of the segment: its view no longer describes a block.
    drop(b);
    assert_eq!(s.live(), 1, "the merged block's view is gone");
    let b = p.alloc(KIB, 1, &s).unwrap();
    assert_ne!(view_of(&b).serial, vb, "a new view for the new placement");
    // Freed together, the blocks merge into the whole segment; a larger request splits it.
    drop((a, b));
    assert_eq!(s.live(), 0);
    let c = p.alloc(3 * KIB, 1, &s).unwrap();
    assert_eq!(view_of(&c).len, 3 * KIB);
    // A block carved from a cached one that is larger gets a view of its own size.
    drop(c);
    let d = p.alloc(KIB, 1, &s).unwrap();
    assert_eq!(view_of(&d).len, KIB);
    check(&p);
    drop(d);
    p.empty_cache();
    assert_eq!(s.live(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: usize, stream: u64 },
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..4 * KIB, 1u64..3).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        2 => (1usize..3 * MIB, 1u64..3).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        1 => (10 * MIB..30 * MIB, 1u64..3).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        4 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the sequence of allocations and frees, every lease's view covers exactly its
    /// block, no more views live than blocks, and none outlives the pool's segments.
    #[test]
    fn views_always_describe_their_block(ops in prop::collection::vec(op(), 1..200), kind in 0usize..4) {
        let cfg = match kind {
            0 => PoolConfig::default(),
            1 => pytorch(),
            2 => PoolConfig::default().with_max_split_size(24 * MIB),
            _ => PoolConfig::new(PoolKind::Binned),
        };
        let s = Counting::default();
        let p = viewed(cfg);
        let mut live: Vec<Lease<Fake, View>> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { bytes, stream } => {
                    let l = p.alloc(bytes, stream, &s).unwrap();
                    view_of(&l);
                    live.push(l);
                }
                Op::Free(i) if !live.is_empty() => {
                    let n = live.len();
                    drop(live.swap_remove(i % n));
                }
                Op::Free(_) => {}
            }
        }
        check(&p);
        for l in &live {
            view_of(l);
        }
        drop(live);
        p.empty_cache();
        prop_assert_eq!(p.stats().reserved.current, 0);
        prop_assert_eq!(s.live(), 0, "no view outlives its segment");
    }
}
