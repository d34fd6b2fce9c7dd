//! A net keeps its operators' blobs between runs (no name is looked up while none changed):
//! a run after a blob was removed, replaced, renamed or forwarded still reads the blob its
//! names lead to now, and a net does not keep a removed blob alive.

use std::sync::{Arc, Mutex};

use syncmem::net::{NetDef, NetOptions};
use syncmem::ops::{register_operator, with_io, Operator, OperatorDef};
use syncmem::tensor::Tensor;
use syncmem::{Context, Device, Result, Workspace};

/// What `Probe` read: the first float of its input at each run.
static SEEN: Mutex<Vec<f32>> = Mutex::new(Vec::new());

/// Reads its one input through `with_io`, as an operator of a net does.
struct Probe(OperatorDef);

impl Operator for Probe {
    fn def(&self) -> &OperatorDef {
        &self.0
    }
    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        with_io(ws, &self.0, ctx.device(), &[], |io| {
            let v = io.input(0)?.host::<f32>()?[0];
            SEEN.lock().unwrap().push(v);
            Ok(())
        })
    }
}

fn put(ws: &Workspace, name: &str, v: f32) -> Result<()> {
    let t = Tensor::from_slice(&[1], &[v], Some(&Device::cpu()))?;
    ws.create_local_blob(name)?.write().reset(t);
    Ok(())
}

/// Runs net `net` and returns what its probe read.
fn probe(ws: &Workspace, net: &str) -> Result<f32> {
    ws.run_net(net)?;
    Ok(SEEN.lock().unwrap().pop().expect("the probe ran"))
}

#[test]
fn runs_follow_the_names_as_they_change() -> Result<()> {
    register_operator("LookupProbe", None, |def, _| {
        Ok(Box::new(Probe(def.clone())))
    })?;
    let dev = Device::cpu();
    let parent = Arc::new(Workspace::new());
    let ws = Workspace::with_parent(parent.clone());
    put(&ws, "x", 1.0)?;
    let def = NetDef::new("probe").op(OperatorDef::new("LookupProbe", &["x"], &[]));
    ws.create_net(&def, &dev, &NetOptions::new())?;
    assert_eq!(probe(&ws, "probe")?, 1.0);
    assert_eq!(probe(&ws, "probe")?, 1.0, "the kept blob");

    // Removed and made again: another blob under the same name.
    let old = Arc::downgrade(&ws.get_blob("x")?);
    assert!(ws.remove_blob("x"));
    assert!(
        old.upgrade().is_none(),
        "the net does not keep a removed blob"
    );
    put(&ws, "x", 2.0)?;
    assert_eq!(probe(&ws, "probe")?, 2.0);

    // Renamed onto the name.
    put(&ws, "z", 3.0)?;
    assert!(ws.remove_blob("x"));
    ws.rename_blob("z", "x")?;
    assert_eq!(probe(&ws, "probe")?, 3.0);

    // Gone locally: the parent's blob of that name.
    put(&parent, "x", 4.0)?;
    assert!(ws.remove_blob("x"));
    assert_eq!(probe(&ws, "probe")?, 4.0);
    // A local blob hides it again.
    put(&ws, "x", 5.0)?;
    assert_eq!(probe(&ws, "probe")?, 5.0);
    // The contents of a kept blob, replaced in place, are read as they are now.
    put(&ws, "x", 6.0)?;
    assert_eq!(probe(&ws, "probe")?, 6.0);

    // No blob of that name anywhere: the run fails, and succeeds again once there is one.
    assert!(ws.remove_blob("x"));
    assert!(parent.remove_blob("x"));
    assert!(ws.run_net("probe").is_err());
    put(&ws, "x", 7.0)?;
    assert_eq!(probe(&ws, "probe")?, 7.0);
    Ok(())
}
