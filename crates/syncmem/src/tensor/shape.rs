//! Dimensions: checked element counts and Caffe2's dimension queries.
//!
//! Dimensions are `usize` (64-bit on the supported targets), so a negative dimension cannot be
//! expressed; [`dims_from_i64`] converts Caffe2-style `int64` dimensions and rejects negatives.
//! Every product is checked: an element count or a byte count that does not fit is
//! [`Error::SizeOverflow`].

use super::Tensor;
use crate::error::{Error, Result};

/// The dims of a shape: up to six live inline, so that resizing a tensor (a net does it for
/// every output of every operator, every step) allocates nothing.
pub(crate) type Dims = smallvec::SmallVec<[usize; 6]>;

/// The shape of an initialised tensor: its dimensions and their product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) dims: Dims,
    pub(crate) numel: usize,
}

impl Shape {
    /// Checks `dims` and computes the element count.
    ///
    /// The product of the non-zero dimensions must fit as well (not only the element count,
    /// which is 0 as soon as one dimension is 0), so that every partial product that
    /// [`Tensor::size_from_dim`] and friends compute fits too.
    pub(crate) fn new(dims: &[usize], what: impl std::fmt::Display) -> Result<Shape> {
        let mut nonzero = 1usize;
        for &d in dims.iter().filter(|&&d| d != 0) {
            nonzero = nonzero.checked_mul(d).ok_or_else(|| Error::SizeOverflow {
                what: format!("{what}: the product of dims {dims:?} does not fit in usize"),
            })?;
        }
        let numel = if dims.contains(&0) { 0 } else { nonzero };
        Ok(Shape {
            dims: Dims::from_slice(dims),
            numel,
        })
    }

    /// A product of dims that is known to fit (a sub-product of a checked shape).
    fn product(dims: &[usize]) -> usize {
        dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
    }
}

/// Converts Caffe2-style `int64` dimensions, rejecting negative ones (Caffe2's `Resize` accepts
/// them and computes a negative or meaningless size).
///
/// # Errors
/// [`Error::InvalidState`] naming the first negative dimension, [`Error::SizeOverflow`] when a
/// dimension does not fit in `usize`.
pub fn dims_from_i64(dims: &[i64]) -> Result<Vec<usize>> {
    dims.iter()
        .enumerate()
        .map(|(i, &d)| {
            if d < 0 {
                return Err(Error::InvalidState {
                    op: "dims_from_i64",
                    buffer: format!("dims {dims:?}"),
                    reason: format!("dimension {i} is negative ({d})"),
                });
            }
            usize::try_from(d).map_err(|_| Error::SizeOverflow {
                what: format!("dimension {i} of {dims:?} ({d}) does not fit in usize"),
            })
        })
        .collect()
}

impl Tensor {
    /// The dimensions; empty for an uninitialised tensor (and for a scalar: see
    /// [`Tensor::is_initialized`]).
    pub fn dims(&self) -> &[usize] {
        self.shape.as_ref().map_or(&[], |s| s.dims.as_slice())
    }

    /// Number of dimensions (0 for a scalar and for an uninitialised tensor).
    pub fn ndim(&self) -> usize {
        self.dims().len()
    }

    /// Number of elements; `None` until the first resize (Caffe2's size −1).
    pub fn numel(&self) -> Option<usize> {
        self.shape.as_ref().map(|s| s.numel)
    }

    /// True once the tensor has a shape (Caffe2: size ≥ 0).
    pub fn is_initialized(&self) -> bool {
        self.shape.is_some()
    }

    /// Bytes of the elements: `numel * itemsize`; 0 while the tensor is uninitialised or its
    /// element type unknown (Caffe2 returns a meaningless product with size −1).
    pub fn nbytes(&self) -> usize {
        // Checked when the shape or the type was set.
        self.numel()
            .unwrap_or(0)
            .saturating_mul(self.itemsize().unwrap_or(0))
    }

    /// Size of one element in bytes, once the element type is known.
    pub fn itemsize(&self) -> Option<usize> {
        self.dtype.map(|d| d.size())
    }

    /// Dimension `i`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `i >= ndim` (Caffe2 checks only in debug builds).
    pub fn dim(&self, i: usize) -> Result<usize> {
        self.dims()
            .get(i)
            .copied()
            .ok_or_else(|| self.axis_error(i, 1))
    }

    /// Dimension `i` as an `i32`, for APIs that take 32-bit sizes (Caffe2's `dim32`).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `i >= ndim`; [`Error::SizeOverflow`] when the dimension is
    /// `i32::MAX` or more (as Caffe2, which enforces `dim < INT_MAX`).
    pub fn dim32(&self, i: usize) -> Result<i32> {
        let d = self.dim(i)?;
        i32::try_from(d)
            .ok()
            .filter(|&v| v < i32::MAX)
            .ok_or_else(|| Error::SizeOverflow {
                what: format!(
                    "dim32({i}) of tensor {}: dimension {d} must be below i32::MAX ({})",
                    self.label,
                    i32::MAX
                ),
            })
    }

    /// Product of the dimensions from `k` on; 1 when `k >= ndim` (as Caffe2).
    pub fn size_from_dim(&self, k: usize) -> usize {
        Shape::product(self.dims().get(k..).unwrap_or(&[]))
    }

    /// Product of the dimensions before `k`.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `k > ndim`.
    pub fn size_to_dim(&self, k: usize) -> Result<usize> {
        let dims = self.dims();
        let head = dims.get(..k).ok_or_else(|| self.axis_error(k, 0))?;
        Ok(Shape::product(head))
    }

    /// Product of the dimensions strictly between `k` and `l` (in either order; Caffe2's
    /// `size_between_dim`).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when `k` or `l` is not below `ndim`. Caffe2 checks `l` only and
    /// reads past the dimensions for a large `k`.
    pub fn size_between_dims(&self, k: usize, l: usize) -> Result<usize> {
        let dims = self.dims();
        for a in [k, l] {
            if a >= dims.len() {
                return Err(self.axis_error(a, 1));
            }
        }
        let (lo, hi) = if k < l { (k, l) } else { (l, k) };
        Ok(Shape::product(dims.get(lo + 1..hi).unwrap_or(&[])))
    }

    /// Maps an axis in `[-ndim, ndim)` to `[0, ndim)` (negative axes count from the end).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] outside that range.
    pub fn canonical_axis_index(&self, axis: i64) -> Result<usize> {
        let n = self.ndim();
        let n_i = i64::try_from(n).unwrap_or(i64::MAX);
        let fixed = if axis < 0 {
            axis.checked_add(n_i)
        } else {
            Some(axis)
        };
        match fixed {
            Some(a) if (0..n_i).contains(&a) => {
                usize::try_from(a).map_err(|_| self.axis_error(n, 1))
            }
            _ => Err(Error::OutOfBounds {
                what: format!(
                    "axis {axis} of tensor {} (valid range [-{n}, {n}))",
                    self.label
                ),
                offset: usize::try_from(axis.unsigned_abs()).unwrap_or(usize::MAX),
                len: 1,
                size: n,
            }),
        }
    }

    fn axis_error(&self, i: usize, len: usize) -> Error {
        Error::OutOfBounds {
            what: format!("dims {:?} of tensor {}", self.dims(), self.label),
            offset: i,
            len,
            size: self.ndim(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_products() {
        assert_eq!(Shape::new(&[2, 3, 5], "t").unwrap().numel, 30);
        assert_eq!(Shape::new(&[], "t").unwrap().numel, 1);
        assert_eq!(Shape::new(&[2, 0, 5], "t").unwrap().numel, 0);
        assert!(Shape::new(&[usize::MAX, 2], "t").is_err());
        // Element count 0, but the non-zero dims overflow: rejected.
        assert!(Shape::new(&[0, usize::MAX, 2], "t").is_err());
    }

    #[test]
    fn i64_dims() {
        assert_eq!(dims_from_i64(&[2, 3]).unwrap(), vec![2, 3]);
        assert!(matches!(
            dims_from_i64(&[2, -1]),
            Err(Error::InvalidState { .. })
        ));
    }
}
