//! One OpenCL device: allocation of device and pinned memory, and new streams.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};

use opencl3::command_queue as cq;
use opencl3::context::Context;
use opencl3::device::Device as ClDeviceId;
use opencl3::error_codes::ClError;
use opencl3::memory::{
    set_mem_object_destructor_callback, Buffer, CL_MAP_READ, CL_MAP_WRITE, CL_MEM_ALLOC_HOST_PTR,
    CL_MEM_READ_WRITE, CL_MEM_USE_HOST_PTR,
};
use opencl3::types::{cl_mem, CL_BLOCKING, CL_NON_BLOCKING};

use super::error::{alloc_error, backend_error};
use super::handle::{release_event_quietly, ClContext, OwnedBuffer, Queue};
use super::memory::free_host_block;
use super::{ClEvent, ClMem, ClPinned, ClStream};
use crate::backend::cpu::host::{AlignedBlock, PAGE_ALIGN};
use crate::backend::{BackendDevice, DeviceInfo, KeepAlive};
use crate::error::{Error, OomReport, Result};

/// One OpenCL device, sharing its platform's context.
pub(crate) struct ClDevice {
    pub(super) info: DeviceInfo,
    pub(super) label: Arc<str>,
    /// `label`, [`interned`](super::handle::interned) once: what each event of the device's
    /// streams keeps.
    pub(super) event_label: &'static str,
    pub(super) device: ClDeviceId,
    pub(super) ctx: Arc<ClContext>,
    /// Internal queue for mapping and unmapping pinned buffers, created on first use.
    pub(super) map_queue: OnceLock<Arc<Queue>>,
    /// Required alignment of sub-buffer origins, in bytes.
    pub(super) base_align: usize,
    /// A CPU device (`CL_DEVICE_TYPE_CPU`): work-items of a group run one after another on one
    /// core, so element-wise kernels give each a contiguous run of elements.
    pub(super) cpu: bool,
    /// `CL_DEVICE_MAX_COMPUTE_UNITS` (at least 1).
    pub(super) compute_units: usize,
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

    /// A second backend device for the same OpenCL device with its own kernels, built for the
    /// element-wise mapping of a CPU device (`cpu`) or of a GPU, whatever this one is: tests run
    /// both mappings on one device.
    #[cfg(test)]
    pub(crate) fn with_mapping(&self, cpu: bool) -> ClDevice {
        ClDevice {
            cpu,
            kernels: Default::default(),
            ..self.duplicate()
        }
    }

    /// A second backend device for the same OpenCL device, with its own counters and pools
    /// once wrapped in a `Device` (see `Device::isolated`).
    pub(crate) fn duplicate(&self) -> ClDevice {
        ClDevice {
            info: self.info.clone(),
            label: self.label.clone(),
            event_label: self.event_label,
            device: self.device,
            ctx: self.ctx.clone(),
            map_queue: OnceLock::new(),
            base_align: self.base_align,
            cpu: self.cpu,
            compute_units: self.compute_units,
            kernels: self.kernels.clone(),
        }
    }
}

impl ClDevice {
    /// Whether `other` is in this device's context: a buffer of either can be copied into a
    /// buffer of the other with one command (`clEnqueueCopyBuffer`).
    pub(crate) fn shares_context(&self, other: &ClDevice) -> bool {
        Arc::ptr_eq(&self.ctx, &other.ctx)
    }

    /// Device memory the host can use in place: a page-aligned, zeroed host block of `bytes`
    /// bytes (rounded up to 64) wrapped with `CL_MEM_USE_HOST_PTR`, the rule for zero-copy
    /// buffers of the drivers that share host memory. The block is freed when OpenCL destroys
    /// the buffer, after the commands that use it.
    pub(crate) fn alloc_unified(&self, bytes: usize) -> Result<ClMem> {
        let rounded = bytes.div_ceil(64).saturating_mul(64);
        let block = AlignedBlock::zeroed_aligned(rounded, PAGE_ALIGN)?;
        let host = NonNull::new(block.as_ptr()).ok_or_else(|| {
            Error::from(OomReport::new(
                self.label.to_string(),
                bytes,
                "no host memory for the buffer",
            ))
        })?;
        // SAFETY: `host` is valid for `rounded >= bytes` bytes and stays allocated until the
        // destructor callback registered below frees it, which OpenCL calls only once the
        // buffer (and every sub-buffer and command using it) is gone.
        let buf = unsafe {
            Buffer::<u8>::create(
                &self.ctx.ctx,
                CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                bytes,
                host.as_ptr().cast::<c_void>(),
            )
        }
        .map_err(|ClError(c)| alloc_error(&self.label, "clCreateBuffer", c, bytes))?;
        let buf = OwnedBuffer {
            buf: ManuallyDrop::new(buf),
        };
        let block = Box::into_raw(Box::new(block));
        // SAFETY: `free_host_block` takes back exactly this box, once, when the memory object
        // is destroyed.
        if let Err(c) = unsafe {
            set_mem_object_destructor_callback(buf.raw(), free_host_block, block.cast::<c_void>())
        } {
            // No callback: release the buffer first (nothing was queued on it), then the block.
            drop(buf);
            // SAFETY: the callback was not registered, so the box is still ours alone.
            drop(unsafe { Box::from_raw(block) });
            return Err(backend_error(
                &self.label,
                "clSetMemObjectDestructorCallback",
                c,
            ));
        }
        let in_place = OnceLock::new();
        let _ = in_place.set(self.maps_in_place(&buf, bytes, host.as_ptr())?);
        Ok(ClMem {
            buf,
            len: bytes,
            ctx: self.ctx.clone(),
            _parent: None,
            host: Some(host),
            in_place,
        })
    }

    /// Whether the driver uses a new buffer's host block in place: a map of the whole buffer,
    /// on the device's internal queue (nothing else is queued there, and nothing has used the
    /// buffer yet), gives the block's address. The map is not blocking (its address is known
    /// when the call returns) and the unmap is queued right behind it, so one wait, for the
    /// unmap, ends both: the buffer is never used while it is mapped.
    fn maps_in_place(&self, buf: &OwnedBuffer, bytes: usize, host: *mut u8) -> Result<bool> {
        let queue = self.map_queue()?;
        let mut mapped: *mut c_void = ptr::null_mut();
        // SAFETY: `buf` is a live buffer of `bytes` bytes in the context of `queue`. The map is
        // not blocking: `mapped` is set when the call returns, and its bytes are not touched
        // (only the address is compared).
        let event = unsafe {
            cq::enqueue_map_buffer(
                queue.raw(),
                buf.raw(),
                CL_NON_BLOCKING,
                CL_MAP_READ,
                0,
                bytes,
                &mut mapped,
                0,
                ptr::null(),
            )
        }
        .map_err(|c| alloc_error(&self.label, "clEnqueueMapBuffer", c, bytes))?;
        release_event_quietly(event);
        // SAFETY: `mapped` is the address the map above returned for `buf`, unmapped once; the
        // queue is in order, so the unmap runs after the map.
        let event =
            unsafe { cq::enqueue_unmap_mem_object(queue.raw(), buf.raw(), mapped, 0, ptr::null()) }
                .map_err(|c| backend_error(&self.label, "clEnqueueUnmapMemObject", c))?;
        let done = opencl3::event::wait_for_events(&[event])
            .map_err(|c| backend_error(&self.label, "clWaitForEvents", c));
        release_event_quietly(event);
        done?;
        Ok(mapped.cast::<u8>() == host)
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
            host: None,
            in_place: OnceLock::new(),
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
            // SAFETY: `off < parent.len`: the address stays inside the parent's host block.
            host: parent
                .host
                .map(|h| unsafe { NonNull::new_unchecked(h.as_ptr().add(off)) }),
            // A sub-buffer of a buffer over a host block is the same block at an offset.
            in_place: parent.in_place.clone(),
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
            event_label: self.event_label,
            timeline: Default::default(),
        })
    }
}
