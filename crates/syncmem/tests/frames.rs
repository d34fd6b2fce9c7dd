//! Frames of allocations, on `cpu` and on OpenCL/PoCL: an allocation made while a net runs
//! records the net and operator; with stacks on, it records its call stack; the PyTorch export
//! carries both as frames.

use std::sync::Arc;

use syncmem::net::{NetDef, NetOptions};
use syncmem::ops::{register_operator, Operator, OperatorDef};
use syncmem::report::torch::TorchSnapshot;
use syncmem::report::{op_scope, set_trace_stacks, Trace, TraceEvent};
use syncmem::{Context, Device, Result, SyncedMemory, Workspace};

/// Allocates a device mirror while it runs (kept in a blob-free buffer, freed at once).
struct AllocHere(OperatorDef);

impl Operator for AllocHere {
    fn def(&self) -> &OperatorDef {
        &self.0
    }
    fn run(&self, _: &Workspace, ctx: &Context) -> Result<()> {
        let m = SyncedMemory::new(4096, ctx.device()).with_zero_copy(false);
        drop(m.device_mut()?);
        Ok(())
    }
}

/// The `operator` and `frames` of the allocations of `trace` on `dev`'s device pool.
fn allocs(trace: &Trace, dev: &Device) -> Vec<(Option<String>, Vec<String>)> {
    trace
        .events()
        .into_iter()
        .filter_map(|e| match e {
            TraceEvent::Alloc {
                device,
                operator,
                frames,
                ..
            } if device == dev.label() => {
                Some((operator, frames.into_iter().map(|f| f.name).collect()))
            }
            _ => None,
        })
        .collect()
}

fn a_net_s_allocations_name_its_operator(dev: &Device) {
    register_operator("AllocHere", None, |def, _| {
        Ok(Box::new(AllocHere(def.clone())))
    })
    .ok();
    let dev = dev.detached();
    let ws = Workspace::new();
    let def = NetDef::new("frames").op(OperatorDef::new("AllocHere", &[], &["x"]));
    ws.create_net(&def, &dev, &NetOptions::new()).unwrap();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&dev);
    ws.run_net("frames").unwrap();
    // Outside the net, no operator is marked.
    drop(
        dev.alloc_pooled(64, &dev.default_stream().unwrap())
            .unwrap(),
    );
    drop(guard);
    let a = allocs(&trace, &dev);
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[0].0.as_deref(), Some("frames[0] AllocHere -> x"));
    assert_eq!(a[1].0, None);
    // The PyTorch export writes the operator as the block's second frame.
    let snap = TorchSnapshot::from_trace(&trace).unwrap();
    let entry = snap
        .device_traces
        .iter()
        .flatten()
        .find(|e| e.frame.as_ref().is_some_and(|f| f.op.is_some()))
        .expect("an entry with the operator");
    let f = entry.frame.as_ref().unwrap();
    assert_eq!(f.op.as_deref(), Some("frames[0] AllocHere -> x"));
    let pickle = snap.to_pickle();
    let has = |s: &[u8]| pickle.windows(s.len()).any(|w| w == s);
    assert!(has(b"(operator)") && has(b"frames[0] AllocHere -> x"));
}

#[inline(never)]
fn allocate_with_a_stack(dev: &Device) {
    drop(
        dev.alloc_pooled(64, &dev.default_stream().unwrap())
            .unwrap(),
    );
}

fn stacks_are_recorded_when_asked(dev: &Device) {
    let dev = dev.detached();
    let trace = Arc::new(Trace::new());
    let guard = trace.attach_device_only(&dev);
    let _op = op_scope("my phase".into());
    set_trace_stacks(true);
    allocate_with_a_stack(&dev);
    set_trace_stacks(false);
    allocate_with_a_stack(&dev);
    drop(guard);
    let a = allocs(&trace, &dev);
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[0].0.as_deref(), Some("my phase"));
    // The stack starts past the recording, and names the caller.
    let stack = &a[0].1;
    assert!(!stack.is_empty());
    assert!(!stack[0].starts_with("syncmem::report"), "{stack:?}");
    assert!(
        stack.iter().any(|n| n.contains("allocate_with_a_stack")),
        "{stack:?}"
    );
    assert!(a[1].1.is_empty(), "stacks off: {:?}", a[1].1);
    // A round trip through a file keeps them; the export writes them after the operator.
    let mut file = Vec::new();
    trace.save(&mut file).unwrap();
    assert_eq!(Trace::load(&file[..]).unwrap().events(), trace.events());
    let snap = TorchSnapshot::from_trace(&trace).unwrap();
    let pickle = snap.to_pickle();
    assert!(pickle
        .windows(b"allocate_with_a_stack".len())
        .any(|w| w == b"allocate_with_a_stack"));
}

syncmem::for_each_device!(
    a_net_s_allocations_name_its_operator,
    stacks_are_recorded_when_asked
);
