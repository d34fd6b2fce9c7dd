//! The geometry of a launch of a user's kernel ([`Grid`]), and what a device launches at most
//! ([`GridLimits`]), checked before every launch.

use std::fmt;

/// The geometry of a launch, as CUDA spells it: `blocks` blocks of `threads` threads each, in
/// up to three dimensions. On OpenCL the global size is `blocks × threads` and the local
/// (work-group) size `threads`; a host closure on `cpu` gets it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Grid {
    /// Blocks (CUDA's grid, OpenCL's number of work-groups) along x, y, z.
    pub blocks: [u32; 3],
    /// Threads per block (CUDA's block, OpenCL's work-group size) along x, y, z.
    pub threads: [u32; 3],
}

impl Grid {
    /// `blocks` blocks of `threads` threads, three dimensions.
    pub fn new(blocks: [u32; 3], threads: [u32; 3]) -> Self {
        Self { blocks, threads }
    }

    /// One dimension: `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self::new([blocks, 1, 1], [threads, 1, 1])
    }

    /// One dimension, enough blocks of `threads` threads to give every one of `n` elements a
    /// thread (at least one block; at most `u32::MAX` blocks: use a grid-stride loop beyond).
    pub fn for_elements(n: usize, threads: u32) -> Self {
        let t = threads.max(1) as usize;
        let blocks = n.div_ceil(t).clamp(1, u32::MAX as usize) as u32;
        Self::linear(blocks, threads)
    }

    /// Threads per block (the product of [`Grid::threads`]).
    pub fn threads_per_block(&self) -> u64 {
        self.threads.iter().map(|&t| u64::from(t)).product()
    }

    /// Threads of the whole launch.
    pub fn total_threads(&self) -> u64 {
        self.threads_per_block()
            .saturating_mul(self.blocks.iter().map(|&b| u64::from(b)).product())
    }

    /// The dimensions a launch needs: 3 when z is used, else 2 when y is, else 1.
    pub fn dims(&self) -> usize {
        let used = |i: usize| self.blocks[i] > 1 || self.threads[i] > 1;
        if used(2) {
            3
        } else if used(1) {
            2
        } else {
            1
        }
    }

    /// `None` when the grid can run, else why not (a zero extent).
    pub(crate) fn problem(&self) -> Option<String> {
        if self.blocks.contains(&0) || self.threads.contains(&0) {
            return Some(format!("the grid {self} has an extent of 0"));
        }
        None
    }

    /// `None` when a device of `limits` can launch the grid, else why not: more work-items in
    /// all than its addresses count (and than the host's `size_t` counts), more threads or
    /// blocks along an axis, or more threads per block than it launches.
    pub(crate) fn exceeds(&self, limits: &GridLimits) -> Option<String> {
        if self.fits(limits) {
            return None;
        }
        self.exceeds_why(limits)
    }

    /// True when a device of `limits` surely launches the grid (checked on every launch: no
    /// wide arithmetic here; [`Grid::exceeds_why`] says why not, or finds that it does).
    #[inline]
    fn fits(&self, limits: &GridLimits) -> bool {
        let mut total = 1u64;
        for d in 0..3 {
            let (t, b) = (u64::from(self.threads[d]), u64::from(self.blocks[d]));
            if t > limits.threads[d] || b > limits.blocks[d] {
                return false;
            }
            // At most 2^32 * 2^32 a factor: two checked products in 64 bits.
            let Some(n) = total.checked_mul(t).and_then(|n| n.checked_mul(b)) else {
                return false;
            };
            total = n;
        }
        let bits = limits.address_bits.min(usize::BITS);
        (bits >= 64 || total >> bits == 0) && self.threads_per_block() <= limits.per_block
    }

    /// [`Grid::exceeds`] the long way.
    #[cold]
    fn exceeds_why(&self, limits: &GridLimits) -> Option<String> {
        let bits = limits.address_bits.min(usize::BITS);
        let total = self
            .blocks
            .iter()
            .chain(&self.threads)
            .try_fold(1u128, |n, &e| n.checked_mul(u128::from(e)));
        match total {
            Some(n) if bits >= 128 || n >> bits == 0 => {}
            Some(n) => {
                return Some(format!(
                    "the grid {self} has {n} work-items, more than {bits}-bit addresses count \
                     (2^{bits})"
                ))
            }
            None => {
                return Some(format!(
                    "the grid {self} has more than 2^128 work-items, more than {bits}-bit \
                     addresses count (2^{bits})"
                ))
            }
        }
        const AXES: [&str; 3] = ["x", "y", "z"];
        for (d, axis) in AXES.iter().enumerate() {
            let (t, b) = (u64::from(self.threads[d]), u64::from(self.blocks[d]));
            if t > limits.threads[d] {
                return Some(format!(
                    "the grid {self} has {t} threads along {axis}; the device runs at most {} \
                     per block",
                    limits.threads[d]
                ));
            }
            if b > limits.blocks[d] {
                return Some(format!(
                    "the grid {self} has {b} blocks along {axis}; the device launches at most {}",
                    limits.blocks[d]
                ));
            }
        }
        let t = self.threads_per_block();
        if t > limits.per_block {
            return Some(format!(
                "the grid {self} has {t} threads per block; the device runs at most {}",
                limits.per_block
            ));
        }
        None
    }
}

/// What a device launches at most, from its own report: checked against every [`Grid`] of a
/// kernel of the user before the launch (a device asked for more fails the launch at best,
/// and at worst runs it for ever or aborts the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GridLimits {
    /// Bits of the device's addresses (`CL_DEVICE_ADDRESS_BITS`; 64 on CUDA): a launch has
    /// fewer than `2^address_bits` work-items in all.
    pub(crate) address_bits: u32,
    /// Most threads per block along x, y, z (`CL_DEVICE_MAX_WORK_ITEM_SIZES`, CUDA's
    /// `MAX_BLOCK_DIM_*`).
    pub(crate) threads: [u64; 3],
    /// Most blocks along x, y, z (CUDA's `MAX_GRID_DIM_*`; OpenCL counts only the total).
    pub(crate) blocks: [u64; 3],
    /// Most threads per block in all (`CL_DEVICE_MAX_WORK_GROUP_SIZE`, CUDA's
    /// `MAX_THREADS_PER_BLOCK`).
    pub(crate) per_block: u64,
}

impl GridLimits {
    /// The `cpu` device: a host closure takes any grid whose work-items the host counts.
    pub(crate) const HOST: GridLimits = GridLimits {
        address_bits: usize::BITS,
        threads: [u64::MAX; 3],
        blocks: [u64::MAX; 3],
        per_block: u64::MAX,
    };
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [bx, by, bz] = self.blocks;
        let [tx, ty, tz] = self.threads;
        write!(f, "({bx}, {by}, {bz}) blocks of ({tx}, {ty}, {tz}) threads")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_count_their_threads_and_dimensions() {
        let g = Grid::for_elements(1000, 256);
        assert_eq!(g.blocks, [4, 1, 1]);
        assert_eq!(
            (g.threads_per_block(), g.total_threads(), g.dims()),
            (256, 1024, 1)
        );
        assert_eq!(Grid::for_elements(0, 64).blocks[0], 1);
        assert_eq!(Grid::new([2, 3, 1], [8, 8, 1]).dims(), 2);
        assert_eq!(Grid::new([1, 1, 2], [1, 1, 1]).dims(), 3);
        assert!(Grid::linear(0, 64).problem().is_some());
        assert!(Grid::linear(1, 64).problem().is_none());
    }

    #[test]
    fn grids_past_a_devices_limits_are_refused() {
        let limits = GridLimits {
            address_bits: 32,
            threads: [1024, 1024, 64],
            blocks: [u64::from(u32::MAX >> 1), 65_535, 65_535],
            per_block: 1024,
        };
        let ok = |g: Grid| g.exceeds(&limits);
        assert_eq!(ok(Grid::new([4, 2, 1], [256, 4, 1])), None);
        assert_eq!(ok(Grid::new([(1 << 22) - 1, 1, 1], [1024, 1, 1])), None);
        let e = ok(Grid::new([1 << 22, 1, 1], [1024, 1, 1])).unwrap();
        assert!(
            e.contains("4294967296 work-items") && e.contains("32-bit"),
            "{e}"
        );
        let e = Grid::new([u32::MAX; 3], [u32::MAX; 3]).exceeds(&GridLimits::HOST);
        assert!(e.unwrap().contains("more than 2^128 work-items"));
        assert!(Grid::new([u32::MAX; 3], [1; 3])
            .exceeds(&GridLimits::HOST)
            .unwrap()
            .contains("64-bit addresses"));
        assert_eq!(
            Grid::new([u32::MAX, 1, 1], [u32::MAX, 1, 1]).exceeds(&GridLimits::HOST),
            None
        );
        let e = ok(Grid::new([1, 1, 1], [1, 1, 128])).unwrap();
        assert!(
            e.contains("128 threads along z") && e.contains("at most 64"),
            "{e}"
        );
        let e = ok(Grid::new([1, 65_536, 1], [1, 1, 1])).unwrap();
        assert!(e.contains("65536 blocks along y"), "{e}");
        let e = ok(Grid::new([1, 1, 1], [64, 32, 1])).unwrap();
        assert!(e.contains("2048 threads per block"), "{e}");
    }
}
