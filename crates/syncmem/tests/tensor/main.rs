//! Tensor against Caffe2's tensor tests (blob_test.cc / blob_gpu_test.cc),
//! typed over several element types, on the `cpu` device and on OpenCL; then extend, reserve,
//! shrink, copies across devices with their copy counts, and one test per fixed pitfall.

use syncmem::dtype::{Element, PodElement};
use syncmem::tensor::Tensor;
use syncmem::Error;

/// Element types the typed tests run over, with a value per index.
trait Sample: PodElement {
    fn at(i: usize) -> Self;
}
macro_rules! sample_int {
    ($($t:ty),*) => {$( impl Sample for $t { fn at(i: usize) -> Self { (i % 100) as $t } } )*};
}
sample_int!(u8, i8, i32, i64);
impl Sample for f32 {
    fn at(i: usize) -> Self {
        i as f32 * 0.5
    }
}
impl Sample for f64 {
    fn at(i: usize) -> Self {
        i as f64 * 0.25
    }
}
impl Sample for half::f16 {
    fn at(i: usize) -> Self {
        half::f16::from_f32((i % 1000) as f32)
    }
}
impl Sample for bool {
    fn at(i: usize) -> Self {
        i % 3 == 1
    }
}

/// Runs a generic test for each sample type (Caffe2 types over char, int and float).
macro_rules! typed {
    ($f:ident, $dev:expr) => {{
        $f::<u8>($dev);
        $f::<i8>($dev);
        $f::<i32>($dev);
        $f::<i64>($dev);
        $f::<f32>($dev);
        $f::<f64>($dev);
        $f::<half::f16>($dev);
        $f::<bool>($dev);
    }};
}

fn samples<T: Sample>(n: usize) -> Vec<T> {
    (0..n).map(T::at).collect()
}

/// Address of the storage (stable while the storage is alive).
fn storage(t: &Tensor) -> usize {
    t.synced().map_or(0, |m| m as *const _ as usize)
}

fn host_ptr<T: Element>(t: &Tensor) -> usize {
    t.host::<T>().unwrap().as_ptr() as usize
}

fn is_state(e: &Error) -> bool {
    matches!(e, Error::InvalidState { .. } | Error::TypeMismatch { .. })
}

// The test modules come after the helpers and macros above, which they use.
mod beyond;
mod caffe2;
mod pitfalls;
mod queries;
