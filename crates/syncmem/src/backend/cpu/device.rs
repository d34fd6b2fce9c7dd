//! The `cpu` device, its memory, its streams and events.

use std::ptr::NonNull;

use super::host::{AlignedBlock, HOST_ALIGN};
use crate::backend::{
    BackendDevice, BackendEvent, BackendMem, BackendPinned, BackendStream, DeviceInfo, KeepAlive,
};
use crate::error::{BackendKind, Result};

pub(crate) struct CpuDevice {
    info: DeviceInfo,
}

impl CpuDevice {
    pub(crate) fn new() -> Self {
        Self {
            info: DeviceInfo {
                backend: BackendKind::Cpu,
                ordinal: 0,
                name: "host".to_string(),
                vendor: std::env::consts::ARCH.to_string(),
                total_memory: total_memory(),
                max_alloc: isize::MAX as u64,
                host_unified: true,
                host_coherent: true,
            },
        }
    }
}

/// Total memory of the machine (`MemTotal` of `/proc/meminfo`), 0 when unknown.
pub(crate) fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// Device memory of the cpu backend: a whole block, or a view into a pool segment. Interior
/// writes go through raw pointers, never through a live `&[u8]`: the public wrapper hands out
/// slices only under `&`/`&mut` of the buffer.
pub(crate) struct CpuMem {
    ptr: NonNull<u8>,
    len: usize,
    _owner: CpuOwner,
}

/// Held for its `Drop` only.
#[allow(dead_code)]
enum CpuOwner {
    /// The memory is this block.
    Block(AlignedBlock),
    /// The memory is a range of a segment that this keeps alive.
    View(KeepAlive),
}

// SAFETY: `CpuMem` owns (or, for a view, exclusively uses a range of) plain host memory with no
// thread affinity; the pointer is only dereferenced under the rules of the wrapper (`&` reads,
// `&mut` or a stream operation on checked ranges for writes). The owner is `Send + Sync`.
unsafe impl Send for CpuMem {}
// SAFETY: as above.
unsafe impl Sync for CpuMem {}
pub(crate) struct CpuPinned(AlignedBlock);
pub(crate) struct CpuStream;
/// An event of the cpu backend: always complete (every operation finished before returning).
#[derive(Clone, Copy)]
pub(crate) struct CpuEvent;

impl CpuMem {
    fn block(b: AlignedBlock) -> Self {
        Self {
            // A zero-length block has an aligned dangling pointer, never null.
            ptr: NonNull::new(b.as_ptr()).unwrap_or(NonNull::dangling()),
            len: b.len(),
            _owner: CpuOwner::Block(b),
        }
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation, or written
        // since) while `self` lives; `&self` excludes writers through the wrapper.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` gives exclusive access, and no other `CpuMem`
        // covers these bytes (pool blocks never overlap).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub(crate) fn len_bytes(&self) -> usize {
        self.len
    }
}

impl BackendDevice for CpuDevice {
    type Mem = CpuMem;
    type Pinned = CpuPinned;
    type Stream = CpuStream;
    type Event = CpuEvent;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, bytes: usize) -> Result<CpuMem> {
        AlignedBlock::zeroed(bytes).map(CpuMem::block)
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<CpuPinned> {
        AlignedBlock::zeroed(bytes).map(CpuPinned)
    }
    fn new_stream(&self) -> Result<CpuStream> {
        Ok(CpuStream)
    }
    fn sub_align(&self) -> usize {
        HOST_ALIGN
    }
    fn sub_mem(&self, parent: &CpuMem, off: usize, len: usize, keep: KeepAlive) -> Result<CpuMem> {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= parent.len));
        // SAFETY: the caller guarantees `off + len <= parent.len`, so the pointer stays inside
        // the parent's allocation, which `keep` keeps alive as long as the view.
        let ptr = unsafe { NonNull::new_unchecked(parent.ptr.as_ptr().add(off)) };
        Ok(CpuMem {
            ptr,
            len,
            _owner: CpuOwner::View(keep),
        })
    }
}

impl BackendMem for CpuMem {
    fn len(&self) -> usize {
        self.len
    }
}

impl BackendPinned for CpuPinned {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl BackendStream for CpuStream {
    type Mem = CpuMem;
    type Event = CpuEvent;

    unsafe fn write(
        &self,
        dst: &CpuMem,
        off: usize,
        src: *const u8,
        len: usize,
        _: bool,
    ) -> Result<u64> {
        // SAFETY: the caller checked off+len <= dst.len() and that src is valid for len bytes;
        // host and device buffers are distinct allocations, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_ptr().add(off), len) };
        Ok(0)
    }

    unsafe fn read(
        &self,
        src: &CpuMem,
        off: usize,
        dst: *mut u8,
        len: usize,
        _: bool,
    ) -> Result<u64> {
        // SAFETY: as in write, mirrored.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(off), dst, len) };
        Ok(0)
    }

    fn copy(&self, src: &CpuMem, so: usize, dst: &CpuMem, doff: usize, len: usize) -> Result<u64> {
        // SAFETY: both ranges were checked by the caller; `copy` handles overlap when src and
        // dst are the same buffer.
        unsafe { std::ptr::copy(src.as_ptr().add(so), dst.as_ptr().add(doff), len) };
        Ok(0)
    }

    fn fill(&self, dst: &CpuMem, off: usize, len: usize, value: u8) -> Result<u64> {
        // SAFETY: range checked by the caller.
        unsafe { std::ptr::write_bytes(dst.as_ptr().add(off), value, len) };
        Ok(0)
    }

    fn record(&self) -> Result<CpuEvent> {
        Ok(CpuEvent)
    }
    fn wait_for(&self, _: &CpuEvent) -> Result<()> {
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn last_seq(&self) -> u64 {
        0
    }
    fn is_done(&self, _: u64) -> Result<bool> {
        Ok(true)
    }
    fn wait_done(&self, _: u64) -> Result<bool> {
        Ok(false)
    }
    fn wait_on(&self, _: &CpuStream, _: u64) -> Result<()> {
        Ok(())
    }
}

impl BackendEvent for CpuEvent {
    fn wait(&self) -> Result<()> {
        Ok(())
    }
    fn is_complete(&self) -> Result<bool> {
        Ok(true)
    }
}
