//! The system allocator with a hook called on every allocation (and reallocation, which may
//! allocate): the global allocator of the tests that count heap allocations
//! (`pool_steady_state.rs` counts per thread, `cpu_threads_steady.rs` for the whole process).

use std::alloc::{GlobalAlloc, Layout, System};

/// Calls its hook, then forwards to [`System`]. The hook must not allocate.
pub struct Counting(pub fn());

// SAFETY: every call is forwarded unchanged to the system allocator; the hook allocates
// nothing (its contract).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        (self.0)();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        (self.0)();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        (self.0)();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}
