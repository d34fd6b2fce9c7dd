//! The locks this thread holds, so that an access that could only wait for this very thread
//! fails with [`Error::Busy`] instead of deadlocking.
//!
//! Every guard of a [`SyncedMemory`] (and every view of a tensor's `String` storage) holds its
//! lock through a [`ReadHeld`] or [`WriteHeld`], which puts a one-word record (the lock's
//! address and whether it is held for writing) in a small thread-local table when it is made
//! and takes it out when it drops. Lock guards are not `Send`, so both happen on the same
//! thread. A tensor view also records the tensor's name ([`Named`]).
//!
//! A blocking access first *tries* the lock, exactly as before; only when that fails does it
//! read the table. If this thread holds the lock in a conflicting way, waiting could never end,
//! and the access returns [`Error::Busy`] naming both sides; otherwise another thread holds it,
//! and the access waits.
//!
//! An uncontended access pays a few thread-local loads and stores (no allocation, no atomic,
//! and the guard does not grow): the table is a fixed array, with a vector behind it only for a
//! thread that holds more than [`SLOTS`] guards at once.
//!
//! A guard that is forgotten (`mem::forget`) leaves its record behind, and its lock held
//! forever: later blocking accesses of that buffer on this thread get [`Error::Busy`] instead
//! of the endless wait the held lock would give.

use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::SyncedMemory;
use crate::error::{Error, Result};

/// Records kept in the fixed part of each table.
const SLOTS: usize = 8;
/// Longest tensor name kept, in bytes; a longer one is cut (at a character boundary) and ends
/// in `…`.
const NAME_MAX: usize = 48;

/// Tag bit: a write guard (else a read guard). Lock addresses are aligned, so it is free.
const WRITE: usize = 1;

/// The table key of a lock: its address.
fn key_of<T>(lock: &RwLock<T>) -> usize {
    lock as *const RwLock<T> as *const () as usize
}

fn tag(key: usize, write: bool) -> usize {
    key | usize::from(write)
}

/// This thread's guard records (no destructor, so no lazy set-up on access).
struct Table {
    len: Cell<usize>,
    tags: [Cell<usize>; SLOTS],
}

thread_local! {
    static TABLE: Table = const {
        Table {
            len: Cell::new(0),
            tags: [const { Cell::new(0) }; SLOTS],
        }
    };
    /// Guard records beyond the fixed part.
    static SPILL: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// The tensor views of this thread: lock key, the name's address (which tells apart two
    /// views of a storage through tensors of the same name), and the name.
    static NAMES: RefCell<Vec<(usize, usize, Name)>> = const { RefCell::new(Vec::new()) };
}

#[inline]
fn push(tag: usize) {
    let pushed = TABLE.with(|t| {
        let n = t.len.get();
        let slot = t.tags.get(n);
        if let Some(slot) = slot {
            slot.set(tag);
            t.len.set(n + 1);
        }
        slot.is_some()
    });
    if !pushed {
        spill(tag);
    }
}

#[cold]
#[inline(never)]
fn spill(tag: usize) {
    SPILL.with(|s| s.borrow_mut().push(tag));
}

#[inline]
fn pop(tag: usize) {
    // Guards mostly drop in the reverse order of their making: the last record first. Records
    // with the same tag are interchangeable.
    let popped = TABLE.with(|t| {
        let last = t.len.get().wrapping_sub(1);
        let top = t.tags.get(last).is_some_and(|s| s.get() == tag);
        if top {
            t.len.set(last);
        }
        top
    });
    if !popped {
        remove(tag);
    }
}

/// Takes a record with `tag` out from anywhere (off the fast path): the spilled ones first,
/// which are the most recent.
#[cold]
#[inline(never)]
fn remove(tag: usize) {
    let spilled = SPILL
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let i = s.iter().rposition(|&t| t == tag);
            i.map(|i| s.swap_remove(i)).is_some()
        })
        .unwrap_or(false);
    if spilled {
        return;
    }
    TABLE.with(|t| {
        let n = t.len.get().min(SLOTS);
        if let Some(i) = (0..n).rev().find(|&i| t.tags[i].get() == tag) {
            let last = n - 1;
            t.tags[i].set(t.tags[last].get());
            t.len.set(last);
        }
    });
}

/// A read guard of an [`RwLock`], recorded as held by this thread while it lives.
pub(crate) struct ReadHeld<'a, T> {
    guard: RwLockReadGuard<'a, T>,
}

/// A write guard of an [`RwLock`], recorded as held by this thread while it lives.
pub(crate) struct WriteHeld<'a, T> {
    guard: RwLockWriteGuard<'a, T>,
}

impl<'a, T> ReadHeld<'a, T> {
    /// Records `guard`.
    #[inline]
    pub(crate) fn new(guard: RwLockReadGuard<'a, T>) -> Self {
        push(tag(key_of(RwLockReadGuard::rwlock(&guard)), false));
        Self { guard }
    }
}

impl<'a, T> WriteHeld<'a, T> {
    /// Records `guard`.
    #[inline]
    pub(crate) fn new(guard: RwLockWriteGuard<'a, T>) -> Self {
        push(tag(key_of(RwLockWriteGuard::rwlock(&guard)), true));
        Self { guard }
    }
}

impl<T> Drop for ReadHeld<'_, T> {
    #[inline]
    fn drop(&mut self) {
        pop(tag(key_of(RwLockReadGuard::rwlock(&self.guard)), false));
    }
}

impl<T> Drop for WriteHeld<'_, T> {
    #[inline]
    fn drop(&mut self) {
        pop(tag(key_of(RwLockWriteGuard::rwlock(&self.guard)), true));
    }
}

impl<T> Deref for ReadHeld<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> Deref for WriteHeld<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for WriteHeld<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// The shared lock of `lock` (recursive: a reader of this thread never waits for a writer
/// queued behind it), waiting for a writer of another thread only; `busy` makes the error when
/// the writer is this thread.
#[inline]
pub(crate) fn read_lock<'a, T>(
    lock: &'a RwLock<T>,
    busy: impl FnOnce(Held) -> Error,
) -> Result<ReadHeld<'a, T>> {
    match lock.try_read_recursive() {
        Some(g) => Ok(ReadHeld::new(g)),
        None => read_lock_contended(lock, busy),
    }
}

#[cold]
#[inline(never)]
fn read_lock_contended<'a, T>(
    lock: &'a RwLock<T>,
    busy: impl FnOnce(Held) -> Error,
) -> Result<ReadHeld<'a, T>> {
    match held(key_of(lock), false) {
        Some(h) => Err(busy(h)),
        None => Ok(ReadHeld::new(lock.read_recursive())),
    }
}

/// The exclusive lock of `lock`, waiting for guards of other threads only; `busy` makes the
/// error when a guard of this thread holds it.
#[inline]
pub(crate) fn write_lock<'a, T>(
    lock: &'a RwLock<T>,
    busy: impl FnOnce(Held) -> Error,
) -> Result<WriteHeld<'a, T>> {
    match lock.try_write() {
        Some(g) => Ok(WriteHeld::new(g)),
        None => write_lock_contended(lock, busy),
    }
}

#[cold]
#[inline(never)]
fn write_lock_contended<'a, T>(
    lock: &'a RwLock<T>,
    busy: impl FnOnce(Held) -> Error,
) -> Result<WriteHeld<'a, T>> {
    match held(key_of(lock), true) {
        Some(h) => Err(busy(h)),
        None => Ok(WriteHeld::new(lock.write())),
    }
}

/// A tensor name, inline.
#[derive(Clone, Copy)]
struct Name {
    len: u8,
    bytes: [u8; NAME_MAX],
}

impl Name {
    fn new(s: &str) -> Name {
        let mut name = Name {
            len: 0,
            bytes: [0; NAME_MAX],
        };
        let (cut, ellipsis) = if s.len() <= NAME_MAX {
            (s.len(), "")
        } else {
            let mut cut = NAME_MAX - '…'.len_utf8();
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            (cut, "…")
        };
        let len = cut + ellipsis.len();
        if let (Some(dst), Some(src)) = (name.bytes.get_mut(..cut), s.as_bytes().get(..cut)) {
            dst.copy_from_slice(src);
        }
        if let Some(dst) = name.bytes.get_mut(cut..len) {
            dst.copy_from_slice(ellipsis.as_bytes());
        }
        name.len = len as u8;
        name
    }

    fn text(self) -> String {
        let len = usize::from(self.len).min(NAME_MAX);
        String::from_utf8_lossy(&self.bytes[..len]).into_owned()
    }
}

/// The name of the tensor a view of this thread was taken through, recorded while it lives
/// (beside the guard's own record), so that a conflicting access can name it.
pub(crate) struct Named {
    key: usize,
    ident: usize,
}

impl Named {
    /// Records a view of the storage whose lock key is `key` through the tensor `tensor`.
    pub(crate) fn new(key: usize, tensor: &str) -> Named {
        let ident = tensor.as_ptr() as usize;
        NAMES.with(|n| n.borrow_mut().push((key, ident, Name::new(tensor))));
        Named { key, ident }
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = NAMES.try_with(|n| {
            let mut n = n.borrow_mut();
            if let Some(i) = n
                .iter()
                .rposition(|&(k, id, _)| k == self.key && id == self.ident)
            {
                n.remove(i);
            }
        });
    }
}

/// A guard this thread holds on a storage.
pub(crate) struct Held {
    /// A write guard (else a read guard).
    pub(crate) write: bool,
    /// The tensor a view of this thread holds the storage through (the most recent), if any.
    pub(crate) tensor: Option<String>,
}

/// A guard this thread holds on the lock `key` that conflicts with a request for a write
/// (`write`: any guard) or a read (only a write guard).
pub(crate) fn held(key: usize, write: bool) -> Option<Held> {
    let conflicts = |t: usize| t & !WRITE == key && (write || t & WRITE != 0);
    let spilled = SPILL.with(|s| s.borrow().iter().rev().copied().find(|&t| conflicts(t)));
    let found = spilled.or_else(|| {
        TABLE.with(|t| {
            let n = t.len.get().min(SLOTS);
            (0..n)
                .rev()
                .map(|i| t.tags[i].get())
                .find(|&t| conflicts(t))
        })
    })?;
    let tensor = NAMES.with(|n| {
        n.borrow()
            .iter()
            .rev()
            .find(|(k, _, _)| *k == key)
            .map(|(_, _, name)| name.text())
    });
    Some(Held {
        write: found & WRITE != 0,
        tensor,
    })
}

/// The error for an access that would wait for a guard of this very thread.
///
/// `asked`: the tensor the access is for, if any; `storage`: the buffer's label.
pub(crate) fn self_deadlock(asked: Option<&str>, storage: &str, held: Held) -> Error {
    let asked = asked.map_or_else(|| storage.to_string(), |t| format!("tensor {t}"));
    let holder = held
        .tensor
        .map_or_else(|| storage.to_string(), |t| format!("tensor {t}"));
    let kind = if held.write { "write" } else { "read" };
    let through = if holder == asked {
        String::new()
    } else {
        format!(", through {holder}")
    };
    Error::Busy {
        buffer: format!(
            "{asked} (this thread already holds a {kind} guard of the same storage{through})"
        ),
        reason: "waiting for that guard would deadlock this thread",
    }
}

/// The table key of the storage behind `lock`, for [`Named`].
pub(crate) fn lock_key<T>(lock: &RwLock<T>) -> usize {
    key_of(lock)
}

impl SyncedMemory {
    /// The access lock, shared; [`Error::Busy`] when only a write guard of this thread holds
    /// it. `tensor`: the tensor the access is for (named in the error).
    #[inline]
    pub(super) fn lock_read(&self, tensor: Option<&str>) -> Result<ReadHeld<'_, ()>> {
        read_lock(&self.shared.access, |h| {
            self_deadlock(tensor, self.label(), h)
        })
    }

    /// The access lock, exclusive; [`Error::Busy`] when a guard of this thread holds it.
    #[inline]
    pub(super) fn lock_write(&self, tensor: Option<&str>) -> Result<WriteHeld<'_, ()>> {
        write_lock(&self.shared.access, |h| {
            self_deadlock(tensor, self.label(), h)
        })
    }

    /// The key of this buffer's lock, for [`Named`].
    pub(crate) fn lock_key(&self) -> usize {
        key_of(&self.shared.access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_and_go_in_any_order_and_beyond_the_fixed_slots() {
        let locks: Vec<RwLock<()>> = (0..SLOTS + 4).map(|_| RwLock::new(())).collect();
        let key = |i: usize| key_of(&locks[i]);
        // Alternately read and write guards, more than the fixed slots hold.
        let mut guards: Vec<Option<Result<ReadHeld<()>, WriteHeld<()>>>> = (0..SLOTS + 4)
            .map(|i| {
                Some(if i % 2 == 0 {
                    Ok(read_lock(&locks[i], |_| unreachable!()).unwrap())
                } else {
                    Err(write_lock(&locks[i], |_| unreachable!()).unwrap())
                })
            })
            .collect();
        for i in 0..SLOTS + 4 {
            let h = held(key(i), true).expect("recorded");
            assert_eq!(h.write, i % 2 == 1);
            assert_eq!(
                held(key(i), false).is_some(),
                i % 2 == 1,
                "reads conflict with writes"
            );
        }
        // Out of order: every other one first, then the rest.
        for i in (0..SLOTS + 4).step_by(2) {
            guards[i] = None;
            assert!(held(key(i), true).is_none(), "{i} gone");
        }
        for i in (1..SLOTS + 4).step_by(2) {
            assert!(held(key(i), true).unwrap().write);
        }
        drop(guards);
        for i in 0..SLOTS + 4 {
            assert!(held(key(i), true).is_none());
        }
        TABLE.with(|t| assert_eq!(t.len.get(), 0));
        SPILL.with(|s| assert!(s.borrow().is_empty()));
    }

    #[test]
    fn contended_locks_of_this_thread_are_refused_and_named() {
        let lock = RwLock::new(());
        let r = read_lock(&lock, |_| unreachable!()).unwrap();
        let again = read_lock(&lock, |_| unreachable!());
        assert!(again.is_ok(), "reads share");
        let named = Named::new(key_of(&lock), "w");
        let e = write_lock(&lock, |h| self_deadlock(Some("alias"), "storage", h)).err();
        let text = e.expect("refused").to_string();
        assert!(
            text.contains("tensor alias") && text.contains("through tensor w"),
            "{text}"
        );
        drop((r, again, named));
        assert!(write_lock(&lock, |_| unreachable!()).is_ok());
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary() {
        let long = "é".repeat(40);
        let kept = Name::new(&long).text();
        assert!(kept.len() <= NAME_MAX && kept.ends_with('…'), "{kept}");
        assert!(long.starts_with(kept.trim_end_matches('…')));
        assert_eq!(Name::new("w").text(), "w");
    }
}
