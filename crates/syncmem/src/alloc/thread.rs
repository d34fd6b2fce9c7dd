//! The calling thread's index: what spreads threads over a pool's shards and over the
//! stripes of the memory counters, so that threads allocating at once write cache lines of
//! their own; and [`Published`], a value they all read without writing.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// A flag of the calling thread set until dropped, then put back as it was, even when the
/// code it wraps unwinds: the settings a call makes for the calls below it on its thread (quiet
/// refusals, unobserved attempts, whether whole segments may be split).
pub(crate) struct SetFlag {
    key: &'static std::thread::LocalKey<Cell<bool>>,
    old: bool,
}

impl SetFlag {
    /// Sets `key` to `now` until the guard is dropped.
    pub(crate) fn new(key: &'static std::thread::LocalKey<Cell<bool>>, now: bool) -> SetFlag {
        SetFlag {
            key,
            old: key.with(|c| c.replace(now)),
        }
    }
}

impl Drop for SetFlag {
    fn drop(&mut self) {
        self.key.with(|c| c.set(self.old));
    }
}

/// Stripes of the memory counters: threads with indexes apart by less than
/// this write cache lines apart.
pub(crate) const STRIPES: usize = 8;

/// A value alone in its cache lines (two, for the adjacent-line prefetcher): one stripe.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's index among the threads that asked (first come, first numbered).
#[inline]
pub(crate) fn index() -> usize {
    THREAD.with(|t| {
        let i = t.get();
        if i != usize::MAX {
            return i;
        }
        let i = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        t.set(i);
        i
    })
}

/// A value read on every allocation and almost never replaced (a device's pool), read with
/// one load and no write: threads reading at once share its cache line read-only.
///
/// Every value published stays allocated, at its address, until the slot is dropped, so a
/// reference read from the slot stays valid for the slot's lifetime even after a newer value
/// replaced it. A replaced value is the caller's to retire (a retired pool refuses work, and
/// its readers read the slot again): use it for values replaced a bounded number of times.
pub(crate) struct Published<T> {
    /// The value last published (null before the first).
    current: AtomicPtr<T>,
    /// Every value published (from `Box::into_raw`), freed when the slot is dropped.
    kept: Mutex<Vec<*mut T>>,
}

// SAFETY: the slot hands out `&T` to every thread (`T: Sync`) and drops the values on the
// thread that drops the slot (`T: Send`); the raw pointers are owned boxes, touched only
// under `kept`'s lock or read through `current` as shared references.
unsafe impl<T: Send + Sync> Send for Published<T> {}
// SAFETY: as for `Send`: readers get shared references only.
unsafe impl<T: Send + Sync> Sync for Published<T> {}

impl<T> Published<T> {
    /// Empty: [`Published::load`] gives `None` until the first [`Published::publish`].
    pub(crate) const fn new() -> Self {
        Self {
            current: AtomicPtr::new(std::ptr::null_mut()),
            kept: Mutex::new(Vec::new()),
        }
    }

    /// The value last published.
    #[inline]
    pub(crate) fn load(&self) -> Option<&T> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null `current` is a box of `kept` (stored after it was initialised,
        // with release ordering, and read with acquire), freed only when `self` is dropped,
        // and never written after it was published: a shared reference for `&self`'s
        // lifetime is valid.
        unsafe { p.as_ref() }
    }

    /// Publishes `value`: later loads give it. The values published before stay where they
    /// are until the slot is dropped.
    pub(crate) fn publish(&self, value: T) -> &T {
        let mut kept = self.kept.lock();
        let p = Box::into_raw(Box::new(value));
        kept.push(p);
        self.current.store(p, Ordering::Release);
        // SAFETY: just made from a box that `kept` keeps until `self` is dropped.
        unsafe { &*p }
    }
}

impl<T> Default for Published<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for Published<T> {
    fn drop(&mut self) {
        for p in self.kept.get_mut().drain(..) {
            // SAFETY: every pointer of `kept` came from `Box::into_raw` and is freed once,
            // here; `&mut self` means no reference read from the slot is alive.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_keeps_its_index_and_threads_differ() {
        let here = super::index();
        assert_eq!(super::index(), here);
        let there = std::thread::spawn(super::index).join().unwrap();
        assert_ne!(here, there);
    }

    #[test]
    fn every_thread_reads_the_value_last_published_and_old_values_stay() {
        let s = super::Published::new();
        assert!(s.load().is_none());
        let first: &String = s.publish("one".to_string());
        let seen = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2 * super::STRIPES)
                .map(|_| sc.spawn(|| s.load().cloned()))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert!(seen.iter().all(|v| v.as_deref() == Some("one")), "{seen:?}");
        s.publish("two".to_string());
        let later = std::thread::scope(|sc| sc.spawn(|| s.load().cloned()).join().unwrap());
        assert_eq!(later.as_deref(), Some("two"));
        // A reference read before the replacement still reads its value.
        assert_eq!(first, "one");
    }

    #[test]
    fn a_reader_racing_publications_sees_a_whole_value() {
        let s = super::Published::new();
        s.publish(vec![0u64; 64]);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for i in 1..200u64 {
                    s.publish(vec![i; 64]);
                }
            });
            for _ in 0..2000 {
                let v = s.load().expect("published");
                assert!(v.iter().all(|&x| x == v[0]), "a torn value");
            }
        });
        assert_eq!(s.load().map(|v| v[0]), Some(199));
    }
}
