//! A device's place in the reports: the source its pools and copies publish under, and the
//! step marks of the traces recording it.

use super::Device;
use crate::alloc::event::{self, Event};

impl Device {
    /// Marks the step the program is in (`None`: none) on every trace recording this device
    /// (`Trace::set_step` of the reports): the events recorded from now on carry it. The
    /// training loop (the trainer's `step`) marks each of its steps. Costs one relaxed atomic
    /// load while no trace is attached.
    pub fn mark_trace_step(&self, step: Option<u64>) {
        if event::active() {
            event::publish(self.trace_source(), &Event::Step(step));
        }
    }

    /// Tells the traces recording this device that net `net`, with a memory plan, was built
    /// for it: per planner slot, the names the plan puts in it in order of first use.
    /// `slots` is only called while a trace or the history records.
    pub(crate) fn publish_plan(
        &self,
        net: &str,
        slots: impl FnOnce() -> Vec<(String, Vec<String>)>,
    ) {
        if event::active() {
            let slots = slots();
            let e = Event::Plan {
                device: self.label(),
                net,
                slots: &slots,
            };
            event::publish(self.trace_source(), &e);
        }
    }

    /// The source this device's pools and streams publish their events under (see
    /// `alloc::event`).
    pub(crate) fn trace_source(&self) -> u64 {
        self.shared.memory.trace_source()
    }
}
