//! 64-byte-aligned, zero-filled host memory that does not touch fresh pages.
//!
//! `std::alloc::alloc_zeroed` with a 64-byte alignment goes through `posix_memalign` + `memset`
//! and so touches every page (about 50 ms for 64 MiB on the project's machines). With the
//! platform's minimum alignment (16) it goes through `calloc`, which hands large requests fresh
//! zero pages from `mmap` without touching them. So a [`HostBlock`] asks for `len + 48` bytes
//! at alignment 16 and rounds the start up to 64: zeroed memory for the price of an `mmap`.
//!
//! Every block frees itself with the same allocator that made it. The host counters are kept
//! by the allocation layer above ([`crate::alloc::HostBlock`]).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{Error, OomReport, Result};

/// Alignment of every host block: one cache line, enough for any SIMD type in use.
pub const HOST_ALIGN: usize = 64;
/// Alignment of the host blocks an OpenCL driver may use in place (`CL_MEM_USE_HOST_PTR`): a
/// page, as the drivers that share host memory with the device ask.
#[cfg_attr(not(feature = "opencl"), allow(dead_code))]
pub const PAGE_ALIGN: usize = 4096;
const BASE_ALIGN: usize = 16;

/// An owned, zero-initialised, 64-byte-aligned host allocation.
pub(crate) struct AlignedBlock {
    /// Aligned start (dangling but aligned when `len == 0`).
    ptr: NonNull<u8>,
    len: usize,
    /// What was allocated: `None` when `len == 0`.
    base: Option<(NonNull<u8>, Layout)>,
}

// SAFETY: AlignedBlock owns its memory exclusively, like Box<[u8]>; nothing in it is tied to a thread.
unsafe impl Send for AlignedBlock {}
// SAFETY: shared access only hands out `&[u8]`, which is Sync.
unsafe impl Sync for AlignedBlock {}

impl AlignedBlock {
    /// Allocates `len` zeroed bytes aligned to [`HOST_ALIGN`]. `len == 0` allocates nothing.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the system allocator fails, [`Error::SizeOverflow`] when
    /// `len` is too large to describe.
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        Self::zeroed_aligned(len, HOST_ALIGN)
    }

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two, at least 16), the same
    /// way: `align - 16` bytes of slack, no page touched.
    ///
    /// # Errors
    /// As [`AlignedBlock::zeroed`].
    pub(crate) fn zeroed_aligned(len: usize, align: usize) -> Result<Self> {
        debug_assert!(align.is_power_of_two() && align >= BASE_ALIGN);
        if len == 0 {
            return Ok(Self {
                ptr: aligned_dangling(),
                len: 0,
                base: None,
            });
        }
        let slack = align - BASE_ALIGN;
        let total = len.checked_add(slack).ok_or_else(|| Error::SizeOverflow {
            what: format!("host allocation of {len} bytes plus {slack} bytes of alignment slack"),
        })?;
        let layout =
            Layout::from_size_align(total, BASE_ALIGN).map_err(|_| Error::SizeOverflow {
                what: format!("host allocation of {len} bytes exceeds isize::MAX"),
            })?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or_else(|| {
            Error::from(OomReport::new("host", len, "the system allocator refused"))
        })?;
        let offset = raw.align_offset(align);
        debug_assert!(offset <= slack);
        // SAFETY: offset <= slack, so `raw + offset .. + len` stays inside the `total` bytes.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(offset)) };
        Ok(Self {
            ptr,
            len,
            base: Some((base, layout)),
        })
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when the block holds no bytes.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the block (aligned to [`HOST_ALIGN`], or to the alignment asked for).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed at allocation) bytes for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        if let Some((base, layout)) = self.base.take() {
            // SAFETY: base/layout are exactly what alloc_zeroed returned/was given.
            unsafe { alloc::dealloc(base.as_ptr(), layout) };
        }
    }
}

impl std::fmt::Debug for AlignedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBlock")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

fn aligned_dangling() -> NonNull<u8> {
    // A non-null, 64-aligned address that is never dereferenced for a zero-length block.
    NonNull::new(HOST_ALIGN as *mut u8).expect("non-zero constant")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed_for_many_sizes() {
        for len in [1usize, 2, 3, 7, 9, 63, 64, 65, 4095, 4096, 1 << 20] {
            let b = AlignedBlock::zeroed(len).unwrap();
            assert_eq!(b.as_ptr() as usize % HOST_ALIGN, 0, "len {len}");
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0), "len {len}");
        }
    }

    #[test]
    fn page_aligned_and_zeroed() {
        for len in [1usize, 64, 4096, 4097, 1 << 20] {
            let b = AlignedBlock::zeroed_aligned(len, PAGE_ALIGN).unwrap();
            assert_eq!(b.as_ptr() as usize % PAGE_ALIGN, 0, "len {len}");
            assert!(b.as_slice().iter().all(|&x| x == 0), "len {len}");
        }
    }

    #[test]
    fn zero_length_allocates_nothing() {
        let b = AlignedBlock::zeroed(0).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.as_slice().len(), 0);
        assert_eq!(b.as_ptr() as usize % HOST_ALIGN, 0);
    }

    #[test]
    fn writes_stay_in_bounds_and_read_back() {
        let mut b = AlignedBlock::zeroed(100).unwrap();
        b.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as u8);
        assert_eq!(b.as_slice()[99], 99);
    }

    #[test]
    fn huge_request_is_an_error_not_an_abort() {
        let e = AlignedBlock::zeroed(usize::MAX - 8).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
        let e = AlignedBlock::zeroed(isize::MAX as usize - 100).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { .. } | Error::SizeOverflow { .. }),
            "{e}"
        );
    }
}
