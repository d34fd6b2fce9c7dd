//! Owned OpenCL handles whose `Drop` never panics.

use std::mem::ManuallyDrop;
use std::ptr;

use opencl3::command_queue::{self as cq, CommandQueue};
use opencl3::context::Context;
use opencl3::device::Device as ClDeviceId;
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer, ClMem as _};
use opencl3::program::Program;
use opencl3::types::{cl_event, cl_mem};
use parking_lot::Mutex;

use super::error::{alloc_error, backend_error};
use crate::error::Result;

/// Releases an event returned by an enqueue call that nobody waits on. Releasing an event does
/// not cancel its command.
pub(super) fn release_event_quietly(event: cl_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: `event` was returned by a successful enqueue call; this function takes over the
    // one reference that call gave us and nothing uses the handle afterwards.
    let _ = unsafe { opencl3::event::release_event(event) };
}

/// The context of one platform, shared by its devices, buffers and queues.
pub(super) struct ClContext {
    pub(super) ctx: ManuallyDrop<Context>,
}

impl Drop for ClContext {
    fn drop(&mut self) {
        // SAFETY: `ctx` is never dropped by `opencl3` (ManuallyDrop), so its one reference is
        // released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::context::context::release_context(self.ctx.get()) };
    }
}

/// A command queue released (without panicking) on drop.
pub(super) struct Queue {
    pub(super) queue: ManuallyDrop<CommandQueue>,
}

impl Queue {
    /// An in-order queue without profiling on `device` of `ctx`.
    pub(super) fn new(ctx: &ClContext, device: ClDeviceId, label: &str) -> Result<Self> {
        // SAFETY: `device` is one of the devices `ctx` was created with (both come from the
        // same platform in `discover`).
        #[allow(deprecated)]
        let queue = unsafe { CommandQueue::create(&ctx.ctx, device.id(), 0) }
            .map_err(|ClError(c)| backend_error(label, "clCreateCommandQueue", c))?;
        Ok(Self {
            queue: ManuallyDrop::new(queue),
        })
    }

    pub(super) fn raw(&self) -> opencl3::types::cl_command_queue {
        self.queue.get()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the `CommandQueue` is never dropped (ManuallyDrop), so its reference is
        // released exactly once, here. OpenCL finishes already queued commands on its own.
        let _ = unsafe { cq::release_command_queue(self.queue.get()) };
    }
}

/// A buffer released (without panicking) on drop.
pub(super) struct OwnedBuffer {
    pub(super) buf: ManuallyDrop<Buffer<u8>>,
}

impl OwnedBuffer {
    pub(super) fn new(ctx: &ClContext, flags: u64, bytes: usize, label: &str) -> Result<Self> {
        // SAFETY: no host pointer is passed (flags never contain CL_MEM_USE_HOST_PTR or
        // CL_MEM_COPY_HOST_PTR), so the runtime reads no host memory.
        let buf = unsafe { Buffer::<u8>::create(&ctx.ctx, flags, bytes, ptr::null_mut()) }
            .map_err(|ClError(c)| alloc_error(label, "clCreateBuffer", c, bytes))?;
        Ok(Self {
            buf: ManuallyDrop::new(buf),
        })
    }

    pub(super) fn raw(&self) -> cl_mem {
        self.buf.get()
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        // SAFETY: the `Buffer` is never dropped (ManuallyDrop), so its reference is released
        // exactly once, here. OpenCL frees the memory only once queued commands using it are
        // done, so pending asynchronous copies stay valid.
        let _ = unsafe { opencl3::memory::release_mem_object(self.buf.get()) };
    }
}

/// `label` for the whole process: one copy per distinct device label (so a handful), kept
/// for every event to name its device in errors without a reference count per command.
pub(super) fn interned(label: &str) -> &'static str {
    static LABELS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut labels = LABELS.lock();
    match labels.iter().find(|l| **l == label) {
        Some(l) => l,
        None => {
            let l: &'static str = Box::leak(label.into());
            labels.push(l);
            l
        }
    }
}

/// An event we hold a reference to. Cloning retains the event (no allocation); dropping
/// releases it.
pub(crate) struct OwnedEvent {
    pub(super) event: cl_event,
    /// The device's label ([`interned`]).
    pub(super) label: &'static str,
}

impl OwnedEvent {
    /// Takes over the one reference an enqueue call returned with `event`.
    pub(super) fn new(event: cl_event, label: &'static str) -> Self {
        Self { event, label }
    }
}

impl Clone for OwnedEvent {
    fn clone(&self) -> Self {
        // SAFETY: `self.event` is a live event (we hold a reference until Drop); retaining it
        // gives the clone a reference of its own, released by its own Drop.
        let _ = unsafe { opencl3::event::retain_event(self.event) };
        Self {
            event: self.event,
            label: self.label,
        }
    }
}

// SAFETY: an OpenCL event handle may be used from any thread: every OpenCL API call except
// clSetKernelArg is thread-safe (OpenCL 3.0 spec, "Multiple Host Threads"). The handle is
// released once per reference, in Drop.
unsafe impl Send for OwnedEvent {}
// SAFETY: as for Send; `&OwnedEvent` only allows clWaitForEvents / clGetEventInfo / retain.
unsafe impl Sync for OwnedEvent {}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        release_event_quietly(self.event);
    }
}

/// A program released quietly on drop (opencl3's own drop panics if the release fails).
pub(super) struct OwnedProgram(pub(super) ManuallyDrop<Program>);

impl Drop for OwnedProgram {
    fn drop(&mut self) {
        // SAFETY: the `Program` is never dropped by opencl3 (ManuallyDrop), so its one
        // reference is released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::program::release_program(self.0.get()) };
    }
}

/// A kernel released quietly on drop.
pub(super) struct OwnedKernel(pub(super) ManuallyDrop<Kernel>);

impl Drop for OwnedKernel {
    fn drop(&mut self) {
        // SAFETY: the `Kernel` is never dropped by opencl3 (ManuallyDrop), so its one
        // reference is released exactly once, here; errors are ignored.
        let _ = unsafe { opencl3::kernel::release_kernel(self.0.get()) };
    }
}
