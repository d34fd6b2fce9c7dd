//! The math of [`ParamBlob`] (`update`, `asum_*`, `sumsq_*`, `scale_*`) and `copy_from`.
//!
//! As in Caffe, each operation runs where the buffer's head is:
//!
//! | head | runs | accesses |
//! |---|---|---|
//! | `Uninitialized` | nothing: `asum`/`sumsq` return 0, `scale` does nothing, `update` fails | none |
//! | `AtHost` | host loops ([`kernels::host`]) | `host()` / `host_mut()` |
//! | `AtDevice`, `Synced` | device kernels ([`kernels`]) on the blob's device | `device()` / `device_mut()` |
//!
//! So a reduction of data whose head is at the device copies nothing back to the host, and
//! `Synced` data is reduced on the device, as Caffe does. Accesses go through the buffer's
//! guards, so any copy they need follows [`SyncedMemory`]'s table.

use std::sync::Arc;

use super::{ParamBlob, Part, Scalar, ScalarKind};
use crate::error::{Error, Result};
use crate::kernels::{self, host, Float, Op};
use crate::synced::{Head, HostRead, HostWrite, SyncedMemory};

impl<T: Scalar> ParamBlob<T> {
    /// `data -= diff` over the count (Caffe's `Update`), on the side of the data's head: a
    /// host loop at `AtHost`, a device kernel at `AtDevice` or `Synced`. The diff is read on the
    /// same side (copied there if needed). A blob of count 0 has nothing to update.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when the data is uninitialized (Caffe: fatal "Syncedmem not
    /// initialized"), [`Error::Unsupported`] for integer blobs or a backend without kernels,
    /// [`Error::RuntimeUnavailable`] on CUDA when `libnvrtc` cannot be loaded (see
    /// [`crate::kernels`]), or an access or backend error.
    pub fn update(&mut self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        if self.data.head() == Head::Uninitialized {
            return Err(Error::InvalidState {
                op: "ParamBlob::update",
                buffer: self.data.label().to_string(),
                reason: format!(
                    "the data of blob {} (shape {}) is uninitialized: nothing to update \
                     (Caffe: \"Syncedmem not initialized\")",
                    self.name,
                    self.shape_string()
                ),
            });
        }
        let (n, data, diff) = (self.count, &self.data, &self.diff);
        match self.float_kind("update")? {
            ScalarKind::F32 => update_as::<f32>(n, data, diff),
            _ => update_as::<f64>(n, data, diff),
        }
    }

    /// `sum |data[i]|` over the count (Caffe's `asum_data`); 0 when uninitialized.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for integer blobs or a backend without kernels,
    /// [`Error::RuntimeUnavailable`] on CUDA when `libnvrtc` cannot be loaded, or an access or
    /// backend error.
    pub fn asum_data(&self) -> Result<T> {
        self.reduce(Part::Data, Op::Asum)
    }

    /// `sum |diff[i]|` over the count (Caffe's `asum_diff`); 0 when uninitialized.
    ///
    /// # Errors
    /// As [`ParamBlob::asum_data`].
    pub fn asum_diff(&self) -> Result<T> {
        self.reduce(Part::Diff, Op::Asum)
    }

    /// `sum data[i]^2` over the count (Caffe's `sumsq_data`); 0 when uninitialized.
    ///
    /// # Errors
    /// As [`ParamBlob::asum_data`].
    pub fn sumsq_data(&self) -> Result<T> {
        self.reduce(Part::Data, Op::Sumsq)
    }

    /// `sum diff[i]^2` over the count (Caffe's `sumsq_diff`); 0 when uninitialized.
    ///
    /// # Errors
    /// As [`ParamBlob::asum_data`].
    pub fn sumsq_diff(&self) -> Result<T> {
        self.reduce(Part::Diff, Op::Sumsq)
    }

    /// `data *= factor` over the count (Caffe's `scale_data`); nothing when uninitialized. At
    /// `Synced` the device copy is scaled and the head becomes `AtDevice`.
    ///
    /// # Errors
    /// As [`ParamBlob::asum_data`].
    pub fn scale_data(&mut self, factor: T) -> Result<()> {
        self.scale(Part::Data, factor)
    }

    /// `diff *= factor` over the count (Caffe's `scale_diff`); as [`ParamBlob::scale_data`].
    ///
    /// # Errors
    /// As [`ParamBlob::asum_data`].
    pub fn scale_diff(&mut self, factor: T) -> Result<()> {
        self.scale(Part::Diff, factor)
    }

    /// Copies `src`'s data (or diff, with `copy_diff`) into this blob's (Caffe's `CopyFrom`).
    ///
    /// When the shapes differ, `reshape` reshapes this blob to `src`'s shape; otherwise it is
    /// an error. The copy runs on the device (device to device) when the source's head is at
    /// the device or synced and both buffers are on one device, else on the host. An
    /// uninitialized source copies zeros without touching the source. Copying a buffer onto
    /// itself (shared) does nothing.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] ("different sizes") when the shapes differ and `reshape` is
    /// false, errors of [`ParamBlob::reshape`], or an access or backend error.
    pub fn copy_from(&mut self, src: &ParamBlob<T>, copy_diff: bool, reshape: bool) -> Result<()> {
        if src.count != self.count || src.shape != self.shape {
            if !reshape {
                let size = std::mem::size_of::<T>();
                return Err(Error::SizeMismatch {
                    what: format!(
                        "ParamBlob::copy_from: trying to copy blobs of different sizes: {} \
                         (shape {}) into {} (shape {}), and reshape is not set",
                        src.name,
                        src.shape_string(),
                        self.name,
                        self.shape_string()
                    ),
                    expected: self.count * size,
                    actual: src.count * size,
                });
            }
            self.reshape(&src.shape)?;
        }
        let part = if copy_diff { Part::Diff } else { Part::Data };
        let (from, to) = (src.part(part), self.part(part));
        let bytes = self.count * std::mem::size_of::<T>();
        if bytes == 0 || Arc::ptr_eq(from, to) {
            return Ok(());
        }
        let same_device = matches!((from.target(), to.target()), (Some(a), Some(b)) if a.same(b));
        match from.head() {
            Head::AtDevice | Head::Synced if same_device => {
                let s = from.device()?;
                let d = if to.len() == bytes {
                    to.device_overwrite()?
                } else {
                    to.device_mut()?
                };
                let stream = d.stream();
                stream.copy_raw(s.buffer(), 0, d.buffer(), 0, bytes)?;
                stream.synchronize()
            }
            Head::Uninitialized => {
                let mut d = host_target(to, bytes)?;
                prefix_mut(&mut d, bytes, to)?.fill(0);
                Ok(())
            }
            _ => {
                let s: HostRead<'_> = from.host()?;
                let src_bytes = s.get(..bytes).ok_or_else(|| short(from, bytes, s.len()))?;
                let mut d = host_target(to, bytes)?;
                prefix_mut(&mut d, bytes, to)?.copy_from_slice(src_bytes);
                Ok(())
            }
        }
    }

    fn reduce(&self, part: Part, op: Op) -> Result<T> {
        let (n, mem) = (self.count, self.part(part));
        let v = match self.float_kind(op.name())? {
            ScalarKind::F32 => f64::from(reduce_as::<f32>(op, n, mem)?),
            _ => reduce_as::<f64>(op, n, mem)?,
        };
        Ok(T::from_f64(v))
    }

    fn scale(&mut self, part: Part, factor: T) -> Result<()> {
        let (n, mem) = (self.count, self.part(part));
        let f = factor.to_f64();
        match self.float_kind("scale")? {
            ScalarKind::F32 => scale_as::<f32>(n, f as f32, mem),
            _ => scale_as::<f64>(n, f, mem),
        }
    }

    /// `F32` or `F64`, or the `NOT_IMPLEMENTED` error for the integer types.
    fn float_kind(&self, op: &str) -> Result<ScalarKind> {
        if T::KIND.is_float() {
            return Ok(T::KIND);
        }
        Err(Error::Unsupported {
            device: self.device.label().to_string(),
            what: format!(
                "{op} on blob {} of element type {}: blob math is implemented for f32 and f64 \
                 only (Caffe: NOT_IMPLEMENTED)",
                self.name,
                T::KIND
            ),
        })
    }
}

/// The host mirror of `to` for writing `bytes` bytes: skips the copy when they are all of it.
fn host_target(to: &SyncedMemory, bytes: usize) -> Result<HostWrite<'_>> {
    if to.len() == bytes {
        to.host_overwrite()
    } else {
        to.host_mut()
    }
}

fn prefix_mut<'g>(
    g: &'g mut HostWrite<'_>,
    bytes: usize,
    mem: &SyncedMemory,
) -> Result<&'g mut [u8]> {
    let len = g.len();
    g.get_mut(..bytes).ok_or_else(|| short(mem, bytes, len))
}

fn head_slice<'a, F: Float>(all: &'a [F], n: usize, mem: &SyncedMemory) -> Result<&'a [F]> {
    all.get(..n).ok_or_else(|| short(mem, n, all.len()))
}

fn short(mem: &SyncedMemory, n: usize, len: usize) -> Error {
    Error::OutOfBounds {
        what: format!("elements of {}", mem.label()),
        offset: 0,
        len: n,
        size: len,
    }
}

fn reduce_as<F: Float>(op: Op, n: usize, mem: &SyncedMemory) -> Result<F> {
    match mem.head() {
        Head::Uninitialized => Ok(F::ZERO),
        // A dropped buffer's host read fails, naming it.
        Head::AtHost | Head::Dropped => {
            let g = mem.host()?;
            let x = head_slice(g.as_slice_of::<F>()?, n, mem)?;
            Ok(match op {
                Op::Asum => host::asum(x),
                _ => host::sumsq(x),
            })
        }
        Head::AtDevice | Head::Synced | Head::Elsewhere => {
            let g = mem.device()?;
            match op {
                Op::Asum => kernels::asum(n, &g),
                _ => kernels::sumsq(n, &g),
            }
        }
    }
}

fn scale_as<F: Float>(n: usize, a: F, mem: &SyncedMemory) -> Result<()> {
    match mem.head() {
        Head::Uninitialized => Ok(()),
        Head::AtHost | Head::Dropped => {
            let mut g = mem.host_mut()?;
            let all = g.as_mut_slice_of::<F>()?;
            let len = all.len();
            let x = all.get_mut(..n).ok_or_else(|| short(mem, n, len))?;
            host::scale(a, x);
            Ok(())
        }
        Head::AtDevice | Head::Synced | Head::Elsewhere => {
            kernels::scale(n, a, &mut mem.device_mut()?)
        }
    }
}

fn update_as<F: Float>(n: usize, data: &SyncedMemory, diff: &SyncedMemory) -> Result<()> {
    let minus_one = -F::from_f64(1.0);
    let on_host = data.head() == Head::AtHost;
    // Data and diff are never one buffer (sharing moves data to data and diff to diff only),
    // so holding a read guard of one and a write guard of the other cannot deadlock.
    // Caffe's order: the diff is read first, then the data taken for writing.
    if on_host {
        let d = diff.host()?;
        let x = head_slice(d.as_slice_of::<F>()?, n, diff)?;
        let mut g = data.host_mut()?;
        let all = g.as_mut_slice_of::<F>()?;
        let len = all.len();
        let y = all.get_mut(..n).ok_or_else(|| short(data, n, len))?;
        host::axpy(minus_one, x, y)
    } else {
        let d = diff.device()?;
        let mut g = data.device_mut()?;
        kernels::axpy(n, minus_one, &d, &mut g)
    }
}
