//! The raw backend allocation behind a device: the call a device pool saves, without the
//! memory cap, the statistics or the buffer wrapper of [`syncmem::Device::alloc`].
//!
//! - `cpu`: `alloc_zeroed` at alignment 16 plus 48 bytes of slack, as the host allocator does;
//! - `opencl:N`: `clCreateBuffer(CL_MEM_READ_WRITE)` + `clReleaseMemObject` on the device's
//!   context;
//! - `cuda:N`: `cuMemAlloc` + `cuMemFree` with the device's context current.

use std::alloc::{GlobalAlloc, Layout, System};

use syncmem::{BackendKind, Device, Error, OomReport, Result, Stream};

/// One raw allocation and free of `bytes` bytes on a device, repeatable.
pub struct RawCycle {
    /// What is called, for the report.
    pub name: &'static str,
    run: Box<dyn FnMut() -> Result<()>>,
}

impl RawCycle {
    /// Allocates and frees once.
    ///
    /// # Errors
    /// The backend's refusal.
    pub fn run(&mut self) -> Result<()> {
        (self.run)()
    }
}

#[cfg(any(feature = "opencl", feature = "cuda"))]
fn backend_error(backend: BackendKind, dev: &Device, op: &'static str, code: i64) -> Error {
    Error::Backend {
        backend,
        device: dev.label().to_string(),
        op,
        code,
        message: "in the raw allocation of the benchmark".to_string(),
    }
}

/// The raw allocation of `dev`'s backend (`stream` gives the backend's context).
///
/// # Errors
/// [`Error::Unsupported`] for a backend compiled out; the backend's error when its context
/// cannot be read.
pub fn raw_cycle(dev: &Device, stream: &Stream, bytes: usize) -> Result<RawCycle> {
    let _ = stream;
    match dev.backend() {
        BackendKind::Cpu => {
            let layout = Layout::from_size_align(bytes.max(1) + 48, 16).map_err(|_| {
                Error::SizeOverflow {
                    what: format!("{bytes} bytes"),
                }
            })?;
            let label = dev.label().to_string();
            Ok(RawCycle {
                name: "alloc_zeroed(align 16) + dealloc (the host allocator)",
                run: Box::new(move || {
                    // SAFETY: non-zero size; freed at once with the same layout.
                    unsafe {
                        let p = System.alloc_zeroed(layout);
                        if p.is_null() {
                            return Err(OomReport::new(label.clone(), bytes, "").into());
                        }
                        System.dealloc(std::hint::black_box(p), layout);
                    }
                    Ok(())
                }),
            })
        }
        #[cfg(feature = "opencl")]
        BackendKind::OpenCl => opencl(dev, stream, bytes),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => cuda(dev, stream, bytes),
        #[allow(unreachable_patterns)]
        other => Err(Error::Unsupported {
            device: dev.label().to_string(),
            what: format!("the raw {other} allocation (feature not compiled in)"),
        }),
    }
}

#[cfg(feature = "opencl")]
fn opencl(dev: &Device, stream: &Stream, bytes: usize) -> Result<RawCycle> {
    use opencl3::memory::{create_buffer, release_mem_object, CL_MEM_READ_WRITE};

    let kind = BackendKind::OpenCl;
    let queue = stream
        .as_opencl()
        .ok_or_else(|| backend_error(kind, dev, "clGetCommandQueueInfo", 0))?;
    let context = queue
        .context()
        .map_err(|e| backend_error(kind, dev, "clGetCommandQueueInfo", i64::from(e.0)))?;
    let d = dev.clone();
    Ok(RawCycle {
        name: "clCreateBuffer + clReleaseMemObject",
        run: Box::new(move || {
            // SAFETY: `context` is the live context of `d`'s queue (the device keeps it), no
            // host pointer is passed, and the buffer is released exactly once, at once.
            unsafe {
                let mem = create_buffer(context, CL_MEM_READ_WRITE, bytes, std::ptr::null_mut())
                    .map_err(|e| backend_error(kind, &d, "clCreateBuffer", i64::from(e)))?;
                release_mem_object(std::hint::black_box(mem))
                    .map_err(|e| backend_error(kind, &d, "clReleaseMemObject", i64::from(e)))
            }
        }),
    })
}

#[cfg(feature = "cuda")]
fn cuda(dev: &Device, stream: &Stream, bytes: usize) -> Result<RawCycle> {
    use cudarc::driver::result::{free_sync, malloc_sync};

    let kind = BackendKind::Cuda;
    let s = stream
        .as_cuda()
        .ok_or_else(|| backend_error(kind, dev, "cuStreamGetCtx", 0))?
        .clone();
    let d = dev.clone();
    Ok(RawCycle {
        name: "cuMemAlloc + cuMemFree",
        run: Box::new(move || {
            let code = |e: cudarc::driver::DriverError| e.0 as i64;
            s.context()
                .bind_to_thread()
                .map_err(|e| backend_error(kind, &d, "cuCtxSetCurrent", code(e)))?;
            // SAFETY: the stream's context is current on this thread; the memory is freed at
            // once and never accessed.
            unsafe {
                let p = malloc_sync(bytes)
                    .map_err(|e| backend_error(kind, &d, "cuMemAlloc", code(e)))?;
                free_sync(std::hint::black_box(p))
                    .map_err(|e| backend_error(kind, &d, "cuMemFree", code(e)))
            }
        }),
    })
}
