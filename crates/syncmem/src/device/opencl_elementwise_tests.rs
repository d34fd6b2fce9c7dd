//! The two mappings of element-wise kernels to work-items (`SM_FOR_EACH`: contiguous runs on
//! CPU devices, a grid-stride loop on GPUs), both run on the test's OpenCL device: every
//! element is written once, with the expression of the one-element formula, at lengths that
//! end runs in every way (below one run, not a multiple of 16, more runs than launched); the
//! reductions count every element once.

use crate::backend::dispatch::RawDevice;
use crate::backend::opencl::ClDevice;
use crate::backend::opencl::CPU_RUN;
use crate::backend::Reduce;
use crate::device::DeviceBuffer;
use crate::testing::opencl_or_skip;
use crate::{Device, Stream};

/// Lengths: one element, a partial block of 16, one run and a bit, and more elements than
/// the most runs `dev` launches times the shortest run (so runs are longer than the shortest).
fn lengths(dev: &Device) -> [usize; 5] {
    let most = cl(dev).cpu_runs(usize::MAX);
    [1, 37, CPU_RUN + 5, 100_003, most * CPU_RUN + 1001]
}

fn cl(dev: &Device) -> &ClDevice {
    match &dev.shared.raw {
        RawDevice::OpenCl(cl) => cl,
        #[allow(unreachable_patterns)]
        _ => panic!("{} is not an OpenCL device", dev.label()),
    }
}

/// `dev`'s OpenCL device with its kernels built for each mapping, CPU first.
fn both_mappings(dev: &Device) -> Vec<(bool, Device)> {
    let cl = cl(dev);
    [true, false]
        .into_iter()
        .map(|cpu| {
            (
                cpu,
                Device::from_raw(RawDevice::OpenCl(cl.with_mapping(cpu))),
            )
        })
        .collect()
}

fn upload(s: &Stream, values: &[f32]) -> DeviceBuffer {
    let mut b = s.device().alloc(values.len() * 4).unwrap();
    s.write(&mut b, 0, bytemuck::cast_slice(values)).unwrap();
    b
}

fn download(s: &Stream, b: &DeviceBuffer, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    s.read(b, 0, bytemuck::cast_slice_mut(&mut out)).unwrap();
    out
}

/// Values with both signs, distinct per element.
fn values(n: usize, salt: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + salt) * 0.618_034).sin() * (1.0 + (i % 7) as f32))
        .collect()
}

#[track_caller]
fn assert_each(what: &str, cpu: bool, n: usize, got: &[f32], want: impl Fn(usize) -> f32) {
    for (i, &g) in got.iter().enumerate() {
        let w = want(i);
        assert!(
            g.to_bits() == w.to_bits(),
            "{what} (cpu mapping: {cpu}), n = {n}: element {i} is {g}, expected {w}"
        );
    }
}

#[test]
fn elementwise_kernels_write_every_element_once_with_either_mapping() {
    let Some(dev) = opencl_or_skip("elementwise_kernels_write_every_element_once") else {
        return;
    };
    for (cpu, d) in both_mappings(&dev) {
        let s = d.default_stream().unwrap();
        let k = s.kernels();
        for n in lengths(&dev) {
            let x = values(n, 0.5);
            let y0 = values(n, 3.0);
            // axpy with a = 1 adds each x once: an element visited twice or never shows.
            let y = upload(&s, &y0);
            k.axpy(n, 1.0f32, &upload(&s, &x), &y).unwrap();
            let got = download(&s, &y, n);
            assert_each("axpy", cpu, n, &got, |i| y0[i] + x[i]);

            let y = upload(&s, &y0);
            k.axpy_multi(-0.25f32, &[(n, &upload(&s, &x), &y)]).unwrap();
            let got = download(&s, &y, n);
            assert_each("axpy_multi", cpu, n, &got, |i| y0[i] + -0.25 * x[i]);

            let y = upload(&s, &y0);
            k.scale(n, 3.0f32, &y).unwrap();
            let got = download(&s, &y, n);
            assert_each("scale", cpu, n, &got, |i| y0[i] * 3.0);

            let y = upload(&s, &y0);
            k.relu(n, &y, &y).unwrap();
            let got = download(&s, &y, n);
            assert_each("relu", cpu, n, &got, |i| y0[i].max(0.0));

            let dy = upload(&s, &x);
            k.relu_grad(n, &upload(&s, &y0), &dy, &dy).unwrap();
            let got = download(&s, &dy, n);
            assert_each("relu_grad", cpu, n, &got, |i| {
                if y0[i] > 0.0 {
                    x[i]
                } else {
                    0.0
                }
            });

            let y = upload(&s, &y0);
            k.fill_f32(n, 7.5, &y).unwrap();
            let got = download(&s, &y, n);
            assert_each("fill", cpu, n, &got, |_| 7.5);
        }
    }
}

#[test]
fn softmax_gradient_covers_every_cell_with_either_mapping() {
    let Some(dev) = opencl_or_skip("softmax_gradient_covers_every_cell") else {
        return;
    };
    let (rows, cols) = (3001, 7);
    let p = values(rows * cols, 1.0);
    let labels: Vec<i32> = (0..rows).map(|i| (i % cols) as i32).collect();
    for (cpu, d) in both_mappings(&dev) {
        let s = d.default_stream().unwrap();
        let pb = upload(&s, &p);
        let mut lb = d.alloc(rows * 4).unwrap();
        s.write(&mut lb, 0, bytemuck::cast_slice(&labels)).unwrap();
        let dx = upload(&s, &vec![f32::NAN; rows * cols]);
        let bad = s
            .kernels()
            .softmax_loss_grad(rows, cols, &pb, &lb, None, &dx)
            .unwrap();
        assert!(bad.is_none());
        let got = download(&s, &dx, rows * cols);
        let scale = 1.0 / rows as f32;
        assert_each("softmax_loss_grad", cpu, rows * cols, &got, |idx| {
            let (i, j) = (idx / cols, idx % cols);
            let g = if labels[i] as usize == j {
                p[idx] - 1.0
            } else {
                p[idx]
            };
            g * scale
        });
    }
}

#[test]
fn reductions_count_every_element_once_with_either_mapping() {
    let Some(dev) = opencl_or_skip("reductions_count_every_element_once") else {
        return;
    };
    for (cpu, d) in both_mappings(&dev) {
        let s = d.default_stream().unwrap();
        let k = s.kernels();
        for n in lengths(&dev) {
            // Sums of small integers are exact in any order: an element counted twice or
            // never shows.
            let ones: Vec<f32> = (0..n)
                .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect();
            let x = upload(&s, &ones);
            let asum: f32 = k.reduce(Reduce::Asum, n, &x).unwrap();
            assert_eq!(asum, n as f32, "asum (cpu mapping: {cpu}), n = {n}");
            let twos: Vec<f32> = ones.iter().map(|v| 2.0 * v).collect();
            let sumsq: f32 = k.reduce(Reduce::Sumsq, n, &upload(&s, &twos)).unwrap();
            assert_eq!(sumsq, 4.0 * n as f32, "sumsq (cpu mapping: {cpu}), n = {n}");
            // Rounded sums of other values: close to the exact one.
            let v = values(n, 2.0);
            let exact: f64 = v.iter().map(|x| f64::from(x.abs())).sum();
            let got: f32 = k.reduce(Reduce::Asum, n, &upload(&s, &v)).unwrap();
            let err = (f64::from(got) - exact).abs() / exact;
            assert!(
                err < 1e-5,
                "asum (cpu mapping: {cpu}), n = {n}: {got} vs {exact}"
            );
        }
        // f64, where the device has it.
        let n = 100_003;
        let halves: Vec<f64> = (0..n)
            .map(|i| if i % 3 == 0 { -0.5 } else { 0.5 })
            .collect();
        let mut x = d.alloc(n * 8).unwrap();
        s.write(&mut x, 0, bytemuck::cast_slice(&halves)).unwrap();
        match k.reduce::<f64>(Reduce::Asum, n, &x) {
            Ok(sum) => assert_eq!(sum, n as f64 * 0.5, "f64 asum (cpu mapping: {cpu})"),
            Err(crate::Error::Unsupported { .. }) => {}
            Err(e) => panic!("f64 asum: {e}"),
        }
    }
}
