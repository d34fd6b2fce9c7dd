//! Moves between the device and the host while a net runs, planned from the uses of the net
//! that runs: for the activations (see [`super::activations`]) and the parameters offloaded
//! layer by layer (see `params.rs`).
//!
//! For a use of a blob the net produces at operator `a` and its next read at operator `b`, at
//! least [`MIN_GAP`] operators later:
//! - after operator `a`: its copy to the host is queued on the mover's copy stream (nothing
//!   when the host copy is current already, as for a parameter that was only read);
//! - from operator `a + 1` on: its device memory is freed after the first operator at whose
//!   end that copy is done; at the latest after operator `a + 1 + DEFER` (but not later than
//!   `b - 3`), then with two mirrors ordered after the copy still running
//!   ([`syncmem::SyncedMemory::offload_ordered`]: its block goes back to the pool with the copy
//!   in flight), and where the host shares the memory in place parked at once, its writer
//!   still running (the host's accesses wait for it, the device's reads do not). On PoCL
//!   with two mirrors (the host queues far ahead of the device, so a copy is seldom done one
//!   operator later), before frees were ordered after the copies, an epoch at hidden 64 with
//!   the parameters offloaded took 20.3, 18.7 and 15.3 ms with `DEFER` 0, 1 and 2. Freeing at
//!   once, ordered, instead of at the deadline took no less time and raised the step's peak:
//!   the compute stream does not reuse a block until the copy using it is done;
//! - after operator `b - 2`: its copy back is queued on the copy stream, one operator ahead of
//!   its reader (behind its copy out on that stream, if that is still running: no wait);
//! - after operator `b - 1`: whether the copy back (or the copy out it follows) is still
//!   running is noted: the copy was not hidden, and the device runs the reader after it.
//!
//! Named blobs (the parameters) are brought up ahead of their first read instead: after
//! operator `first - 2`, or before the run ([`Mover::before`]) when one of the first two
//! operators reads them; and they stay until their last use. When that use writes them (their
//! update) and is not the net's last operator, they go back to the host at once: their copy
//! is queued after it and their device memory freed as above. They do not leave
//! between their forward and their backward reads: measured on three hidden layers of 256 with
//! batches of 16, that lowered the step's peak by 3% more (905 KiB to 881 KiB) for the weights'
//! bytes moved up twice.
//!
//! Nothing depends on the plan for correctness: the buffers' head state machine orders every
//! access after the copies, so a plan that misjudges only moves bytes in vain.
//!
//! Where the device keeps two mirrors (a discrete device, or zero-copy off), the moved values'
//! host mirrors are pinned memory of the device ([`pin_host`]): its copies to and from them
//! run at full speed and without a host wait, as the copy stream needs. Where the device shares
//! host memory in place nothing is copied, and the values keep their one allocation.

use std::collections::{BTreeSet, HashMap};

use syncmem::net::NetDef;
use syncmem::synced::PendingKind;
use syncmem::workspace::BlobRef;
use syncmem::{BackendKind, Device, Head, Result, Stream, SyncedMemory, Tensor, Workspace};

use super::activations::{OffloadMoves, MIN_GAP};

/// Operators a value on its way out may stay on the device for its copy to end without a
/// host wait (see the [module docs](self)).
const DEFER: usize = 2;

/// Which blobs a plan moves.
pub(super) enum Pick<'a> {
    /// The blobs the net writes before it reads them (its intermediate values).
    Produced,
    /// The blobs of these names.
    Named(&'a BTreeSet<String>),
}

/// The plan: per operator, what to do after it ran (indexes into `names`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// The blob names moved (the net's run names).
    pub(super) names: Vec<String>,
    /// Before the run: queue the copy to the device.
    pub(super) before: Vec<u32>,
    /// After operator `i`: queue the copy to the host.
    pub(super) down: Vec<Vec<u32>>,
    /// After operator `i`: free the device memory at the latest (it leaves earlier once its
    /// copy to the host is done).
    pub(super) free: Vec<Vec<u32>>,
    /// After operator `i`: queue the copy to the device.
    pub(super) up: Vec<Vec<u32>>,
    /// After operator `i`: note whether the copy to the device for operator `i + 1` is done.
    pub(super) check: Vec<Vec<u32>>,
}

/// Per blob name of `def`, in order of first use: its uses, each `(operator, reads it)` (one
/// per operator).
fn uses(def: &NetDef) -> Vec<(String, Vec<(usize, bool)>)> {
    let mut uses: Vec<(String, Vec<(usize, bool)>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, op) in def.ops.iter().enumerate() {
        let named = op.inputs.iter().map(|s| (s, true));
        for (name, read) in named.chain(op.outputs.iter().map(|s| (s, false))) {
            let k = *index.entry(name.as_str()).or_insert_with(|| {
                uses.push((name.clone(), Vec::new()));
                uses.len() - 1
            });
            let list = &mut uses[k].1;
            match list.last_mut() {
                Some(last) if last.0 == i => last.1 |= read,
                _ => list.push((i, read)),
            }
        }
    }
    uses
}

/// The plan of `def` for the blobs `pick` picks (see the [module docs](self)).
pub(super) fn plan(def: &NetDef, pick: &Pick<'_>) -> Plan {
    let n = def.ops.len();
    let mut p = Plan {
        names: Vec::new(),
        before: Vec::new(),
        down: vec![Vec::new(); n],
        free: vec![Vec::new(); n],
        up: vec![Vec::new(); n],
        check: vec![Vec::new(); n],
    };
    for (name, list) in uses(def) {
        let Some(&(first, read_first)) = list.first() else {
            continue;
        };
        let picked = match pick {
            Pick::Produced => !read_first,
            Pick::Named(names) => names.contains(&name),
        };
        if !picked {
            continue;
        }
        let id = p.names.len() as u32;
        let mut any = false;
        if read_first && matches!(pick, Pick::Named(_)) {
            if first >= 2 {
                p.up[first - 2].push(id);
                p.check[first - 1].push(id);
            } else {
                p.before.push(id);
            }
            any = true;
        }
        // Written by its last use (a parameter's update): back to the host at once.
        if let (Pick::Named(_), Some(&(last, _))) = (pick, list.last()) {
            let writes = def.ops[last].outputs.contains(&name);
            if writes && last + 1 < n {
                p.down[last].push(id);
                p.free[(last + 1 + DEFER).min(n - 1)].push(id);
                any = true;
            }
        }
        // Named blobs (parameters) stay once brought up: see the module docs.
        let pairs = if matches!(pick, Pick::Produced) {
            list.windows(2)
        } else {
            [].windows(2)
        };
        for pair in pairs {
            let ((a, _), (b, read)) = (pair[0], pair[1]);
            if read && b - a >= MIN_GAP {
                p.down[a].push(id);
                p.free[(a + 1 + DEFER).min(b - 3).max(a + 1)].push(id);
                p.up[b - 2].push(id);
                p.check[b - 1].push(id);
                any = true;
            }
        }
        if any {
            p.names.push(name);
        }
    }
    p
}

/// A plan with its blobs and copy stream, and what it did.
pub(super) struct Mover {
    plan: Plan,
    blobs: Vec<BlobRef>,
    stream: Stream,
    stats: OffloadMoves,
    /// Values due to leave the device whose copy to the host is still running: each is
    /// freed after the first operator at whose end the copy is done (no host wait), or kept
    /// when its copy back is due first.
    leaving: Vec<u32>,
    /// The values' host mirrors are pinned memory ([`pins_host`]).
    pin: bool,
}

impl Mover {
    /// `plan` over the blobs of `ws`, its copies queued on a new stream of `device`.
    ///
    /// # Errors
    /// A planned blob missing from `ws` (a net not created in it); the stream's creation.
    pub(super) fn new(plan: Plan, ws: &Workspace, device: &Device) -> Result<Self> {
        let pin = pin_host(ws, device, &plan.names);
        let blobs = plan
            .names
            .iter()
            .map(|n| ws.get_blob(n))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            stats: OffloadMoves {
                planned: plan.names.len(),
                ..OffloadMoves::default()
            },
            plan,
            blobs,
            stream: device.new_stream()?,
            leaving: Vec::new(),
            pin,
        })
    }

    /// What the plan did so far.
    pub(super) fn stats(&self) -> OffloadMoves {
        self.stats
    }

    /// The stream the copies are queued on.
    pub(super) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The copies to the device due before the run.
    ///
    /// # Errors
    /// The copies' errors (out of memory under a cap included).
    pub(super) fn before(&mut self) -> Result<()> {
        // Whatever was on its way out last run has left (the deadlines fall inside a run).
        self.leaving.clear();
        for &id in &self.plan.before {
            each(&self.blobs[id as usize], |m| {
                up(m, &self.stream, &mut self.stats)
            })?;
        }
        Ok(())
    }

    /// Frees the values on their way out whose copy to the host is done, and those due after
    /// operator `op` whatever their copy (waiting for it); keeps the others.
    ///
    /// # Errors
    /// The frees' errors.
    fn free_leaving(&mut self, op: usize) -> Result<()> {
        let due = self.plan.free.get(op).map_or(&[][..], Vec::as_slice);
        let mut i = 0;
        while i < self.leaving.len() {
            let id = self.leaving[i];
            let mut keep = false;
            each(&self.blobs[id as usize], |m| {
                if !due.contains(&id) && m.pending()? == Some(PendingKind::ToHost) {
                    keep = true;
                } else if matches!(m.head(), Head::AtDevice | Head::Synced) && m.device_allocated()
                {
                    // The host copy is current, or its copy is still running at the deadline:
                    // with two mirrors the block goes back ordered after the copy, with no host
                    // wait (sharing memory in place, parked with its writer still running).
                    let bytes = m.offload_ordered()?;
                    self.stats.offloads += u64::from(bytes > 0);
                    self.stats.bytes_released += bytes as u64;
                }
                Ok(())
            })?;
            if keep {
                i += 1;
            } else {
                self.leaving.swap_remove(i);
            }
        }
        Ok(())
    }

    /// The moves due after operator `op` ran (see the [module docs](self)).
    ///
    /// # Errors
    /// The copies' and frees' errors (out of memory under a cap included).
    pub(super) fn after(&mut self, op: usize) -> Result<()> {
        self.free_leaving(op)?;
        let Self {
            plan,
            blobs,
            stream,
            stats,
            leaving,
            pin,
        } = self;
        // A value still on its way out when its copy back is due stays.
        let up_now = plan.up.get(op).map_or(&[][..], Vec::as_slice);
        leaving.retain(|id| !up_now.contains(id));
        for &id in plan.down.get(op).into_iter().flatten() {
            leaving.push(id);
            each(&blobs[id as usize], |m| {
                if *pin {
                    // A value whose tensor the net made after the mover was: its buffer's
                    // first host mirror is made by this copy.
                    m.set_pinned_host(true);
                }
                if matches!(m.head(), Head::AtDevice) && m.prefetch_to_host(Some(stream))?.is_some()
                {
                    stats.bytes_down += m.len() as u64;
                }
                Ok(())
            })?;
        }
        for &id in plan.up.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| up(m, stream, stats))?;
        }
        for &id in plan.check.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| {
                stats.not_ready += u64::from(m.pending()?.is_some());
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Whether values offloaded from `device` get pinned host mirrors: where the device keeps
/// two mirrors (it does not share host memory in place), whose copies between them a pinned
/// host side makes fast and asynchronous; not on `cpu`, whose device memory is host memory.
pub(super) fn pins_host(device: &Device) -> bool {
    device.zero_copy_protocol().is_none() && device.backend() != BackendKind::Cpu
}

/// Pins the host mirrors of the tensors of the blobs `names` of `ws` (those that exist and
/// hold a tensor, for their storage now and later: [`Tensor::set_pinned_host`]) where
/// [`pins_host`] says so; returns whether it did.
///
pub(super) fn pin_host(ws: &Workspace, device: &Device, names: &[String]) -> bool {
    if !pins_host(device) {
        return false;
    }
    for name in names {
        if let Ok(blob) = ws.get_blob(name) {
            if let Ok(t) = blob.write().get_mut::<Tensor>() {
                t.set_pinned_host(true);
            }
        }
    }
    true
}

/// Queues the copy of `m` to the device on `stream`, when only the host holds its data.
fn up(m: &SyncedMemory, stream: &Stream, stats: &mut OffloadMoves) -> Result<()> {
    if matches!(m.head(), Head::AtHost) {
        stats.refills += 1;
        if m.prefetch_to_device(Some(stream))?.is_some() {
            stats.bytes_up += m.len() as u64;
        }
    }
    Ok(())
}

/// Runs `f` on the buffer of the tensor `blob` holds (a blob holding something else, or a
/// tensor with no buffer yet, is passed over).
fn each(blob: &BlobRef, f: impl FnOnce(&SyncedMemory) -> Result<()>) -> Result<()> {
    let b = blob.read();
    match b.get::<Tensor>().ok().and_then(Tensor::synced) {
        Some(m) => f(m),
        None => Ok(()),
    }
}

#[cfg(test)]
#[path = "moves_tests.rs"]
mod tests;
