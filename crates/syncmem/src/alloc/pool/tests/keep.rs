//! Owners kept for the leases of a stream (`Pool::alloc_with`): made once per stream and
//! shard, alive while a lease is out and until the stream is released, gone with a released
//! stream's last lease or when the pool retires.

use super::*;

/// An owner to keep (watched through its strong count) and how many times it was handed over.
struct Owner {
    value: Arc<u32>,
    made: AtomicUsize,
}

impl Owner {
    fn new() -> Self {
        Self {
            value: Arc::new(7),
            made: AtomicUsize::new(0),
        }
    }

    fn keep(&self) -> Keep {
        self.made.fetch_add(1, Ordering::SeqCst);
        self.value.clone()
    }

    /// Copies the pool holds.
    fn held(&self) -> usize {
        Arc::strong_count(&self.value) - 1
    }

    fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }
}

fn one_shard() -> Arc<Pool<Fake>> {
    pool(PoolConfig::default().with_shards(1))
}

fn kept_counts(p: &Pool<Fake>) -> Vec<(StreamId, usize, bool)> {
    p.shards[0].inner.lock().kept.counts()
}

#[test]
fn an_owner_is_handed_over_once_and_kept_until_the_stream_is_released() {
    let p = one_shard();
    let o = Owner::new();
    let a = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    let b = p
        .alloc_with(5000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    assert!(a.is_kept() && b.is_kept());
    assert_eq!(
        (o.made(), o.held()),
        (1, 1),
        "one owner for the stream's leases"
    );
    assert_eq!(kept_counts(&p), vec![(1, 2, false)]);
    drop((a, b));
    assert_eq!(
        o.held(),
        1,
        "kept past the leases, for the stream's next one"
    );
    let c = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    assert_eq!(o.made(), 1, "not handed over again");
    drop(c);
    p.release_stream(1);
    assert_eq!(o.held(), 0, "released with no lease out: gone at once");
    assert!(kept_counts(&p).is_empty());
    let d = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    assert_eq!(
        (o.made(), o.held()),
        (2, 1),
        "kept again once the stream allocates again"
    );
    drop(d);
    p.release_stream(1);
    assert_eq!(o.held(), 0);
}

#[test]
fn a_released_stream_s_owner_goes_with_its_last_lease() {
    let p = one_shard();
    let o = Owner::new();
    let a = p
        .alloc_with(1000, 3, &fake, None, Some(&|| o.keep()))
        .unwrap();
    let b = p
        .alloc_with(1000, 3, &fake, None, Some(&|| o.keep()))
        .unwrap();
    p.release_stream(3);
    assert_eq!(o.held(), 1, "leases are out: kept");
    assert_eq!(kept_counts(&p), vec![(3, 2, true)]);
    drop(a);
    assert_eq!(o.held(), 1, "one lease is still out");
    drop(b);
    assert_eq!(o.held(), 0, "gone with the last lease");
    assert!(kept_counts(&p).is_empty());
}

#[test]
fn streams_keep_owners_of_their_own() {
    let p = one_shard();
    let (o1, o2) = (Owner::new(), Owner::new());
    let a = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o1.keep()))
        .unwrap();
    let b = p
        .alloc_with(1000, 2, &fake, None, Some(&|| o2.keep()))
        .unwrap();
    assert_eq!((o1.held(), o2.held()), (1, 1));
    drop((a, b));
    p.release_stream(1);
    assert_eq!((o1.held(), o2.held()), (0, 1), "stream 2 is not released");
    p.release_stream(2);
    assert_eq!(o2.held(), 0);
}

#[test]
fn plain_and_host_stream_leases_keep_nothing() {
    let p = one_shard();
    let o = Owner::new();
    let host = p
        .alloc_with(1000, HOST_STREAM, &fake, None, Some(&|| o.keep()))
        .unwrap();
    let plain = p.alloc(1000, 1, &fake).unwrap();
    assert!(!host.is_kept() && !plain.is_kept());
    assert_eq!(o.made(), 0);
    assert!(kept_counts(&p).is_empty());
    drop((host, plain));
    p.release_stream(1);
}

#[test]
fn a_retired_pool_lets_every_owner_go() {
    let p = one_shard();
    let o = Owner::new();
    drop(
        p.alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
            .unwrap(),
    );
    assert_eq!(o.held(), 1);
    p.retire_if_idle(|_| -> Error { unreachable!("idle") }, |_| Ok(()))
        .unwrap();
    assert_eq!(o.held(), 0, "a retired pool hands nothing out any more");
    assert!(p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .is_err());
    assert_eq!(o.made(), 1);
}

#[test]
fn a_dropped_pool_lets_its_owners_go_with_its_blocks() {
    let p = one_shard();
    let o = Owner::new();
    let a = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    drop(
        p.alloc_with(1000, 2, &fake, None, Some(&|| o.keep()))
            .unwrap(),
    );
    assert_eq!(o.held(), 2);
    drop(p);
    assert_eq!(o.held(), 2, "the shard lives on with its block");
    drop(a);
    assert_eq!(
        o.held(),
        0,
        "the shard went with its last block, and its owners with it"
    );
}

#[test]
fn each_shard_counts_the_leases_it_handed_out() {
    let p = pool(PoolConfig::default().with_shards(2));
    let o = Owner::new();
    // New threads until one lands on each shard (threads are numbered for shards in turn).
    let mut by_shard: [Option<Lease<Fake>>; 2] = [None, None];
    for _ in 0..1000 {
        let l = std::thread::scope(|s| {
            s.spawn(|| {
                p.alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
                    .unwrap()
            })
            .join()
            .unwrap()
        });
        let i = l.shard().index;
        if by_shard[i].is_none() {
            by_shard[i] = Some(l);
        }
        if by_shard.iter().all(Option::is_some) {
            break;
        }
    }
    let [Some(a), Some(b)] = by_shard else {
        panic!("no thread was numbered for one of the shards");
    };
    assert_eq!((o.made(), o.held()), (2, 2), "one owner per shard");
    p.release_stream(1);
    drop(a);
    assert_eq!(o.held(), 1, "the other shard's lease is out");
    drop(b);
    assert_eq!(o.held(), 0);
}

#[test]
fn a_stream_allocating_again_after_its_release_is_kept_again() {
    let p = one_shard();
    let o = Owner::new();
    let a = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    p.release_stream(1);
    let b = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    assert_eq!(kept_counts(&p), vec![(1, 2, false)], "no longer released");
    drop((a, b));
    assert_eq!(o.held(), 1, "kept until the next release");
    p.release_stream(1);
    assert_eq!((o.made(), o.held()), (1, 0));
}

#[test]
fn a_refused_retirement_keeps_the_owners() {
    let p = one_shard();
    let o = Owner::new();
    let a = p
        .alloc_with(1000, 1, &fake, None, Some(&|| o.keep()))
        .unwrap();
    let busy = p.retire_if_idle(
        |used| Error::InvalidState {
            op: "retire",
            buffer: "test".into(),
            reason: format!("{used} bytes in use"),
        },
        |_| -> Result<()> { unreachable!("busy") },
    );
    assert!(busy.is_err() && !p.is_retired());
    assert_eq!(o.held(), 1);
    drop(a);
    assert_eq!(o.held(), 1);
    p.release_stream(1);
    assert_eq!(o.held(), 0);
}
