//! One block of the reduction as a thread computes it: the operands' tiles, packed into the
//! thread's panels or read in place, and the tile of C that the micro-kernels compute from
//! them (see the [parent](super)).

use super::kernel::{tile, tile_avx2};
use super::{Isa, Problem, Tile, MR, NR};

/// A row tile's operand: its first row, its rows, and where its values are (`A'(r, l)` at
/// `a[r*rsa + l*csa]`, from the block's first step).
#[derive(Clone, Copy)]
pub(super) struct Rows {
    i: usize,
    mm: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
}

/// A column tile's operand: its first column, its columns, and where its values are
/// (`B'(l, q)` at `b[l*rsb + q]`, from the block's first step).
#[derive(Clone, Copy)]
pub(super) struct Cols {
    j: usize,
    nn: usize,
    b: *const f32,
    rsb: usize,
}

/// One block of the reduction of a product (`kc` steps from `l0`), with the panels of its
/// packed operands.
pub(super) struct Block<'a> {
    pub(super) p: &'a Problem,
    pub(super) l0: usize,
    pub(super) kc: usize,
    pub(super) abuf: *mut f32,
    pub(super) bbuf: *mut f32,
}

impl Block<'_> {
    /// Packs the `mm` rows from row `i` into A panel `t`: `A'(i + r, l0 + l)` at
    /// `t*MR*kc + l*MR + r`, zeros past the last row.
    ///
    /// # Safety
    /// The rows lie inside A'; the A panels hold at least `t + 1` panels of `MR * kc` floats.
    pub(super) unsafe fn pack_rows(&self, (i, mm): (usize, usize), t: usize) {
        let p = self.p;
        // SAFETY: the caller's promise.
        unsafe {
            let panel = self.abuf.add(t * MR * self.kc);
            for l in 0..self.kc {
                let src = p.a.add(i * p.rsa + (self.l0 + l) * p.csa);
                let dst = panel.add(l * MR);
                if mm == MR && p.rsa == 1 {
                    // A whole tile of contiguous rows (`tn`: a row of dY): one copy.
                    std::ptr::copy_nonoverlapping(src, dst, MR);
                    continue;
                }
                for r in 0..MR {
                    *dst.add(r) = if r < mm { *src.add(r * p.rsa) } else { 0.0 };
                }
            }
        }
    }

    /// Packs the [`NR`] columns from column `j` into B panel `t`: `B'(l0 + l, j + q)` at
    /// `t*kc*NR + l*NR + q`. A transposed op(B) is packed for partial tiles too (`nn`
    /// columns, the rest of each row of the panel left as it was): each of its columns is
    /// a row of the stored matrix, read in order.
    ///
    /// # Safety
    /// The columns lie inside B'; the B panels hold at least `t + 1` panels of `kc * NR`
    /// floats.
    pub(super) unsafe fn pack_cols(&self, (j, nn): (usize, usize), t: usize) {
        let p = self.p;
        if p.tb {
            let panel = self.bbuf.wrapping_add(t * self.kc * NR);
            for q in 0..nn {
                // SAFETY: the caller's promise: column j + q of B' is row j + q of the
                // stored matrix, steps l0..l0 + kc inside it; the panel holds kc * NR floats.
                unsafe {
                    let src = p.b.add((j + q) * p.rsb + self.l0);
                    for l in 0..self.kc {
                        *panel.add(l * NR + q) = *src.add(l);
                    }
                }
            }
            return;
        }
        if nn < NR {
            return;
        }
        for l in 0..self.kc {
            // SAFETY: the caller's promise.
            unsafe {
                let src = p.b.add((self.l0 + l) * p.rsb + j);
                let dst = self.bbuf.add(t * self.kc * NR + l * NR);
                std::ptr::copy_nonoverlapping(src, dst, NR);
            }
        }
    }

    /// The row tile of `mm` rows from row `i`: in A panel `panel`, or in A' itself.
    ///
    /// # Safety
    /// The rows lie inside A'; a panel named was packed.
    pub(super) unsafe fn rows(&self, i: usize, mm: usize, panel: Option<usize>) -> Rows {
        let p = self.p;
        // SAFETY: the caller's promise.
        unsafe {
            match panel {
                Some(t) => Rows {
                    i,
                    mm,
                    a: self.abuf.add(t * MR * self.kc),
                    rsa: 1,
                    csa: MR,
                },
                None => Rows {
                    i,
                    mm,
                    a: p.a.add(i * p.rsa + self.l0 * p.csa),
                    rsa: p.rsa,
                    csa: p.csa,
                },
            }
        }
    }

    /// The column tile of `nn` columns from column `j`: in B panel `panel`, or in B' itself.
    ///
    /// # Safety
    /// The columns lie inside B'; a panel named was packed.
    pub(super) unsafe fn cols(&self, j: usize, nn: usize, panel: Option<usize>) -> Cols {
        let p = self.p;
        // SAFETY: the caller's promise.
        unsafe {
            match panel {
                Some(t) => Cols {
                    j,
                    nn,
                    b: self.bbuf.add(t * self.kc * NR),
                    rsb: NR,
                },
                None => Cols {
                    j,
                    nn,
                    b: p.b.add(self.l0 * p.rsb + j),
                    rsb: p.rsb,
                },
            }
        }
    }

    /// Computes the tile of rows `a` and columns `b` over this block.
    ///
    /// # Safety
    /// The tile lies inside C'; this thread alone writes it; the CPU has the problem's
    /// micro-kernels.
    pub(super) unsafe fn tile(&self, a: Rows, b: Cols) {
        let p = self.p;
        let t = Tile {
            a: a.a,
            rsa: a.rsa,
            csa: a.csa,
            b: b.b,
            rsb: b.rsb,
            kc: self.kc,
            // SAFETY: (i, j) is inside C'.
            c: unsafe { p.c.add(a.i * p.rsc + b.j * p.csc) },
            rsc: p.rsc,
            csc: p.csc,
            beta: p.beta,
            first: self.l0 == 0,
        };
        // SAFETY: the caller's promise.
        unsafe {
            // A tile at C's right edge (fewer than NR columns) too, with masked loads.
            if p.isa == Isa::Avx2 {
                return tile_avx2(t, (a.mm, b.nn));
            }
            let nn = b.nn;
            match a.mm {
                12 => tile::<12>(t, nn),
                11 => tile::<11>(t, nn),
                10 => tile::<10>(t, nn),
                9 => tile::<9>(t, nn),
                8 => tile::<8>(t, nn),
                7 => tile::<7>(t, nn),
                6 => tile::<6>(t, nn),
                5 => tile::<5>(t, nn),
                4 => tile::<4>(t, nn),
                3 => tile::<3>(t, nn),
                2 => tile::<2>(t, nn),
                _ => tile::<1>(t, nn),
            }
        }
    }
}
