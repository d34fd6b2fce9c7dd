//! Kernels of the user with by-value parameters of types the crate has no scalar for (`char`,
//! `float4`, a struct): only raw bytes or scalars of their size are taken, on every backend.

#[path = "common/model.rs"]
mod model;

use model::{filled, host_f32, kernel_error};
use syncmem::device::{Grid, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::Device;

/// Parameters of types the crate has no scalar for, in OpenCL C and CUDA C: `odd` takes a
/// struct too, `odd2` does not.
const ODD_CL: &str = "typedef struct { float a; float b; uint n; } triple;\n\
                      __kernel void odd(__global float* y, char c, float4 v, triple t) { \
                      y[0] = (float)c; y[1] = v.x + v.w; y[2] = t.a + t.b * (float)t.n; }\n\
                      __kernel void odd2(__global float* y, char c, float4 v) { \
                      y[0] = (float)c; y[1] = v.x + v.w; }";
const ODD_CU: &str = "struct triple { float a; float b; unsigned int n; };\n\
                      extern \"C\" __global__ void odd(float* y, char c, float4 v, triple t) { \
                      y[0] = (float)c; y[1] = v.x + v.w; y[2] = t.a + t.b * (float)t.n; }\n\
                      extern \"C\" __global__ void odd2(float* y, char c, float4 v) { \
                      y[0] = (float)c; y[1] = v.x + v.w; }";

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// A `char`, a `float4` and a struct parameter take only raw bytes or a scalar of their size:
/// anything else is refused as a typed error naming the argument, before anything is queued;
/// raw bytes of the right size run.
fn odd_parameters_refuse_other_sizes(dev: &Device) {
    let k = UserKernel::new("odd").with_opencl(ODD_CL).with_cuda(ODD_CU);
    let stream = dev.default_stream().unwrap();
    let y = filled(dev, &[7.0; 4]);
    let x = filled(dev, &[1.0; 4]);
    let launch = |k: &UserKernel, args: &[Arg<'_>]| {
        // SAFETY: `odd` and `odd2` write 3 elements of a buffer of 4 floats.
        unsafe { kernels::launch(k, &stream, Grid::linear(1, 1), args) }
    };
    let v16 = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let t12 = [f32_bytes(&[0.5, 2.0]), 3u32.to_ne_bytes().to_vec()].concat();
    let (c, v, t) = (Arg::bytes(&[3]), Arg::bytes(&v16), Arg::bytes(&t12));
    let refused = |args: &[Arg<'_>], index: usize, what: &[&str]| {
        let e = launch(&k, args).unwrap_err();
        let (name, i, reason) = kernel_error(&e);
        assert_eq!((name, i), ("odd", Some(index)), "{reason}");
        for w in what {
            assert!(reason.contains(w), "{w:?} in {reason}");
        }
    };
    for bad in [
        Arg::scalar(3u32),
        3i32.into(),
        1.0f32.into(),
        1u64.into(),
        Arg::read(&x),
    ] {
        refused(&[Arg::write(&y), bad, v, t], 1, &["char", "1 byte"]);
    }
    refused(
        &[Arg::write(&y), Arg::bytes(&[3, 0]), v, t],
        1,
        &["2 bytes"],
    );
    for bad in [Arg::scalar(1.0f32), 1.0f64.into(), Arg::bytes(&v16[..12])] {
        refused(&[Arg::write(&y), c, bad, t], 2, &["16 bytes"]);
    }
    let cuda = dev.backend() == syncmem::BackendKind::Cuda;
    for bad in [Arg::scalar(7u32), 7u64.into(), Arg::bytes(&t12[..8])] {
        // CUDA's PTX tells the struct's size; OpenCL reports only its name.
        let what = if cuda { "12 bytes" } else { "does not report" };
        refused(&[Arg::write(&y), c, v, bad], 3, &[what]);
    }
    if cuda {
        launch(&k, &[Arg::write(&y), c, v, t]).unwrap();
        assert_eq!(host_f32(&y), [3.0, 5.0, 6.5, 7.0]);
    } else {
        // The struct's size is unknown: even its right bytes are refused.
        refused(&[Arg::write(&y), c, v, t], 3, &["does not report"]);
        assert_eq!(host_f32(&y), [7.0; 4], "no refused launch ran");
        let k2 = UserKernel::new("odd2").with_opencl(ODD_CL);
        launch(&k2, &[Arg::write(&y), c, v]).unwrap();
        assert_eq!(host_f32(&y), [3.0, 5.0, 7.0, 7.0]);
    }
}

/// On `cpu`, the host closure reads raw bytes as they were passed.
#[test]
fn odd_parameters_reach_a_host_closure_as_bytes() {
    let dev = Device::cpu();
    let k = UserKernel::new("odd").with_host(|a| {
        let (c, v) = (a.bytes(1)?, a.bytes(2)?);
        let lane =
            |i: usize| f32::from_ne_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]);
        a.output::<f32>(0)?[..2].copy_from_slice(&[f32::from(c[0]), lane(0) + lane(3)]);
        assert!(a.bytes(0).is_err() && a.scalar(1).is_err() && a.input::<u8>(2).is_err());
        Ok(())
    });
    let y = filled(&dev, &[7.0; 2]);
    let v16 = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let stream = dev.default_stream().unwrap();
    let args = [Arg::write(&y), Arg::bytes(&[3]), Arg::bytes(&v16)];
    // SAFETY: a host closure (safe Rust).
    unsafe { kernels::launch(&k, &stream, Grid::linear(1, 1), &args) }.unwrap();
    assert_eq!(host_f32(&y), [3.0, 5.0]);
}

#[test]
fn odd_parameters_refuse_other_sizes_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("odd user kernel parameters") {
        odd_parameters_refuse_other_sizes(&dev);
    }
}

#[test]
fn odd_parameters_refuse_other_sizes_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("odd user kernel parameters on cuda") {
        odd_parameters_refuse_other_sizes(&dev);
    }
}
