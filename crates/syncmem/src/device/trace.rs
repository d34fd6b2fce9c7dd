//! Recording a device's memory traffic: [`Trace::attach`] and [`Trace::attach_device_only`].

use std::sync::Arc;

use super::Device;
use crate::alloc::trace::{hub, Trace, TraceGuard};

impl Trace {
    /// Records `device`: allocations, frees and evictions of its device pool and of its pinned
    /// host pool, every copy made by its streams, and the allocations and frees of the global
    /// host pool (the host mirrors of [`crate::SyncedMemory`]), until the guard is dropped.
    ///
    /// Pools made later ([`Device::set_pool`], a first use) are covered too. Another handle on
    /// the same hardware made by [`Device::isolated`] is a different device here. Direct
    /// allocations ([`Device::alloc`]) are not pool traffic and are not recorded.
    pub fn attach(self: &Arc<Self>, device: &Device) -> TraceGuard {
        self.attach_source(device.shared.memory.trace_source(), true)
    }

    /// As [`Trace::attach`] without the global host pool: only `device`'s own pools and copies
    /// (other users of the host pool in the process do not show up).
    pub fn attach_device_only(self: &Arc<Self>, device: &Device) -> TraceGuard {
        self.attach_source(device.shared.memory.trace_source(), false)
    }
}

impl Device {
    /// Marks the step the program is in (`None`: none) on every trace recording this device
    /// ([`Trace::set_step`]): the events recorded from now on carry it. The training loop
    /// (the trainer's `step`) marks each of its steps. Costs one relaxed atomic
    /// load while no trace is attached.
    pub fn mark_trace_step(&self, step: Option<u64>) {
        if hub::active() {
            hub::mark_step(self.shared.memory.trace_source(), step);
        }
    }
}
