//! Copies between storages, and the operations built on them: copy, deep clone, reserve,
//! extend, shrink.
//!
//! # Which copy
//!
//! A copy reads the source's newest data. When the source's head is at the device and both
//! storages are on the same device, the bytes go device to device ([`Stream::copy`](
//! crate::Stream::copy)) and the destination's head ends at the device. Otherwise they go
//! through the host: the source's host mirror (copied from its device first when only the
//! device is current) into the destination's host mirror, whose head ends at the host. Copies
//! are blocking.

use super::shape::Shape;
use super::storage::Storage;
use super::Tensor;
use crate::error::{Error, Result};
use crate::synced::{Head, SyncedMemory};

/// Whether the destination storage was just created (its unused tail must read as zeros) or is
/// reused (its tail is invisible).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dest {
    Fresh,
    Reused,
}

fn kind_error(op: &'static str, label: &str) -> Error {
    Error::InvalidState {
        op,
        buffer: format!("tensor {label}"),
        reason: "source and destination storages hold different kinds of elements".into(),
    }
}

/// Copies the first `n` elements (`nbytes` bytes) of `src` into `dst`, two different storages.
fn copy_prefix(
    src: &Storage,
    dst: &Storage,
    n: usize,
    nbytes: usize,
    dest: Dest,
    (src_label, label): (&str, &str),
) -> Result<()> {
    match (src, dst) {
        (Storage::Bytes(s), Storage::Bytes(d)) => {
            copy_bytes(&s.mem, &d.mem, nbytes, dest, (src_label, label))
        }
        (Storage::Strings(s), Storage::Strings(d)) => {
            let from = s.read_for(src_label)?;
            let mut to = d.write_for(label)?;
            for (a, b) in to.iter_mut().zip(from.iter()).take(n) {
                a.clone_from(b);
            }
            Ok(())
        }
        _ => Err(kind_error("copy", label)),
    }
}

fn copy_bytes(
    src: &SyncedMemory,
    dst: &SyncedMemory,
    nbytes: usize,
    dest: Dest,
    (src_label, label): (&str, &str),
) -> Result<()> {
    if nbytes == 0 {
        return Ok(());
    }
    let same_device = match (src.target(), dst.target()) {
        (Some(a), Some(b)) => a.same(b),
        _ => false,
    };
    match src.head() {
        // Never written: the source reads as zeros, as does a fresh destination.
        Head::Uninitialized => {
            if dest == Dest::Reused {
                if let Some(b) = dst.host_write_for(Some(label), true)?.get_mut(..nbytes) {
                    b.fill(0);
                }
            }
            Ok(())
        }
        Head::AtDevice if same_device => {
            let from = src.device_for(Some(src_label))?;
            let to = dst.device_write_for(Some(label), true)?;
            let stream = to.stream().clone();
            stream.copy_raw(from.buffer(), 0, to.buffer(), 0, nbytes)?;
            let cap = to.buffer().len();
            if dest == Dest::Fresh && cap > nbytes {
                // Fresh device memory is not zeroed; the tail becomes visible on growth.
                stream.fill_raw(to.buffer(), nbytes, cap - nbytes, 0)?;
            }
            // Blocking: the source may be written or freed as soon as this returns.
            stream.synchronize()
        }
        _ => {
            let from = src.host_for(Some(src_label))?;
            let mut to = dst.host_write_for(Some(label), true)?;
            // A fresh host mirror is zero-filled, so its tail needs nothing.
            match (to.get_mut(..nbytes), from.get(..nbytes)) {
                (Some(a), Some(b)) => {
                    a.copy_from_slice(b);
                    Ok(())
                }
                _ => Err(Error::OutOfBounds {
                    what: format!("copy from {} into {}", src.label(), dst.label()),
                    offset: 0,
                    len: nbytes,
                    size: src.len().min(dst.len()),
                }),
            }
        }
    }
}

impl Tensor {
    /// Makes this tensor a copy of `src`, which may be on another device or host only
    /// (Caffe2's `CopyFrom`): same dims and type, elements copied (deeply for `String`). The
    /// storage is reused when it fits (as [`Tensor::set_dtype`] decides); when it is shared
    /// with other tensors, they see the new contents too (as in Caffe2).
    ///
    /// The copy reads `src`'s newest data. When `src`'s head is at the device and both tensors
    /// are on the same device, it copies device to device and this tensor's head ends at the
    /// device; otherwise it copies through the host (from `src`'s device first when only that
    /// copy is current) and this tensor's head ends at the host. The copy is blocking.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when `src` is uninitialised or has elements but no data;
    /// out of memory or a backend error. On error this tensor may have taken `src`'s shape
    /// and type already.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        let op = "copy_from";
        let shape = src.shape.clone().ok_or_else(|| {
            self.err_state(
                op,
                format!("the source tensor {} is uninitialised", src.label),
            )
        })?;
        let n = shape.numel;
        if n > 0 && src.storage.is_none() {
            return Err(self.err_state(
                op,
                format!(
                    "the source tensor {} has {n} elements but no data",
                    src.label
                ),
            ));
        }
        // Size the buffer for the source's type (Caffe2 sets the meta first, and then
        // `raw_mutable_data()` can return the old buffer although it is too small).
        self.resize_shape(shape, src.itemsize().unwrap_or(0))?;
        let Some(dtype) = src.dtype else {
            // No type: no elements either (checked above), nothing to hold.
            self.dtype = None;
            self.free_memory();
            return Ok(());
        };
        self.prepare(dtype, op)?;
        match (&src.storage, &self.storage) {
            (Some(s), Some(d)) if !s.same(d) => copy_prefix(
                s,
                d,
                n,
                self.nbytes(),
                Dest::Reused,
                (&src.label, &self.label),
            ),
            // Same storage: the elements are already these bytes. Or nothing to copy.
            _ => Ok(()),
        }
    }

    /// A deep copy on the same device, with the same dims, type, elements, label suffix and
    /// shrink policy; its capacity is exactly its bytes. This is the explicit replacement for
    /// Caffe2's copy constructor, which silently shares the buffer: `Tensor` has no `Clone`.
    ///
    /// # Errors
    /// Out of memory or a backend error.
    pub fn clone_deep(&self) -> Result<Tensor> {
        let mut t = Tensor::on(self.device.as_ref())
            .with_label(format!("{}.clone", self.label))
            .with_policy(self.policy);
        t.pinned_host = self.pinned_host;
        t.shape = self.shape.clone();
        t.dtype = self.dtype;
        if let (Some(src), Some(dtype), Some(n)) = (&self.storage, self.dtype, self.numel()) {
            let dst = Storage::new(dtype, n, t.device.as_ref(), &t.label, t.pinned_host)?;
            copy_prefix(src, &dst, n, t.nbytes(), Dest::Fresh, (&t.label, &t.label))?;
            t.storage = Some(dst);
        }
        Ok(t)
    }

    /// Makes the capacity at least `capacity_dims` worth of elements, keeping the data
    /// (Caffe2's 2018 `Reserve`). Dims do not change. Later shrinking resizes keep this
    /// capacity whatever the [`super::ShrinkPolicy`]. New elements read as zero.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor is uninitialised or its type unknown (Caffe2
    /// does nothing then); [`Error::SizeOverflow`]; out of memory or a backend error.
    pub fn reserve(&mut self, capacity_dims: &[usize]) -> Result<()> {
        let op = "reserve";
        let n = self.numel().ok_or_else(|| self.uninit(op))?;
        let dtype = self.dtype.ok_or_else(|| {
            self.err_state(
                op,
                "the element type is not known yet: call set_dtype".into(),
            )
        })?;
        let cap = Shape::new(
            capacity_dims,
            format_args!("reserve of tensor {}", self.label),
        )?;
        let cap_bytes = crate::error::checked_mul(
            cap.numel,
            dtype.size(),
            format_args!("reserved bytes of tensor {}", self.label),
        )?;
        if cap_bytes <= self.capacity_bytes() {
            return Ok(());
        }
        let dst = Storage::new(
            dtype,
            cap.numel,
            self.device.as_ref(),
            &self.label,
            self.pinned_host,
        )?;
        if let Some(src) = &self.storage {
            copy_prefix(
                src,
                &dst,
                n,
                self.nbytes(),
                Dest::Fresh,
                (&self.label, &self.label),
            )?;
        }
        self.storage = Some(dst);
        self.reserved = true;
        Ok(())
    }

    /// Grows the outer dimension by `num`, keeping the data (Caffe2's `Extend`). Within the
    /// capacity only the dims change; beyond it the capacity grows to the larger of the new
    /// outer dimension and the old one increased by `growth_pct` percent, so repeated extends
    /// reallocate O(log n) times. Without storage, this is a plain resize.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor has no dimension; [`Error::SizeOverflow`];
    /// out of memory or a backend error.
    pub fn extend(&mut self, num: usize, growth_pct: u32) -> Result<()> {
        let op = "extend";
        let dims = self.dims().to_vec();
        let Some(&outer) = dims.first() else {
            return Err(self.err_state(op, "extend needs at least one dimension".into()));
        };
        let overflow = |what: String| Error::SizeOverflow { what };
        let new_outer = outer
            .checked_add(num)
            .ok_or_else(|| overflow(format!("extend of tensor {}: {outer} + {num}", self.label)))?;
        let mut new_dims = dims.clone();
        if let Some(first) = new_dims.first_mut() {
            *first = new_outer;
        }
        if self.storage.is_none() {
            return self.resize(&new_dims);
        }
        let shape = Shape::new(&new_dims, format_args!("extend of tensor {}", self.label))?;
        let itemsize = self.itemsize().unwrap_or(0);
        let new_bytes = crate::error::checked_mul(shape.numel, itemsize, "extended bytes")?;
        if new_bytes > self.capacity_bytes() {
            let grown = (outer as u128 * (100 + u128::from(growth_pct))).div_ceil(100);
            let grown = usize::try_from(grown).unwrap_or(usize::MAX);
            let mut cap_dims = dims;
            if let Some(first) = cap_dims.first_mut() {
                *first = new_outer.max(grown);
            }
            self.reserve(&cap_dims)?;
        }
        // Within capacity now: dims and count only, no storage change.
        self.shape = Some(shape);
        Ok(())
    }

    /// Lowers the outer dimension to `outer`, keeping the memory (Caffe2's `Shrink`).
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the tensor has no dimension, or when `outer` exceeds the
    /// current outer dimension (Caffe2 also accepts negative values; `usize` cannot be
    /// negative). The tensor is unchanged on error.
    pub fn shrink(&mut self, outer: usize) -> Result<()> {
        let op = "shrink";
        let mut dims = self.dims().to_vec();
        let Some(first) = dims.first_mut() else {
            return Err(self.err_state(op, "shrink needs at least one dimension".into()));
        };
        if outer > *first {
            return Err(self.err_state(
                op,
                format!(
                    "the new outer dimension {outer} must not exceed the current one ({})",
                    *first
                ),
            ));
        }
        *first = outer;
        let shape = Shape::new(&dims, "shrink")?;
        self.shape = Some(shape);
        Ok(())
    }
}
