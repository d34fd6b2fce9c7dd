//! Nets: operators run in order in a workspace (Caffe2's `NetBase` / `SimpleNet`), their
//! management in a [`Workspace`], rewrites at build time, and memory planning. The built-in
//! operators, their fusion, the MLP and the training loop are in the `syncmem-nn` crate.
//!
//! ```
//! use syncmem::net::{NetDef, NetOptions};
//! use syncmem::ops::{register_operator, Operator, OperatorDef};
//! use syncmem::{Context, Device, Result, Workspace};
//!
//! /// Creates its output blob (and does nothing else).
//! struct Touch(OperatorDef);
//!
//! impl Operator for Touch {
//!     fn def(&self) -> &OperatorDef {
//!         &self.0
//!     }
//!     fn run(&self, ws: &Workspace, _: &Context) -> Result<()> {
//!         ws.create_blob(&self.0.outputs[0]).map(drop)
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! register_operator("Touch", None, |def, _| Ok(Box::new(Touch(def.clone()))))?;
//! let dev = Device::cpu();
//! let ws = Workspace::new();
//! let def = NetDef::new("init").op(OperatorDef::new("Touch", &[], &["x"]));
//! ws.create_net(&def, &dev, &NetOptions::new())?;    // builds every operator, or fails whole
//! ws.run_net("init")?;                                // errors name the net and the operator
//! assert_eq!(ws.nets(), vec!["init".to_string()]);
//! assert!(ws.has_blob("x"));
//! # Ok(())
//! # }
//! ```
//!
//! # Modules
//!
//! | module | role |
//! |---|---|
//! | [`NetDef`] | the serialisable description (JSON), with external inputs and outputs |
//! | [`Net`] | a net built for a device: its operators and a [`Context`] |
//! | `Workspace` net methods | `create_net`, `get_net`, `run_net`, `delete_net`, `nets`, `run_net_once` |
//! | [`plan`] | memory planning: intermediate blobs whose lifetimes do not overlap share buffers |
//! | [`NetRewrite`] | a rewrite of a net's definition applied at build time, before planning (`syncmem-nn`'s operator fusion is one) |
//! | [`memory`] | where each blob lives, bytes per side, peaks measured while a net runs |
//!
//! # Departures from Caffe2, on purpose
//!
//! | Caffe2 | here |
//! |---|---|
//! | `CreateNet(overwrite)` erases the old net before building the new one | the old net is replaced only once the new one has built |
//! | a build failure logs and returns null | [`Error::OperatorFailed`] naming the net, the operator's position, type and name |
//! | `RunNet` of a missing net logs and returns `false` | [`Error::NotFound`] naming the net |
//! | a failing operator makes `Run` return `false` | [`Error::OperatorFailed`] wrapping the operator's error |
//! | workspace and nets are not thread-safe | `Send + Sync`; one run of a given net at a time |
//! | memonger is a separate Python pass | [`NetOptions::plan_memory`] at creation |
//! | a device out of memory fails the run | under a memory cap the run's schedule picks what leaves the device: dead internal values dropped with no write-back (reading one after the run is [`Error::ContentsDropped`]; keep it with [`PlanOptions::keep`]), then the buffers used furthest ahead spilled |

mod def;
pub mod memory;
pub mod plan;
mod schedule;
mod workspace_nets;

pub use def::NetDef;
pub use plan::{plan_memory, MemoryPlan, PlanOptions};

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::context::{random_seed, Context};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::cache::{Installed, Kept};
use crate::ops::{create_operator, Operator, OperatorDef};
use crate::workspace::Workspace;

/// A rewrite of a net's definition, applied when the net is built and before planning: operator
/// fusion (`syncmem-nn`'s `Fuse`), or any pass of the user's. It returns the definition to
/// run, which must still write every blob of `keep` (the planner's `keep` names: what the
/// caller reads after a run) and every external output.
pub trait NetRewrite: Send + Sync {
    /// Rewrites `def`.
    ///
    /// # Errors
    /// Any error of the pass; [`Net::build`] returns it, naming the net.
    fn rewrite(&self, def: &NetDef, keep: &[String]) -> Result<NetDef>;
}

/// A source of operators tried before the registry ([`create_operator`]): returns
/// `Ok(None)` for a type it does not know. Lets users (and tests) add operator types.
pub type OperatorFactory =
    Arc<dyn Fn(&OperatorDef, &Device) -> Result<Option<Box<dyn Operator>>> + Send + Sync>;

/// How a net is created.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct NetOptions {
    /// Replace a net of the same name (only once the new one has built).
    pub overwrite: bool,
    /// Let intermediate blobs whose lifetimes do not overlap share buffers (see [`plan`]).
    pub plan_memory: bool,
    /// Options of the planner (names to keep, size hints); its `keep` names are never fused
    /// away either.
    pub plan: PlanOptions,
    /// A rewrite applied before planning (see [`NetRewrite`]); `None` by default. Blobs a
    /// rewrite removes are no longer written.
    pub rewrite: Option<Arc<dyn NetRewrite>>,
    /// Seed of the net's context (random fills); `None` draws one.
    pub seed: Option<u64>,
    /// Operators tried before the built-in ones.
    pub operators: Option<OperatorFactory>,
    /// Give a value's device memory back as soon as it is dead, even on a device without a
    /// memory cap (under a cap a run does so for all but the values smaller than a 32nd of the
    /// cap, which go when an allocation does not fit): after each operator, the device mirror
    /// of an internal blob whose next use overwrites it whole, this run or the next, is dropped
    /// without a write-back ([`crate::SyncedMemory::drop_contents`]). A value then holds
    /// device memory from its first write to its last read only, so the device's peak is that
    /// of the values live at once, at the cost of one pooled allocation per value and run.
    /// For work that moves values off the device between uses (offloaded activations): the
    /// room they leave is not taken back by values that are already dead.
    pub drop_dead: bool,
}

impl NetOptions {
    /// The defaults: no overwrite, no planning, no rewrite, a random seed, registered operators.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`NetOptions::overwrite`].
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// Sets [`NetOptions::plan_memory`].
    pub fn plan_memory(mut self, yes: bool) -> Self {
        self.plan_memory = yes;
        self
    }

    /// Sets [`NetOptions::rewrite`].
    pub fn rewrite(mut self, pass: Option<Arc<dyn NetRewrite>>) -> Self {
        self.rewrite = pass;
        self
    }

    /// Sets the planner's options (and turns planning on).
    pub fn with_plan(mut self, plan: PlanOptions) -> Self {
        self.plan_memory = true;
        self.plan = plan;
        self
    }

    /// Sets [`NetOptions::seed`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Sets [`NetOptions::operators`].
    pub fn operators(mut self, factory: OperatorFactory) -> Self {
        self.operators = Some(factory);
        self
    }

    /// Sets [`NetOptions::drop_dead`].
    pub fn drop_dead(mut self, yes: bool) -> Self {
        self.drop_dead = yes;
        self
    }
}

impl fmt::Debug for NetOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetOptions")
            .field("overwrite", &self.overwrite)
            .field("plan_memory", &self.plan_memory)
            .field("plan", &self.plan)
            .field("rewrite", &self.rewrite.is_some())
            .field("seed", &self.seed)
            .field("operators", &self.operators.is_some())
            .finish()
    }
}

/// A net built for one device: every operator of its [`NetDef`], and a [`Context`] (the
/// device's default stream and a seeded generator) it runs them with.
///
/// `Net` is `Send + Sync`. Runs of one net are serialised (Caffe2 reports "Detected concurrent
/// runs"); different nets run concurrently, each blob being protected by its own lock.
pub struct Net {
    def: NetDef,
    rewritten: Option<NetDef>,
    plan: Option<MemoryPlan>,
    device: Device,
    ctx: Context,
    ops: Vec<Box<dyn Operator>>,
    /// What the operators do with each blob (the schedule of a run under a memory cap).
    blob_uses: schedule::Schedules,
    /// What each operator's allocations record as the operator running (see
    /// [`crate::report::op_scope`]): `NET[INDEX] TYPE -> OUTPUTS`.
    sites: Vec<Arc<str>>,
    /// Held while the net runs: each operator's blobs as its last run found them (see
    /// `ops::cache`), so that a run looks up no name while no name changed.
    running: Mutex<Vec<Option<Box<Kept>>>>,
    /// [`NetOptions::drop_dead`].
    drop_dead: bool,
}

impl Net {
    /// Builds every operator of `def` for `device` (after `opts.rewrite`, then
    /// planning memory when `opts.plan_memory`). The workspace is not touched; on error
    /// nothing is left behind.
    ///
    /// # Errors
    /// [`Error::OperatorFailed`] (stage `"build"`) naming the net and the operator whose
    /// construction failed (unknown type, bad arguments), or (stage `"rewrite"`) wrapping the
    /// error of the rewrite; an error of the planner; a backend
    /// error creating the context.
    pub fn build(def: &NetDef, device: &Device, opts: &NetOptions) -> Result<Net> {
        let rewritten = match &opts.rewrite {
            Some(pass) => {
                Some(
                    pass.rewrite(def, &opts.plan.keep)
                        .map_err(|e| Error::OperatorFailed {
                            net: def.name.clone(),
                            stage: "rewrite",
                            index: 0,
                            op: "(the net's rewrite)".into(),
                            error: Box::new(e),
                        })?,
                )
            }
            None => None,
        };
        let base = rewritten.as_ref().unwrap_or(def);
        let plan = if opts.plan_memory {
            Some(plan_memory(base, &opts.plan)?)
        } else {
            None
        };
        if let Some(p) = &plan {
            // The traces recording the device learn which blobs each slot holds.
            device.publish_plan(&def.name, || p.slots_in_order(base));
        }
        let run_def = plan.as_ref().map_or(base, |p| &p.def);
        let mut ops = Vec::with_capacity(run_def.ops.len());
        for (index, op_def) in run_def.ops.iter().enumerate() {
            let built = match &opts.operators {
                Some(f) => match f(op_def, device) {
                    Ok(Some(op)) => Ok(op),
                    Ok(None) => create_operator(op_def, device),
                    Err(e) => Err(e),
                },
                None => create_operator(op_def, device),
            };
            ops.push(built.map_err(|e| op_failed(base, plan.as_ref(), "build", index, e))?);
        }
        let ctx = Context::with_seed(device, opts.seed.unwrap_or_else(random_seed))?;
        let protected = plan::protected_names(run_def, &opts.plan);
        let internal: BTreeSet<String> = run_def
            .blob_names()
            .into_iter()
            .filter(|n| !protected.contains(n))
            .collect();
        let blob_uses = schedule::Schedules::new(schedule::BlobUses::new(&ops, &internal));
        let sites = run_def
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| site(&def.name, i, o))
            .collect();
        let kept = ops.iter().map(|_| Some(Box::default())).collect();
        Ok(Net {
            def: def.clone(),
            rewritten,
            plan,
            device: device.clone(),
            ctx,
            ops,
            blob_uses,
            sites,
            running: Mutex::new(kept),
            drop_dead: opts.drop_dead,
        })
    }

    /// The net's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The definition the net was created from.
    pub fn def(&self) -> &NetDef {
        &self.def
    }

    /// The definition that runs: rewritten when the net was built with
    /// [`NetOptions::rewrite`], then planned when memory was planned; else [`Net::def`].
    pub fn run_def(&self) -> &NetDef {
        self.plan
            .as_ref()
            .map_or_else(|| self.base_def(), |p| &p.def)
    }

    /// The definition before planning: the rewritten one, else [`Net::def`].
    fn base_def(&self) -> &NetDef {
        self.rewritten.as_ref().unwrap_or(&self.def)
    }

    /// The rewritten definition, when the net was built with [`NetOptions::rewrite`].
    pub fn rewritten(&self) -> Option<&NetDef> {
        self.rewritten.as_ref()
    }

    /// The memory plan, when the net was created with one.
    pub fn plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// The workspace name under which blob `name` of [`Net::def`] lives while the net runs: a
    /// shared buffer's name when planning mapped it, else `name` itself.
    pub fn blob_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.plan
            .as_ref()
            .and_then(|p| p.mapping.get(name))
            .map_or(name, String::as_str)
    }

    /// The device the operators were built for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The net's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Number of operators.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True for a net without operators.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Runs every operator in order with the net's context.
    ///
    /// # Errors
    /// [`Error::OperatorFailed`] (stage `"run"`) naming the net and the first operator that
    /// failed, with the operator's error inside. Later operators do not run.
    pub fn run(&self, ws: &Workspace) -> Result<()> {
        self.run_with(ws, &self.ctx)
    }

    /// Runs every operator in order with another context (on the same device).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `ctx` is on another device; as [`Net::run`].
    pub fn run_with(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        self.run_observed(ws, ctx, |_, _| Ok(()))
    }

    /// As [`Net::run_with`], calling `after(index, op)` after each operator succeeded (for
    /// measurements; an error from it stops the run and is returned as is).
    ///
    /// # Errors
    /// As [`Net::run_with`], or the error of `after`.
    pub fn run_observed(
        &self,
        ws: &Workspace,
        ctx: &Context,
        mut after: impl FnMut(usize, &OperatorDef) -> Result<()>,
    ) -> Result<()> {
        if !ctx.device().same(&self.device) {
            return Err(Error::DeviceMismatch {
                op: "Net::run",
                expected: format!("{} (net {:?})", self.device.label(), self.def.name),
                actual: ctx.device().label().to_string(),
            });
        }
        let mut kept = self.running.lock();
        // Under a memory cap (or asked to), the device drops and spills by this run's next
        // uses.
        let schedule =
            schedule::Installed::when_needed(&self.device, &self.blob_uses, ws, self.drop_dead);
        for (index, op) in self.ops.iter().enumerate() {
            if let Some(s) = &schedule {
                s.schedule.at(index);
            }
            let _site = crate::report::op_scope(self.sites[index].clone());
            let installed = Installed::new(&mut kept[index]);
            op.run(ws, ctx)
                .map_err(|e| op_failed(self.base_def(), self.plan.as_ref(), "run", index, e))?;
            drop(installed);
            if let Some(s) = &schedule {
                s.drop_dead_after(index);
            }
            after(index, op.def())?;
        }
        Ok(())
    }
}

/// What the allocations of operator `index` of net `net` record as their operator.
fn site(net: &str, index: usize, op: &OperatorDef) -> Arc<str> {
    format!("{net}[{index}] {} -> {}", op.label(), op.outputs.join(", ")).into()
}

/// The error for operator `index` of `def`. With a memory plan, the blob names the operator's
/// own error uses are the planned ones: the message lists how its blobs were renamed.
fn op_failed(
    def: &NetDef,
    plan: Option<&MemoryPlan>,
    stage: &'static str,
    index: usize,
    e: Error,
) -> Error {
    let mut op = def
        .ops
        .get(index)
        .map_or_else(String::new, OperatorDef::label);
    if let (Some(p), Some(orig)) = (plan, def.ops.get(index)) {
        let mut renamed: Vec<String> = Vec::new();
        for n in orig.inputs.iter().chain(&orig.outputs) {
            if let Some(slot) = p.mapping.get(n) {
                let r = format!("{n} -> {slot}");
                if !renamed.contains(&r) {
                    renamed.push(r);
                }
            }
        }
        if !renamed.is_empty() {
            op.push_str(&format!(" (memory plan: {})", renamed.join(", ")));
        }
    }
    Error::OperatorFailed {
        net: def.name.clone(),
        stage,
        index,
        op,
        error: Box::new(e),
    }
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Net")
            .field("name", &self.def.name)
            .field("device", &self.device.label())
            .field("ops", &self.ops.len())
            .field("rewritten", &self.rewritten.is_some())
            .field("planned", &self.plan.is_some())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Net>();
    check::<NetDef>();
    check::<NetOptions>();
    check::<Workspace>();
}
