//! The argument lists of the device kernels, shared by the OpenCL and CUDA backends: their
//! kernels are twins (same parameters, same order), so each list is built once here, over the
//! backend's pointer type (`cl_mem`, a CUDA device address). OpenCL's reductions add a local
//! scratch buffer at the end, which its launch helper appends.

use crate::dtype::{Float, ScalarKind};
use crate::error::{Error, Result};

use super::{Gemm, AXPY_MULTI};

/// One kernel argument; `P` is the backend's device pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KArg<P> {
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A device pointer: memory of the launch's context, or the null pointer for an operand
    /// the kernel does not read.
    Ptr(P),
    /// The raw bytes of a by-value parameter of a user's kernel (a `char`, a `float4`, a
    /// struct): `len` bytes at `ptr`, borrowed by the launch that holds this argument (valid
    /// until it returns; the backends copy the value when the kernel is queued).
    Bytes {
        /// The first byte.
        ptr: *const u8,
        /// The number of bytes.
        len: usize,
    },
}

/// A device pointer type with a null value.
pub(crate) trait DevicePtr: Copy {
    /// The null pointer.
    const NULL: Self;
}

/// CUDA device addresses (`CUdeviceptr`).
impl DevicePtr for u64 {
    const NULL: Self = 0;
}

/// A size as a kernel `uint`.
pub(crate) fn u32_arg<P>(v: usize, what: &'static str, label: &str) -> Result<KArg<P>> {
    u32::try_from(v)
        .map(KArg::U32)
        .map_err(|_| Error::Unsupported {
            device: label.to_string(),
            what: format!("{what} = {v} exceeds the 32-bit sizes of the device kernels"),
        })
}

fn ptr<P: DevicePtr>(p: Option<P>) -> KArg<P> {
    KArg::Ptr(p.unwrap_or(P::NULL))
}

fn flag<P>(b: bool) -> KArg<P> {
    KArg::U32(b.into())
}

/// A floating-point argument of type `F` (`float` or `double`).
pub(crate) fn value<P, F: Float>(a: F) -> KArg<P> {
    match F::KIND {
        ScalarKind::F64 => KArg::F64(a.to_f64()),
        _ => KArg::F32(a.to_f64() as f32),
    }
}

/// A scalar argument of a user's kernel, by its bits: signed integers go as the unsigned word
/// of their size (a kernel argument is its bytes).
pub(crate) fn scalar<P>(s: super::user::ScalarArg) -> KArg<P> {
    use super::user::ScalarArg as S;
    match s {
        S::I32(v) => KArg::U32(v as u32),
        S::U32(v) => KArg::U32(v),
        S::I64(v) => KArg::U64(v as u64),
        S::U64(v) => KArg::U64(v),
        S::F32(v) => KArg::F32(v),
        S::F64(v) => KArg::F64(v),
    }
}

/// `sm_gemm(M, N, K, ta, tb, A, B, C, bias, mask, sum, flags)`: `flags` bit 0 adds the bias,
/// bit 1 applies the ReLU ([`Gemm::relu`]), bit 2 the mask of a fused ReLU gradient, bit 3
/// writes the column sums of `A` into `sum` (a fused bias gradient), bit 4 applies a user's
/// activation ([`Gemm::user`]), bit 5 its gradient (with `mask` as the activation's output, in
/// place of bit 2).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<P: DevicePtr>(
    label: &str,
    g: &Gemm,
    a: Option<P>,
    b: Option<P>,
    c: P,
    bias: Option<P>,
    mask: Option<P>,
    sum: Option<P>,
) -> Result<[KArg<P>; 12]> {
    let user_grad = g.user.is_some_and(|u| u.grad);
    Ok([
        u32_arg(g.m, "GEMM M", label)?,
        u32_arg(g.n, "GEMM N", label)?,
        u32_arg(g.k, "GEMM K", label)?,
        flag(g.ta),
        flag(g.tb),
        ptr(a),
        ptr(b),
        KArg::Ptr(c),
        ptr(bias),
        ptr(mask),
        ptr(sum),
        KArg::U32(
            u32::from(bias.is_some())
                | (u32::from(g.relu) << 1)
                | (u32::from(mask.is_some() && !user_grad) << 2)
                | (u32::from(sum.is_some()) << 3)
                | (u32::from(g.user.is_some_and(|u| !u.grad)) << 4)
                | (u32::from(user_grad && mask.is_some()) << 5),
        ),
    ])
}

/// `sm_col_sum(rows, cols, X, out)`.
pub(crate) fn col_sum<P: DevicePtr>(
    label: &str,
    rows: usize,
    cols: usize,
    x: Option<P>,
    out: P,
) -> Result<[KArg<P>; 4]> {
    Ok([
        u32_arg(rows, "rows", label)?,
        u32_arg(cols, "columns", label)?,
        ptr(x),
        KArg::Ptr(out),
    ])
}

/// `sm_relu(n, x, y)`.
pub(crate) fn relu<P: DevicePtr>(n: usize, x: P, y: P) -> [KArg<P>; 3] {
    [KArg::U64(n as u64), KArg::Ptr(x), KArg::Ptr(y)]
}

/// `sm_relu_grad(n, y, dy, dx)`.
pub(crate) fn relu_grad<P: DevicePtr>(n: usize, y: P, dy: P, dx: P) -> [KArg<P>; 4] {
    [
        KArg::U64(n as u64),
        KArg::Ptr(y),
        KArg::Ptr(dy),
        KArg::Ptr(dx),
    ]
}

/// `sm_fill(n, value, y)`.
pub(crate) fn fill<P: DevicePtr>(n: usize, v: f32, y: P) -> [KArg<P>; 3] {
    [KArg::U64(n as u64), KArg::F32(v), KArg::Ptr(y)]
}

/// `sm_softmax_loss(N, C, X, labels, P, loss, A, top_k, dX, S, flags)`: `flags` bit 0 writes
/// the accuracy into `A`, bit 1 the gradient into `dX`, bit 2 the loss and the accuracy into
/// `S[0..2]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_loss<P: DevicePtr>(
    label: &str,
    (rows, cols): (usize, usize),
    x: Option<P>,
    labels: Option<P>,
    p: Option<P>,
    loss: P,
    accuracy: Option<(usize, P)>,
    grad: Option<P>,
    scalars: Option<P>,
) -> Result<[KArg<P>; 11]> {
    let top_k = accuracy.map_or(1, |a| a.0);
    let flags = u32::from(accuracy.is_some())
        | (u32::from(grad.is_some()) << 1)
        | (u32::from(scalars.is_some()) << 2);
    Ok([
        u32_arg(rows, "rows", label)?,
        u32_arg(cols, "classes", label)?,
        ptr(x),
        ptr(labels),
        ptr(p),
        KArg::Ptr(loss),
        ptr(accuracy.map(|a| a.1)),
        u32_arg(top_k, "top_k", label)?,
        ptr(grad),
        ptr(scalars),
        KArg::U32(flags),
    ])
}

/// `sm_softmax_loss_grad(N, C, P, labels, dloss, has_dloss, dX)`.
pub(crate) fn softmax_loss_grad<P: DevicePtr>(
    label: &str,
    (rows, cols): (usize, usize),
    p: P,
    labels: P,
    dloss: Option<P>,
    dx: P,
) -> Result<[KArg<P>; 7]> {
    Ok([
        u32_arg(rows, "rows", label)?,
        u32_arg(cols, "classes", label)?,
        KArg::Ptr(p),
        KArg::Ptr(labels),
        ptr(dloss),
        flag(dloss.is_some()),
        KArg::Ptr(dx),
    ])
}

/// `sm_accuracy(N, C, top_k, X, labels, out)`.
pub(crate) fn accuracy<P: DevicePtr>(
    label: &str,
    (rows, cols, top_k): (usize, usize, usize),
    x: Option<P>,
    labels: Option<P>,
    out: P,
) -> Result<[KArg<P>; 6]> {
    Ok([
        u32_arg(rows, "rows", label)?,
        u32_arg(cols, "classes", label)?,
        u32_arg(top_k, "top_k", label)?,
        ptr(x),
        ptr(labels),
        KArg::Ptr(out),
    ])
}

/// `sm_axpy(n, a, x, y)`.
pub(crate) fn axpy<P: DevicePtr, F: Float>(n: usize, a: F, x: P, y: P) -> [KArg<P>; 4] {
    [KArg::U64(n as u64), value(a), KArg::Ptr(x), KArg::Ptr(y)]
}

/// `sm_axpy_multi(a, count, n0..n7, x0, y0, ..., x7, y7)` for 1 to [`AXPY_MULTI`] pairs
/// `(n, x, y)`; the pairs not given are empty (length 0, null pointers).
pub(crate) fn axpy_multi<P: DevicePtr, F: Float>(
    a: F,
    pairs: &[(usize, P, P)],
) -> [KArg<P>; 2 + 3 * AXPY_MULTI] {
    debug_assert!((1..=AXPY_MULTI).contains(&pairs.len()));
    let mut args = [KArg::Ptr(P::NULL); 2 + 3 * AXPY_MULTI];
    args[0] = value(a);
    args[1] = KArg::U32(pairs.len().min(AXPY_MULTI) as u32);
    for i in 0..AXPY_MULTI {
        let (n, x, y) = pairs.get(i).copied().unwrap_or((0, P::NULL, P::NULL));
        args[2 + i] = KArg::U64(n as u64);
        args[2 + AXPY_MULTI + 2 * i] = KArg::Ptr(x);
        args[3 + AXPY_MULTI + 2 * i] = KArg::Ptr(y);
    }
    args
}

/// `sm_scale(n, a, x)`.
pub(crate) fn scale<P: DevicePtr, F: Float>(n: usize, a: F, x: P) -> [KArg<P>; 3] {
    [KArg::U64(n as u64), value(a), KArg::Ptr(x)]
}

/// `sm_asum` / `sm_sumsq(n, x, partial)`.
pub(crate) fn reduce<P: DevicePtr>(n: usize, x: P, partial: P) -> [KArg<P>; 3] {
    [KArg::U64(n as u64), KArg::Ptr(x), KArg::Ptr(partial)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_32_bits_are_refused() {
        assert!(matches!(u32_arg::<u64>(7, "rows", "x:0"), Ok(KArg::U32(7))));
        let e = u32_arg::<u64>(u32::MAX as usize + 1, "GEMM K", "opencl:0").unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { device, what }
                if device == "opencl:0" && what.contains("GEMM K = 4294967296")),
            "{e}"
        );
    }

    #[test]
    fn optional_operands_become_null_and_flags() {
        let g = Gemm {
            ta: true,
            tb: false,
            m: 2,
            n: 3,
            k: 0,
            relu: false,
            user: None,
        };
        let a = gemm::<u64>("x", &g, None, None, 9, Some(5), None, None).unwrap();
        assert!(matches!(a[3], KArg::U32(1)) && matches!(a[4], KArg::U32(0)));
        assert!(matches!(a[5], KArg::Ptr(0)) && matches!(a[7], KArg::Ptr(9)));
        assert!(matches!(a[8], KArg::Ptr(5)) && matches!(a[9], KArg::Ptr(0)));
        assert!(matches!(a[10], KArg::Ptr(0)) && matches!(a[11], KArg::U32(1)));
        let relu = Gemm { relu: true, ..g };
        let r = gemm::<u64>("x", &relu, None, None, 9, None, None, None).unwrap();
        assert!(matches!(r[8], KArg::Ptr(0)) && matches!(r[11], KArg::U32(2)));
        let r = gemm::<u64>("x", &relu, None, None, 9, Some(5), None, None).unwrap();
        assert!(matches!(r[11], KArg::U32(3)));
        let r = gemm::<u64>("x", &g, None, None, 9, None, Some(6), None).unwrap();
        assert!(matches!(r[9], KArg::Ptr(6)) && matches!(r[11], KArg::U32(4)));
        let r = gemm::<u64>("x", &g, None, None, 9, None, None, Some(7)).unwrap();
        assert!(matches!(r[10], KArg::Ptr(7)) && matches!(r[11], KArg::U32(8)));
        let code = crate::backend::epilogue::EpilogueCode {
            name: "act".into(),
            source: None,
            grad_source: None,
            host: None,
            host_grad: None,
            preludes: Default::default(),
        };
        let act = crate::backend::epilogue::UserAct {
            code: &code,
            grad: false,
        };
        let fwd = Gemm {
            user: Some(act),
            ..g
        };
        let r = gemm::<u64>("x", &fwd, None, None, 9, None, None, None).unwrap();
        assert!(matches!(r[11], KArg::U32(16)));
        let grad = Gemm {
            user: Some(crate::backend::epilogue::UserAct { grad: true, ..act }),
            ..g
        };
        // The gradient replaces the ReLU mask: bit 5, not bit 2.
        let r = gemm::<u64>("x", &grad, None, None, 9, None, Some(6), None).unwrap();
        assert!(matches!(r[9], KArg::Ptr(6)) && matches!(r[11], KArg::U32(32)));
        let s = softmax_loss_grad::<u64>("x", (1, 2), 1, 2, None, 3).unwrap();
        assert!(matches!(s[4], KArg::Ptr(0)) && matches!(s[5], KArg::U32(0)));
        assert!(matches!(value::<u64, f64>(0.5), KArg::F64(v) if v == 0.5));
        assert!(matches!(value::<u64, f32>(0.5), KArg::F32(v) if v == 0.5));
    }
}
