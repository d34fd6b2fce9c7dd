//! Values built once ([`BuildOnce`]): the compiled kernels of a device (one slot per device and
//! kind of kernels), the PTX of a CUDA source (one per process).
//!
//! A build runs at most once at a time per slot; a failed build is not kept, so the next call
//! tries again (a runtime that appears later, a transient out-of-memory).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;

/// A value built on first use and kept; a failed build is not kept.
pub(crate) struct BuildOnce<T> {
    slot: Mutex<Option<Arc<T>>>,
}

impl<T> Default for BuildOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> BuildOnce<T> {
    /// An empty slot (usable in a `static`).
    pub(crate) const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// The value, built by `build` if there is none yet. Concurrent callers wait for one build.
    ///
    /// # Errors
    /// The error of `build`; nothing is kept then.
    pub(crate) fn get_or_build(&self, build: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
        let mut slot = self.slot.lock();
        if let Some(v) = slot.as_ref() {
            return Ok(v.clone());
        }
        let built = Arc::new(build()?);
        *slot = Some(built.clone());
        Ok(built)
    }

    /// The value if it was built.
    #[allow(dead_code)]
    pub(crate) fn get(&self) -> Option<Arc<T>> {
        self.slot.lock().clone()
    }
}

/// Values built once per key (the user's kernels: by source, by name), each in a
/// [`BuildOnce`] of its own: a build for one key never waits for another key's.
pub(crate) struct BuildMap<K, T> {
    slots: Mutex<HashMap<K, Arc<BuildOnce<T>>>>,
}

impl<K, T> Default for BuildMap<K, T> {
    fn default() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, T> BuildMap<K, T> {
    /// The slot of `key` (made empty on first use).
    pub(crate) fn slot(&self, key: K) -> Arc<BuildOnce<T>> {
        self.slots.lock().entry(key).or_default().clone()
    }

    /// The slot of a borrowed `key`, which is copied only on first use.
    pub(crate) fn slot_of<Q>(&self, key: &Q) -> Arc<BuildOnce<T>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get(key) {
            return slot.clone();
        }
        slots.entry(key.to_owned()).or_default().clone()
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
    fn build_once_keeps_the_first_success_only() {
        let once: BuildOnce<usize> = BuildOnce::new();
        assert!(once.get_or_build(|| Err(failure())).is_err());
        assert!(once.get().is_none(), "a failure is not kept");
        let a = once.get_or_build(|| Ok(1)).unwrap();
        let b = once.get_or_build(|| Ok(2)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*b, 1);
    }

    #[test]
    fn concurrent_callers_share_one_build() {
        let once: BuildOnce<usize> = BuildOnce::new();
        let builds = AtomicUsize::new(0);
        let start = Barrier::new(8);
        let values: Vec<Arc<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let (once, builds, start) = (&once, &builds, &start);
                    s.spawn(move || {
                        start.wait();
                        once.get_or_build(|| {
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
}
