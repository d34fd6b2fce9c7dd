//! Placement under a cap: small requests keep whole the segments made for one larger block
//! (the blocks a program frees and asks for again), and get small segments of their own while
//! the cap allows; when it does not, the storage decides whether such a segment is split.

use super::*;

/// A storage that refuses to let whole segments be split (as a device's does before its
/// out-of-memory path has freed what it can).
struct Strict;

impl RawStorage for Strict {
    type Segment = Fake;
    type View = ();

    fn alloc(&self, bytes: usize) -> Result<Fake> {
        Ok(Fake(bytes))
    }

    fn view(&self, _: &Arc<Fake>, _: usize, _: usize) -> Result<()> {
        Ok(())
    }

    fn may_split_whole(&self) -> bool {
        false
    }
}

/// A default pool of one shard under a cap of `cap` bytes (`None`: no cap).
fn capped(cap: Option<u64>) -> Arc<Pool<Fake>> {
    Pool::new(
        "capped",
        PoolConfig::default().with_shards(1),
        Arc::new(Budget::new(cap)),
        usize::MAX,
    )
    .unwrap()
}

/// A 16 KiB block allocated and freed: the pool holds one whole 16 KiB segment made for it.
fn with_a_free_fitted_segment(p: &Arc<Pool<Fake>>) {
    let big = p.alloc(16 * KIB, 1, &fake).unwrap();
    assert_eq!(big.segment().0, 16 * KIB);
    drop(big);
}

#[test]
fn under_a_cap_a_small_request_keeps_a_fitted_segment_whole() {
    let p = capped(Some(64 * KIB as u64));
    with_a_free_fitted_segment(&p);
    let small = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(small.segment().0, 4 * KIB, "a small segment of its own");
    let again = p.alloc(16 * KIB, 1, &fake).unwrap();
    assert_eq!(again.segment().0, 16 * KIB);
    let s = p.stats();
    assert_eq!((s.backend_allocs, s.cache_hits), (2, 1), "{s}");
    // Small requests share the small segment.
    let more: Vec<_> = (0..7).map(|_| p.alloc(512, 1, &fake).unwrap()).collect();
    assert!(more.iter().all(|l| l.segment().0 == 4 * KIB));
    assert_eq!(p.stats().backend_allocs, 2);
    drop((small, again, more));
}

#[test]
fn without_a_cap_a_small_request_splits_a_free_segment() {
    let p = capped(None);
    with_a_free_fitted_segment(&p);
    let small = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(small.segment().0, 16 * KIB);
    assert_eq!(p.stats().backend_allocs, 1);
}

#[test]
fn when_the_cap_refuses_a_small_segment_the_fitted_one_is_split() {
    let p = capped(Some(16 * KIB as u64));
    with_a_free_fitted_segment(&p);
    let small = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(small.segment().0, 16 * KIB, "split, rather than refused");
    assert_eq!(p.stats().backend_allocs, 1);
}

#[test]
fn a_storage_may_refuse_to_split_a_fitted_segment() {
    let p = capped(Some(16 * KIB as u64));
    let big = p.alloc(16 * KIB, 1, &Strict).unwrap();
    drop(big);
    let e = p.alloc(512, 1, &Strict).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // The segment kept whole serves its size.
    let big = p.alloc(16 * KIB, 1, &Strict).unwrap();
    assert_eq!(big.segment().0, 16 * KIB);
    drop(big);
    // And the default storage takes it.
    let small = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(small.segment().0, 16 * KIB);
}

#[test]
fn near_the_cap_a_small_segment_takes_the_room_left() {
    // 16 KiB + a 4 KiB small segment, then 2.5 KiB of room: a 512-byte request that finds no
    // room gets a segment of the room left (rounded down to the 512-byte unit), not of 512.
    let p = capped(Some(22 * KIB as u64 + 512));
    let big = p.alloc(16 * KIB, 1, &fake).unwrap();
    let small: Vec<_> = (0..8).map(|_| p.alloc(512, 1, &fake).unwrap()).collect();
    assert!(small.iter().all(|l| l.segment().0 == 4 * KIB));
    let next = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(next.segment().0, 2 * KIB + 512);
    let after: Vec<_> = (0..4).map(|_| p.alloc(512, 1, &fake).unwrap()).collect();
    assert!(after.iter().all(|l| l.segment().0 == 2 * KIB + 512));
    assert_eq!(p.stats().backend_allocs, 3);
    drop((big, small, next, after));
}

#[test]
fn idle_release_before_growth_spares_a_kept_segment() {
    // A pool that gives idle segments back before it grows (the default, 6 %) keeps the
    // fitted segment a small request passed over: its size is asked for again.
    let p = capped(Some(64 * KIB as u64));
    with_a_free_fitted_segment(&p);
    let small = p.alloc(512, 1, &fake).unwrap();
    assert_eq!(
        p.stats().reserved.current,
        20 * KIB as u64,
        "both segments kept"
    );
    drop(small);
}

#[test]
fn a_release_for_enough_only_gives_back_nothing_unless_it_can_give_back_enough() {
    let p = capped(Some(64 * KIB as u64));
    // Two idle 4 KiB segments (small blocks freed) and one 16 KiB segment in use.
    let small: Vec<_> = (0..16).map(|_| p.alloc(512, 1, &fake).unwrap()).collect();
    let big = p.alloc(16 * KIB, 1, &fake).unwrap();
    drop(small);
    let reserved = p.stats().reserved.current;
    assert_eq!(reserved, 24 * KIB as u64);
    // 12 KiB asked for: the 8 KiB idle cannot make that room, so nothing goes.
    assert_eq!(
        p.release_at_least_sparing(12 * KIB as u64, usize::MAX, true),
        0
    );
    assert_eq!(p.stats().reserved.current, reserved);
    // Without the condition, what can go goes.
    assert_eq!(
        p.release_at_least_sparing(12 * KIB as u64, usize::MAX, false),
        8 * KIB as u64
    );
    drop(big);
    // With enough idle, as much as asked for (whole segments, largest first).
    assert_eq!(
        p.release_at_least_sparing(KIB as u64, usize::MAX, true),
        16 * KIB as u64
    );
    assert_eq!(p.stats().reserved.current, 0);
}
