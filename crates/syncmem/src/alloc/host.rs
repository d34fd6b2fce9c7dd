//! Host memory: 64-byte-aligned, zero-filled blocks that do not touch fresh pages (the raw
//! allocation is the `cpu` backend's), counted in the process-wide host counters.

use crate::backend::cpu::host::AlignedBlock;
use crate::error::Result;

use super::stats::{Counted, HOST};

pub use crate::backend::cpu::host::HOST_ALIGN;

/// An owned, zero-initialised, 64-byte-aligned host allocation.
///
/// A large block costs an `mmap` of fresh zero pages, not a `memset`: the allocation asks
/// `calloc` (alignment 16) for 48 bytes more and rounds the start up to 64.
pub struct HostBlock {
    block: AlignedBlock,
    /// The host statistics' token when the block is counted there.
    counted: Option<Counted>,
}

impl HostBlock {
    /// Allocates `len` zeroed bytes aligned to [`HOST_ALIGN`], counted as host memory
    /// ([`crate::stats`]). `len == 0` allocates nothing.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] when the system allocator fails,
    /// [`crate::Error::SizeOverflow`] when `len` is too large to describe.
    pub fn zeroed(len: usize) -> Result<Self> {
        let mut b = Self::zeroed_uncounted(len)?;
        if len > 0 {
            b.counted = Some(HOST.on_alloc(len));
        }
        Ok(b)
    }

    /// As [`HostBlock::zeroed`], but not counted as host memory (the caller counts it, e.g. in
    /// a pool's statistics). Its drop does not touch the host counters either.
    pub(crate) fn zeroed_uncounted(len: usize) -> Result<Self> {
        Ok(Self {
            block: AlignedBlock::zeroed(len)?,
            counted: None,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.block.len()
    }

    /// True when the block holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.block.is_empty()
    }

    /// Start of the block (aligned to [`HOST_ALIGN`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.block.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.block.as_slice()
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.block.as_mut_slice()
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Some(counted) = self.counted {
            HOST.on_free(counted, self.block.len());
        }
    }
}

impl std::fmt::Debug for HostBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBlock")
            .field("ptr", &self.block.as_ptr())
            .field("len", &self.block.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_blocks_show_in_the_host_counters() {
        let before = HOST.snapshot("host");
        let b = HostBlock::zeroed(4096).unwrap();
        assert_eq!(b.as_ptr() as usize % HOST_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        let during = HOST.snapshot("host");
        assert!(during.allocs > before.allocs);
        drop(b);
        assert!(HOST.snapshot("host").frees > before.frees);
        let u = HostBlock::zeroed_uncounted(64).unwrap();
        assert_eq!(u.len(), 64);
    }
}
