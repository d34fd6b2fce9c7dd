//! A process-wide cache of values built once per key: the compiled kernels of a device (or of
//! a device and an element type).
//!
//! A build runs at most once at a time per key; builds for different keys do not wait for each
//! other (the map's lock is released before building); a failed build is not cached, so the
//! next call tries again (a runtime that appears later, a transient out-of-memory).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;

type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

/// Values of type `T` built on first use, one per key `K`, kept for the life of the process.
pub(crate) struct BuildCache<K, T> {
    slots: Mutex<BTreeMap<K, Slot<T>>>,
}

impl<K: Ord, T> BuildCache<K, T> {
    /// An empty cache (usable in a `static`).
    pub(crate) const fn new() -> Self {
        Self {
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    /// The value of `key`, built by `build` if there is none yet.
    ///
    /// # Errors
    /// The error of `build`; nothing is cached then.
    pub(crate) fn get_or_build(&self, key: K, build: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
        let slot = self.slots.lock().entry(key).or_default().clone();
        let mut entry = slot.lock();
        if let Some(v) = entry.as_ref() {
            return Ok(v.clone());
        }
        let built = Arc::new(build()?);
        *entry = Some(built.clone());
        Ok(built)
    }

    /// True when a value for `key` was built.
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &K) -> bool {
        let slot = self.slots.lock().get(key).cloned();
        slot.is_some_and(|s| s.lock().is_some())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Barrier;

    use super::*;
    use crate::error::Error;

    fn failure() -> Error {
        Error::InvalidConfig {
            what: "test build".into(),
            reason: "fails on purpose".into(),
        }
    }

    #[test]
    fn builds_once_per_key_and_does_not_cache_failures() {
        let cache: BuildCache<&str, usize> = BuildCache::new();
        let builds = AtomicUsize::new(0);
        let build = |v: usize| {
            builds.fetch_add(1, SeqCst);
            Ok(v)
        };
        let a = cache.get_or_build("a", || build(1)).unwrap();
        let again = cache.get_or_build("a", || build(2)).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!((*again, builds.load(SeqCst)), (1, 1));

        assert!(cache.get_or_build("b", || Err(failure())).is_err());
        assert!(!cache.contains(&"b"));
        assert_eq!(*cache.get_or_build("b", || build(3)).unwrap(), 3);
        assert!(cache.contains(&"b"));
        assert_eq!(builds.load(SeqCst), 2);
    }

    #[test]
    fn concurrent_callers_of_one_key_share_one_build() {
        let cache: BuildCache<u8, usize> = BuildCache::new();
        let builds = AtomicUsize::new(0);
        let start = Barrier::new(8);
        let values: Vec<Arc<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let (cache, builds, start) = (&cache, &builds, &start);
                    s.spawn(move || {
                        start.wait();
                        cache
                            .get_or_build(0, || {
                                builds.fetch_add(1, SeqCst);
                                Ok(i)
                            })
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(builds.load(SeqCst), 1);
        assert!(values.iter().all(|v| Arc::ptr_eq(v, &values[0])));
    }

    #[test]
    fn a_slow_build_does_not_block_other_keys() {
        let cache: BuildCache<u8, u8> = BuildCache::new();
        let (entered, release) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            let slow = s.spawn(|| {
                cache.get_or_build(1, || {
                    entered.wait();
                    // Key 2 is built by the other thread while this build is in progress.
                    release.wait();
                    Ok(1)
                })
            });
            entered.wait();
            assert_eq!(*cache.get_or_build(2, || Ok(2)).unwrap(), 2);
            release.wait();
            assert_eq!(*slow.join().unwrap().unwrap(), 1);
        });
    }
}
