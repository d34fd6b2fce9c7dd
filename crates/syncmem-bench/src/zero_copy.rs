//! Zero-copy rows: one cycle of a buffer's life (host write, device read, device write, host
//! read, as a step that fills a batch, runs a kernel on it and reads the result) on a buffer
//! that shares one allocation between host and device, against the same cycle with two
//! mirrors, and (OpenCL) against the raw map/unmap calls the map protocol makes.

use std::hint::black_box;

use syncmem::{Device, Result, SyncedMemory, ZeroCopy};

use crate::rows::{compare, Runs};
use crate::{size_name, Row};

/// Goal of the zero-copy cycle against two mirrors.
pub const VS_COPIES_GOAL: f64 = 50.0;
/// Goal of the map protocol's cycle against the raw map/unmap calls.
pub const VS_RAW_MAP_GOAL: f64 = 0.9;

/// Host write of one byte, device read, device write, host read of the last byte: with two
/// mirrors an upload and a read-back of the whole buffer; shared, no copy.
fn cycle(buf: &SyncedMemory, bytes: usize) -> Result<()> {
    buf.host_mut()?[0] = 1;
    drop(black_box(buf.device()?));
    drop(black_box(buf.device_mut()?));
    black_box(buf.host()?[bytes - 1]);
    Ok(())
}

/// The cycle on a shared buffer vs two mirrors; `None` where `dev`'s memory is not host
/// memory (no buffer of it can share).
///
/// # Errors
/// Device errors.
pub fn vs_copies_row(dev: &Device, bytes: usize, runs: Runs) -> Result<Option<Row>> {
    let shared = dev.isolated();
    shared.set_zero_copy(ZeroCopy::Auto);
    let Some(protocol) = shared.zero_copy_protocol() else {
        return Ok(None);
    };
    let copying = dev.isolated();
    copying.set_zero_copy(ZeroCopy::Off);
    let a = SyncedMemory::new(bytes, &shared);
    let b = SyncedMemory::new(bytes, &copying);
    let samples = compare(runs, || cycle(&a, bytes), || cycle(&b, bytes))?;
    debug_assert_eq!(a.copy_stats().total_count(), 0);
    Ok(Some(
        samples
            .row(
                &format!("zero-copy cycle {}", size_name(bytes)),
                &format!(
                    "SyncedMemory shared ({protocol}): host write, device read + write, host read"
                ),
                "the same with two mirrors (zero-copy off)",
            )
            .with_goal(VS_COPIES_GOAL),
    ))
}

/// The cycle with the map protocol forced vs the raw calls it makes: a blocking
/// `clEnqueueMapBuffer` for writing, the write, `clEnqueueUnmapMemObject`, a blocking map for
/// reading, the read, an unmap, on a `CL_MEM_USE_HOST_PTR` buffer of the same size on the
/// device's own queue. `None` off OpenCL or where the device's memory is not host memory.
///
/// # Errors
/// Device errors.
#[cfg(feature = "opencl")]
pub fn vs_raw_map_row(dev: &Device, bytes: usize, runs: Runs) -> Result<Option<Row>> {
    if dev.backend() != syncmem::BackendKind::OpenCl {
        return Ok(None);
    }
    let mapped = dev.isolated();
    mapped.set_zero_copy(ZeroCopy::Map);
    if mapped.zero_copy_protocol().is_none() {
        return Ok(None);
    }
    let buf = SyncedMemory::new(bytes, &mapped);
    let stream = mapped.default_stream()?;
    let mut raw = raw_map::RawMapped::new(dev, &stream, bytes)?;
    let samples = compare(runs, || cycle(&buf, bytes), || raw.cycle())?;
    Ok(Some(
        samples
            .row(
                &format!("zero-copy map cycle {}", size_name(bytes)),
                "SyncedMemory shared (map protocol forced): the same cycle",
                "clEnqueueMapBuffer + unmap for the write, again for the read (opencl3)",
            )
            .with_goal(VS_RAW_MAP_GOAL),
    ))
}

/// Without the OpenCL backend there is no raw map call to compare with.
#[cfg(not(feature = "opencl"))]
pub fn vs_raw_map_row(_dev: &Device, _bytes: usize, _runs: Runs) -> Result<Option<Row>> {
    Ok(None)
}

/// Goal of the small cycle with many live buffers against few: flat (within noise).
pub const LIVE_BUFFERS_GOAL: f64 = 0.9;
/// Buffers of the small cycle's rows: few and many live ones.
pub const LIVE_BUFFERS: [usize; 2] = [100, 100_000];
/// Bytes of each buffer of the live-buffer rows.
pub const SMALL_CYCLE_BYTES: usize = 256;

/// `count` buffers of [`SMALL_CYCLE_BYTES`] on `dev`, each written on the host and read on
/// the device once, so that all of them are allocated and current on both sides.
fn live_buffers(dev: &Device, count: usize) -> Result<Vec<SyncedMemory>> {
    (0..count)
        .map(|_| {
            let b = SyncedMemory::new(SMALL_CYCLE_BYTES, dev);
            cycle(&b, SMALL_CYCLE_BYTES)?;
            Ok(b)
        })
        .collect()
}

/// The cycle of [`SMALL_CYCLE_BYTES`] on 100 buffers (spread evenly, in turn) among
/// [`LIVE_BUFFERS`]`[1]` live ones, against the same among [`LIVE_BUFFERS`]`[0]`: the cost of
/// a sync must not grow with the number of live buffers (no scan of them, no longer lists).
/// On `dev` as it is set (zero-copy where its memory is host memory).
///
/// # Errors
/// Device errors, out of memory for the live buffers.
pub fn live_buffers_row(dev: &Device, runs: Runs) -> Result<Row> {
    let [few, many] = LIVE_BUFFERS;
    let a = dev.isolated();
    let b = dev.isolated();
    let few_bufs = live_buffers(&a, few)?;
    let many_bufs = live_buffers(&b, many)?;
    // The same number of buffers cycled on both sides, spread over all the live ones.
    let stride = many / few;
    let (mut i, mut j) = (0, 0);
    let samples = compare(
        runs,
        || {
            i = (i + 1) % few;
            cycle(&many_bufs[i * stride], SMALL_CYCLE_BYTES)
        },
        || {
            j = (j + 1) % few;
            cycle(&few_bufs[j], SMALL_CYCLE_BYTES)
        },
    )?;
    let how = match b.zero_copy_protocol() {
        Some(p) => format!("shared ({p})"),
        None => "two mirrors".to_string(),
    };
    Ok(samples
        .row(
            &format!("{SMALL_CYCLE_BYTES} B cycle, {many} live buffers"),
            &format!(
                "the zero-copy cycle, {SMALL_CYCLE_BYTES} B, {how}, among {many} live buffers"
            ),
            &format!("the same among {few} live buffers"),
        )
        .with_goal(LIVE_BUFFERS_GOAL))
}

#[cfg(feature = "opencl")]
mod raw_map {
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::ffi::c_void;
    use std::mem::ManuallyDrop;
    use std::ptr;

    use opencl3::command_queue::CommandQueue;
    use opencl3::memory::{
        create_buffer, Buffer, ClMem, CL_MAP_READ, CL_MAP_WRITE, CL_MEM_READ_WRITE,
        CL_MEM_USE_HOST_PTR,
    };
    use opencl3::types::{cl_mem, CL_BLOCKING};
    use syncmem::{BackendKind, Device, Error, Result, Stream};

    const ALIGN: usize = 4096;

    fn cl_error(dev: &Device, op: &'static str, code: i64) -> Error {
        Error::Backend {
            backend: BackendKind::OpenCl,
            device: dev.label().to_string(),
            op,
            code,
            message: "in the raw map/unmap of the benchmark".to_string(),
        }
    }

    /// A `CL_MEM_USE_HOST_PTR` buffer over page-aligned host memory, mapped and unmapped on
    /// a syncmem stream's queue.
    pub(super) struct RawMapped<'a> {
        queue: &'a CommandQueue,
        dev: Device,
        /// Released in Drop before the host memory it uses is freed.
        buffer: ManuallyDrop<Buffer<u8>>,
        host: *mut u8,
        layout: Layout,
    }

    impl<'a> RawMapped<'a> {
        pub(super) fn new(dev: &Device, stream: &'a Stream, bytes: usize) -> Result<Self> {
            let queue = stream.as_opencl().ok_or_else(|| Error::Unsupported {
                device: dev.label().to_string(),
                what: "a raw OpenCL queue on this stream".to_string(),
            })?;
            let context = queue
                .context()
                .map_err(|e| cl_error(dev, "clGetCommandQueueInfo", e.0 as i64))?;
            let layout =
                Layout::from_size_align(bytes.max(1), ALIGN).map_err(|_| Error::SizeOverflow {
                    what: format!("{bytes} bytes"),
                })?;
            // SAFETY: a non-zero size; freed in Drop with the same layout.
            let host = unsafe { alloc_zeroed(layout) };
            if host.is_null() {
                return Err(syncmem::OomReport::new("host", bytes, "system allocator").into());
            }
            // SAFETY: `host` holds `bytes` bytes and outlives the buffer (released first in
            // Drop); the context is the queue's, alive while the stream is.
            let mem: cl_mem = unsafe {
                create_buffer(
                    context,
                    CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                    bytes,
                    host.cast::<c_void>(),
                )
            }
            .map_err(|e| {
                // SAFETY: allocated above with `layout`, not used by any buffer.
                unsafe { dealloc(host, layout) };
                cl_error(dev, "clCreateBuffer", e as i64)
            })?;
            Ok(RawMapped {
                queue,
                dev: dev.clone(),
                buffer: ManuallyDrop::new(Buffer::new(mem)),
                host,
                layout,
            })
        }

        /// Maps with `flags` (blocking), runs `f` on the mapped bytes, unmaps (queued).
        fn mapped(&mut self, flags: u64, f: impl FnOnce(*mut u8)) -> Result<()> {
            let queue = self.queue;
            let len = self.layout.size();
            let mut p: cl_mem = ptr::null_mut();
            // SAFETY: the whole buffer, mapped blocking: `p` is valid for `len` bytes until the
            // unmap below, which nothing else maps or uses meanwhile.
            unsafe {
                queue.enqueue_map_buffer(&self.buffer, CL_BLOCKING, flags, 0, len, &mut p, &[])
            }
            .map_err(|e| cl_error(&self.dev, "clEnqueueMapBuffer", e.0 as i64))?;
            f(p.cast::<u8>());
            // SAFETY: `p` is the pointer the map above returned for this buffer.
            unsafe { queue.enqueue_unmap_mem_object(self.buffer.get(), p, &[]) }
                .map_err(|e| cl_error(&self.dev, "clEnqueueUnmapMemObject", e.0 as i64))?;
            Ok(())
        }

        /// The cycle: a write of the first byte, a read of the last, each inside its map.
        pub(super) fn cycle(&mut self) -> Result<()> {
            let last = self.layout.size() - 1;
            // SAFETY: `p` is mapped for `last + 1` bytes (see `mapped`).
            self.mapped(CL_MAP_READ | CL_MAP_WRITE, |p| unsafe {
                p.write_volatile(1)
            })?;
            // SAFETY: as above.
            self.mapped(CL_MAP_READ, |p| {
                std::hint::black_box(unsafe { p.add(last).read_volatile() });
            })
        }
    }

    impl Drop for RawMapped<'_> {
        fn drop(&mut self) {
            // Nothing queued may still use the memory.
            let _ = self.queue.finish();
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.buffer) };
            // SAFETY: allocated in `new` with `layout`; its buffer was released above.
            unsafe { dealloc(self.host, self.layout) };
        }
    }
}
