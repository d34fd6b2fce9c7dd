//! Tests of the OpenCL backend on a real OpenCL device; each skips with a message when there
//! is none (a failure instead with `SYNCMEM_REQUIRE_OPENCL=1`).

use crate::backend::dispatch::RawDevice;
use crate::backend::opencl::{
    alloc_error, backend_error, cl_error_message, enqueue_error, unavailable,
};
use crate::backend::opencl::{ClDevice, ClMem, ClStream};
use crate::backend::BackendDevice;
use crate::error::{BackendKind, Error};
use crate::testing::opencl_or_skip;
use crate::Device;

fn raw(dev: &Device) -> &ClDevice {
    match &dev.shared.raw {
        RawDevice::OpenCl(d) => d,
        #[allow(unreachable_patterns)]
        _ => panic!("{} is not an OpenCL device", dev.label()),
    }
}

/// A fresh `Device` over the same OpenCL device, with counters no other test touches.
fn private_device(dev: &Device) -> Device {
    Device::from_raw(RawDevice::OpenCl(raw(dev).duplicate()))
}

#[test]
fn opencl_discovery_reports_sane_info() {
    let Some(dev) = opencl_or_skip("opencl_discovery_reports_sane_info") else {
        return;
    };
    let all = Device::all(BackendKind::OpenCl).unwrap();
    assert!(!all.is_empty());
    for (i, d) in all.iter().enumerate() {
        let info = d.info();
        assert_eq!(info.backend, BackendKind::OpenCl);
        assert_eq!(info.ordinal, i);
        assert_eq!(d.label(), format!("opencl:{i}"));
        assert!(!info.name.trim().is_empty());
        assert!(!info.vendor.trim().is_empty());
        assert!(info.max_alloc > 0);
        assert!(info.total_memory >= info.max_alloc, "{info:?}");
    }
    assert!(Device::open("opencl:0").unwrap().same(&dev));
    let e = Device::open(&format!("opencl:{}", all.len())).unwrap_err();
    assert!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
}

#[test]
fn opencl_alloc_above_max_alloc_is_out_of_memory() {
    let Some(dev) = opencl_or_skip("opencl_alloc_above_max_alloc_is_out_of_memory") else {
        return;
    };
    let max = dev.info().max_alloc;
    let too_big = usize::try_from(max).unwrap().saturating_add(1);
    let e = dev.alloc(too_big).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // The backend itself maps clCreateBuffer's refusal to OutOfMemory as well.
    let e = raw(&dev).alloc(too_big).err().unwrap();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("opencl:0"), "{e}");
    let e = dev.alloc_pinned(too_big).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // Nothing was counted.
    let m = private_device(&dev);
    assert!(m.alloc(too_big).is_err());
    assert_eq!(m.memory_stats().allocs, 0);
}

#[test]
fn opencl_error_mapping() {
    for code in [-4, -5, -6, -61] {
        let e = alloc_error("opencl:3", "clCreateBuffer", code, 99);
        match e.oom_report() {
            Some(r) => {
                assert_eq!((r.device.as_str(), r.requested), ("opencl:3", 99));
                assert!(r.cause.contains("clCreateBuffer"), "{r}");
            }
            None => panic!("{code}: {e}"),
        }
    }
    let e = alloc_error("opencl:0", "clCreateBuffer", -30, 1);
    assert!(matches!(e, Error::Backend { code: -30, .. }), "{e}");
    let e = backend_error("opencl:1", "clEnqueueWriteBuffer", -38);
    let text = e.to_string();
    assert!(text.contains("clEnqueueWriteBuffer"), "{text}");
    assert!(text.contains("CL_INVALID_MEM_OBJECT"), "{text}");
    assert!(text.contains("opencl:1"), "{text}");
    assert!(matches!(
        e,
        Error::Backend {
            backend: BackendKind::OpenCl,
            code: -38,
            ..
        }
    ));
    assert_eq!(
        enqueue_error("opencl:0", "clEnqueueWriteBuffer", -4, 8)
            .oom_report()
            .map(|r| r.requested),
        Some(8)
    );
    assert!(matches!(
        enqueue_error("opencl:0", "clEnqueueWriteBuffer", -5, 8),
        Error::Backend { code: -5, .. }
    ));
    assert_eq!(cl_error_message(-9999), "OpenCL error");
    assert_eq!(cl_error_message(-48), "CL_INVALID_KERNEL");
    for code in [-2000, -1001, -2001, -30] {
        match unavailable(code) {
            Error::RuntimeUnavailable {
                backend: BackendKind::OpenCl,
                reason,
            } => assert!(!reason.is_empty()),
            e => panic!("{code}: {e}"),
        }
    }
}

/// Host values for a GEMM operand of `n` elements (small, exact in binary, some negative).
fn gemm_values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + seed * 13) % 23) as f32 - 11.0) / 8.0)
        .collect()
}

/// `v` in new memory of `cl` (a blocking write).
fn upload(cl: &ClDevice, s: &ClStream, v: &[f32]) -> ClMem {
    use crate::backend::BackendStream;
    let m = cl.alloc(v.len().max(1) * 4).unwrap();
    // SAFETY: `v` holds `4 * len` readable bytes; the write is blocking.
    unsafe { s.write(&m, 0, v.as_ptr().cast(), v.len() * 4, true) }.unwrap();
    m
}

/// The first `len` elements of `mem` (a blocking read).
fn download(s: &ClStream, mem: &ClMem, len: usize) -> Vec<f32> {
    use crate::backend::BackendStream;
    let mut got = vec![0f32; len];
    // SAFETY: `got` has room for the `4 * len` bytes read; the read is blocking.
    unsafe { s.read(mem, 0, got.as_mut_ptr().cast(), len * 4, true) }.unwrap();
    got
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One GEMM of the sweep: its operands on the device and the host's answers.
struct GemmCase {
    g: crate::backend::Gemm<'static>,
    a: ClMem,
    b: ClMem,
    bias: ClMem,
    want: Vec<f32>,
    /// The column sums of `A` by the `col_sum` kernel, when `A` is transposed.
    want_sum: Option<Vec<f32>>,
}

impl GemmCase {
    fn new(cl: &ClDevice, s: &ClStream, g: crate::backend::Gemm<'static>) -> Self {
        use crate::backend::cpu::math;
        use crate::backend::BackendKernels;
        let (m, n, k) = (g.m, g.n, g.k);
        let (a, b, bias) = (
            gemm_values(m * k, 1),
            gemm_values(k * n, 2),
            gemm_values(n, 3),
        );
        let mut want: Vec<f32> = bias.iter().cycle().take(m * n).copied().collect();
        math::gemm((g.ta, g.tb), (m, n, k), &a, &b, 1.0, &mut want).unwrap();
        if g.relu {
            math::relu_in_place(&mut want);
        }
        let a = upload(cl, s, &a);
        let want_sum = g.ta.then(|| {
            let out = upload(cl, s, &vec![f32::NAN; m]);
            cl.col_sum(s, k, m, Some(&a), &out).unwrap();
            download(s, &out, m)
        });
        let (b, bias) = (upload(cl, s, &b), upload(cl, s, &bias));
        GemmCase {
            g,
            a,
            b,
            bias,
            want,
            want_sum,
        }
    }

    /// Runs `kernel` and checks C against the host GEMM (and the column sums, bit for bit);
    /// returns C.
    fn check(
        &self,
        cl: &ClDevice,
        s: &ClStream,
        kernel: crate::backend::opencl::GemmKernel,
    ) -> Vec<f32> {
        let (g, m, n) = (&self.g, self.g.m, self.g.n);
        let c = upload(cl, s, &vec![f32::NAN; m * n]);
        let sum = g.ta.then(|| upload(cl, s, &vec![f32::NAN; m]));
        let ops = (
            Some(&self.a),
            Some(&self.b),
            &c,
            Some(&self.bias),
            None,
            sum.as_ref(),
        );
        cl.gemm_on(s, g, ops, kernel).unwrap();
        if let (Some(sum), Some(want)) = (&sum, &self.want_sum) {
            let got = download(s, sum, m);
            assert_eq!(
                bits(&got),
                bits(want),
                "{g:?}, {kernel:?}: sums {got:?}, want {want:?}"
            );
        }
        let got = download(s, &c, m * n);
        for (i, (x, y)) in got.iter().zip(&self.want).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{g:?}, {kernel:?}: C[{i}] = {x}, want {y}"
            );
        }
        got
    }
}

/// Every OpenCL GEMM (tiled, register-blocked, B staged in local memory) against the host
/// GEMM, for every transpose pair, with and without bias and ReLU, at sizes off every tile and
/// block (K over several staging steps, the last one short) and at skinny shapes; the device's
/// default choice is one of them. With `A` transposed, the same launch also writes the column
/// sums of `A`, bit for bit those of the `col_sum` kernel. The staged kernel sums in the
/// register-blocked kernel's order: their results are the same bit for bit.
#[test]
fn every_gemm_kernel_matches_the_host_gemm() {
    use crate::backend::opencl::GemmKernel;
    use crate::backend::Gemm;
    let Some(dev) = opencl_or_skip("every_gemm_kernel_matches_the_host_gemm") else {
        return;
    };
    let cl = raw(&dev);
    let ks = cl.kernel_cache().ops(cl).unwrap();
    if ks.register_blocked {
        assert!(ks.has_gemm_rbl(), "a CPU device runs the staged kernel too");
    }
    let s = cl.new_stream().unwrap();
    let shapes = [
        (64, 3, 70),
        (3, 64, 64),
        (64, 70, 2),
        (17, 1, 1),
        (70, 130, 33),
        (70, 33, 300),
        (17, 20, 40),
    ];
    let flags = [
        (false, false, false),
        (true, false, true),
        (false, true, true),
        (true, true, false),
    ];
    for (m, n, k) in shapes {
        for (ta, tb, relu) in flags {
            let g = Gemm {
                ta,
                tb,
                m,
                n,
                k,
                relu,
                user: None,
            };
            let case = GemmCase::new(cl, &s, g);
            let blocked = case.check(cl, &s, GemmKernel::RegisterBlocked);
            let staged = case.check(cl, &s, GemmKernel::Staged);
            assert_eq!(bits(&staged), bits(&blocked), "{g:?}: staged vs blocked");
            case.check(cl, &s, GemmKernel::Tiled);
        }
    }
}

/// A user's epilogue that is ReLU (and its gradient the ReLU mask) gives the built-in ReLU's
/// results bit for bit through every OpenCL GEMM: the snippet is spliced into the tiled, the
/// register-blocked (16 columns at once and the edges) and the staged kernels alike.
#[test]
fn a_user_epilogue_runs_in_every_gemm_kernel() {
    use crate::backend::epilogue::{EpilogueCode, UserAct};
    use crate::backend::opencl::GemmKernel;
    use crate::backend::Gemm;
    let Some(dev) = opencl_or_skip("a_user_epilogue_runs_in_every_gemm_kernel") else {
        return;
    };
    let cl = raw(&dev);
    let s = cl.new_stream().unwrap();
    let code = EpilogueCode {
        name: "relu".into(),
        source: Some("return x > 0.0f ? x : 0.0f;".into()),
        grad_source: Some("return y > 0.0f ? g : 0.0f;".into()),
        host: None,
        host_grad: None,
        preludes: Default::default(),
    };
    for (m, n, k, ta, tb) in [(70, 130, 33, false, true), (17, 20, 40, true, false)] {
        let base = Gemm {
            ta,
            tb,
            m,
            n,
            k,
            relu: false,
            user: None,
        };
        let (a, b) = (
            upload(cl, &s, &gemm_values(m * k, 1)),
            upload(cl, &s, &gemm_values(k * n, 2)),
        );
        let bias = upload(cl, &s, &gemm_values(n, 3));
        let y = upload(cl, &s, &gemm_values(m * n, 4));
        let run = |g: &Gemm, bias: Option<&ClMem>, mask: Option<&ClMem>, kernel| {
            let c = upload(cl, &s, &vec![f32::NAN; m * n]);
            let ops = (Some(&a), Some(&b), &c, bias, mask, None);
            cl.gemm_on(&s, g, ops, kernel).unwrap();
            bits(&download(&s, &c, m * n))
        };
        for kernel in [
            GemmKernel::Tiled,
            GemmKernel::RegisterBlocked,
            GemmKernel::Staged,
        ] {
            let fwd = Gemm {
                user: Some(UserAct {
                    code: &code,
                    grad: false,
                }),
                ..base
            };
            let relu = Gemm { relu: true, ..base };
            let want = run(&relu, Some(&bias), None, kernel);
            assert_eq!(run(&fwd, Some(&bias), None, kernel), want, "{kernel:?}");
            let grad = Gemm {
                user: Some(UserAct {
                    code: &code,
                    grad: true,
                }),
                ..base
            };
            let want = run(&base, None, Some(&y), kernel);
            assert_eq!(run(&grad, None, Some(&y), kernel), want, "{kernel:?} grad");
        }
    }
}
