//! The `cpu` backend's own f32 GEMM for x86-64 CPUs with AVX-512F, or AVX2 and FMA: W, the
//! large operand of an FC layer, is never copied whole; no heap allocation in a steady state;
//! threads that stay up.
//!
//! `C = op(A)·op(B) + beta·C` (row-major):
//!
//! - `nn` (an FC layer's `dX = dY·W`) and `tn` (its `dW = dYᵀ·X`): a register-blocked
//!   micro-kernel computes a [`MR`] x [`NR`] tile of C from `MR` broadcast values of op(A) and
//!   two 16-float vectors of a row of op(B) per step of the reduction (24 accumulators). An
//!   operand whose values a tile reads far apart is copied a block at a time into small
//!   contiguous panels of the thread (rows of W 4 KiB apart at width 1024 map to a few cache
//!   sets): 32 columns of W's rows for a column tile, 12 columns of dYᵀ for a row tile.
//! - `nt` (the forward product `Y = X·Wᵀ`): both operands run along the reduction, so tiles of
//!   4 rows of X and 4 rows of W sum 16 vectors of 16 products each and add each vector up at
//!   the end. Nothing is copied; each thread reads its part of W once per block of 64 rows of X.
//!   Short reductions (fewer than [`NT_DOT_MIN_K`] steps: the first layer's 2 inputs, and
//!   every layer at hidden 64) run as tiles instead, with W (short rows) copied transposed,
//!   8 x 8 values at a time through registers (`kernel::transpose`: at hidden 64 the
//!   element-wise copy was about 5% of a `cpu` training step).
//! - A product with fewer columns than a tile and more rows, whose op(A) has contiguous
//!   columns (the first layer's `dW`, 1024 x 2), runs as its transpose, so that its long side
//!   fills the vectors.
//! - `tt` is left to `matrixmultiply` (no operator of this crate runs it), as is every product
//!   on a CPU with neither AVX-512F nor AVX2 (`matrixmultiply` packs its operands into buffers
//!   it allocates on every call), or when `SYNCMEM_CPU_GEMM=matrixmultiply`.
//!
//! Without AVX-512F ([`Isa::Avx2`], or `SYNCMEM_CPU_GEMM=avx2`), the same tiles are computed
//! as sub-tiles of 6 rows by 16 columns in 8-float vectors, and the `nt` dot products with two
//! 8-float accumulators for each vector of 16 lanes, added up in the same order; short `nt`
//! reductions run as tiles, W's rows packed transposed into the thread's column panels a block
//! at a time. Each element is summed in the same order as with AVX-512: every product gives
//! the same bits with either ISA (tested), so training on `cpu` ends with the same loss on both
//! kinds of CPU. Measured on the same VM with `SYNCMEM_CPU_GEMM=avx2` (before the AVX2 edge
//! tiles and dot products), against `matrixmultiply` built with only its AVX2 + FMA kernel
//! (`MMTEST_FEATURE=fma,avx2`), GEMM rows in the same runs: hidden 1024 forward 155-158
//! GFLOP/s against 133-150, backward 213-228 against 158-180, both 189-199 against 155-161;
//! hidden 256 both 159-162 against 105-155; hidden 64 89-93 against 78-81; no heap allocation
//! per step against 8.
//!
//! The reduction runs in blocks of [`KC`]; each element of C is summed in one fixed order
//! whatever the threads do, so results repeat bit for bit. A product of more than
//! [`THREADED_FLOPS`] splits into one part per thread of the backend's team (`super::team`:
//! the machine's cores, at most 4, the calling thread one of them; a thread slow to start
//! leaves its part to the others); smaller ones run on the calling thread. The panels are kept
//! between calls: a product on one thread packs into that thread's own, the parts of a
//! threaded product into the panels of their part's index (`PART_PANELS`).
//!
//! Measured on a 2-core AMD EPYC VM with AVX-512 at the shapes of `syncmem train --hidden 1024`
//! (`FC` + `FCGradient` at batch 64, `syncmem bench`'s GEMM rows), against `matrixmultiply`
//! (with its AVX-512 kernel and its threads) in the same runs: forward 370-378 GFLOP/s against
//! 210-219, backward 330-333 against 182-280, both 343-347 against 193-252 (69% of the
//! measured 2-core FMA peak); at hidden 256, 258-313 against 206-222.

use std::cell::RefCell;
use std::sync::OnceLock;

use super::team::in_part;
use super::team::{team, MAX_THREADS};
use parking_lot::Mutex;

use block::Block;
use nt::run_nt;

mod block;
mod kernel;
mod nt;

/// The reduction is walked in blocks of this many steps (a block of B's rows stays in cache
/// while every row tile of C uses it).
const KC: usize = 512;
/// Products of at least this many flops (`2·m·n·k`) use the threads of the team.
const THREADED_FLOPS: usize = 1 << 22;
/// Set to `matrixmultiply` to run every product with `matrixmultiply` instead (comparisons).
pub(crate) const GEMM_ENV: &str = "SYNCMEM_CPU_GEMM";

/// `nt` products with reductions at least this long run as dot products ([`nt`]); shorter
/// ones as tiles of the transposed product (a dot product of a few vectors spends more on
/// adding its vector up than on the products).
const NT_DOT_MIN_K: usize = 128;

thread_local! {
    /// `Bᵀ` of a short `nt` product, kept between calls.
    static XT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows of a tile of C: `MR` broadcasts of op(A) per step of the reduction.
const MR: usize = 12;
/// Columns of a tile of C: two 16-float vectors of op(B) per step, so a tile is 24 vector
/// accumulators (with the two B vectors and the broadcast: 27 of the 32 AVX-512 registers).
const NR: usize = 32;

/// The vector instructions the micro-kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// AVX-512F and FMA: [`MR`] x [`NR`] tiles in 24 vector accumulators; `nt` as dot
    /// products.
    Avx512,
    /// AVX2 and FMA (CPUs without AVX-512F): the same tiles, computed as sub-tiles of 6 rows
    /// by 16 columns in 12 of the 16 vector registers, each element summed in the same order
    /// (so bit for bit the AVX-512 tiles' results); `nt` as tiles with op(B) copied transposed.
    Avx2,
}

/// The micro-kernels this CPU runs: AVX-512F, else AVX2 (both with FMA), else none
/// (`matrixmultiply` runs the products). `SYNCMEM_CPU_GEMM=matrixmultiply` asks for
/// `matrixmultiply`, `SYNCMEM_CPU_GEMM=avx2` for the AVX2 kernels (where the CPU has them).
fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| match std::env::var(GEMM_ENV).as_deref() {
        Ok("matrixmultiply") => None,
        Ok("avx2") => available().find(|&i| i == Isa::Avx2),
        _ => available().next(),
    })
}

/// The micro-kernels this CPU can run, best first (whatever `SYNCMEM_CPU_GEMM` says).
fn available() -> impl Iterator<Item = Isa> {
    let fma = is_x86_feature_detected!("fma");
    [
        (Isa::Avx512, fma && is_x86_feature_detected!("avx512f")),
        (Isa::Avx2, fma && is_x86_feature_detected!("avx2")),
    ]
    .into_iter()
    .filter_map(|(isa, ok)| ok.then_some(isa))
}

/// One product, as the micro-kernel sees it: `C'(i, j) = sum_l A'(i, l) · B'(l, j)` for
/// `i < m`, `j < n`, `l < k`, with `A'(i, l) = a[i*rsa + l*csa]`, `B'(l, j) = b[l*rsb + j]` and
/// `C'(i, j)` at `c[i*rsc + j*csc]`.
#[derive(Clone, Copy)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    rsb: usize,
    c: *mut f32,
    rsc: usize,
    csc: usize,
    beta: f32,
    /// op(B) is stored transposed: `B'(l, j)` at `b[j*rsb + l]` (its column panels are then
    /// always packed, transposing).
    tb: bool,
    /// The micro-kernels (found on this CPU).
    isa: Isa,
}

// SAFETY: a `Problem` is only handed to threads that read `a` and `b` (shared, not written
// during the product) and write disjoint tiles of `c` (see `run`), while the caller's borrows
// of the three slices outlive the threads' work (the team's job returns only when every part has run).
unsafe impl Send for Problem {}
// SAFETY: as for `Send`.
unsafe impl Sync for Problem {}

/// `C[m,n] = op(A)·op(B) + beta·C` with the operands as in `super::math::gemm` (whose checks
/// have passed: every slice holds exactly its matrix and `m, n, k >= 1`). Returns false when
/// this GEMM does not run the product (neither AVX-512F nor AVX2, or both operands
/// transposed): the caller runs it another way.
pub(crate) fn gemm(
    t: (bool, bool),
    mnk: (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) -> bool {
    isa().is_some_and(|isa| gemm_on(isa, t, mnk, a, b, beta, c))
}

/// [`gemm`] with the micro-kernels of `isa`, which the CPU must have.
fn gemm_on(
    isa: Isa,
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) -> bool {
    // C row-major and A with contiguous rows; each case changes what differs.
    let base = Problem {
        m,
        n,
        k,
        a: a.as_ptr(),
        rsa: k,
        csa: 1,
        b: b.as_ptr(),
        rsb: n,
        c: c.as_mut_ptr(),
        rsc: n,
        csc: 1,
        beta,
        tb: false,
        isa,
    };
    match (ta, tb) {
        (false, false) => run(&base),
        (true, false) => run(&Problem {
            rsa: 1,
            csa: m,
            ..base
        }),
        // W (op(B) = Wᵀ) read in place, by dot products (the same bits with either ISA).
        (false, true) if k >= NT_DOT_MIN_K => run_nt(&Problem { rsb: k, ..base }),
        // Short reductions with AVX2: W packed transposed into the column panels.
        (false, true) if isa == Isa::Avx2 => run(&Problem {
            rsb: k,
            tb: true,
            ..base
        }),
        (false, true) => XT.with(|xt| {
            // Short reductions: C = A·(Bᵀ) by tiles, with Bᵀ copied into a buffer of the
            // thread (k·n floats, k short).
            let mut xt = xt.borrow_mut();
            let buf = room(&mut xt, k * n);
            // SAFETY: `b` holds n rows of k; the buffer holds k * n floats of this thread;
            // this branch runs with AVX-512F, so with AVX.
            unsafe { kernel::transpose(b, n, k, buf) };
            run(&Problem {
                b: buf.cast_const(),
                ..base
            });
        }),
        (true, true) => return false,
    }
    true
}

/// Runs `p`, on the team's threads when it is large enough: the column tiles (or, with fewer
/// column tiles than threads, the row tiles) are split into one contiguous range per thread.
fn run(p: &Problem) {
    if p.n < NR && p.m >= NR && p.rsa == 1 {
        // Cᵀ = op(B)ᵀ·op(A)ᵀ: A''(i, l) = B'(l, i), B''(l, j) = A'(j, l) (contiguous in j).
        let (rsa, csa) = if p.tb { (p.rsb, 1) } else { (1, p.rsb) };
        return run(&Problem {
            m: p.n,
            n: p.m,
            k: p.k,
            a: p.b,
            rsa,
            csa,
            b: p.a,
            rsb: p.csa,
            c: p.c,
            rsc: p.csc,
            csc: p.rsc,
            beta: p.beta,
            tb: false,
            isa: p.isa,
        });
    }
    let (col_tiles, row_tiles) = (p.n.div_ceil(NR), p.m.div_ceil(MR));
    let by_cols = col_tiles >= row_tiles;
    on_threads(p, &|t, parts| {
        let (rows, cols) = if by_cols {
            ((0, p.m), share((t, parts), col_tiles, NR, p.n))
        } else {
            (share((t, parts), row_tiles, MR, p.m), (0, p.n))
        };
        if rows.0 < rows.1 && cols.0 < cols.1 {
            // A part of a threaded product packs into the panels of its index, whichever
            // thread runs it; a product on one thread into the thread's own.
            if parts > 1 {
                part(p, rows, cols, &mut PART_PANELS[t % MAX_THREADS].lock());
            } else {
                PANELS.with(|panels| part(p, rows, cols, &mut panels.borrow_mut()));
            }
        }
    });
}

/// Runs `job(t, parts)` for every part `t` of `parts`: one part on the calling thread when
/// `p` is below [`THREADED_FLOPS`] (or the machine has one core, or the team is busy with
/// another thread's product), else one per thread of the [`team`] (a thread slow to start
/// leaves its part to the others).
fn on_threads(p: &Problem, job: &(dyn Fn(usize, usize) + Sync)) {
    let team = team();
    let threads = team.threads();
    // Inside a part of a split (see `par`), this thread is one of the team's.
    if threads == 1 || 2 * p.m * p.n * p.k < THREADED_FLOPS || in_part() {
        job(0, 1);
        return;
    }
    // With the workers on another thread's product, one part on this thread: the parts'
    // panels (`PART_PANELS`) may be that product's.
    team.run_or(threads, &|t| job(t, threads), &|| job(0, 1));
}

/// Part `t` of `parts` of `tiles` tiles of `size` along a side of `len`: its first and end
/// index, whole tiles each (the last one cut at `len`).
fn share((t, parts): (usize, usize), tiles: usize, size: usize, len: usize) -> (usize, usize) {
    let lo = (tiles * t / parts * size).min(len);
    let hi = (tiles * (t + 1) / parts * size).min(len);
    (lo, hi)
}

/// What one tile reads and writes: `A'(r, l)` at `a[r*rsa + l*csa]` and `B'(l, q)` at
/// `b[l*rsb + q]` for the tile's rows `r`, columns `q` and the `kc` steps `l` of its block of
/// the reduction; `C'(r, q)` at `c[r*rsc + q*csc]`; `first`: the block is the first (which
/// applies `beta`; later blocks add to C).
#[derive(Clone, Copy)]
struct Tile {
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    rsb: usize,
    kc: usize,
    c: *mut f32,
    rsc: usize,
    csc: usize,
    beta: f32,
    first: bool,
}

/// Packed panels: `[op(A) row panels, op(B) column panel]`.
type Panels = [Vec<f32>; 2];

thread_local! {
    /// The panels of a product that runs on one thread.
    static PANELS: RefCell<Panels> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// The panels of part `t` of a threaded product. Any thread of the team may run any part
/// (see `super::team`): with panels of the thread, a thread that ran a smaller part of a
/// shape in the first step would grow its panels (a heap allocation) the first time it ran a
/// larger one, at any later step. Kept by part, they reach their sizes in the first product
/// of each shape. A lock each: a part runs once per product, so only a second product of
/// another thread at the same time ever waits.
static PART_PANELS: [Mutex<Panels>; MAX_THREADS] =
    [const { Mutex::new([Vec::new(), Vec::new()]) }; MAX_THREADS];

/// Grows `v` to at least `len` elements (a heap allocation only when it grows).
fn room(v: &mut Vec<f32>, len: usize) -> *mut f32 {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    v.as_mut_ptr()
}

/// Computes the tiles of `p` in rows `rows.0..rows.1` and columns `cols.0..cols.1`, block of
/// the reduction by block. The longer side is walked outside: with more rows than columns each
/// row tile meets every column tile while its rows of op(A) are in cache (the forward product,
/// `W·Xᵀ`, reads W once), else the other way round. An operand whose values a tile reads far
/// apart is first copied into contiguous panels: op(A) when its columns are strided (`tn`: a
/// column of dYᵀ is a row of dY, 4 KiB apart at width 1024, which every cache level maps to a
/// few sets), op(B) when its rows are (rows of W): the operand of the inner loop all at once
/// for the block, the outer one a tile at a time.
fn part(p: &Problem, rows: (usize, usize), cols: (usize, usize), panels: &mut Panels) {
    let [apanels, bpanels] = panels;
    let outer_rows = rows.1 - rows.0 >= cols.1 - cols.0;
    let row_tiles = (rows.1 - rows.0).div_ceil(MR);
    let col_tiles = (cols.1 - cols.0).div_ceil(NR);
    let (pack_a, pack_b) = (p.csa != 1 || p.rsa >= 256, p.tb || p.rsb >= 256);
    // A transposed op(B) is read from its panels only, partial column tiles too.
    let b_panel = |nn: usize| pack_b && (nn == NR || p.tb);
    let mut l0 = 0;
    while l0 < p.k {
        let kc = KC.min(p.k - l0);
        let a_tiles = if outer_rows { 1 } else { row_tiles };
        let b_tiles = if outer_rows { col_tiles } else { 1 };
        let b = Block {
            p,
            l0,
            kc,
            abuf: if pack_a {
                room(apanels, a_tiles * MR * kc)
            } else {
                std::ptr::null_mut()
            },
            bbuf: if pack_b {
                room(bpanels, b_tiles * kc * NR)
            } else {
                std::ptr::null_mut()
            },
        };
        let tile_rows = |ti: usize| (rows.0 + ti * MR, MR.min(rows.1 - rows.0 - ti * MR));
        let tile_cols = |tj: usize| (cols.0 + tj * NR, NR.min(cols.1 - cols.0 - tj * NR));
        // SAFETY: the panels were sized above for what each call packs
        // (`a_tiles` row tiles, `b_tiles` column tiles); the tiles lie inside `p`'s
        // matrices (`gemm`'s caller checked the slices); this thread alone writes the
        // tiles of its part; `isa()` found the problem's micro-kernels on this CPU.
        unsafe {
            if outer_rows {
                if pack_b {
                    for tj in 0..col_tiles {
                        b.pack_cols(tile_cols(tj), tj);
                    }
                }
                for ti in 0..row_tiles {
                    let (i, mm) = tile_rows(ti);
                    if pack_a {
                        b.pack_rows((i, mm), 0);
                    }
                    let a = b.rows(i, mm, pack_a.then_some(0));
                    for tj in 0..col_tiles {
                        let (j, nn) = tile_cols(tj);
                        b.tile(a, b.cols(j, nn, b_panel(nn).then_some(tj)));
                    }
                }
            } else {
                if pack_a {
                    for ti in 0..row_tiles {
                        b.pack_rows(tile_rows(ti), ti);
                    }
                }
                for tj in 0..col_tiles {
                    let (j, nn) = tile_cols(tj);
                    let packed = b_panel(nn);
                    if packed {
                        b.pack_cols((j, nn), 0);
                    }
                    let c = b.cols(j, nn, packed.then_some(0));
                    for ti in 0..row_tiles {
                        let (i, mm) = tile_rows(ti);
                        b.tile(b.rows(i, mm, pack_a.then_some(ti)), c);
                    }
                }
            }
        }
        l0 += kc;
    }
}

#[cfg(test)]
mod tests;
