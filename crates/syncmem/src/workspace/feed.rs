//! One call each for the common tensor reads and writes of a [`Workspace`], in Caffe2's words:
//! [`Workspace::fetch`] (`FetchBlob`) and [`Workspace::feed`] (`FeedBlob`).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::synced::Head;
use crate::tensor::Tensor;

use super::Workspace;

impl Workspace {
    /// Copies the elements of the tensor in blob `name` into a `Vec` (Caffe2's `FetchBlob`),
    /// from whichever side holds the newest data: straight from device memory when only the
    /// device is current (no host mirror is allocated and the head stays at the device),
    /// otherwise from the host. The blob is read-locked for the copy only.
    ///
    /// For more than a copy (dims, element type, a view without copying), use
    /// [`Workspace::with_tensor`], which lends the tensor to a closure.
    ///
    /// ```
    /// use syncmem::{workspace::Workspace, Device, Tensor};
    ///
    /// # fn main() -> syncmem::Result<()> {
    /// let ws = Workspace::new();
    /// let dev = Device::cpu();
    /// ws.feed("x", Tensor::from_slice(&[2, 2], &[1.0_f32, 2.0, 3.0, 4.0], Some(&dev))?)?;
    /// assert_eq!(ws.fetch::<f32>("x")?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// - [`Error::NotFound`] naming the blob when no blob is visible as `name`;
    /// - [`Error::TypeMismatch`] naming the blob when it holds no [`Tensor`] (or nothing), or
    ///   when the tensor's element type is not `T` (the message names both types);
    /// - [`Error::InvalidState`] for a tensor with elements but no data yet;
    /// - out of memory or a device error from the copy.
    pub fn fetch<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        self.with_tensor(name, |t| {
            if t.dtype() != Some(T::DTYPE) {
                return Err(Error::TypeMismatch {
                    what: format!("tensor in blob {name:?}"),
                    stored: t
                        .dtype()
                        .map_or("no element type (an uninitialised tensor)", DType::name)
                        .to_string(),
                    requested: T::DTYPE.to_string(),
                });
            }
            match t.head() {
                Some(Head::AtDevice) => t.device::<T>()?.to_vec(),
                _ => Ok(t.host::<T>()?.to_vec()),
            }
        })
    }

    /// Puts `tensor` in blob `name`, replacing whatever the blob held (Caffe2's `FeedBlob`).
    /// The blob is the one [`Workspace::create_blob`] gives: a visible blob of that name (a
    /// parent's included, as in Caffe2), or a new local one. The tensor is moved in as it is:
    /// its device, data and head are kept and nothing is copied.
    ///
    /// ```
    /// use syncmem::{workspace::Workspace, Tensor};
    ///
    /// # fn main() -> syncmem::Result<()> {
    /// let ws = Workspace::new();
    /// ws.feed("labels", Tensor::from_slice(&[3], &[0_i32, 2, 1], None)?)?;
    /// ws.feed("labels", Tensor::scalar(7_i64, None)?)?;            // replaced
    /// assert_eq!(ws.fetch::<i64>("labels")?, [7]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotFound`] when `name` is forwarded to a parent blob that no longer exists.
    pub fn feed(&self, name: &str, tensor: Tensor) -> Result<()> {
        self.create_blob(name)?.write().reset(tensor);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::device::Device;

    #[test]
    fn feed_then_fetch_on_the_host() {
        let ws = Workspace::new();
        ws.feed("x", Tensor::from_slice(&[3], &[1_i32, 2, 3], None).unwrap())
            .unwrap();
        assert_eq!(ws.fetch::<i32>("x").unwrap(), [1, 2, 3]);
        // Strings and bools too.
        let words = ["a".to_string(), "bc".to_string()];
        ws.feed("s", Tensor::from_slice(&[2], &words, None).unwrap())
            .unwrap();
        assert_eq!(ws.fetch::<String>("s").unwrap(), words);
        ws.feed("b", Tensor::scalar(true, Some(&Device::cpu())).unwrap())
            .unwrap();
        assert_eq!(ws.fetch::<bool>("b").unwrap(), [true]);
        // An empty tensor fetches as an empty vector.
        ws.feed("e", Tensor::with_shape(&[0, 4], DType::F32, None).unwrap())
            .unwrap();
        assert!(ws.fetch::<f32>("e").unwrap().is_empty());
    }

    #[test]
    fn feed_replaces_whatever_the_blob_held() {
        let ws = Workspace::new();
        ws.create_blob("n").unwrap().write().reset(5_u8);
        ws.feed("n", Tensor::scalar(2.5_f64, None).unwrap())
            .unwrap();
        assert_eq!(ws.fetch::<f64>("n").unwrap(), [2.5]);
        ws.feed("n", Tensor::from_slice(&[2], &[4_u16, 5], None).unwrap())
            .unwrap();
        assert_eq!(ws.fetch::<u16>("n").unwrap(), [4, 5]);
        assert_eq!(ws.local_blobs(), ["n"]);
    }

    #[test]
    fn feed_goes_to_the_visible_blob_and_fails_on_a_dangling_forward() {
        let parent = Arc::new(Workspace::new());
        parent.create_blob("p").unwrap();
        let child = Workspace::with_parent(parent.clone());
        child
            .feed("p", Tensor::scalar(1_i8, None).unwrap())
            .unwrap();
        assert_eq!(parent.fetch::<i8>("p").unwrap(), [1]);
        assert!(child.local_blobs().is_empty());

        let fwd = Workspace::with_forwarded(parent.clone(), [("local", "p")]).unwrap();
        parent.remove_blob("p");
        let e = fwd
            .feed("local", Tensor::scalar(1_i8, None).unwrap())
            .unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("\"p\""), "{e}");
    }

    fn fetch_newest_side(dev: &Device) {
        let ws = Workspace::new();
        ws.feed(
            "w",
            Tensor::from_slice(&[4], &[1.0_f32, 2.0, 3.0, 4.0], Some(dev)).unwrap(),
        )
        .unwrap();
        // Newest on the device only: read from device memory, no host mirror, no copy state
        // change.
        ws.with_tensor_mut("w", |t| t.device_mut::<f32>()?.write(&[5.0, 6.0, 7.0, 8.0]))
            .unwrap();
        let before = ws.with_tensor("w", |t| Ok(t.copy_stats())).unwrap();
        assert_eq!(ws.fetch::<f32>("w").unwrap(), [5.0, 6.0, 7.0, 8.0]);
        ws.with_tensor("w", |t| {
            assert_eq!(t.head(), Some(Head::AtDevice));
            assert_eq!(
                t.copy_stats().device_to_host.count,
                before.device_to_host.count
            );
            Ok(())
        })
        .unwrap();
        // Newest on the host: read from the host.
        ws.with_tensor_mut("w", |t| {
            t.host_mut::<f32>()?[0] = 9.0;
            Ok(())
        })
        .unwrap();
        assert_eq!(ws.fetch::<f32>("w").unwrap(), [9.0, 6.0, 7.0, 8.0]);
        ws.with_tensor("w", |t| {
            assert_eq!(t.head(), Some(Head::AtHost));
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn fetch_reads_the_newest_side_cpu() {
        fetch_newest_side(&Device::cpu());
    }

    #[cfg(feature = "opencl")]
    #[test]
    fn fetch_reads_the_newest_side_opencl() {
        if let Some(d) = crate::testing::opencl_or_skip("fetch_reads_the_newest_side_opencl") {
            fetch_newest_side(&d);
        }
    }

    #[test]
    fn fetch_errors_name_the_blob() {
        let ws = Workspace::new();
        let e = ws.fetch::<f32>("missing").unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("\"missing\""), "{e}");

        ws.create_blob("n").unwrap().write().reset(3_i32);
        let e = ws.fetch::<i32>("n").unwrap_err();
        assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("blob \"n\"") && msg.contains("i32"), "{msg}");
        assert!(msg.contains("Tensor"), "{msg}");

        ws.create_blob("empty").unwrap();
        let msg = ws.fetch::<u8>("empty").unwrap_err().to_string();
        assert!(
            msg.contains("blob \"empty\"") && msg.contains("empty"),
            "{msg}"
        );

        ws.feed("f", Tensor::scalar(1.0_f32, None).unwrap())
            .unwrap();
        let e = ws.fetch::<i64>("f").unwrap_err();
        match &e {
            Error::TypeMismatch {
                what,
                stored,
                requested,
            } => {
                assert!(what.contains("\"f\""), "{e}");
                assert_eq!((stored.as_str(), requested.as_str()), ("f32", "i64"));
            }
            _ => panic!("{e}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("f32") && msg.contains("i64"), "{msg}");

        ws.feed("u", Tensor::host_only()).unwrap();
        let msg = ws.fetch::<f32>("u").unwrap_err().to_string();
        assert!(msg.contains("\"u\"") && msg.contains("f32"), "{msg}");
    }
}
