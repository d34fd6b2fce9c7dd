//! Tests of the schedule (`super`).

use super::*;

use crate::device::Inert;

/// A schedule of `len` operators over buffers `1..`, each of one name with these uses
/// (`(op, overwrite)`) and internal or not; buffer `k` is name `k - 1`.
fn schedule(len: usize, names: &[(&[(u32, bool)], bool)]) -> Schedule {
    let blobs = BlobUses {
        names: (0..names.len()).map(|n| format!("b{n}")).collect(),
        uses: names
            .iter()
            .map(|(l, _)| {
                l.iter()
                    .map(|&(op, overwrite)| Use { op, overwrite })
                    .collect()
            })
            .collect(),
        internal: names.iter().map(|&(_, i)| i).collect(),
        by_op: vec![SmallVec::new(); len],
        dead_after: vec![SmallVec::new(); len],
    };
    let buffers = (0..names.len())
        .map(|n| {
            let item: Weak<dyn Evictable> = Weak::<Inert>::new();
            let names = SmallVec::from_slice(&[n as u32]);
            let bytes = 0;
            (n + 1, Buffer { names, item, bytes })
        })
        .collect();
    Schedule {
        blobs: Arc::new(blobs),
        buffers,
        keys: (1..=names.len()).collect(),
        held: vec![None; names.len()],
        at: AtomicUsize::new(0),
        found: names.iter().map(|_| Weak::new()).collect(),
        looked_up: None,
        joined: Vec::new(),
    }
}

#[test]
fn next_uses_count_on_into_the_next_run() {
    let s = schedule(
        8,
        &[(&[(0, false), (5, false)], true), (&[(3, false)], true)],
    );
    assert_eq!(
        (s.next_use(1), s.next_use(2), s.next_use(3)),
        (Some(0), Some(3), None)
    );
    s.at(4);
    assert_eq!((s.next_use(1), s.next_use(2)), (Some(1), Some(7)));
    s.at(6);
    // Buffer 1 next at operator 0 of the next run.
    assert_eq!(s.next_use(1), Some(2));
}

#[test]
fn dead_until_overwritten_and_only_inside_the_net() {
    let s = schedule(
        6,
        &[
            // Written by 1, read by 4 (an activation): dead after 4 until the next run's 1.
            (&[(1, true), (4, false)], true),
            // The same, but an external output: never dead.
            (&[(1, true), (4, false)], false),
            // Read by 0, overwritten by 2 in the run, read by 3.
            (&[(0, false), (2, true), (3, false)], true),
        ],
    );
    // Before 1 writes it: dead (the next use overwrites it). Buffer 3 is read by 0, which
    // runs now.
    assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
    s.at(1);
    // 1 runs now and may have written it already.
    assert!(!s.is_dead(1) && s.is_dead(3));
    s.at(2);
    assert!(!s.is_dead(1) && !s.is_dead(3));
    s.at(5);
    // Past its last read: dead until the next run's write; never for the external one.
    assert!(s.is_dead(1) && !s.is_dead(2) && !s.is_dead(3));
    assert!(
        !s.is_dead(9),
        "a buffer the net does not use is not known dead"
    );
}

#[test]
fn a_buffer_of_two_names_is_dead_only_if_both_say_so() {
    let mut s = schedule(
        4,
        &[
            (&[(0, true), (2, false)], true),
            (&[(1, false), (2, true)], true),
        ],
    );
    // One buffer under both names.
    s.buffers.remove(&2);
    s.buffers.get_mut(&1).unwrap().names.push(1);
    s.at(3);
    // Next: name 0's overwrite at 0 (the next run's), before name 1's read at 1.
    assert!(s.is_dead(1));
    s.at(1);
    // Next: name 1's read at 1, running now: not dead.
    assert!(!s.is_dead(1));
    s.at(2);
    // At 2 name 0 is read and name 1 overwritten: a read.
    assert!(!s.is_dead(1));
    let mut t = schedule(4, &[(&[(2, true)], true), (&[(2, true)], false)]);
    t.buffers.remove(&2);
    t.buffers.get_mut(&1).unwrap().names.push(1);
    assert!(!t.is_dead(1), "one external name keeps it");
}

/// A mirror that counts the dead drops asked of it, freeing its bytes each time.
struct Counted(std::sync::atomic::AtomicUsize, usize);

impl Evictable for Counted {
    fn try_evict(&self) -> Option<usize> {
        None
    }
    fn try_spill(&self, _: bool) -> Option<crate::device::Freed> {
        None
    }
    fn try_drop_dead(&self, _: bool) -> Option<usize> {
        self.0.fetch_add(1, Relaxed);
        Some(self.1)
    }
    fn last_use(&self) -> u64 {
        0
    }
    fn head_now(&self) -> Option<crate::device::Head> {
        None
    }
    fn label_now(&self) -> String {
        String::new()
    }
    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

#[test]
fn under_a_cap_small_dead_values_are_left_to_the_out_of_memory_path() {
    // Two activations, each dead after operator 1 (overwritten by the next run's 0).
    let mut s = schedule(
        2,
        &[
            (&[(0, true), (1, false)], true),
            (&[(0, true), (1, false)], true),
        ],
    );
    Arc::get_mut(&mut s.blobs).unwrap().dead_after[1] = SmallVec::from_slice(&[0, 1]);
    let small = Arc::new(Counted(AtomicUsize::new(0), 100));
    let large = Arc::new(Counted(AtomicUsize::new(0), 4096));
    for (n, item) in [(0, &small), (1, &large)] {
        let weak: Weak<dyn Evictable> = Arc::downgrade(item) as Weak<dyn Evictable>;
        s.held[n] = Some(Held {
            item: weak,
            shared: false,
            bytes: item.1,
        });
    }
    let dev = Device::cpu();
    let dropped = Cell::new((0, 0));
    // The least a drop must free (a cap's share): the small value stays.
    s.drop_dead_after(1, &dev, &dropped, 1024);
    let counts = || (small.0.load(Relaxed), large.0.load(Relaxed));
    assert_eq!(counts(), (0, 1));
    assert_eq!(dropped.get(), (1, 4096));
    // No least (no cap, dead values dropped as asked): both go.
    s.drop_dead_after(1, &dev, &dropped, 0);
    assert_eq!(counts(), (1, 2));
    assert_eq!(dropped.get(), (3, 4096 * 2 + 100));
}

#[test]
fn buffers_new_to_the_schedule_and_dead_at_its_start_are_dropped_before_the_run() {
    // Three activations overwritten by operator 0 and read by 1, and one read by 0.
    let mut s = schedule(
        2,
        &[
            (&[(0, true), (1, false)], true),
            (&[(0, true), (1, false)], true),
            (&[(0, false), (1, true)], true),
            (&[(0, true), (1, false)], true),
        ],
    );
    let items: Vec<_> = [4096, 4096, 4096, 100]
        .into_iter()
        .map(|bytes| Arc::new(Counted(AtomicUsize::new(0), bytes)))
        .collect();
    for (n, item) in items.iter().enumerate() {
        let b = s.buffers.get_mut(&(n + 1)).unwrap();
        b.item = Arc::downgrade(item) as Weak<dyn Evictable>;
        b.bytes = item.1;
    }
    // The previous run knew the first: it went after its last use there.
    s.joined = vec![2, 3, 4];
    let dev = Device::cpu();
    let dropped = Cell::new((0, 0));
    s.drop_dead_joined(&dev, &dropped, 1024);
    let counts: Vec<usize> = items.iter().map(|i| i.0.load(Relaxed)).collect();
    // The second only: the third is read first, the fourth is under the least.
    assert_eq!(counts, [0, 1, 0, 0]);
    assert_eq!(dropped.get(), (1, 4096));
    s.drop_dead_joined(&dev, &dropped, 0);
    let counts: Vec<usize> = items.iter().map(|i| i.0.load(Relaxed)).collect();
    assert_eq!(counts, [0, 2, 0, 1]);
}

/// A blob `name` of `ws` holding a 4-element tensor of `dev` with storage of its own, or
/// sharing blob `from`'s; returns the key of its buffer.
fn blob(ws: &Workspace, dev: &Device, name: &str, from: Option<&str>) -> usize {
    let t = match from {
        Some(src) => {
            let src = ws.try_get_blob(src).unwrap();
            let src = src.read();
            let mut t = Tensor::new(dev);
            t.resize(&[4]).unwrap();
            t.share_data(src.get::<Tensor>().unwrap()).unwrap();
            t
        }
        None => Tensor::from_slice(&[4], &[1.0f32; 4], Some(dev)).unwrap(),
    };
    let key = t.synced().unwrap().key();
    ws.create_blob(name).unwrap().write().reset(t);
    key
}

/// The schedules of a net of two operators, each reading one internal blob of its own: `b0`
/// by operator 0, `b1` by operator 1.
fn two_names() -> Schedules {
    let mut blobs = schedule(2, &[(&[(0, false)], true), (&[(1, false)], true)])
        .blobs
        .as_ref()
        .clone_for_test();
    blobs.by_op = vec![SmallVec::from_slice(&[0]), SmallVec::from_slice(&[1])];
    Schedules::new(blobs)
}

#[test]
fn a_schedule_is_reused_and_follows_a_blob_to_its_new_buffer() {
    let dev = Device::cpu();
    let ws = Workspace::new();
    let a = blob(&ws, &dev, "b0", None);
    blob(&ws, &dev, "b1", None);
    let schedules = two_names();
    let first = schedules.current(&ws);
    assert_eq!(first.next_use(a), Some(0));
    // Read anew: every buffer is new to it.
    assert_eq!(first.joined.len(), 2);
    let first_ptr = Arc::as_ptr(&first);
    drop(first);
    // The same buffers: the same schedule, brought up to date in place.
    assert_eq!(Arc::as_ptr(&schedules.current(&ws)), first_ptr);
    // b1 now shares b0's buffer (a batch fed by sharing): one buffer of two names.
    assert_eq!(blob(&ws, &dev, "b1", Some("b0")), a);
    let s = schedules.current(&ws);
    assert_eq!(Arc::as_ptr(&s), first_ptr);
    assert_eq!(s.keys, vec![a, a]);
    assert_eq!(s.buffers.len(), 1);
    assert!(s.held.iter().all(|h| h.as_ref().is_some_and(|h| h.shared)));
    drop(s);
    // b1 back on a buffer of its own: the one buffer new to the schedule.
    let c = blob(&ws, &dev, "b1", None);
    let s = schedules.current(&ws);
    assert_eq!(Arc::as_ptr(&s), first_ptr);
    assert_eq!(s.joined, vec![c]);
    assert_eq!(s.buffers.len(), 2);
    assert!(s.held.iter().all(|h| h.as_ref().is_some_and(|h| !h.shared)));
    assert_eq!((s.next_use(a), s.next_use(c)), (Some(0), Some(1)));
    // While a run holds it, the next gets a schedule of its own.
    let other = schedules.current(&ws);
    assert!(!Arc::ptr_eq(&s, &other));
    assert_eq!(other.next_use(c), Some(1));
}

#[test]
fn a_schedule_looks_names_up_again_once_a_name_changed() {
    let dev = Device::cpu();
    let ws = Workspace::new();
    let a = blob(&ws, &dev, "b0", None);
    let b = blob(&ws, &dev, "b1", None);
    let schedules = two_names();
    assert_eq!(schedules.current(&ws).keys, vec![a, b]);
    // The same names: the blobs found last are read again, with what they hold now.
    let c = blob(&ws, &dev, "b1", None);
    assert_eq!(schedules.current(&ws).keys, vec![a, c]);
    // b1 removed and made again: another blob under the same name, found by a new lookup.
    assert!(ws.remove_blob("b1"));
    let d = blob(&ws, &dev, "b1", None);
    assert_eq!(schedules.current(&ws).keys, vec![a, d]);
    // b0 gone: no buffer for it.
    assert!(ws.remove_blob("b0"));
    assert_eq!(schedules.current(&ws).keys, vec![0, d]);
    // Another workspace, with no change of names in between: looked up there.
    let other = Workspace::new();
    let e = blob(&other, &dev, "b0", None);
    let f = blob(&other, &dev, "b1", None);
    let g = blob(&ws, &dev, "b0", None);
    assert_eq!(schedules.current(&other).keys, vec![e, f]);
    assert_eq!(schedules.current(&ws).keys, vec![g, d]);
}

#[test]
fn the_least_dead_value_dropped_at_once_is_a_share_of_the_cap_unless_all_are_asked_for() {
    use crate::alloc::pool::{MemoryCap, PoolConfig};
    let dev = Device::cpu().detached();
    let schedules = Schedules::new(BlobUses::new(&[], &BTreeSet::new()));
    let ws = Workspace::new();
    // No cap: nothing installed unless asked for, and then every dead value goes.
    assert!(Installed::when_needed(&dev, &schedules, &ws, false).is_none());
    let all = Installed::when_needed(&dev, &schedules, &ws, true).map(|i| i.min_bytes);
    assert_eq!(all, Some(0));
    dev.set_pool(PoolConfig::default().with_memory_cap(MemoryCap::Bytes(64 << 10)))
        .unwrap();
    let capped = Installed::when_needed(&dev, &schedules, &ws, false).map(|i| i.min_bytes);
    assert_eq!(capped, Some((64 << 10) / SMALL_DEAD as usize));
    let asked = Installed::when_needed(&dev, &schedules, &ws, true).map(|i| i.min_bytes);
    assert_eq!(asked, Some(0));
}
