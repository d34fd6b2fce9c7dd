//! Element-wise work split between the `cpu` backend's threads (see [`super::team`]: the
//! machine's cores, at most 4, the calling thread one of them), which the GEMM uses too.
//!
//! Work of at least [`THREADED_ELEMENTS`] elements is cut into one contiguous part per thread,
//! each starting at a multiple of [`ALIGN`] elements (for `f32` on a 64-byte aligned start,
//! no two threads write one cache line); smaller work runs on the calling thread, where a
//! wake-up of the other threads (microseconds) would cost more than it saves. Every element is
//! computed by the same code whichever part it falls in: the results do not depend on the
//! number of threads.
//!
//! Work started from inside a part (a nested split) runs on its own thread.

use std::ops::Range;

use parking_lot::Mutex;

use super::team::{in_part, team, MAX_THREADS};

/// Elements of element-wise work (an SGD update, a ReLU, ...) from which it is split between
/// the threads: 256 KiB of `f32`, tens of microseconds of memory traffic on one core.
pub(crate) const THREADED_ELEMENTS: usize = 1 << 16;

/// Parts start at multiples of this many elements.
const ALIGN: usize = 16;

/// Work that splits in two at an element index: slices, index ranges, tuples of them (of one
/// length, cut at the same index) and rows of them.
pub(crate) trait Split: Sized + Send {
    /// Elements (the fewest of its members', for a tuple: cuts stay inside every member).
    fn items(&self) -> usize;
    /// The first `mid` elements and the rest.
    fn cut(self, mid: usize) -> (Self, Self);
}

impl<T: Sync> Split for &[T] {
    fn items(&self) -> usize {
        <[T]>::len(self)
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        <[T]>::split_at(self, mid)
    }
}

impl<T: Send> Split for &mut [T] {
    fn items(&self) -> usize {
        <[T]>::len(self)
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        self.split_at_mut(mid)
    }
}

impl Split for Range<usize> {
    fn items(&self) -> usize {
        self.end.saturating_sub(self.start)
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        let cut = (self.start + mid).min(self.end);
        (self.start..cut, cut..self.end)
    }
}

impl<A: Split, B: Split> Split for (A, B) {
    fn items(&self) -> usize {
        self.0.items().min(self.1.items())
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.cut(mid);
        let (b0, b1) = self.1.cut(mid);
        ((a0, b0), (a1, b1))
    }
}

impl<A: Split, B: Split, C: Split> Split for (A, B, C) {
    fn items(&self) -> usize {
        self.0.items().min(self.1.items()).min(self.2.items())
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.cut(mid);
        let (b0, b1) = self.1.cut(mid);
        let (c0, c1) = self.2.cut(mid);
        ((a0, b0, c0), (a1, b1, c1))
    }
}

/// `S` seen as rows of `cols` elements: its length and its cuts count whole rows.
pub(crate) struct Rows<S> {
    pub(crate) s: S,
    pub(crate) cols: usize,
}

impl<S: Split> Split for Rows<S> {
    fn items(&self) -> usize {
        self.s.items() / self.cols.max(1)
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        let cols = self.cols;
        let (a, b) = self.s.cut(mid * cols);
        (Rows { s: a, cols }, Rows { s: b, cols })
    }
}

/// Runs `f` on `s`: on one part per thread of the [`team`] when `threaded` (the caller's
/// measure of the work, e.g. at least [`THREADED_ELEMENTS`] elements) and the machine has
/// more than one core, else on the calling thread at once.
pub(crate) fn for_parts<S: Split>(s: S, threaded: bool, f: &(dyn Fn(S) + Sync)) {
    let team = team();
    let threads = team.threads();
    if !threaded || threads == 1 || s.items() < 2 * ALIGN || in_part() {
        f(s);
        return;
    }
    // One contiguous piece per thread, cut at multiples of ALIGN; each part takes its piece.
    let pieces: [Mutex<Option<S>>; MAX_THREADS] = std::array::from_fn(|_| Mutex::new(None));
    let mut rest = s;
    for (i, piece) in pieces.iter().enumerate().take(threads) {
        let left = threads - i;
        let (a, b) = if left == 1 {
            let n = rest.items();
            rest.cut(n)
        } else {
            let mid = (rest.items() / left)
                .next_multiple_of(ALIGN)
                .min(rest.items());
            rest.cut(mid)
        };
        *piece.lock() = Some(a);
        rest = b;
    }
    team.run(threads, &|i| {
        let piece = pieces[i].lock().take();
        if let Some(p) = piece {
            f(p);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_element_once_at_aligned_cuts() {
        for n in [0, 1, 31, 32, 33, 1000, THREADED_ELEMENTS + 5] {
            let mut out = vec![0u32; n];
            let x: Vec<u32> = (0..n as u32).collect();
            for_parts((&x[..], &mut out[..], 0..n), true, &|(x, y, r)| {
                assert_eq!((x.len(), y.len()), (r.len(), r.len()));
                assert!(r.start % ALIGN == 0 || r.start == n, "{r:?}");
                for ((o, &v), i) in y.iter_mut().zip(x).zip(r) {
                    assert_eq!(v as usize, i);
                    *o += v + 1;
                }
            });
            assert!(out.iter().enumerate().all(|(i, &v)| v as usize == i + 1));
        }
    }

    #[test]
    fn a_split_inside_a_part_runs_on_its_thread() {
        let n = 4 * THREADED_ELEMENTS;
        let mut out = vec![0u8; n];
        let inner = std::sync::atomic::AtomicUsize::new(0);
        for_parts(&mut out[..], true, &|part| {
            assert!(in_part());
            // A nested split: it runs on the thread of its part.
            for_parts(part, true, &|p| {
                inner.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                p.fill(1);
            });
        });
        assert!(!in_part());
        assert!(out.iter().all(|&v| v == 1));
        assert_eq!(
            inner.into_inner(),
            team().threads(),
            "one inner call per part"
        );
    }

    #[test]
    fn rows_are_cut_whole() {
        let cols = 3;
        let mut m = vec![0usize; cols * 1001];
        for_parts(
            Rows {
                s: &mut m[..],
                cols,
            },
            true,
            &|r| {
                assert_eq!(r.s.len() % cols, 0);
                for row in r.s.chunks_exact_mut(cols) {
                    row.iter_mut().for_each(|v| *v += 1);
                }
            },
        );
        assert!(m.iter().all(|&v| v == 1));
    }
}
