//! Shape accessors of [`ParamBlob`]: axis canonicalisation, partial counts, the legacy 4-D view
//! (num, channels, height, width), offsets, and shape comparison with a serialised shape.

use super::{ParamBlob, Scalar};
use crate::error::{Error, Result};

/// The shape recorded in a serialised blob (Caffe's `BlobProto`), for
/// [`ParamBlob::shape_equals`]: the deprecated 4-D fields, or the `shape.dim` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoShape {
    /// The legacy `num`, `channels`, `height`, `width` fields.
    Legacy {
        /// `num`.
        num: usize,
        /// `channels`.
        channels: usize,
        /// `height`.
        height: usize,
        /// `width`.
        width: usize,
    },
    /// The `shape.dim` list.
    Dims(Vec<usize>),
}

impl<T: Scalar> ParamBlob<T> {
    /// Caffe's shape string: the dimensions separated by spaces, then the count in
    /// parentheses, e.g. `"2 3 4 5 (120)"`.
    pub fn shape_string(&self) -> String {
        let mut s = String::new();
        for d in &self.shape {
            s.push_str(&d.to_string());
            s.push(' ');
        }
        s.push_str(&format!("({})", self.count));
        s
    }

    /// The axis index `axis` in `[0, num_axes)`, counting from the end when negative
    /// (Caffe's `CanonicalAxisIndex`).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when `axis` is outside `[-num_axes, num_axes)`; the message names
    /// the blob and its shape.
    pub fn canonical_axis_index(&self, axis: isize) -> Result<usize> {
        let n = self.num_axes() as isize;
        if axis < -n || axis >= n {
            return Err(self.shape_error(
                "ParamBlob::canonical_axis_index",
                format!(
                    "axis {axis} out of range for a {n}-axis blob (valid: {} to {})",
                    -n,
                    n - 1
                ),
            ));
        }
        Ok(if axis < 0 { axis + n } else { axis } as usize)
    }

    /// The dimension of `axis` (negative counts from the end; Caffe's `shape(i)`).
    ///
    /// # Errors
    /// As [`ParamBlob::canonical_axis_index`].
    pub fn shape_at(&self, axis: isize) -> Result<usize> {
        Ok(self.shape[self.canonical_axis_index(axis)?])
    }

    /// The product of the dimensions of axes `start..end` (1 for an empty range; Caffe's
    /// `count(start, end)`).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] unless `start <= end <= num_axes`.
    pub fn count_range(&self, start: usize, end: usize) -> Result<usize> {
        if start > end || end > self.num_axes() {
            return Err(self.shape_error(
                "ParamBlob::count_range",
                format!(
                    "axis range {start}..{end} is not within 0..{}",
                    self.num_axes()
                ),
            ));
        }
        Ok(self.shape[start..end].iter().product())
    }

    /// The product of the dimensions from axis `start` to the last (Caffe's `count(start)`).
    ///
    /// # Errors
    /// As [`ParamBlob::count_range`].
    pub fn count_from(&self, start: usize) -> Result<usize> {
        self.count_range(start, self.num_axes())
    }

    /// Caffe's `LegacyShape(index)`: for blobs of at most 4 axes, the dimension of `index` in
    /// `[-4, 4)`, or 1 for an axis the blob does not have.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for a blob of more than 4 axes or `index` outside `[-4, 4)`.
    pub fn legacy_shape(&self, index: isize) -> Result<usize> {
        if self.num_axes() > 4 {
            return Err(self.shape_error(
                "ParamBlob::legacy_shape",
                "the legacy accessors (num, channels, height, width) need at most 4 axes".into(),
            ));
        }
        if !(-4..4).contains(&index) {
            return Err(self.shape_error(
                "ParamBlob::legacy_shape",
                format!("legacy axis {index} is outside -4..4"),
            ));
        }
        let n = self.num_axes() as isize;
        if index >= n || index < -n {
            return Ok(1);
        }
        self.shape_at(index)
    }

    /// `legacy_shape(0)` (Caffe's `num()`).
    ///
    /// # Errors
    /// As [`ParamBlob::legacy_shape`].
    pub fn num(&self) -> Result<usize> {
        self.legacy_shape(0)
    }

    /// `legacy_shape(1)` (Caffe's `channels()`).
    ///
    /// # Errors
    /// As [`ParamBlob::legacy_shape`].
    pub fn channels(&self) -> Result<usize> {
        self.legacy_shape(1)
    }

    /// `legacy_shape(2)` (Caffe's `height()`).
    ///
    /// # Errors
    /// As [`ParamBlob::legacy_shape`].
    pub fn height(&self) -> Result<usize> {
        self.legacy_shape(2)
    }

    /// `legacy_shape(3)` (Caffe's `width()`).
    ///
    /// # Errors
    /// As [`ParamBlob::legacy_shape`].
    pub fn width(&self) -> Result<usize> {
        self.legacy_shape(3)
    }

    /// The element offset of `(n, c, h, w)`: `((n * C + c) * H + h) * W + w`.
    ///
    /// Unlike Caffe, each index must be strictly below its dimension: `n == num()` is an error
    /// (Caffe's checks use `<=` and let one-past-the-end through).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] as [`ParamBlob::legacy_shape`], [`Error::OutOfBounds`] for an index
    /// at or past its dimension.
    pub fn offset(&self, n: usize, c: usize, h: usize, w: usize) -> Result<usize> {
        let dims = [self.num()?, self.channels()?, self.height()?, self.width()?];
        let idx = [n, c, h, w];
        for (axis, (&i, &d)) in ["num", "channels", "height", "width"]
            .iter()
            .zip(idx.iter().zip(&dims))
        {
            if i >= d {
                return Err(self.index_error(axis, i, d));
            }
        }
        Ok(((n * dims[1] + c) * dims[2] + h) * dims[3] + w)
    }

    /// The element offset of an index vector (Caffe's `offset(vector<int>)`): at most
    /// `num_axes` indices, each below its dimension; missing trailing indices count as 0.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for more indices than axes, [`Error::OutOfBounds`] for an index at
    /// or past its dimension.
    pub fn offset_of(&self, indices: &[usize]) -> Result<usize> {
        if indices.len() > self.num_axes() {
            return Err(self.shape_error(
                "ParamBlob::offset_of",
                format!(
                    "{} indices {indices:?} for a {}-axis blob",
                    indices.len(),
                    self.num_axes()
                ),
            ));
        }
        let mut offset = 0usize;
        for (axis, &dim) in self.shape.iter().enumerate() {
            offset *= dim;
            if let Some(&i) = indices.get(axis) {
                if i >= dim {
                    return Err(self.index_error(&format!("axis {axis}"), i, dim));
                }
                offset += i;
            }
        }
        Ok(offset)
    }

    fn index_error(&self, axis: &str, index: usize, dim: usize) -> Error {
        Error::OutOfBounds {
            what: format!(
                "index on {axis} of blob {} (shape {})",
                self.name,
                self.shape_string()
            ),
            offset: index,
            len: 1,
            size: dim,
        }
    }

    /// True when the blob's shape matches a serialised one (Caffe's `ShapeEquals(BlobProto)`).
    /// Against the legacy 4-D fields, the blob must have at most 4 axes and its shape,
    /// right-aligned with missing leading axes counted as 1, must equal them; against a dim list
    /// the shape must be equal.
    pub fn shape_equals(&self, proto: &ProtoShape) -> bool {
        match proto {
            ProtoShape::Legacy {
                num,
                channels,
                height,
                width,
            } => {
                self.num_axes() <= 4
                    && [-4isize, -3, -2, -1]
                        .iter()
                        .zip([num, channels, height, width])
                        .all(|(&i, &want)| self.legacy_shape(i).ok() == Some(want))
            }
            ProtoShape::Dims(dims) => self.shape == *dims,
        }
    }
}
