//! The update operators with state, `MomentumSGD` and `Adam`: what they share.
//!
//! Each updates one parameter or several in place, from its gradient and its state tensors
//! (blobs of the workspace beside the parameter, zero-filled by the init net:
//! [`crate::optimizer`]). Inputs come in groups, one per parameter: `[param, grad, state...]`
//! (`MomentumSGD`: one state, the momentum; `Adam`: two, the moments `m` and `v`); outputs
//! are none, or every written blob of every group in order, `[param, state...]` (each the
//! input of the same name: the update is in place). At most [`MAX_GROUPS`] parameters per
//! operator; the update fusion ([`crate::fuse::sgd`]) merges consecutive ones.
//!
//! Each has one element-wise kernel, OpenCL C and CUDA C twins in files next to the operator
//! (`momentum.cl`, `momentum.cu`, `adam.cl`, `adam.cu`), and a host closure for the `cpu`
//! device, launched once per parameter through [`syncmem::kernels::launch`], the door a
//! user's kernel takes (see the `custom_operator` example). The launch is the one `unsafe`
//! call of this crate ([`launch_group`]): syncmem cannot check what a kernel of its user
//! touches, so the caller vouches for it, here after checking that every buffer of the
//! launch holds the parameter's elements.

mod adam;
mod momentum;

use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;

use syncmem::device::{Grid, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::ops::{
    check_context, invalid_def as invalid, with_io, Args, Operand as What, Operator, OperatorDef,
};
use syncmem::{Context, Device, Error, Result, Tensor, Workspace};

use super::access::{expect_dtype, shape_error};

pub(crate) use adam::build_adam;
pub(crate) use momentum::build_momentum_sgd;

/// The most parameters of one update operator.
pub(crate) const MAX_GROUPS: usize = syncmem::kernels::AXPY_MULTI;

/// Threads per block of a launch, and most blocks (the kernels loop over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: usize = 1024;

/// The inputs per parameter of an update operator type (`[param, grad, state...]`): 2 for
/// `SGD`, 3 for `MomentumSGD`, 4 for `Adam`; `None` for any other type. Data-parallel
/// training splits the update off a train net by these types.
pub(crate) fn update_group(op_type: &str) -> Option<usize> {
    match op_type {
        "SGD" => Some(2),
        "MomentumSGD" => Some(2 + momentum::STATES),
        "Adam" => Some(2 + adam::STATES),
        _ => None,
    }
}

/// What differs between the update operators: the kernel, the states per parameter, the
/// scalars of a run.
trait Rule: Send + Sync + 'static {
    /// State tensors per parameter.
    const STATES: usize;

    /// The kernel: `(param, grad, state..., n, scalars...)`.
    fn kernel() -> &'static UserKernel;

    /// The arguments after `n` for run number `t` of the operator (from 1): scalars, or the
    /// raw bytes of a vector of the rule's own. A launch has at most 8 arguments in all (the
    /// `cpu` device passes that many without a heap allocation).
    fn scalars(&self, t: u64) -> SmallVec<[Arg<'_>; 4]>;
}

/// An update operator over its parameters' groups.
struct Update<R> {
    def: OperatorDef,
    /// `def` with its outputs spelled out: with no output listed, the parameters and states
    /// are still written, so they run as if they were the outputs.
    run_def: OperatorDef,
    /// The (input, output) pairs computed in place.
    in_place: Vec<(usize, usize)>,
    device: Device,
    rule: R,
    /// Runs so far (Adam's bias correction counts them).
    runs: AtomicU64,
}

/// Checks the groups of `def` (`2 + R::STATES` inputs per parameter, outputs none or the
/// written blobs of every group, in place) and builds the operator with `rule`.
fn build<R: Rule>(
    def: &OperatorDef,
    device: &Device,
    known: &[&str],
    rule: impl FnOnce(&Args<'_>) -> Result<R>,
) -> Result<Box<dyn Operator>> {
    let (ins, outs) = (2 + R::STATES, 1 + R::STATES);
    let args = Args::check(def, (ins, ins * MAX_GROUPS), (0, outs * MAX_GROUPS), known)?;
    let rule = rule(&args)?;
    if !def.inputs.len().is_multiple_of(ins) {
        return Err(invalid(
            def,
            format!(
                "takes (parameter, gradient{}) groups: a multiple of {ins} inputs, got {}",
                ", state".repeat(R::STATES),
                def.inputs.len()
            ),
        ));
    }
    let groups = def.inputs.len() / ins;
    let written: Vec<(usize, usize)> = (0..groups)
        .flat_map(|g| {
            let param = std::iter::once((g * ins, g * outs));
            param.chain((0..R::STATES).map(move |s| (g * ins + 2 + s, g * outs + 1 + s)))
        })
        .collect();
    if !def.outputs.is_empty() && def.outputs.len() != written.len() {
        return Err(invalid(
            def,
            format!(
                "updates its {groups} parameter(s) and their state in place: list none or all \
                 {} of them as outputs, not {}",
                written.len(),
                def.outputs.len()
            ),
        ));
    }
    for (&(i, j), out) in written.iter().zip(&def.outputs) {
        if *out != def.inputs[i] {
            return Err(invalid(
                def,
                format!(
                    "updates in place: output {j} must be {:?} (input {i}), not {out:?}",
                    def.inputs[i]
                ),
            ));
        }
    }
    let mut run_def = def.clone();
    run_def.outputs = written
        .iter()
        .map(|&(i, _)| def.inputs[i].clone())
        .collect();
    Ok(Box::new(Update {
        def: def.clone(),
        run_def,
        in_place: written,
        device: device.clone(),
        rule,
        runs: AtomicU64::new(0),
    }))
}

/// A finite argument within `range` (its default when absent), else an error naming the
/// operator.
fn arg_in(
    def: &OperatorDef,
    args: &Args<'_>,
    key: &str,
    default: Option<f32>,
    range: (std::ops::Bound<f32>, std::ops::Bound<f32>),
    want: &str,
) -> Result<f32> {
    let v = match default {
        Some(d) => args.f32_or(key, d)?,
        None => args.f32_required(key)?,
    };
    if std::ops::RangeBounds::contains(&range, &v) {
        return Ok(v);
    }
    Err(invalid(
        def,
        format!("argument {key:?} must be {want}, got {v}"),
    ))
}

impl<R: Rule> Operator for Update<R> {
    fn def(&self) -> &OperatorDef {
        &self.def
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn run(&self, ws: &Workspace, ctx: &Context) -> Result<()> {
        check_context(&self.def, &self.device, ctx)?;
        let t = self.runs.load(Ordering::Relaxed) + 1;
        let scalars = self.rule.scalars(t);
        let (ins, outs) = (2 + R::STATES, 1 + R::STATES);
        with_io(ws, &self.run_def, ctx.device(), &self.in_place, |io| {
            for g in 0..self.def.inputs.len() / ins {
                let grad = io.input(g * ins + 1)?;
                let param = io.output(g * outs)?;
                let mut states: SmallVec<[&mut Tensor; 2]> = SmallVec::new();
                for s in 0..R::STATES {
                    states.push(io.output(g * outs + 1 + s)?);
                }
                let group = Group {
                    def: &self.def,
                    first: g * ins,
                    param,
                    grad,
                    states,
                };
                launch_group(R::kernel(), ctx, group, &scalars)?;
            }
            Ok(())
        })?;
        self.runs.store(t, Ordering::Relaxed);
        Ok(())
    }
}

/// The tensors of one parameter's update.
struct Group<'a> {
    def: &'a OperatorDef,
    /// The input index of the parameter (the gradient is the next one, then the states).
    first: usize,
    param: &'a mut Tensor,
    grad: &'a Tensor,
    states: SmallVec<[&'a mut Tensor; 2]>,
}

impl Group<'_> {
    /// The parameter's elements, as the kernels' `uint n`, once every tensor of the group is
    /// checked to be `f32` with the parameter's dims.
    fn elements(&self) -> Result<u32> {
        let param = What::input(self.def, self.first);
        expect_dtype::<f32>(self.param, param)?;
        let dims = self.param.dims();
        let others = std::iter::once(self.grad).chain(self.states.iter().map(|s| &**s));
        for (k, t) in others.enumerate() {
            let what = What::input(self.def, self.first + 1 + k);
            expect_dtype::<f32>(t, what)?;
            if t.dims() != dims {
                let role = if k == 0 { "gradient" } else { "state" };
                return Err(shape_error(
                    what,
                    t.dims(),
                    format!("the {role} must have the dims of the parameter {dims:?}"),
                ));
            }
        }
        let n = self.param.numel().unwrap_or(0);
        u32::try_from(n).map_err(|_| {
            shape_error(
                param,
                dims,
                "more elements than the update kernels' 32-bit count".into(),
            )
        })
    }
}

/// Launches `kernel` over one parameter's group: `(param, grad, state..., n, scalars...)`.
#[allow(unsafe_code)]
fn launch_group(
    kernel: &UserKernel,
    ctx: &Context,
    group: Group<'_>,
    scalars: &[Arg<'_>],
) -> Result<()> {
    let n = group.elements()?;
    if n == 0 {
        return Ok(());
    }
    let Group {
        param,
        grad,
        states,
        ..
    } = group;
    let mut args: SmallVec<[Arg<'_>; 10]> = SmallVec::new();
    args.push(Arg::write(param));
    args.push(Arg::read(grad));
    for s in states {
        args.push(Arg::write(s));
    }
    args.push(n.into());
    args.extend_from_slice(scalars);
    let grid = Grid::for_elements((n as usize).min(THREADS as usize * MAX_BLOCKS), THREADS);
    // SAFETY: the update kernels (the OpenCL C and CUDA C files of this folder, and the host
    // closures, which are safe Rust) read and write element `i` of each buffer only for
    // `i < n` (grid-stride loops bounded by `n`), and write only the parameter and the states,
    // passed with `Arg::write`. `elements` checked that every tensor of the group is `f32`
    // with the parameter's dims, so each holds `n` floats; `kernels::launch` takes a buffer of
    // another device through its replica on the stream's device, and refuses one passed twice
    // with a write before anything runs.
    unsafe { kernels::launch(kernel, ctx.stream(), grid, &args) }
}

/// An error of a host closure: a buffer shorter than `n` (never, after the checks of
/// [`launch_group`]).
fn short(kernel: &str, index: usize, n: usize) -> Error {
    Error::KernelArgument {
        kernel: kernel.to_string(),
        index: Some(index),
        reason: format!("holds fewer than {n} floats"),
    }
}

/// The first `n` elements of a host closure's buffer `index`, or [`short`].
fn first_n<'s, T>(s: &'s mut [T], kernel: &str, index: usize, n: usize) -> Result<&'s mut [T]> {
    s.get_mut(..n).ok_or_else(|| short(kernel, index, n))
}
