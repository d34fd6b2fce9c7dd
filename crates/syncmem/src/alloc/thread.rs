//! The calling thread's index: what spreads threads over a pool's shards, over the stripes
//! of the memory counters and over the copies of a [`Striped`] value, so that threads
//! allocating at once write cache lines of their own.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

/// Stripes of [`Striped`] and of the memory counters: threads with indexes apart by less than
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

/// A value read on every allocation and almost never replaced (a device's pool): one copy
/// behind a lock of its own per stripe. A reader read-locks its thread's stripe only, so
/// threads reading at once write no shared lock word; a replacement write-locks every stripe
/// (all held together) and replaces every copy, so no reader sees a stripe mid-change.
pub(crate) struct Striped<T> {
    stripes: [Padded<RwLock<Option<T>>>; STRIPES],
}

impl<T: Clone> Striped<T> {
    /// Empty (every stripe `None`).
    pub(crate) fn new() -> Self {
        Self {
            stripes: std::array::from_fn(|_| Padded(RwLock::new(None))),
        }
    }

    /// The calling thread's copy, read-locked: a replacement waits until it is dropped.
    #[inline]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Option<T>> {
        self.stripes[index() % STRIPES].0.read()
    }

    /// A clone of the value.
    pub(crate) fn get(&self) -> Option<T> {
        self.read().clone()
    }

    /// Replaces the value in every stripe; returns the old one.
    pub(crate) fn replace(&self, value: Option<T>) -> Option<T> {
        self.replace_with(|_| Ok::<_, ()>(value))
            .unwrap_or_else(|()| unreachable!("the replacement cannot fail"))
    }

    /// Replaces the value in every stripe by what `f` makes of the current one, with every
    /// stripe write-locked from the call of `f` to the replacement (no reader in between);
    /// returns the old value, or `f`'s error (nothing replaced).
    pub(crate) fn replace_with<E>(
        &self,
        f: impl FnOnce(Option<&T>) -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        let mut guards: Vec<_> = self.stripes.iter().map(|s| s.0.write()).collect();
        let value = f(guards[0].as_ref())?;
        let old = guards[0].clone();
        for g in &mut guards {
            **g = value.clone();
        }
        Ok(old)
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
    fn every_thread_reads_the_value_last_put() {
        let s = super::Striped::new();
        assert_eq!(s.get(), None);
        assert_eq!(s.replace(Some(1)), None);
        let seen = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2 * super::STRIPES)
                .map(|_| sc.spawn(|| *s.read()))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert!(seen.iter().all(|&v| v == Some(1)), "{seen:?}");
        assert_eq!(s.replace(Some(2)), Some(1));
        let later = std::thread::spawn(move || s.get()).join().unwrap();
        assert_eq!(later, Some(2));
    }
}
