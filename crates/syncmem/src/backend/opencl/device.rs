//! One OpenCL device: allocation of device and pinned memory, and new streams.

use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::{Arc, OnceLock};

use opencl3::command_queue as cq;
use opencl3::context::Context;
use opencl3::device::Device as ClDeviceId;
use opencl3::error_codes::ClError;
use opencl3::memory::{CL_MAP_READ, CL_MAP_WRITE, CL_MEM_ALLOC_HOST_PTR, CL_MEM_READ_WRITE};
use opencl3::types::{cl_mem, CL_BLOCKING};

use super::error::{alloc_error, backend_error};
use super::handle::{release_event_quietly, ClContext, OwnedBuffer, Queue};
use super::{ClEvent, ClMem, ClPinned, ClStream};
use crate::backend::{BackendDevice, DeviceInfo, KeepAlive};
use crate::error::Result;

/// One OpenCL device, sharing its platform's context.
pub(crate) struct ClDevice {
    pub(super) info: DeviceInfo,
    pub(super) label: Arc<str>,
    pub(super) device: ClDeviceId,
    pub(super) ctx: Arc<ClContext>,
    /// Internal queue for mapping and unmapping pinned buffers, created on first use.
    pub(super) map_queue: OnceLock<Arc<Queue>>,
    /// Required alignment of sub-buffer origins, in bytes.
    pub(super) base_align: usize,
    /// The compiled kernels, shared with duplicates (same context).
    pub(super) kernels: Arc<super::KernelCache>,
}

impl ClDevice {
    /// `opencl:N`.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The device's compiled kernels.
    pub(crate) fn kernel_cache(&self) -> &super::KernelCache {
        &self.kernels
    }

    /// The platform's OpenCL context, e.g. to build programs for this device.
    pub(crate) fn context(&self) -> &Context {
        &self.ctx.ctx
    }

    /// The OpenCL device handle.
    pub(crate) fn device_id(&self) -> opencl3::types::cl_device_id {
        self.device.id()
    }

    fn map_queue(&self) -> Result<Arc<Queue>> {
        if let Some(q) = self.map_queue.get() {
            return Ok(q.clone());
        }
        let q = Arc::new(Queue::new(&self.ctx, self.device, &self.label)?);
        // Two threads may race here; the loser's queue is simply released.
        Ok(self.map_queue.get_or_init(|| q).clone())
    }

    /// A second backend device for the same OpenCL device, with its own counters and pools
    /// once wrapped in a `Device` (see `Device::isolated`).
    pub(crate) fn duplicate(&self) -> ClDevice {
        ClDevice {
            info: self.info.clone(),
            label: self.label.clone(),
            device: self.device,
            ctx: self.ctx.clone(),
            map_queue: OnceLock::new(),
            base_align: self.base_align,
            kernels: self.kernels.clone(),
        }
    }
}

impl BackendDevice for ClDevice {
    type Mem = ClMem;
    type Pinned = ClPinned;
    type Stream = ClStream;
    type Event = ClEvent;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<ClMem> {
        Ok(ClMem {
            buf: OwnedBuffer::new(&self.ctx, CL_MEM_READ_WRITE, bytes, &self.label)?,
            len: bytes,
            ctx: self.ctx.clone(),
            _parent: None,
        })
    }

    fn sub_align(&self) -> usize {
        self.base_align
    }

    fn sub_mem(&self, parent: &ClMem, off: usize, len: usize, keep: KeepAlive) -> Result<ClMem> {
        // SAFETY: CL_MEM_READ_WRITE is compatible with the parent's flags (CL_MEM_READ_WRITE),
        // and no host pointer flag is passed. The region lies inside the parent (caller's
        // contract); its origin is aligned to CL_DEVICE_MEM_BASE_ADDR_ALIGN (`sub_align`).
        let sub = unsafe {
            parent
                .buffer()
                .create_sub_buffer(CL_MEM_READ_WRITE, off, len)
        }
        .map_err(|ClError(c)| alloc_error(&self.label, "clCreateSubBuffer", c, len))?;
        Ok(ClMem {
            buf: OwnedBuffer {
                buf: ManuallyDrop::new(sub),
            },
            len,
            ctx: self.ctx.clone(),
            _parent: Some(keep),
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<ClPinned> {
        let buf = OwnedBuffer::new(
            &self.ctx,
            CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
            bytes,
            &self.label,
        )?;
        let queue = self.map_queue()?;
        let mut mapped: cl_mem = ptr::null_mut();
        // SAFETY: `buf` is a live buffer of `bytes` bytes in the context of `queue`; the map
        // is blocking, so `mapped` is set (or an error returned) when the call returns.
        let event = unsafe {
            cq::enqueue_map_buffer(
                queue.raw(),
                buf.raw(),
                CL_BLOCKING,
                CL_MAP_READ | CL_MAP_WRITE,
                0,
                bytes,
                &mut mapped,
                0,
                ptr::null(),
            )
        }
        .map_err(|c| alloc_error(&self.label, "clEnqueueMapBuffer", c, bytes))?;
        release_event_quietly(event);
        let ptr = mapped.cast::<u8>();
        if ptr.is_null() {
            return Err(backend_error(&self.label, "clEnqueueMapBuffer", -12));
        }
        // SAFETY: the blocking map made `ptr` valid for reads and writes of `bytes` bytes
        // until the buffer is unmapped, which only `ClPinned::drop` does.
        unsafe { ptr::write_bytes(ptr, 0, bytes) };
        Ok(ClPinned {
            buf,
            ptr,
            len: bytes,
            queue,
        })
    }

    fn new_stream(&self) -> Result<ClStream> {
        Ok(ClStream {
            queue: Queue::new(&self.ctx, self.device, &self.label)?,
            ctx: self.ctx.clone(),
            label: self.label.clone(),
            timeline: Default::default(),
        })
    }
}
