//! Blob lookup and locking for one run of an operator.
//!
//! [`resolve`] looks up the inputs (they must exist) and creates the outputs, then
//! removes duplicates by identity (two names can reach the same blob through a parent or a
//! forwarded name); a net keeps what it found between runs (see [`super::cache`]).
//! [`Blobs::lock`] takes one lock per distinct blob, in the order of the blobs'
//! addresses: a read lock for a blob that is only read, a write lock for a blob that is written
//! (also when it is read too, in place). [`Locked::io`] then hands out `&Tensor` for inputs and
//! `&mut Tensor` for outputs, with the checks every operator needs (a tensor, on the operator's
//! device, initialised).

use std::sync::Arc;

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use smallvec::{smallvec, SmallVec};

use super::operand::Operand as What;
use super::OperatorDef;
use crate::blob::Blob;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::workspace::{BlobRef, Workspace};

/// The lists of one run live on the stack: operators have a handful of inputs and outputs, and
/// a step of a net runs without a heap allocation.
pub(crate) type Small<T> = SmallVec<[T; 16]>;

/// Which of the distinct blobs of a run each input and output is, and the order they are
/// locked in: what a lookup found, kept between runs of a net (see [`super::cache`]).
#[derive(Default)]
pub(crate) struct Layout {
    writable: Small<bool>,
    ins: Small<usize>,
    outs: Small<usize>,
    /// For each input, the output it shares its blob with (an allowed in-place pair).
    in_place: Small<Option<usize>>,
    /// The blobs' indices in the order of their addresses (the order of locking).
    order: Small<usize>,
}

/// The distinct blobs of one run, and which inputs and outputs map to which.
#[derive(Clone, Copy)]
pub(crate) struct Blobs<'a> {
    def: &'a OperatorDef,
    refs: &'a [BlobRef],
    layout: &'a Layout,
}

/// Looks up the inputs and creates the outputs of `def`: its distinct blobs and their
/// [`Layout`]. `in_place_ok` lists the (input, output) pairs that may name the same blob.
pub(crate) fn resolve(
    ws: &Workspace,
    def: &OperatorDef,
    in_place_ok: &[(usize, usize)],
) -> Result<(Small<BlobRef>, Layout)> {
    let mut refs: Small<BlobRef> = SmallVec::new();
    let index_of = |r: BlobRef, refs: &mut Small<BlobRef>| -> usize {
        match refs.iter().position(|x| Arc::ptr_eq(x, &r)) {
            Some(i) => i,
            None => {
                refs.push(r);
                refs.len() - 1
            }
        }
    };
    let mut ins: Small<usize> = SmallVec::new();
    for (i, name) in def.inputs.iter().enumerate() {
        let r = ws.try_get_blob(name).ok_or_else(|| Error::NotFound {
            kind: "blob",
            name: name.clone(),
            detail: format!(" in the workspace (input {i} of operator {})", def.label()),
        })?;
        ins.push(index_of(r, &mut refs));
    }
    let mut outs: Small<usize> = SmallVec::new();
    for name in &def.outputs {
        outs.push(index_of(ws.create_blob(name)?, &mut refs));
    }
    let mut writable: Small<bool> = smallvec![false; refs.len()];
    for (j, &b) in outs.iter().enumerate() {
        if writable[b] {
            return Err(Error::InvalidState {
                op: "Operator::run",
                buffer: format!("blob {:?}", def.outputs[j]),
                reason: format!(
                    "operator {} writes the blob through two of its outputs",
                    def.label()
                ),
            });
        }
        writable[b] = true;
    }
    let in_place = in_place_pairs(def, &ins, &outs, &writable, in_place_ok)?;
    let mut order: Small<usize> = (0..refs.len()).collect();
    order.sort_unstable_by_key(|&i| Arc::as_ptr(&refs[i]) as usize);
    let layout = Layout {
        writable,
        ins,
        outs,
        in_place,
        order,
    };
    Ok((refs, layout))
}

/// For each input, the output it shares its blob with: an error for a pair not in
/// `in_place_ok`.
fn in_place_pairs(
    def: &OperatorDef,
    ins: &[usize],
    outs: &[usize],
    writable: &[bool],
    in_place_ok: &[(usize, usize)],
) -> Result<Small<Option<usize>>> {
    let mut in_place: Small<Option<usize>> = smallvec![None; ins.len()];
    for (i, &b) in ins.iter().enumerate() {
        if !writable[b] {
            continue;
        }
        let j = outs.iter().position(|&o| o == b).unwrap_or(usize::MAX);
        if !in_place_ok.contains(&(i, j)) {
            let allowed = if in_place_ok.is_empty() {
                "it computes nothing in place".to_string()
            } else {
                let pairs: Vec<String> = in_place_ok
                    .iter()
                    .map(|(i, j)| format!("input {i} -> output {j}"))
                    .collect();
                format!("it allows only {}", pairs.join(", "))
            };
            return Err(Error::InvalidState {
                op: "Operator::run",
                buffer: format!("blob {:?}", def.inputs[i]),
                reason: format!(
                    "input {i} of operator {} is also its output {j} ({:?}), but {allowed}",
                    def.label(),
                    def.outputs.get(j).map_or("", String::as_str)
                ),
            });
        }
        in_place[i] = Some(j);
    }
    Ok(in_place)
}

impl<'a> Blobs<'a> {
    /// The blobs `refs` of a run of `def`, as `layout` (from [`resolve`]) maps them.
    pub(crate) fn new(def: &'a OperatorDef, refs: &'a [BlobRef], layout: &'a Layout) -> Self {
        Self { def, refs, layout }
    }

    /// Locks every distinct blob once, in address order.
    pub(crate) fn lock(self) -> Locked<'a> {
        let l = self.layout;
        // Lists are extended in place, not collected: a collected list is moved (copied)
        // into place afterwards.
        let mut slots: Small<Option<Guard<'a>>> = SmallVec::new();
        slots.extend((0..self.refs.len()).map(|_| None));
        for &i in &l.order {
            slots[i] = Some(if l.writable[i] {
                Guard::W(self.refs[i].write())
            } else {
                Guard::R(self.refs[i].read())
            });
        }
        Locked {
            blobs: self,
            guards: slots,
        }
    }
}

enum Guard<'r> {
    R(RwLockReadGuard<'r, Blob>),
    W(RwLockWriteGuard<'r, Blob>),
}

/// The locks of one run.
pub(crate) struct Locked<'r> {
    blobs: Blobs<'r>,
    /// One per distinct blob (all `Some`).
    guards: Small<Option<Guard<'r>>>,
}

enum Slot<'g> {
    R(&'g Blob),
    W(&'g mut Blob),
}

impl<'r> Locked<'r> {
    /// An empty [`Io`] of the run, for [`Locked::fill`].
    fn empty_io<'g>(&self) -> Io<'g>
    where
        'r: 'g,
    {
        Io {
            def: self.blobs.def,
            ins: SmallVec::new(),
            in_place: &self.blobs.layout.in_place,
            outs: SmallVec::new(),
        }
    }

    /// Fills `io` (from [`Locked::empty_io`]) with the tensors of the run, checked to live
    /// on `dev`. Filled in place: an `Io` is a few hundred bytes, and a step of a small net
    /// spent a few percent of its time copying them when they were returned.
    fn fill<'g>(&'g mut self, dev: &'g Device, io: &mut Io<'g>) -> Result<()> {
        let def = self.blobs.def;
        let b = self.blobs.layout;
        let mut slots: Small<Option<Slot<'g>>> = SmallVec::new();
        slots.extend(self.guards.iter_mut().map(|g| {
            g.as_mut().map(|g| match g {
                Guard::R(g) => Slot::R(g),
                Guard::W(g) => Slot::W(g),
            })
        }));
        let ins = &mut io.ins;
        for (i, &s) in b.ins.iter().enumerate() {
            if b.in_place[i].is_some() {
                ins.push(None);
                continue;
            }
            let blob = match &slots[s] {
                Some(Slot::R(blob)) => *blob,
                _ => return Err(internal(def, "an input blob is not read-locked")),
            };
            let what = What::input(def, i);
            let t = blob.get::<Tensor>().map_err(|_| not_tensor(blob, what))?;
            check_tensor(t, dev, what)?;
            ins.push(Some(t));
        }
        let outs = &mut io.outs;
        for (j, &s) in b.outs.iter().enumerate() {
            let Some(Slot::W(blob)) = slots[s].take() else {
                return Err(internal(def, "an output blob is not write-locked"));
            };
            let name = &def.outputs[j];
            let what = What::output(def, j);
            let t = if b.in_place.contains(&Some(j)) {
                if !blob.is_type::<Tensor>() {
                    return Err(not_tensor(blob, what));
                }
                let t = blob.get_mut::<Tensor>()?;
                check_tensor(t, dev, what)?;
                t
            } else {
                let (t, _) = blob
                    .get_or_insert_with(|| Tensor::new(dev).with_label(name.clone()))
                    .map_err(|e| Error::InvalidState {
                        op: "Operator::run",
                        buffer: format!("blob {name:?}"),
                        reason: format!("{what} cannot be written: {e}"),
                    })?;
                if !t.target().is_some_and(|d| d.same(dev)) {
                    // Caffe2's GetMutable<Tensor<Context>>: a tensor of another device is
                    // replaced (an output is overwritten anyway).
                    *t = Tensor::new(dev).with_label(name.clone());
                }
                t
            };
            outs.push(Some(t));
        }
        check_storage_aliasing(def, ins, outs)?;
        Ok(())
    }
}

/// The tensors of one run: shared inputs, exclusive outputs.
pub(crate) struct Io<'g> {
    def: &'g OperatorDef,
    ins: Small<Option<&'g Tensor>>,
    in_place: &'g [Option<usize>],
    outs: Small<Option<&'g mut Tensor>>,
}

impl<'g> Io<'g> {
    /// Input `i`. For an input computed in place, use the output it shares its blob with.
    pub(crate) fn input(&self, i: usize) -> Result<&'g Tensor> {
        self.ins.get(i).copied().flatten().ok_or_else(|| {
            internal(
                self.def,
                &format!("input {i} is absent or in place (read it through its output)"),
            )
        })
    }

    /// The output that input `i` shares its blob with (in place), if any.
    pub(crate) fn in_place(&self, i: usize) -> Option<usize> {
        self.in_place.get(i).copied().flatten()
    }

    /// Output `j`; each output can be taken once.
    pub(crate) fn output(&mut self, j: usize) -> Result<&'g mut Tensor> {
        self.outs
            .get_mut(j)
            .and_then(Option::take)
            .ok_or_else(|| internal(self.def, &format!("output {j} is absent or taken")))
    }

    /// The def being run.
    pub(crate) fn def(&self) -> &'g OperatorDef {
        self.def
    }
}

/// The tensors of one run of an operator, for operators defined outside the crate (see
/// [`with_io`]): inputs shared, outputs exclusive, checked as the built-in operators' are.
pub struct OperatorIo<'g> {
    io: Io<'g>,
}

impl<'g> OperatorIo<'g> {
    /// The def being run.
    pub fn def(&self) -> &'g OperatorDef {
        self.io.def()
    }

    /// Input `i`: a tensor on the run's device, with a shape. For an input computed in place,
    /// use the output it shares its blob with ([`OperatorIo::in_place`]).
    ///
    /// # Errors
    /// [`Error::InvalidState`] for an input that is absent or in place.
    pub fn input(&self, i: usize) -> Result<&'g Tensor> {
        self.io.input(i)
    }

    /// The output that input `i` shares its blob with (an allowed in-place pair), if any.
    pub fn in_place(&self, i: usize) -> Option<usize> {
        self.io.in_place(i)
    }

    /// Output `j`, once: the blob's tensor of the run's device (a fresh tensor when the blob
    /// held something else or a tensor of another device, as Caffe2's `GetMutable`). Resize it
    /// and set its element type before writing it.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for an output that is absent or was taken already.
    pub fn output(&mut self, j: usize) -> Result<&'g mut Tensor> {
        self.io.output(j)
    }
}

/// Runs `f` with the tensors of one run of operator `def` on `device`, as the built-in
/// operators do: the inputs are looked up (they must exist) and the outputs created in `ws`;
/// every distinct blob is locked once (read locks for inputs, a write lock for a blob written),
/// in the order of the blobs' addresses, so that operators running on several threads cannot
/// deadlock; each input must hold an initialised tensor of a device (`device`, or another one,
/// read through a replica on `device`). `in_place` lists the
/// (input, output) pairs that may name the same blob; any other pair sharing a blob or a
/// storage is an error. The locks are released when `f` returns.
///
/// # Errors
/// [`Error::NotFound`] for a missing input blob; [`Error::TypeMismatch`],
/// [`Error::DeviceMismatch`] or [`Error::InvalidState`] for an input that is not an initialised
/// tensor of a device; [`Error::InvalidState`] for a blob shared against `in_place`; the error
/// of `f`. Every message names the operator and the blob.
pub fn with_io<R>(
    ws: &Workspace,
    def: &OperatorDef,
    device: &Device,
    in_place: &[(usize, usize)],
    f: impl FnOnce(&mut OperatorIo<'_>) -> Result<R>,
) -> Result<R> {
    let Some(mut kept) = super::cache::take() else {
        let (refs, layout) = resolve(ws, def, in_place)?;
        return run_io(Blobs::new(def, &refs, &layout), device, f);
    };
    let mut refs = SmallVec::new();
    let r = kept
        .refs_into(ws, def, in_place, &mut refs)
        .and_then(|()| run_io(Blobs::new(def, &refs, kept.layout()), device, f));
    super::cache::put_back(kept);
    r
}

/// Locks `blobs` and runs `f` with their tensors.
fn run_io<R>(
    blobs: Blobs<'_>,
    device: &Device,
    f: impl FnOnce(&mut OperatorIo<'_>) -> Result<R>,
) -> Result<R> {
    let mut locked = blobs.lock();
    let mut io = OperatorIo {
        io: locked.empty_io(),
    };
    locked.fill(device, &mut io.io)?;
    f(&mut io)
}

/// Two views of one storage in a run would wait on each other (a read guard and a write
/// guard, or two write guards, of the same SyncedMemory): refuse tensors that share storage.
fn check_storage_aliasing(
    def: &OperatorDef,
    ins: &[Option<&Tensor>],
    outs: &[Option<&mut Tensor>],
) -> Result<()> {
    for (j, o) in outs.iter().enumerate() {
        let Some(o) = o.as_deref() else { continue };
        let clash = ins
            .iter()
            .enumerate()
            .find_map(|(i, t)| {
                t.filter(|t| t.shares_storage_with(o))
                    .map(|_| What::input(def, i))
            })
            .or_else(|| {
                outs.iter().enumerate().skip(j + 1).find_map(|(k, t)| {
                    t.as_deref()
                        .filter(|t| t.shares_storage_with(o))
                        .map(|_| What::output(def, k))
                })
            });
        if let Some(other) = clash {
            return Err(Error::InvalidState {
                op: "Operator::run",
                buffer: What::output(def, j).to_string(),
                reason: format!("its tensor shares its memory with {other} (share_data)"),
            });
        }
    }
    Ok(())
}

/// An input (or in-place output) must be an initialised tensor of a device: the operator's own,
/// or another one, whose data the operator then uses through a replica on its device
/// ([`crate::SyncedMemory::device_on`]). A host-only tensor is refused.
fn check_tensor(t: &Tensor, dev: &Device, what: What<'_>) -> Result<()> {
    match t.target() {
        Some(_) => {}
        other => {
            return Err(Error::DeviceMismatch {
                op: "Operator::run",
                expected: format!("{} (the operator's device)", dev.label()),
                actual: format!("{} for {}", other.map_or("host only", Device::label), what),
            })
        }
    }
    if !t.is_initialized() {
        return Err(Error::InvalidState {
            op: "Operator::run",
            buffer: what.to_string(),
            reason: "the tensor is uninitialised (no shape)".into(),
        });
    }
    Ok(())
}

fn not_tensor(blob: &Blob, what: What<'_>) -> Error {
    Error::TypeMismatch {
        what: what.to_string(),
        stored: blob
            .type_name()
            .unwrap_or("nothing (the blob is empty)")
            .to_string(),
        requested: std::any::type_name::<Tensor>().to_string(),
    }
}

fn internal(def: &OperatorDef, reason: &str) -> Error {
    Error::InvalidState {
        op: "Operator::run",
        buffer: format!("operator {}", def.label()),
        reason: reason.to_string(),
    }
}
