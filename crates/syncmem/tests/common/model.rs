//! Helpers of the tests that check buffers against a host model of their `f32` contents
//! (the model tests, the user kernel tests): fill and read buffers, compare values, make
//! patterns, and one user kernel every backend runs.

// Each test file uses a part of these helpers.
#![allow(dead_code)]

use proptest::test_runner::TestCaseError;
use syncmem::kernels::UserKernel;
use syncmem::{Device, Error, SyncedMemory};

/// A buffer of `dev` holding `values`.
pub fn filled(dev: &Device, values: &[f32]) -> SyncedMemory {
    let m = SyncedMemory::new(values.len() * 4, dev);
    m.host_overwrite()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .copy_from_slice(values);
    m
}

/// The buffer's contents, read on the host.
pub fn host_f32(m: &SyncedMemory) -> Vec<f32> {
    m.host().unwrap().as_slice_of::<f32>().unwrap().to_vec()
}

/// Bytes read back from a device, as `f32`s.
pub fn values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A failure naming the first element where `got` differs from the model's `want`.
pub fn same(what: &str, got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    if got.len() != want.len() {
        return Err(TestCaseError::fail(format!(
            "{what}: {} elements where the model has {}",
            got.len(),
            want.len()
        )));
    }
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{what}: element {i} is {} where the model has {}",
            got[i], want[i]
        )));
    }
    Ok(())
}

/// `n` small integers as `f32`s (exact under scaling by 2, 0.5 and -1), shifted by `seed`.
pub fn pattern(n: usize, seed: u8) -> Vec<f32> {
    (0..n)
        .map(|i| f32::from((i as u8).wrapping_add(seed) % 16) - 8.0)
        .collect()
}

/// `y[i] *= 2` for `i < n` (`twice(y, n)`), on every backend.
pub fn user_twice() -> UserKernel {
    UserKernel::new("twice")
        .with_opencl(
            "__kernel void twice(__global float* y, uint n) { size_t i = get_global_id(0); \
             if (i < n) y[i] *= 2.0f; }",
        )
        .with_cuda(
            "extern \"C\" __global__ void twice(float* y, unsigned int n) { unsigned int i = \
             blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] *= 2.0f; }",
        )
        .with_host(|args| {
            let n = args.u32(1)? as usize;
            args.output::<f32>(0)?[..n]
                .iter_mut()
                .for_each(|v| *v *= 2.0);
            Ok(())
        })
}

/// The kernel, argument index and reason of a [`Error::KernelArgument`].
///
/// # Panics
/// For any other error.
pub fn kernel_error(e: &Error) -> (&str, Option<usize>, &str) {
    match e {
        Error::KernelArgument {
            kernel,
            index,
            reason,
        } => (kernel, *index, reason),
        other => panic!("expected KernelArgument, got {other}"),
    }
}
