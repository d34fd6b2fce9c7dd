//! OpenCL C sources of the math kernels of parameter blobs ([`MATH`], for one element type
//! `T`), and [`ELEMENTWISE`], the mapping of element-wise loops to work-items that every
//! program of the backend starts with.

/// `SM_FOR_EACH(i, n)`: the loop over the elements of an element-wise kernel that fall to the
/// calling work-item.
///
/// On a GPU (the default) it is a grid-stride loop: consecutive work-items on consecutive
/// elements, so that a warp's loads coalesce. On a CPU device (built with `-D SM_CONTIGUOUS`)
/// the work-items of a group run one after another on one core, so a grid-stride loop would
/// touch one element per cache line before moving to the next work-item (at 4M elements,
/// 3.6 GB/s on PoCL); there each work-item takes one contiguous run of elements, a multiple of
/// 16 long, which the compiler vectorizes. Each element gets the same expression either way,
/// so the results of element-wise kernels do not depend on the mapping (the reductions' sums
/// are taken in another order).
///
/// On a CPU device the macro declares `i_end` (for a loop variable `i`) in the enclosing
/// scope: a second loop there goes in braces of its own (as `SM_AXPY_PAIR` does). `SM_SUM`
/// (the reductions) takes the same runs (`SM_RUN_LO`, `SM_RUN_HI`).
pub(super) const ELEMENTWISE: &str = r#"
#ifdef SM_CONTIGUOUS
/* The run of the calling work-item over n elements: ceil(n / global size) rounded up to 16
 * long, from lo (a multiple of 16) to hi (at most n; hi <= lo past the end). */
#define SM_RUN_PER(n) ((((ulong)(n) + get_global_size(0) - 1) / get_global_size(0) + 15) \
                       & ~(ulong)15)
#define SM_RUN_LO(n) ((ulong)get_global_id(0) * SM_RUN_PER(n))
#define SM_RUN_HI(n) min((ulong)(n), SM_RUN_LO(n) + SM_RUN_PER(n))
#define SM_FOR_EACH(i, n)                                                                 \
    const ulong i##_end = SM_RUN_HI(n);                                                   \
    for (ulong i = SM_RUN_LO(n); i < i##_end; ++i)
#else
#define SM_FOR_EACH(i, n) for (ulong i = get_global_id(0); i < (ulong)(n); i += get_global_size(0))
#endif
"#;

/// The math kernels; `T` is defined as `float` or `double` in front of it.
///
/// The axpy kernels round the product and the sum each on its own (no contraction into a
/// fused multiply-add, which OpenCL C allows by default), as the host's axpy does: `SGD`
/// offloaded to the host gives the device's bits.
pub(super) const MATH: &str = r#"
#pragma OPENCL FP_CONTRACT OFF
__kernel void sm_axpy(const ulong n, const T a, __global const T* x, __global T* y) {
    SM_FOR_EACH(i, n) {
        y[i] += a * x[i];
    }
}

__kernel void sm_scale(const ulong n, const T a, __global T* x) {
    SM_FOR_EACH(i, n) {
        x[i] *= a;
    }
}

/* y_p[i] += a * x_p[i] for each pair p (at most 8, count of them given, the others of length
 * 0) of one launch: every work-item takes blocks of 8 elements of each pair in turn (one vector
 * of 8, or the elements of a last partial block one by one), the blocks mapped to work-items
 * as the elements of the other element-wise kernels (SM_FOR_EACH).
 * Each element gets the expression of sm_axpy, so the results are those of one sm_axpy per pair,
 * bit for bit (a multi-tensor SGD). */
#define SM_AXPY_PAIR(N, X, Y)                                                             \
    {                                                                                     \
        SM_FOR_EACH(b, ((N) + 7) / 8) {                                                   \
            if (b * 8 + 8 <= (N)) {                                                       \
                vstore8(vload8(b, Y) + a * vload8(b, X), b, Y);                           \
            } else {                                                                      \
                for (ulong i = b * 8; i < (N); ++i) {                                     \
                    (Y)[i] += a * (X)[i];                                                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }
__kernel void sm_axpy_multi(const T a, const uint count,
                            const ulong n0, const ulong n1, const ulong n2, const ulong n3,
                            const ulong n4, const ulong n5, const ulong n6, const ulong n7,
                            __global const T* x0, __global T* y0,
                            __global const T* x1, __global T* y1,
                            __global const T* x2, __global T* y2,
                            __global const T* x3, __global T* y3,
                            __global const T* x4, __global T* y4,
                            __global const T* x5, __global T* y5,
                            __global const T* x6, __global T* y6,
                            __global const T* x7, __global T* y7) {
    SM_AXPY_PAIR(n0, x0, y0)
    SM_AXPY_PAIR(n1, x1, y1)
    SM_AXPY_PAIR(n2, x2, y2)
    SM_AXPY_PAIR(n3, x3, y3)
    SM_AXPY_PAIR(n4, x4, y4)
    SM_AXPY_PAIR(n5, x5, y5)
    SM_AXPY_PAIR(n6, x6, y6)
    SM_AXPY_PAIR(n7, x7, y7)
}
#pragma OPENCL FP_CONTRACT ON

/* Vector types of T. */
#define SM_CAT_(a, b) a##b
#define SM_CAT(a, b) SM_CAT_(a, b)
#define T16 SM_CAT(T, 16)
#define T8 SM_CAT(T, 8)
#define T4 SM_CAT(T, 4)
#define T2 SM_CAT(T, 2)

/* ACC += the sum of EXPR (of v = x[i]) over the elements of the calling work-item. On a CPU
 * device (one contiguous run each) in 16 lanes, lane k summing elements k, k + 16, ... of the
 * run (v a vector of 16), then the lanes added in a fixed tree and the last elements one by one:
 * 16 sums in flight instead of one chain of dependent additions. Elsewhere in the order of
 * SM_FOR_EACH. So the order of the sum (its last bits) depends on the mapping: a CPU device and
 * a GPU may differ there, each always gives the same. */
#ifdef SM_CONTIGUOUS
#define SM_SUM(ACC, n, x, EXPR)                                                           \
    {                                                                                     \
        const ulong hi = SM_RUN_HI(n);                                                    \
        ulong i = SM_RUN_LO(n);                                                           \
        T16 lanes = (T16)(0);                                                             \
        for (; i + 16 <= hi; i += 16) {                                                   \
            const T16 v = vload16(0, (x) + i);                                            \
            lanes += EXPR;                                                                \
        }                                                                                 \
        const T8 h = lanes.lo + lanes.hi;                                                 \
        const T4 q = h.lo + h.hi;                                                         \
        const T2 d = q.lo + q.hi;                                                         \
        ACC += d.x + d.y;                                                                 \
        for (; i < hi; ++i) {                                                             \
            const T v = (x)[i];                                                           \
            ACC += EXPR;                                                                  \
        }                                                                                 \
    }
#else
#define SM_SUM(ACC, n, x, EXPR)                                                           \
    SM_FOR_EACH(i, n) {                                                                   \
        const T v = (x)[i];                                                               \
        ACC += EXPR;                                                                      \
    }
#endif

/* One partial sum per work-group (SM_SUM per work-item, then added over the group). The local
 * size is a power of two. */
#define SM_REDUCE(NAME, EXPR)                                                             \
__kernel void NAME(const ulong n, __global const T* x, __global T* partial,             \
                   __local T* scratch) {                                                 \
    const size_t lid = get_local_id(0);                                                  \
    T acc = (T)0;                                                                        \
    SM_SUM(acc, n, x, EXPR)                                                              \
    scratch[lid] = acc;                                                                  \
    barrier(CLK_LOCAL_MEM_FENCE);                                                        \
    for (size_t s = get_local_size(0) / 2; s > 0; s >>= 1) {                             \
        if (lid < s) {                                                                   \
            scratch[lid] += scratch[lid + s];                                            \
        }                                                                                \
        barrier(CLK_LOCAL_MEM_FENCE);                                                    \
    }                                                                                    \
    if (lid == 0) {                                                                      \
        partial[get_group_id(0)] = scratch[0];                                           \
    }                                                                                    \
}

SM_REDUCE(sm_asum, fabs(v))
SM_REDUCE(sm_sumsq, v * v)
"#;
