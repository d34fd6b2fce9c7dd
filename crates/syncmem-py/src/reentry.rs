//! Calls into the package from inside a Python operator function.
//!
//! While an operator runs, it holds the locks of its blobs (read locks for its inputs, write
//! locks for its outputs) and the run holds the device gate shared (see `views`). A call from
//! the operator's function that waits for one of those would wait forever: the function runs
//! on the thread that holds them. So the operator records, for its thread, the blobs it holds
//! while its function runs, and the package's calls check them first:
//!
//! - a call that would write a held blob (`feed_blob`, `load`), or read one held for writing
//!   (`fetch_blob`, `numpy`, `save`, a tensor property of an output), raises `BusyError`
//!   naming the blob and the operator;
//! - a read of a blob held for reading takes the lock recursively (it never queues behind a
//!   writer waiting for the operator's own lock);
//! - `run_net` and `run_net_once` raise `BusyError` when the net uses a held blob, and run
//!   otherwise;
//! - a writable view (`numpy(writable=True)`, a host DLPack export) needs the device gate
//!   exclusively, which the running net holds: it raises `BusyError`;
//! - `memory_snapshot()` takes no blob lock it would wait for: a blob locked for writing shows
//!   as busy.

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::RwLockReadGuard;
use pyo3::prelude::*;
use syncmem::workspace::BlobRef;
use syncmem::Blob;

use crate::errors::BusyError;

/// A blob held by an operator running on this thread.
struct Held {
    blob: usize,
    name: String,
    written: bool,
}

/// One operator function running on this thread.
struct Running {
    op: String,
    blobs: Vec<Held>,
}

thread_local! {
    /// The operator functions running on this thread, innermost last.
    static RUNNING: RefCell<Vec<Running>> = const { RefCell::new(Vec::new()) };
}

fn addr(blob: &BlobRef) -> usize {
    Arc::as_ptr(blob) as usize
}

/// Marks an operator function running on this thread while it lives.
#[must_use = "the operator counts as running while the scope lives"]
pub struct Scope(());

impl Drop for Scope {
    fn drop(&mut self) {
        RUNNING.with(|r| {
            r.borrow_mut().pop();
        });
    }
}

/// Records that operator `op` runs a Python function on this thread, holding `blobs`
/// (`(blob, name, written)`), until the returned scope is dropped.
pub fn enter(op: String, blobs: impl IntoIterator<Item = (BlobRef, String, bool)>) -> Scope {
    let blobs = blobs
        .into_iter()
        .map(|(b, name, written)| Held {
            blob: addr(&b),
            name,
            written,
        })
        .collect();
    RUNNING.with(|r| r.borrow_mut().push(Running { op, blobs }));
    Scope(())
}

/// The innermost operator whose Python function runs on this thread, if any.
pub fn running_op() -> Option<String> {
    RUNNING.with(|r| r.borrow().last().map(|x| x.op.clone()))
}

/// `(operator, blob name, written)` when an operator running on this thread holds `blob`
/// (for writing, when any of them holds it so).
fn holder(blob: &BlobRef) -> Option<(String, String, bool)> {
    let a = addr(blob);
    RUNNING.with(|r| {
        let mut found: Option<(String, String, bool)> = None;
        for run in r.borrow().iter() {
            for h in run.blobs.iter().filter(|h| h.blob == a) {
                if found.as_ref().is_none_or(|f| !f.2 && h.written) {
                    found = Some((run.op.clone(), h.name.clone(), h.written));
                }
            }
        }
        found
    })
}

fn busy(op: &str, name: &str, written: bool, what: &str) -> PyErr {
    let how = if written { "writing" } else { "reading" };
    BusyError::new_err(format!(
        "{what}: blob {name:?} is held for {how} by operator {op}, whose Python function is \
         running on this thread: waiting for it would never end. Use the blob after the run"
    ))
}

/// `BusyError` when an operator running on this thread holds `blob` (for writing, or at
/// all when `write`).
pub fn check(blob: &BlobRef, write: bool, what: &str) -> PyResult<()> {
    match holder(blob) {
        Some((op, name, written)) if written || write => Err(busy(&op, &name, written, what)),
        _ => Ok(()),
    }
}

/// The blob's read lock, or `BusyError` when an operator running on this thread holds it for
/// writing; a blob held for reading here is locked recursively.
pub fn read<'b>(blob: &'b BlobRef, what: &str) -> PyResult<RwLockReadGuard<'b, Blob>> {
    match holder(blob) {
        Some((op, name, true)) => Err(busy(&op, &name, true, what)),
        Some(_) => Ok(blob.read_recursive()),
        None => Ok(blob.read()),
    }
}

/// `BusyError` when a net using `names` (resolved by `resolve`) would wait on a blob held by
/// an operator running on this thread.
pub fn check_names<'a>(
    names: impl IntoIterator<Item = &'a String>,
    resolve: impl Fn(&str) -> Option<BlobRef>,
    what: &str,
) -> PyResult<()> {
    if running_op().is_none() {
        return Ok(());
    }
    for name in names {
        if let Some(b) = resolve(name) {
            if let Some((op, _, written)) = holder(&b) {
                return Err(busy(&op, name, written, what));
            }
        }
    }
    Ok(())
}

/// `BusyError` for a writable view asked for inside an operator function.
pub fn check_writable_view(what: &str) -> PyResult<()> {
    match running_op() {
        Some(op) => Err(BusyError::new_err(format!(
            "{what}: a writable view cannot be made while operator {op} runs on this thread \
             (its Python function is calling): the net's device work holds what it needs. Take \
             a read-only view, or make it after the run"
        ))),
        None => Ok(()),
    }
}
