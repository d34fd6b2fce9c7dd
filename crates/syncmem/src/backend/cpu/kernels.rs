//! [`BackendKernels`] for the `cpu` device: the loops of [`super::math`] over the device's
//! memory. Every call has finished when it returns.

use bytemuck::Pod;

use super::math;
use super::{CpuDevice, CpuMem, CpuStream};
use crate::backend::epilogue::EpilogueCode;
use crate::backend::{BackendKernels, BadLabel, Buf, Gemm, Reduce, SoftmaxExtra};
use crate::dtype::{Float, ScalarKind};
use crate::error::{Error, Result};

/// The first `n` elements of `m` as `T`, read-only.
fn view<T: Pod>(m: &CpuMem, n: usize) -> Result<&[T]> {
    let bytes = n
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= m.len_bytes());
    let Some(bytes) = bytes else {
        return Err(too_small(m.len_bytes(), n, std::mem::size_of::<T>()));
    };
    // SAFETY: `m` owns (or keeps alive) `m.len_bytes()` initialised bytes at `as_ptr()`, and
    // `bytes` is within them. Under the kernel contract no writer touches an input while the
    // call runs (the caller holds the buffers' guards), so a shared slice is sound.
    let raw = unsafe { std::slice::from_raw_parts(m.as_ptr(), bytes) };
    bytemuck::try_cast_slice(raw).map_err(|e| misaligned::<T>(e))
}

/// The first `n` elements of `m` as `T`, writable.
///
/// # Safety
/// No other reference to these bytes may be alive while the returned slice is (the kernel
/// contract: outputs are held exclusively and alias no input, except through the in-place
/// forms, which never call this for both).
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<T: Pod>(m: &CpuMem, n: usize) -> Result<&mut [T]> {
    let bytes = n
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= m.len_bytes());
    let Some(bytes) = bytes else {
        return Err(too_small(m.len_bytes(), n, std::mem::size_of::<T>()));
    };
    // SAFETY: as in `view`, and the caller guarantees exclusive access to the bytes.
    let raw = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), bytes) };
    bytemuck::try_cast_slice_mut(raw).map_err(|e| misaligned::<T>(e))
}

/// An optional operand: an empty slice for `None`.
fn view_opt<T: Pod>(m: Buf<'_, CpuMem>, n: usize) -> Result<&[T]> {
    match m {
        Some(m) => view(m, n),
        None if n == 0 => Ok(&[]),
        None => Err(too_small(0, n, std::mem::size_of::<T>())),
    }
}

fn too_small(have: usize, n: usize, size: usize) -> Error {
    Error::InvalidState {
        op: "cpu kernel",
        buffer: format!("a buffer of {have} bytes"),
        reason: format!("the kernel needs {n} elements of {size} bytes"),
    }
}

fn misaligned<T>(e: bytemuck::PodCastError) -> Error {
    Error::InvalidState {
        op: "cpu kernel",
        buffer: "a cpu-device buffer".into(),
        reason: format!("cannot view it as {}: {e:?}", std::any::type_name::<T>()),
    }
}

/// Copies `row` into every row of `c` (whose length is a multiple of the row's): into the
/// first, then doubling the rows filled with each copy (a few large copies, not one per row).
fn fill_rows(c: &mut [f32], row: &[f32]) {
    let n = row.len();
    if n == 0 || c.len() < n {
        return;
    }
    c[..n].copy_from_slice(row);
    let mut filled = n;
    while filled < c.len() {
        let more = filled.min(c.len() - filled);
        c.copy_within(..more, filled);
        filled += more;
    }
}

fn same(a: &CpuMem, b: &CpuMem) -> bool {
    std::ptr::eq(a.as_ptr(), b.as_ptr())
}

impl BackendKernels for CpuDevice {
    type Stream = CpuStream;
    type Mem = CpuMem;

    fn prepare_math(&self, _kind: ScalarKind) -> Result<()> {
        Ok(())
    }

    fn gemm(
        &self,
        _: &CpuStream,
        g: &Gemm,
        a: Buf<'_, CpuMem>,
        b: Buf<'_, CpuMem>,
        c: &CpuMem,
        bias: Buf<'_, CpuMem>,
        mask: Buf<'_, CpuMem>,
        sum: Buf<'_, CpuMem>,
    ) -> Result<()> {
        let (m, n, k) = (g.m, g.n, g.k);
        let user = g.user.map(EpilogueCode::host_fn).transpose()?;
        let a = view_opt::<f32>(a, m * k)?;
        let b = view_opt::<f32>(b, k * n)?;
        // SAFETY: `c` is the one output, held exclusively, aliasing no input.
        let c = unsafe { view_mut::<f32>(c, m * n)? };
        let beta = match bias {
            Some(bias) => {
                fill_rows(c, view::<f32>(bias, n)?);
                1.0
            }
            None => 0.0,
        };
        math::gemm((g.ta, g.tb), (m, n, k), a, b, beta, c)?;
        if g.relu {
            math::relu_in_place(c);
        }
        let mask = mask.map(|x| view::<f32>(x, m * n)).transpose()?;
        match (user, mask) {
            (Some(f), y) => f.apply(c, y)?,
            (None, Some(mask)) => math::relu_grad_in_place(mask, c),
            (None, None) => {}
        }
        if let Some(sum) = sum {
            // Nothing to save on the host: the column sums as `col_sum` computes them.
            // SAFETY: `sum` is an output held exclusively, aliasing no other operand.
            math::col_sum(k, m, a, unsafe { view_mut::<f32>(sum, m)? });
        }
        Ok(())
    }

    fn col_sum(
        &self,
        _: &CpuStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, CpuMem>,
        out: &CpuMem,
    ) -> Result<()> {
        let x = view_opt::<f32>(x, rows * cols)?;
        // SAFETY: `out` is the one output, held exclusively, aliasing no input.
        let out = unsafe { view_mut::<f32>(out, cols)? };
        math::col_sum(rows, cols, x, out);
        Ok(())
    }

    fn relu(&self, _: &CpuStream, n: usize, x: &CpuMem, y: &CpuMem) -> Result<()> {
        if same(x, y) {
            // SAFETY: in place: `y` is the only view of its bytes.
            math::relu_in_place(unsafe { view_mut::<f32>(y, n)? });
        } else {
            let xs = view::<f32>(x, n)?;
            // SAFETY: `y` is held exclusively and is not `x`.
            math::relu(xs, unsafe { view_mut::<f32>(y, n)? });
        }
        Ok(())
    }

    fn relu_grad(
        &self,
        _: &CpuStream,
        n: usize,
        y: &CpuMem,
        dy: &CpuMem,
        dx: &CpuMem,
    ) -> Result<()> {
        let ys = view::<f32>(y, n)?;
        if same(dy, dx) {
            // SAFETY: in place on `dx` (= `dy`), which aliases nothing else.
            math::relu_grad_in_place(ys, unsafe { view_mut::<f32>(dx, n)? });
        } else {
            let dys = view::<f32>(dy, n)?;
            // SAFETY: `dx` is held exclusively and aliases no input.
            math::relu_grad(ys, dys, unsafe { view_mut::<f32>(dx, n)? });
        }
        Ok(())
    }

    fn fill_f32(&self, _: &CpuStream, n: usize, value: f32, y: &CpuMem) -> Result<()> {
        // SAFETY: `y` is the one output, held exclusively.
        unsafe { view_mut::<f32>(y, n)? }.fill(value);
        Ok(())
    }

    fn softmax_loss(
        &self,
        s: &CpuStream,
        rows: usize,
        cols: usize,
        x: Buf<'_, CpuMem>,
        labels: Buf<'_, CpuMem>,
        p: Buf<'_, CpuMem>,
        loss: &CpuMem,
        extra: SoftmaxExtra<'_, CpuMem>,
    ) -> Result<Option<BadLabel>> {
        {
            let xs = view_opt::<f32>(x, rows * cols)?;
            let ls = view_opt::<i32>(labels, rows)?;
            let ps: &mut [f32] = match p {
                // SAFETY: `p` is an output, held exclusively, aliasing no input or `loss`.
                Some(p) => unsafe { view_mut(p, rows * cols)? },
                None => &mut [],
            };
            match math::softmax_loss(rows, cols, xs, ls, ps) {
                Ok(v) => {
                    // SAFETY: `loss` is an output, held exclusively, aliasing nothing else.
                    let out = unsafe { view_mut::<f32>(loss, 1)? };
                    out[0] = v;
                }
                Err(bad) => return Ok(Some(bad)),
            }
        }
        // The rest reads the probabilities just written, as the separate kernels would.
        if let Some((top_k, out)) = extra.accuracy {
            if let Some(bad) = self.accuracy(s, rows, cols, top_k, p, labels, out)? {
                return Ok(Some(bad));
            }
            if let Some(both) = extra.scalars {
                let (l, a) = (view::<f32>(loss, 1)?[0], view::<f32>(out, 1)?[0]);
                // SAFETY: `scalars` is an output, held exclusively, aliasing nothing else.
                unsafe { view_mut::<f32>(both, 2)? }.copy_from_slice(&[l, a]);
            }
        }
        if let (Some(dx), Some(p), Some(labels)) = (extra.grad, p, labels) {
            return self.softmax_loss_grad(s, rows, cols, p, labels, None, dx);
        }
        Ok(None)
    }

    fn softmax_loss_grad(
        &self,
        _: &CpuStream,
        rows: usize,
        cols: usize,
        p: &CpuMem,
        labels: &CpuMem,
        dloss: Buf<'_, CpuMem>,
        dx: &CpuMem,
    ) -> Result<Option<BadLabel>> {
        let ps = view::<f32>(p, rows * cols)?;
        let ls = view::<i32>(labels, rows)?;
        let scale = match dloss {
            Some(d) => view::<f32>(d, 1)?[0],
            None => 1.0,
        };
        // SAFETY: `dx` is the one output, held exclusively, aliasing no input.
        let dxs = unsafe { view_mut::<f32>(dx, rows * cols)? };
        Ok(math::softmax_loss_grad(rows, cols, ps, ls, scale, dxs).err())
    }

    fn accuracy(
        &self,
        _: &CpuStream,
        rows: usize,
        cols: usize,
        top_k: usize,
        x: Buf<'_, CpuMem>,
        labels: Buf<'_, CpuMem>,
        out: &CpuMem,
    ) -> Result<Option<BadLabel>> {
        let xs = view_opt::<f32>(x, rows * cols)?;
        let ls = view_opt::<i32>(labels, rows)?;
        match math::accuracy(rows, cols, top_k, xs, ls) {
            Ok(v) => {
                // SAFETY: `out` is the one output, held exclusively, aliasing no input.
                let out = unsafe { view_mut::<f32>(out, 1)? };
                out[0] = v;
                Ok(None)
            }
            Err(bad) => Ok(Some(bad)),
        }
    }

    fn axpy<F: Float>(&self, _: &CpuStream, n: usize, a: F, x: &CpuMem, y: &CpuMem) -> Result<()> {
        let xs = view::<F>(x, n)?;
        // SAFETY: `y` is the one output, held exclusively; the caller never passes `x == y`
        // (it would need a read and a write guard of one buffer).
        let ys = unsafe { view_mut::<F>(y, n)? };
        math::axpy(a, xs, ys)
    }

    fn axpy_multi<F: Float>(
        &self,
        s: &CpuStream,
        a: F,
        pairs: &[(usize, &CpuMem, &CpuMem)],
    ) -> Result<()> {
        for &(n, x, y) in pairs {
            self.axpy(s, n, a, x, y)?;
        }
        Ok(())
    }

    fn scale<F: Float>(&self, _: &CpuStream, n: usize, a: F, x: &CpuMem) -> Result<()> {
        // SAFETY: `x` is the one operand, held exclusively.
        math::scale(a, unsafe { view_mut::<F>(x, n)? });
        Ok(())
    }

    fn reduce_groups(&self, _n: usize) -> usize {
        1
    }

    fn reduce_partials<F: Float>(
        &self,
        _: &CpuStream,
        op: Reduce,
        n: usize,
        x: &CpuMem,
        partial: &CpuMem,
    ) -> Result<()> {
        let xs = view::<F>(x, n)?;
        let v = match op {
            Reduce::Asum => math::asum(xs),
            Reduce::Sumsq => math::sumsq(xs),
        };
        // SAFETY: `partial` is the one output, a scratch buffer aliasing nothing.
        let out = unsafe { view_mut::<F>(partial, 1)? };
        out[0] = v;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::fill_rows;

    #[test]
    fn fill_rows_copies_the_row_into_every_row() {
        for rows in [1, 2, 3, 5, 8, 63, 64, 65] {
            let row = [1.5f32, -2.0, 3.25];
            let mut c = vec![0.0f32; rows * row.len()];
            fill_rows(&mut c, &row);
            assert!(c.chunks_exact(3).all(|r| r == row), "{rows} rows");
        }
    }
}
