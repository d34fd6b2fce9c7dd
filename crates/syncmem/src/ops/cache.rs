//! The blobs of an operator kept between runs of a net: a run of a net finds each operator's
//! blobs as the previous run left them, without looking up a name, while no name of any
//! workspace changed.
//!
//! A net keeps one [`Kept`] per operator and installs it on the running thread around the
//! operator's run ([`Installed`]); [`super::with_io`] takes it from there. The lookup is made
//! again when the workspace, the names or the allowed in-place pairs differ from the kept
//! ones, when a name of any workspace changed since (a blob added, removed or renamed, a
//! name forwarded: the workspace's count of name changes), or when a kept blob is gone. The
//! kept blobs are weak references: a blob removed from its workspace is not kept alive by a
//! net.

use std::cell::Cell;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use super::io::{resolve, Layout, Small};
use super::OperatorDef;
use crate::blob::Blob;
use crate::error::Result;
use crate::workspace::{names_generation, BlobRef, Workspace};

thread_local! {
    /// The kept lookup of the operator running on this thread, while a net runs it.
    static SLOT: Cell<Option<Box<Kept>>> = const { Cell::new(None) };
}

/// What a lookup was made for.
#[derive(Default)]
struct Key {
    /// The workspace's address.
    ws: usize,
    /// The count of name changes before the lookup.
    generation: u64,
    inputs: Small<String>,
    outputs: Small<String>,
    in_place_ok: Small<(usize, usize)>,
}

impl Key {
    fn matches(
        &self,
        ws: usize,
        generation: u64,
        def: &OperatorDef,
        in_place_ok: &[(usize, usize)],
    ) -> bool {
        self.ws == ws
            && self.generation == generation
            && self.inputs[..] == def.inputs[..]
            && self.outputs[..] == def.outputs[..]
            && self.in_place_ok[..] == *in_place_ok
    }

    /// Becomes the key of a lookup of `def` (reusing its strings' memory).
    fn set(&mut self, ws: usize, generation: u64, def: &OperatorDef, ok: &[(usize, usize)]) {
        self.ws = ws;
        self.generation = generation;
        copy_names(&mut self.inputs, &def.inputs);
        copy_names(&mut self.outputs, &def.outputs);
        self.in_place_ok.clear();
        self.in_place_ok.extend_from_slice(ok);
    }
}

fn copy_names(to: &mut Small<String>, from: &[String]) {
    to.truncate(from.len());
    for (t, f) in to.iter_mut().zip(from) {
        t.clone_from(f);
    }
    let have = to.len();
    to.extend(from[have..].iter().cloned());
}

/// One operator's blobs, as its last lookup found them.
#[derive(Default)]
pub(crate) struct Kept {
    /// `None` until a lookup succeeded (and after one failed).
    key: Option<Key>,
    /// Kept for its strings' memory while `key` is `None`.
    spare: Key,
    refs: Small<Weak<RwLock<Blob>>>,
    layout: Layout,
}

impl Kept {
    /// Puts in `refs` (empty) the distinct blobs of a run of `def` in `ws` (see [`resolve`]):
    /// the kept ones when nothing changed, else those of a new lookup, which are then kept.
    /// Filled in place, not returned: the list is over a hundred bytes, copied when moved.
    ///
    /// # Errors
    /// As [`resolve`].
    pub(crate) fn refs_into(
        &mut self,
        ws: &Workspace,
        def: &OperatorDef,
        in_place_ok: &[(usize, usize)],
        refs: &mut Small<BlobRef>,
    ) -> Result<()> {
        debug_assert!(refs.is_empty(), "refs_into fills an empty list");
        let at = ws as *const Workspace as usize;
        // Read before the lookup: a change during it makes the next run look up again.
        let generation = names_generation();
        if self
            .key
            .as_ref()
            .is_some_and(|k| k.matches(at, generation, def, in_place_ok))
        {
            refs.extend(self.refs.iter().map_while(Weak::upgrade));
            if refs.len() == self.refs.len() {
                return Ok(());
            }
            refs.clear();
        }
        if let Some(old) = self.key.take() {
            self.spare = old;
        }
        let (found, layout) = resolve(ws, def, in_place_ok)?;
        self.layout = layout;
        self.refs.clear();
        self.refs.extend(found.iter().map(Arc::downgrade));
        let mut key = std::mem::take(&mut self.spare);
        key.set(at, generation, def, in_place_ok);
        self.key = Some(key);
        *refs = found;
        Ok(())
    }

    /// How the blobs of the last lookup map to the inputs and outputs.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Takes the kept lookup installed on this thread, if any (give it back with [`put_back`]).
pub(crate) fn take() -> Option<Box<Kept>> {
    SLOT.with(Cell::take)
}

/// Gives back what [`take`] took.
pub(crate) fn put_back(kept: Box<Kept>) {
    SLOT.with(|s| s.set(Some(kept)));
}

/// `slot`'s lookup installed on this thread until dropped, then back in `slot` (a net's, for
/// the operator it runs). What was installed before comes back after (a net run by an
/// operator of another net).
pub(crate) struct Installed<'a> {
    slot: &'a mut Option<Box<Kept>>,
    before: Option<Box<Kept>>,
}

impl<'a> Installed<'a> {
    /// Installs `slot`'s lookup (a new one when it has none).
    pub(crate) fn new(slot: &'a mut Option<Box<Kept>>) -> Self {
        let mine = slot.take().unwrap_or_default();
        let before = SLOT.with(|s| s.replace(Some(mine)));
        Self { slot, before }
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        *self.slot = SLOT.with(|s| s.replace(self.before.take()));
    }
}
