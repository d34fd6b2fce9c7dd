//! The activations off the device between forward and backward
//! ([`TrainConfig::offload_activations`]), as vDNN does (Rhu et al., MICRO 2016): a value
//! that forward writes and backward reads long after stays on the host in between, so that
//! the device holds, at the start of backward, the values of the last layers only.
//!
//! The plan comes from the net that runs ([`Net::run_def`]: fused and memory-planned), fixed
//! when the trainer is built. A blob the net writes before it reads it (an intermediate value,
//! not a parameter, an optimizer state or the data) is offloaded across each gap of at least
//! [`MIN_GAP`] operators between one use and the next, when the next use reads it. For a use
//! at operator `a` and the next read at operator `b`:
//! - after operator `a`: its copy to the host is queued on the plan's copy stream
//!   ([`syncmem::SyncedMemory::prefetch_to_host`]; ordered after the work that wrote it);
//! - after operator `a + 1`: its device memory is freed ([`syncmem::SyncedMemory::offload`],
//!   which waits for that copy if it is still running, while operator `a + 1` is queued);
//! - after operator `b - 2`: its copy back is queued on the copy stream
//!   ([`syncmem::SyncedMemory::prefetch_to_device`]), one operator ahead of its reader;
//! - after operator `b - 1`: whether the copy back is still running is noted (the reader's
//!   access then waits for it: the copy was not hidden).
//!
//! Nothing depends on the plan for correctness: the buffers' head state machine orders every
//! access after the copies, so a plan that misjudges only moves bytes in vain. Where the host
//! uses the device's memory in place (`cpu`, PoCL's zero-copy buffers) nothing is copied: the
//! block is spilled in place and only leaves the device's memory cap (see
//! [`syncmem::SyncedMemory::offload`]).

use std::collections::HashMap;

use syncmem::net::{Net, NetDef};
use syncmem::synced::PendingKind;
use syncmem::workspace::BlobRef;
use syncmem::{Device, Head, Result, Stream, Tensor, Workspace};

#[cfg(doc)]
use super::TrainConfig;

/// The fewest operators between a use of a value and its next read for the value to leave the
/// device in between: one to copy it out under, one to free it after, one to bring it back
/// under.
pub const MIN_GAP: usize = 4;

/// What offloading the activations did (see [`super::Trainer::activation_offload`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivationOffload {
    /// Blob names the plan moves (per step, each may leave more than once).
    pub planned: usize,
    /// Values that left the device (their device memory freed or, shared in place, uncharged).
    pub offloads: u64,
    /// Device bytes those released.
    pub bytes_released: u64,
    /// Bytes copied to the host (0 where the host uses the device's memory in place).
    pub bytes_down: u64,
    /// Values brought back ahead of their reader.
    pub refills: u64,
    /// Bytes copied back to the device.
    pub bytes_up: u64,
    /// Readers that found their value's copy back still running (the copy was not hidden
    /// behind the operator before them).
    pub not_ready: u64,
}

/// The plan: per operator, what to do after it ran (indexes into `names`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// The blob names moved (the net's run names).
    pub(super) names: Vec<String>,
    /// After operator `i`: queue the copy to the host.
    pub(super) down: Vec<Vec<u32>>,
    /// After operator `i`: free the device memory.
    pub(super) free: Vec<Vec<u32>>,
    /// After operator `i`: queue the copy back to the device.
    pub(super) up: Vec<Vec<u32>>,
    /// After operator `i`: note whether the copy back for operator `i + 1` is done.
    pub(super) check: Vec<Vec<u32>>,
}

/// The plan of `def` (see the [module docs](self)).
pub(super) fn plan(def: &NetDef) -> Plan {
    let n = def.ops.len();
    // Per blob name, in order: (operator, reads it).
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
    let mut p = Plan {
        names: Vec::new(),
        down: vec![Vec::new(); n],
        free: vec![Vec::new(); n],
        up: vec![Vec::new(); n],
        check: vec![Vec::new(); n],
    };
    for (name, list) in uses {
        // Produced by the net: written before anything reads it.
        if list.first().is_none_or(|&(_, read)| read) {
            continue;
        }
        let id = p.names.len() as u32;
        let mut any = false;
        for pair in list.windows(2) {
            let ((a, _), (b, read)) = (pair[0], pair[1]);
            if read && b - a >= MIN_GAP {
                p.down[a].push(id);
                p.free[a + 1].push(id);
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

/// The plan of a training net, with its blobs and copy stream, and what it did.
pub(super) struct OffloadedActivations {
    plan: Plan,
    blobs: Vec<BlobRef>,
    stream: Stream,
    stats: ActivationOffload,
}

impl OffloadedActivations {
    /// The plan of `net`, whose blobs live in `ws`, moved by a new stream of `device`.
    ///
    /// # Errors
    /// The stream's creation; a planned blob missing from `ws` (a net not created in it).
    pub(super) fn new(net: &Net, device: &Device, ws: &Workspace) -> Result<Self> {
        let plan = plan(net.run_def());
        let blobs = plan
            .names
            .iter()
            .map(|n| ws.get_blob(n))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            stats: ActivationOffload {
                planned: plan.names.len(),
                ..ActivationOffload::default()
            },
            plan,
            blobs,
            stream: device.new_stream()?,
        })
    }

    /// What the plan did so far.
    pub(super) fn stats(&self) -> ActivationOffload {
        self.stats
    }

    /// The moves due after operator `op` ran (see the [module docs](self)).
    ///
    /// # Errors
    /// The copies' and frees' errors (out of memory under a cap included).
    pub(super) fn after(&mut self, op: usize) -> Result<()> {
        let Self {
            plan,
            blobs,
            stream,
            stats,
        } = self;
        for &id in plan.free.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| {
                if matches!(m.head(), Head::AtDevice | Head::Synced) && m.device_allocated() {
                    let bytes = m.offload()?;
                    stats.offloads += u64::from(bytes > 0);
                    stats.bytes_released += bytes as u64;
                }
                Ok(())
            })?;
        }
        for &id in plan.down.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| {
                if matches!(m.head(), Head::AtDevice) && m.prefetch_to_host(Some(stream))?.is_some()
                {
                    stats.bytes_down += m.len() as u64;
                }
                Ok(())
            })?;
        }
        for &id in plan.up.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| {
                if matches!(m.head(), Head::AtHost) {
                    stats.refills += 1;
                    if m.prefetch_to_device(Some(stream))?.is_some() {
                        stats.bytes_up += m.len() as u64;
                    }
                }
                Ok(())
            })?;
        }
        for &id in plan.check.get(op).into_iter().flatten() {
            each(&blobs[id as usize], |m| {
                stats.not_ready += u64::from(m.pending()? == Some(PendingKind::ToDevice));
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Runs `f` on the buffer of the tensor `blob` holds (a blob holding something else, or a
/// tensor with no buffer yet, is passed over).
fn each(blob: &BlobRef, mut f: impl FnMut(&syncmem::SyncedMemory) -> Result<()>) -> Result<()> {
    let b = blob.read();
    match b.get::<Tensor>().ok().and_then(Tensor::synced) {
        Some(m) => f(m),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncmem::ops::OperatorDef;

    fn net(ops: &[(&[&str], &[&str])]) -> NetDef {
        let mut d = NetDef::new("t");
        for (i, (inp, out)) in ops.iter().enumerate() {
            d.ops.push(OperatorDef::new(&format!("Op{i}"), inp, out));
        }
        d
    }

    #[test]
    fn moves_values_across_long_gaps_only() {
        // x: external (read first); a: written at 0, read at 1 and at 6 (gap 5);
        // b: written at 1, read at 4 (gap 3, too short); c: written at 2, written at 7 (no read).
        let d = net(&[
            (&["x", "w"], &["a"]),
            (&["a"], &["b"]),
            (&["b"], &["c"]),
            (&["c"], &["d"]),
            (&["b", "d"], &["e"]),
            (&["e"], &["f"]),
            (&["f", "a", "w"], &["g"]),
            (&["g"], &["c"]),
        ]);
        let p = plan(&d);
        assert_eq!(p.names, vec!["a".to_string()]);
        let at = |v: &Vec<Vec<u32>>| -> Vec<usize> {
            (0..v.len()).filter(|&i| !v[i].is_empty()).collect()
        };
        assert_eq!(at(&p.down), vec![1]);
        assert_eq!(at(&p.free), vec![2]);
        assert_eq!(at(&p.up), vec![4]);
        assert_eq!(at(&p.check), vec![5]);
    }

    #[test]
    fn a_value_can_leave_twice_and_the_gap_bound_is_inclusive() {
        let d = net(&[
            (&["x"], &["a"]),
            (&[], &["p"]),
            (&[], &["q"]),
            (&[], &["r"]),
            (&["a"], &["s"]),
            (&[], &["t"]),
            (&[], &["u"]),
            (&[], &["v"]),
            (&["a"], &["y"]),
        ]);
        let p = plan(&d);
        assert_eq!(p.names, vec!["a".to_string()]);
        assert_eq!(p.down[0], vec![0]);
        assert_eq!(p.down[4], vec![0]);
        assert_eq!(p.up[2], vec![0]);
        assert_eq!(p.up[6], vec![0]);
        // A gap of MIN_GAP - 1 stays on the device.
        let d = net(&[
            (&["x"], &["a"]),
            (&[], &["p"]),
            (&[], &["q"]),
            (&["a"], &["y"]),
        ]);
        assert!(plan(&d).names.is_empty());
    }

    #[test]
    fn an_in_place_output_counts_as_one_use() {
        // `a` read and written by operator 1 (in place): one use there.
        let d = net(&[
            (&["x"], &["a"]),
            (&["a"], &["a"]),
            (&[], &["p"]),
            (&[], &["q"]),
            (&[], &["r"]),
            (&["a"], &["y"]),
        ]);
        let p = plan(&d);
        assert_eq!(p.down[1], vec![0]);
        assert!(p.down[0].is_empty());
    }
}
