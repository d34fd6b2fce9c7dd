//! Kernels of the user: results on `cpu` (host closure) and OpenCL (source built once per
//! device), the copies the guards make, queued launches ordered across streams without a host
//! wait, and the typed errors of bad launches.

#[path = "common/model.rs"]
mod model;

use model::{filled, host_f32, kernel_error};
use syncmem::device::{Grid, KernelParam, ScalarType, UserKernel};
use syncmem::kernels::{self, Arg};
use syncmem::{Device, Error, Head, SyncedMemory, Tensor};

const SCALE_CL: &str = "__kernel void scale(const __global float* x, __global float* y, \
                        uint n, float a) { size_t i = get_global_id(0); if (i < n) y[i] = a * x[i]; }";
const SCALE_CU: &str = "extern \"C\" __global__ void scale(const float* x, float* y, \
                        unsigned int n, float a) { unsigned int i = blockIdx.x * blockDim.x + \
                        threadIdx.x; if (i < n) y[i] = a * x[i]; }";

/// `y[..n] = a * x[..n]` on every backend.
fn scale_kernel() -> UserKernel {
    UserKernel::new("scale")
        .with_opencl(SCALE_CL)
        .with_cuda(SCALE_CU)
        .with_host(|args| {
            let x = args.input::<f32>(0)?;
            let y = args.output::<f32>(1)?;
            let (n, a) = (args.u32(2)? as usize, args.f32(3)?);
            for (y, x) in y[..n].iter_mut().zip(&x[..n]) {
                *y = a * x;
            }
            Ok(())
        })
}

/// `y = a * x` through `kernels::launch`: the input is uploaded once, the output neither
/// copied nor filled, and the result reads back on the host.
fn scales_through_the_guards(dev: &Device) {
    let k = scale_kernel();
    let n = 1000;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 - 300.0).collect();
    let x = filled(dev, &xs);
    let y = SyncedMemory::new(n * 4, dev);
    let stream = dev.default_stream().unwrap();
    let args = [
        Arg::read(&x),
        Arg::overwrite(&y),
        (n as u32).into(),
        0.5f32.into(),
    ];
    // SAFETY: `scale` touches elements 0..n of x and y, which both hold n floats.
    unsafe { kernels::launch(&k, &stream, Grid::for_elements(n, 64), &args) }.unwrap();
    // x made current on the device once: a copy with two mirrors, a zero-copy sync (no byte
    // moved) where the device shares host memory.
    let (xc, yc) = (x.copy_stats(), y.copy_stats());
    if dev.zero_copy_protocol().is_some() {
        assert_eq!(
            (xc.host_to_device.count, xc.mapped.count),
            (0, 1),
            "x synced once"
        );
    } else {
        assert_eq!(
            (xc.host_to_device.count, xc.mapped.count),
            (1, 0),
            "x uploaded once"
        );
    }
    assert_eq!(
        (yc.host_to_device.count, yc.mapped.count),
        (0, 0),
        "y is overwritten: no copy, no sync"
    );
    assert_eq!(y.head(), Head::AtDevice);
    assert_eq!(x.head(), Head::Synced);
    let want: Vec<f32> = xs.iter().map(|v| v * 0.5).collect();
    assert_eq!(host_f32(&y), want);
    // In place, read and written: y = 2 * y.
    let k2 = model::user_twice();
    let args = [Arg::write(&y), (n as u32).into()];
    // SAFETY: `twice` touches elements 0..n of y, which holds n floats.
    unsafe { kernels::launch(&k2, &stream, Grid::for_elements(n, 64), &args) }.unwrap();
    assert_eq!(host_f32(&y), xs);
}

#[test]
fn user_kernels_scale_through_the_guards_on_cpu() {
    scales_through_the_guards(&Device::cpu());
}

#[test]
fn user_kernels_scale_through_the_guards_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("user kernels on opencl") {
        scales_through_the_guards(&dev);
    }
}

#[test]
fn user_kernels_scale_through_the_guards_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("user kernels on cuda") {
        scales_through_the_guards(&dev);
    }
}

/// Tensors as arguments: a tensor written by a kernel is read by a built-in operator path
/// (the host view) and by another kernel, and an empty tensor passes an empty buffer.
#[test]
fn tensors_are_arguments_too() {
    for dev in [
        Some(Device::cpu()),
        syncmem::testing::opencl_or_skip("user kernels on tensors"),
    ]
    .into_iter()
    .flatten()
    {
        let k = scale_kernel();
        let x =
            Tensor::from_slice(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], Some(&dev)).unwrap();
        let mut y = Tensor::with_shape(&[2, 3], syncmem::DType::F32, Some(&dev)).unwrap();
        let stream = dev.default_stream().unwrap();
        let args = [
            Arg::read(&x),
            Arg::overwrite(&mut y),
            6u32.into(),
            (-1.0f32).into(),
        ];
        // SAFETY: 6 elements of two tensors of 6 floats.
        unsafe { kernels::launch(&k, &stream, Grid::linear(1, 8), &args) }.unwrap();
        assert_eq!(
            &*y.host::<f32>().unwrap(),
            [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
        );
        // An empty tensor: nothing to read, nothing written (n = 0).
        let e = Tensor::with_shape(&[0], syncmem::DType::F32, Some(&dev)).unwrap();
        let mut f = Tensor::with_shape(&[0], syncmem::DType::F32, Some(&dev)).unwrap();
        let args = [
            Arg::read(&e),
            Arg::overwrite(&mut f),
            0u32.into(),
            1.0f32.into(),
        ];
        // SAFETY: n = 0: the kernel touches nothing.
        unsafe { kernels::launch(&k, &stream, Grid::linear(1, 8), &args) }.unwrap();
    }
}

/// A launch is queued, never waited for: no host wait, even with its input still held on
/// another stream, and the result is there once the other stream's work completed.
#[cfg(feature = "opencl")]
#[test]
fn launches_are_queued_and_ordered_after_other_streams() {
    #[path = "common/gate.rs"]
    mod gate;
    // The calling thread's waits: tests of this file run at once on other threads, and their
    // maps (SYNCMEM_ZERO_COPY=map) wait for real.
    use syncmem::alloc::stats::thread_host_waits as host_waits;
    use syncmem::device::KernelArg;
    let Some(dev) = syncmem::testing::opencl_or_skip("user kernels queued") else {
        return;
    };
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let n = 4096;
    let x = SyncedMemory::new(n * 4, &dev).with_stream(&a).unwrap();
    x.host_overwrite()
        .unwrap()
        .as_mut_slice_of::<f32>()
        .unwrap()
        .fill(3.0);
    let y = SyncedMemory::new(n * 4, &dev).with_stream(&b).unwrap();
    let k = scale_kernel();
    k.prepare(&dev).unwrap();
    let waits = host_waits();
    // Stream a is held: x's upload (queued on a) cannot run yet.
    let gate = gate::Gate::block(&a);
    {
        let mut yd = y.device_overwrite().unwrap();
        {
            let xd = x.device().unwrap();
            let args = [
                KernelArg::from(&xd),
                KernelArg::from(&mut yd),
                (n as u32).into(),
                2.0f32.into(),
            ];
            // SAFETY: n elements of two buffers of n floats.
            unsafe { k.launch(&b, Grid::for_elements(n, 64), &args) }.unwrap();
        }
        // And again, on the held stream itself: y is read there now (ordered after b's write).
        let mut xw = x.device_mut().unwrap();
        let args = [
            KernelArg::read(yd.buffer()),
            KernelArg::from(&mut xw),
            (n as u32).into(),
            1.0f32.into(),
        ];
        // SAFETY: as above.
        unsafe { k.launch(&a, Grid::for_elements(n, 64), &args) }.unwrap();
    }
    assert_eq!(
        host_waits(),
        waits,
        "nothing waited while the gate was closed"
    );
    assert!(!gate.is_open());
    gate.open();
    assert_eq!(host_f32(&y), vec![6.0; n]);
    assert_eq!(host_f32(&x), vec![6.0; n]);
}

/// Wrong argument count or kind, a buffer of another device, a written buffer twice, a grid
/// the kernel cannot run: typed errors naming the kernel and the argument, nothing queued.
fn bad_launches_are_typed_errors(dev: &Device) {
    let k = scale_kernel();
    let stream = dev.default_stream().unwrap();
    let x = filled(dev, &[1.0; 8]);
    let y = filled(dev, &[7.0; 8]);
    let launch = |args: &[Arg<'_>], grid: Grid| -> Error {
        // SAFETY: every launch here is refused before anything runs; were one to run, it
        // would touch 8 elements of buffers of 8 floats.
        unsafe { kernels::launch(&k, &stream, grid, args) }.unwrap_err()
    };
    let g = Grid::linear(1, 8);
    let device = dev.backend() != syncmem::BackendKind::Cpu;
    // A buffer passed twice while written.
    let e = launch(
        &[Arg::read(&x), Arg::write(&x), 8u32.into(), 1.0f32.into()],
        g,
    );
    let (name, index, reason) = kernel_error(&e);
    assert_eq!((name, index), ("scale", Some(1)));
    assert!(reason.contains("passed twice"), "{reason}");
    if device {
        device_launch_errors(dev, &launch, &x, &y);
    } else {
        host_closure_errors(&launch, &x, &y);
    }
    let e = launch(
        &[Arg::read(&x), Arg::write(&y), 8u32.into(), 1.0f32.into()],
        Grid::linear(0, 8),
    );
    assert!(kernel_error(&e).2.contains("extent of 0"), "{e}");
    assert_eq!(host_f32(&y), [7.0; 8], "no refused launch ran");
    // A kernel without anything for this backend.
    let elsewhere = if dev.backend() == syncmem::BackendKind::Cuda {
        UserKernel::new("scale").with_opencl(SCALE_CL)
    } else {
        UserKernel::new("scale").with_cuda(SCALE_CU)
    };
    let e = elsewhere.prepare(dev).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

/// What a launch of [`scale_kernel`] returns: the error of a refused launch.
type Launch<'a> = dyn Fn(&[Arg<'_>], Grid) -> Error + 'a;

/// On a device: a buffer of another device, the count and kinds of the arguments from the
/// compiled kernel's parameters, more threads per block than the kernel runs.
fn device_launch_errors(dev: &Device, launch: &Launch<'_>, x: &SyncedMemory, y: &SyncedMemory) {
    let g = Grid::linear(1, 8);
    // A buffer on the host only (one of another device is used through its replica there).
    let host_only = SyncedMemory::host_only(32);
    let e = launch(
        &[
            Arg::read(&host_only),
            Arg::write(y),
            8u32.into(),
            1.0f32.into(),
        ],
        g,
    );
    let (_, index, reason) = kernel_error(&e);
    assert_eq!(index, Some(0));
    assert!(reason.contains("lives on the host only"), "{reason}");
    // The count and the kinds, from the compiled kernel's parameters.
    let e = launch(&[Arg::read(x), Arg::write(y), 8u32.into()], g);
    let (_, index, reason) = kernel_error(&e);
    assert_eq!(index, None);
    assert!(
        reason.contains("takes 4 arguments, the launch passes 3"),
        "{reason}"
    );
    let e = launch(
        &[Arg::read(x), Arg::write(y), 8u32.into(), 1.0f64.into()],
        g,
    );
    let (_, index, reason) = kernel_error(&e);
    assert_eq!(index, Some(3));
    assert!(
        reason.contains("float scalar") && reason.contains("double scalar"),
        "{reason}"
    );
    if dev.backend() == syncmem::BackendKind::OpenCl {
        assert!(
            reason.contains("`float a`"),
            "the parameter is named: {reason}"
        );
    }
    let e = launch(
        &[Arg::read(x), 8u32.into(), Arg::write(y), 1.0f32.into()],
        g,
    );
    assert_eq!(kernel_error(&e).1, Some(1));
    // More threads per block than the kernel runs.
    let e = launch(
        &[Arg::read(x), Arg::write(y), 8u32.into(), 1.0f32.into()],
        Grid::linear(1, 1 << 20),
    );
    assert!(kernel_error(&e).2.contains("threads per block"), "{e}");
}

/// On `cpu`: a host closure checks its accesses.
fn host_closure_errors(launch: &Launch<'_>, x: &SyncedMemory, y: &SyncedMemory) {
    let g = Grid::linear(1, 8);
    // A scalar read as a buffer.
    let e = launch(&[8u32.into(), Arg::write(y), 8u32.into(), 1.0f32.into()], g);
    let (name, index, reason) = kernel_error(&e);
    assert_eq!((name, index), ("scale", Some(0)));
    assert!(reason.contains("not a buffer"), "{reason}");
    let e = launch(
        &[Arg::read(x), Arg::write(y), 8u32.into(), 1.0f64.into()],
        g,
    );
    assert_eq!(kernel_error(&e).1, Some(3));
}

#[test]
fn bad_launches_are_typed_errors_on_cpu() {
    bad_launches_are_typed_errors(&Device::cpu());
}

#[test]
fn bad_launches_are_typed_errors_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("bad user kernel launches") {
        bad_launches_are_typed_errors(&dev);
        let k = scale_kernel();
        assert_eq!(
            k.params(&dev).unwrap().unwrap(),
            [
                KernelParam::Buffer { read_only: true },
                KernelParam::Buffer { read_only: false },
                KernelParam::Scalar(ScalarType::U32),
                KernelParam::Scalar(ScalarType::F32),
            ]
        );
    }
}

#[test]
fn bad_launches_are_typed_errors_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("bad user kernel launches on cuda") {
        bad_launches_are_typed_errors(&dev);
    }
}

/// Grids past the device's limits, refused before anything is queued: more work-items than
/// the device's addresses count (2^96 here, which a device would run for ever, if at all), and
/// on CUDA more blocks or threads along an axis than the device launches.
fn oversized_grids_are_refused(dev: &Device) {
    let k = scale_kernel();
    let stream = dev.default_stream().unwrap();
    let x = filled(dev, &[1.0; 8]);
    let y = filled(dev, &[7.0; 8]);
    let launch = |grid: Grid| -> Error {
        let args = [Arg::read(&x), Arg::write(&y), 8u32.into(), 1.0f32.into()];
        // SAFETY: every launch here is refused before anything runs; were one to run, it
        // would touch 8 elements of buffers of 8 floats.
        unsafe { kernels::launch(&k, &stream, grid, &args) }.unwrap_err()
    };
    for grid in [
        Grid::new([u32::MAX; 3], [1; 3]),
        Grid::new([u32::MAX, u32::MAX, 2], [1, 1, 1]),
        Grid::new([u32::MAX, 1 << 25, 1], [256, 1, 1]),
    ] {
        let e = launch(grid);
        let (name, index, reason) = kernel_error(&e);
        assert_eq!((name, index), ("scale", None));
        assert!(
            reason.contains("work-items") && reason.contains("-bit addresses"),
            "{reason}"
        );
    }
    if dev.backend() == syncmem::BackendKind::Cuda {
        let e = launch(Grid::new([1, 65_536, 1], [8, 1, 1]));
        assert!(kernel_error(&e).2.contains("blocks along y"), "{e}");
        let e = launch(Grid::new([1, 1, 1], [1, 1, 128]));
        assert!(kernel_error(&e).2.contains("threads along z"), "{e}");
    }
    assert_eq!(host_f32(&y), [7.0; 8], "no refused launch ran");
}

#[test]
fn oversized_grids_are_refused_on_cpu() {
    oversized_grids_are_refused(&Device::cpu());
}

#[test]
fn oversized_grids_are_refused_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("oversized user kernel grids") {
        oversized_grids_are_refused(&dev);
    }
}

#[test]
fn oversized_grids_are_refused_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("oversized user kernel grids on cuda") {
        oversized_grids_are_refused(&dev);
    }
}

/// A NUL byte in a kernel's name (on every backend) or in its source: a build error, neither a
/// panic in the bindings nor a source cut short at the NUL.
fn nul_bytes_are_build_errors(dev: &Device) {
    let with_sources = |name: &str, cl: &str, cu: &str| {
        UserKernel::new(name)
            .with_opencl(cl)
            .with_cuda(cu)
            .with_host(|_| Ok(()))
    };
    let build_error = |k: &UserKernel| match k.prepare(dev) {
        Err(Error::KernelBuild {
            kernel,
            device,
            reason,
            ..
        }) => {
            assert_eq!((kernel.as_str(), device.as_str()), (k.name(), dev.label()));
            reason
        }
        other => panic!("expected KernelBuild for {:?}, got {other:?}", k.name()),
    };
    let named = with_sources("sc\0ale", SCALE_CL, SCALE_CU);
    let reason = build_error(&named);
    assert!(
        reason.contains("a NUL byte (at byte 2) in the kernel's name"),
        "{reason}"
    );
    if dev.backend() != syncmem::BackendKind::Cpu {
        // The source up to the NUL is a whole kernel: cut there, it would build.
        let cl = format!("{SCALE_CL}\0 not C at all");
        let cu = format!("{SCALE_CU}\0 not C at all");
        let cut = with_sources("scale", &cl, &cu);
        let reason = build_error(&cut);
        assert!(
            reason.contains("in the OpenCL C source") || reason.contains("in the CUDA C source"),
            "{reason}"
        );
        if dev.backend() == syncmem::BackendKind::OpenCl {
            let opts = with_sources("scale", SCALE_CL, SCALE_CU).with_opencl_options("-D A=1\0");
            let reason = build_error(&opts);
            assert!(reason.contains("in the OpenCL build options"), "{reason}");
        }
    }
}

#[test]
fn nul_bytes_are_build_errors_on_cpu() {
    nul_bytes_are_build_errors(&Device::cpu());
}

#[test]
fn nul_bytes_are_build_errors_on_opencl() {
    if let Some(dev) = syncmem::testing::opencl_or_skip("nul bytes in user kernels") {
        nul_bytes_are_build_errors(&dev);
    }
}

#[test]
fn nul_bytes_are_build_errors_on_cuda() {
    if let Some(dev) = syncmem::testing::cuda_or_skip("nul bytes in user kernels on cuda") {
        nul_bytes_are_build_errors(&dev);
    }
}

/// A source that does not compile: the build log names the problem; the kernel is not kept.
#[test]
fn a_build_failure_is_a_typed_error_with_the_log() {
    let Some(dev) = syncmem::testing::opencl_or_skip("user kernel build failure") else {
        return;
    };
    let k =
        UserKernel::new("bad").with_opencl("__kernel void bad(__global float* x) { x[0] = y; }");
    for _ in 0..2 {
        match k.prepare(&dev).unwrap_err() {
            Error::KernelBuild {
                kernel,
                device,
                log,
                ..
            } => {
                assert_eq!((kernel.as_str(), device.as_str()), ("bad", dev.label()));
                assert!(log.contains('y'), "{log}");
            }
            other => panic!("expected KernelBuild, got {other}"),
        }
    }
}
