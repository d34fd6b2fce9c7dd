//! OpenCL C sources: the operator kernels ([`OPS`], `f32`, labels `int`); the math kernels of
//! parameter blobs are in [`super::math_source`]. Both start with
//! [`super::math_source::ELEMENTWISE`], the mapping of element-wise loops to work-items.

/// The operator kernels. The GEMM tile sizes `TSM`, `TSN`, `TSK` of `sm_gemm` are defined by
/// the build options (`-D TSM=64 -D TSN=64 -D TSK=32`); `sm_gemm_rb_*` are the register-blocked
/// GEMMs of CPU devices. See [`super::program`].
pub(super) const OPS: &str = r#"
/* Tile sizes, set by the build options: TSM x TSN elements of C per work-group, TSK along K.
 * Each work-item computes a WPTM x WPTN block of C (WPTN as one float8), so a work-group is
 * (TSN / WPTN) x (TSM / WPTM) work-items. TSM must be a multiple of 4, TSN of 8. */
#ifndef TSM
#define TSM 64
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 32
#endif
#define WPTM 4
#define WPTN 8
#define RTSM (TSM / WPTM)
#define RTSN (TSN / WPTN)
#define WG_SIZE (RTSM * RTSN)

/* The GEMM epilogue: v (+ bias[n] when flags bit 0), then the ReLU when flags bit 1 (a fused
 * FC + Relu), with the select of sm_relu: NaN and -0 become 0, bit for bit as unfused; then,
 * when flags bit 2, the ReLU gradient's mask (a fused FCGradient + ReluGradient): v where
 * mask[m*N + n] > 0, else 0, the select of sm_relu_grad. */
#define SM_BIAS 1u
#define SM_RELU 2u
#define SM_MASK 4u
/* flags bit 3 (a fused bias gradient, with ta): the GEMM's launch also writes
 * sum[m] = sum_k A[k*M + m], the column sums of A as stored, in the order of sm_col_sum (one
 * accumulator per column, k ascending), so bit for bit its result. */
#define SM_SUM 8u
/* flags bit 4: a user's activation sm_user_act(v) after the bias and ReLU; bit 5: its gradient
 * sm_user_act_grad(v, mask[at]) in place of the mask (a fused FCGradient + the gradient of a
 * user's element-wise operator). Both exist only in a program built with a user's epilogue
 * (SM_USER_EPILOGUE, defined by the prelude that defines the two functions). */
#define SM_ACT 16u
#define SM_DACT 32u
inline float sm_epilogue(float v, __global const float* bias, __global const float* mask,
                         const size_t at, const uint n, const uint flags) {
    v = (flags & SM_BIAS) ? v + bias[n] : v;
    v = (flags & SM_RELU) ? (v > 0.0f ? v : 0.0f) : v;
#ifdef SM_USER_EPILOGUE
    v = (flags & SM_ACT) ? sm_user_act(v) : v;
    v = (flags & SM_DACT) ? sm_user_act_grad(v, mask[at]) : v;
#endif
    return (flags & SM_MASK) ? (mask[at] > 0.0f ? v : 0.0f) : v;
}

/* C[M,N] = op(A)[M,K] * op(B)[K,N], then the epilogue (bias, ReLU) of `flags`.
 *   op(A)[m,k] = ta ? A[k*M + m] : A[m*K + k]
 *   op(B)[k,n] = tb ? B[n*K + k] : B[k*N + n]
 * The K axis is walked in steps of TSK. At each step the work-group copies a TSM x TSK tile of
 * op(A) and a TSK x TSN tile of op(B) into local memory (k-major; zeros outside the matrices,
 * so no size needs to be a multiple of a tile; consecutive work-items read consecutive global
 * addresses in either layout), then every work-item accumulates its 4 x 8 block from local
 * memory: one float4 of A and one float8 of B per k, four float8 FMAs. Work-items outside C
 * compute on zeros and write nothing. */
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void sm_gemm(const uint M, const uint N, const uint K, const uint ta, const uint tb,
             __global const float* A, __global const float* B, __global float* C,
             __global const float* bias, __global const float* mask, __global float* sum,
             const uint flags) {
    __local float As[TSK * TSM];
    __local float Bs[TSK * TSN];
    const uint lc = get_local_id(0);
    const uint lr = get_local_id(1);
    const uint tid = lr * RTSN + lc;
    const uint m0 = get_group_id(1) * TSM;
    const uint n0 = get_group_id(0) * TSN;
    float8 acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    for (uint t = 0; t < K; t += TSK) {
        for (uint e = tid; e < TSM * TSK; e += WG_SIZE) {
            uint mm, kk;
            if (ta) {
                kk = e / TSM;
                mm = e % TSM;
            } else {
                mm = e / TSK;
                kk = e % TSK;
            }
            const uint gm = m0 + mm, gk = t + kk;
            float v = 0.0f;
            if (gm < M && gk < K) {
                v = ta ? A[(size_t)gk * M + gm] : A[(size_t)gm * K + gk];
            }
            As[kk * TSM + mm] = v;
        }
        for (uint e = tid; e < TSN * TSK; e += WG_SIZE) {
            uint nn, kk;
            if (tb) {
                nn = e / TSK;
                kk = e % TSK;
            } else {
                kk = e / TSN;
                nn = e % TSN;
            }
            const uint gn = n0 + nn, gk = t + kk;
            float v = 0.0f;
            if (gn < N && gk < K) {
                v = tb ? B[(size_t)gn * K + gk] : B[(size_t)gk * N + gn];
            }
            Bs[kk * TSN + nn] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint k = 0; k < TSK; ++k) {
            const float4 a = vload4(0, As + k * TSM + lr * WPTM);
            const float8 b = vload8(0, Bs + k * TSN + lc * WPTN);
            acc0 = fma((float8)(a.s0), b, acc0);
            acc1 = fma((float8)(a.s1), b, acc1);
            acc2 = fma((float8)(a.s2), b, acc2);
            acc3 = fma((float8)(a.s3), b, acc3);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float acc[WPTM][WPTN];
    vstore8(acc0, 0, acc[0]);
    vstore8(acc1, 0, acc[1]);
    vstore8(acc2, 0, acc[2]);
    vstore8(acc3, 0, acc[3]);
    for (uint i = 0; i < WPTM; ++i) {
        const uint gm = m0 + lr * WPTM + i;
        for (uint j = 0; j < WPTN; ++j) {
            const uint gn = n0 + lc * WPTN + j;
            if (gm < M && gn < N) {
                const size_t at = (size_t)gm * N + gn;
                C[at] = sm_epilogue(acc[i][j], bias, mask, at, gn, flags);
            }
        }
    }
    /* The column sums of A for this work-group's rows, by the work-groups of the first
     * column tile. */
    if ((flags & SM_SUM) && get_group_id(0) == 0) {
        for (uint r = tid; r < TSM; r += WG_SIZE) {
            const uint gm = m0 + r;
            if (gm < M) {
                float s = 0.0f;
                for (uint k = 0; k < K; ++k) {
                    s += ta ? A[(size_t)k * M + gm] : A[(size_t)gm * K + k];
                }
                sum[gm] = s;
            }
        }
    }
}

/* Register-blocked GEMM for CPU devices (no local memory, no barrier): a work-item computes
 * SM_RB_M rows x 32 columns of C over the whole K, in 2 x SM_RB_M float16 accumulators: per k,
 * one row of 32 values of op(B) (two float16) and one broadcast value of op(A) per row,
 * 2 x SM_RB_M FMAs (16 columns per work-item made it 8 FMAs for 9 loads). A CPU
 * runtime runs a work-group as a loop over its work-items, so local memory would only be one
 * more copy, and a barrier would spill the accumulators at every K step; without them the
 * accumulators stay in registers. No size is padded: a block at an edge of C (fewer than 32
 * columns or SM_RB_M rows, as the 3 classes or 2 features of a small MLP) loads what exists and
 * zeros, K is walked exactly. Work-items past C return at once (the grid is rounded up to the
 * work-group). TA and TB are constants in each kernel below, so every branch on them folds. */
#define SM_RB_M 8
/* The column sums of A (stored k-major, ta) for rows m0..m0+mm of C, written to sum: one
 * accumulator per row, k ascending (sm_col_sum's order, so bit for bit its result). */
__attribute__((always_inline)) inline void sm_rb_col_sum(const uint M, const uint K, const uint m0, const uint mm,
                          __global const float* A, __global float* sum) {
    float s[SM_RB_M];
#pragma unroll
    for (uint i = 0; i < SM_RB_M; ++i) {
        s[i] = 0.0f;
    }
    for (uint k = 0; k < K; ++k) {
#pragma unroll
        for (uint i = 0; i < SM_RB_M; ++i) {
            s[i] += i < mm ? A[(size_t)k * M + m0 + i] : 0.0f;
        }
    }
    for (uint i = 0; i < mm; ++i) {
        sum[m0 + i] = s[i];
    }
}

/* Stores the mm x nn block of C at (m0, n0) from its accumulators, through the epilogue. */
__attribute__((always_inline)) inline void sm_rb_store(const float16* acc, const uint N, const uint m0, const uint n0,
                        const uint mm, const uint nn, __global float* C,
                        __global const float* bias, __global const float* mask,
                        const uint flags) {
    if (nn == 16) {
        /* The epilogue of sm_epilogue on 16 columns at once (the same select). */
        const float16 bv = (flags & SM_BIAS) ? vload16(0, bias + n0) : (float16)(0.0f);
#pragma unroll
        for (uint i = 0; i < SM_RB_M; ++i) {
            if (i < mm) {
                float16 v = (flags & SM_BIAS) ? acc[i] + bv : acc[i];
                if (flags & SM_RELU) {
                    v = select((float16)(0.0f), v, v > 0.0f);
                }
                if (flags & SM_MASK) {
                    const float16 y = vload16(0, mask + (size_t)(m0 + i) * N + n0);
                    v = select((float16)(0.0f), v, y > 0.0f);
                }
#if defined(SM_USER_VECTOR)
                /* A user's activation or its gradient on 16 lanes at once. */
                if (flags & SM_ACT) {
                    v = sm_user_act16(v);
                }
                if (flags & SM_DACT) {
                    v = sm_user_act_grad16(v, vload16(0, mask + (size_t)(m0 + i) * N + n0));
                }
#elif defined(SM_USER_EPILOGUE)
                /* A body that does not compile on vectors: lane by lane. */
                if (flags & (SM_ACT | SM_DACT)) {
                    float t[16];
                    vstore16(v, 0, t);
                    const size_t row = (size_t)(m0 + i) * N + n0;
                    if (flags & SM_ACT) {
#pragma unroll
                        for (uint j = 0; j < 16; ++j) {
                            t[j] = sm_user_act(t[j]);
                        }
                    } else {
#pragma unroll
                        for (uint j = 0; j < 16; ++j) {
                            t[j] = sm_user_act_grad(t[j], mask[row + j]);
                        }
                    }
                    v = vload16(0, t);
                }
#endif
                vstore16(v, 0, C + (size_t)(m0 + i) * N + n0);
            }
        }
        return;
    }
#pragma unroll
    for (uint i = 0; i < SM_RB_M; ++i) {
        if (i < mm) {
            float t[16];
            vstore16(acc[i], 0, t);
            const size_t row = (size_t)(m0 + i) * N + n0;
            for (uint j = 0; j < nn; ++j) {
                C[row + j] = sm_epilogue(t[j], bias, mask, row + j, n0 + j, flags);
            }
        }
    }
}
inline void sm_gemm_rb(const uint M, const uint N, const uint K, const bool TA, const bool TB,
                       __global const float* A, __global const float* B, __global float* C,
                       __global const float* bias, __global const float* mask,
                       __global float* sum, const uint flags) {
    const uint n0 = get_global_id(0) * 32;
    const uint m0 = get_global_id(1) * SM_RB_M;
    if (n0 >= N || m0 >= M) {
        return;
    }
    const uint nn = min(32u, N - n0);
    const uint mm = min((uint)SM_RB_M, M - m0);
    if (TA && (flags & SM_SUM) && n0 == 0) {
        sm_rb_col_sum(M, K, m0, mm, A, sum);
    }
    float16 acc0[SM_RB_M], acc1[SM_RB_M];
#pragma unroll
    for (uint i = 0; i < SM_RB_M; ++i) {
        acc0[i] = 0.0f;
        acc1[i] = 0.0f;
    }
    if (nn == 32 && mm == SM_RB_M) {
        for (uint k = 0; k < K; ++k) {
            float16 b0, b1;
            if (TB) {
                float t[32];
#pragma unroll
                for (uint j = 0; j < 32; ++j) {
                    t[j] = B[(size_t)(n0 + j) * K + k];
                }
                b0 = vload16(0, t);
                b1 = vload16(1, t);
            } else {
                b0 = vload16(0, B + (size_t)k * N + n0);
                b1 = vload16(0, B + (size_t)k * N + n0 + 16);
            }
#pragma unroll
            for (uint i = 0; i < SM_RB_M; ++i) {
                const float a = TA ? A[(size_t)k * M + m0 + i] : A[(size_t)(m0 + i) * K + k];
                acc0[i] = fma((float16)(a), b0, acc0[i]);
                acc1[i] = fma((float16)(a), b1, acc1[i]);
            }
        }
    } else {
        for (uint k = 0; k < K; ++k) {
            float t[32];
#pragma unroll
            for (uint j = 0; j < 32; ++j) {
                t[j] = j < nn ? (TB ? B[(size_t)(n0 + j) * K + k] : B[(size_t)k * N + n0 + j])
                              : 0.0f;
            }
            const float16 b0 = vload16(0, t), b1 = vload16(1, t);
#pragma unroll
            for (uint i = 0; i < SM_RB_M; ++i) {
                const float a = i < mm
                    ? (TA ? A[(size_t)k * M + m0 + i] : A[(size_t)(m0 + i) * K + k])
                    : 0.0f;
                acc0[i] = fma((float16)(a), b0, acc0[i]);
                acc1[i] = fma((float16)(a), b1, acc1[i]);
            }
        }
    }
    sm_rb_store(acc0, N, m0, n0, mm, min(16u, nn), C, bias, mask, flags);
    if (nn > 16) {
        sm_rb_store(acc1, N, m0, n0 + 16, mm, nn - 16, C, bias, mask, flags);
    }
}

#define SM_GEMM_RB(NAME, TA, TB)                                                              \
__kernel void NAME(const uint M, const uint N, const uint K, const uint ta, const uint tb,    \
                   __global const float* A, __global const float* B, __global float* C,       \
                   __global const float* bias, __global const float* mask,                   \
                   __global float* sum, const uint flags) {                                   \
    sm_gemm_rb(M, N, K, TA, TB, A, B, C, bias, mask, sum, flags);                             \
}
SM_GEMM_RB(sm_gemm_rb_nn, false, false)
SM_GEMM_RB(sm_gemm_rb_tn, true, false)
SM_GEMM_RB(sm_gemm_rb_nt, false, true)
SM_GEMM_RB(sm_gemm_rb_tt, true, true)

/* The register-blocked GEMM with op(B) transposed (B stored n-major: op(B)[k,n] = B[n*K + k]),
 * for CPU devices. sm_gemm_rb reads a row of op(B) as 32 loads K floats apart, a gather per k
 * for 16 FMAs. Here the SM_RBL_R work-items of a work-group share one 32-column block of C
 * (SM_RBL_R blocks of SM_RB_M rows each, the whole 64-row batch of a train step): at each
 * SM_RBL_K step of K they copy the block's 32 rows of B into local memory k-major (each
 * work-item reads whole rows, contiguous in memory), then each accumulates its SM_RB_M x 32
 * block from local memory exactly as sm_gemm_rb does (two vload16 per k, k ascending, one fma
 * chain per element: the same results bit for bit). A CPU runtime stores the accumulators at
 * each barrier, once per SM_RBL_K values of k. Work-items past C take part in the copies and
 * the barriers but compute nothing. */
#define SM_RBL_R 8
#define SM_RBL_K 128
inline void sm_gemm_rbl(const uint M, const uint N, const uint K, const bool TA,
                        __global const float* A, __global const float* B, __global float* C,
                        __global const float* bias, __global const float* mask,
                        __global float* sum, const uint flags, __local float* Bs) {
    const uint n0 = get_group_id(0) * 32;
    const uint r = get_local_id(1);
    const uint m0 = get_global_id(1) * SM_RB_M;
    const uint nn = min(32u, N - n0);
    const uint mm = m0 < M ? min((uint)SM_RB_M, M - m0) : 0u;
    if (TA && (flags & SM_SUM) && n0 == 0 && mm > 0) {
        sm_rb_col_sum(M, K, m0, mm, A, sum);
    }
    float16 acc0[SM_RB_M], acc1[SM_RB_M];
#pragma unroll
    for (uint i = 0; i < SM_RB_M; ++i) {
        acc0[i] = 0.0f;
        acc1[i] = 0.0f;
    }
    for (uint k0 = 0; k0 < K; k0 += SM_RBL_K) {
        const uint kk = min((uint)SM_RBL_K, K - k0);
        /* 32 rows of B, 32 / SM_RBL_R per work-item; zeros past N. */
        for (uint j = r; j < 32; j += SM_RBL_R) {
            if (j < nn) {
                __global const float* row = B + (size_t)(n0 + j) * K + k0;
                for (uint k = 0; k < kk; ++k) {
                    Bs[k * 32 + j] = row[k];
                }
            } else {
                for (uint k = 0; k < kk; ++k) {
                    Bs[k * 32 + j] = 0.0f;
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (mm == SM_RB_M) {
            for (uint k = 0; k < kk; ++k) {
                const float16 b0 = vload16(2 * k, Bs), b1 = vload16(2 * k + 1, Bs);
#pragma unroll
                for (uint i = 0; i < SM_RB_M; ++i) {
                    const uint kg = k0 + k;
                    const float a = TA ? A[(size_t)kg * M + m0 + i] : A[(size_t)(m0 + i) * K + kg];
                    acc0[i] = fma((float16)(a), b0, acc0[i]);
                    acc1[i] = fma((float16)(a), b1, acc1[i]);
                }
            }
        } else if (mm > 0) {
            for (uint k = 0; k < kk; ++k) {
                const float16 b0 = vload16(2 * k, Bs), b1 = vload16(2 * k + 1, Bs);
#pragma unroll
                for (uint i = 0; i < SM_RB_M; ++i) {
                    const uint kg = k0 + k;
                    const float a = i < mm
                        ? (TA ? A[(size_t)kg * M + m0 + i] : A[(size_t)(m0 + i) * K + kg])
                        : 0.0f;
                    acc0[i] = fma((float16)(a), b0, acc0[i]);
                    acc1[i] = fma((float16)(a), b1, acc1[i]);
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (mm > 0) {
        sm_rb_store(acc0, N, m0, n0, mm, min(16u, nn), C, bias, mask, flags);
        if (nn > 16) {
            sm_rb_store(acc1, N, m0, n0 + 16, mm, nn - 16, C, bias, mask, flags);
        }
    }
}

#define SM_GEMM_RBL(NAME, TA)                                                                 \
__kernel __attribute__((reqd_work_group_size(1, SM_RBL_R, 1)))                              \
void NAME(const uint M, const uint N, const uint K, const uint ta, const uint tb,             \
          __global const float* A, __global const float* B, __global float* C,                \
          __global const float* bias, __global const float* mask, __global float* sum,       \
          const uint flags) {                                                                 \
    __local float Bs[SM_RBL_K * 32];                                                          \
    sm_gemm_rbl(M, N, K, TA, A, B, C, bias, mask, sum, flags, Bs);                            \
}
SM_GEMM_RBL(sm_gemm_rbl_nt, false)
SM_GEMM_RBL(sm_gemm_rbl_tt, true)

/* out[j] = sum_i X[i*cols + j]: one work-item per column. */
__kernel void sm_col_sum(const uint rows, const uint cols, __global const float* X,
                         __global float* out) {
    const uint j = get_global_id(0);
    if (j >= cols) {
        return;
    }
    float acc = 0.0f;
    for (uint i = 0; i < rows; ++i) {
        acc += X[(size_t)i * cols + j];
    }
    out[j] = acc;
}

/* y = max(x, 0); x and y may be the same buffer. */
__kernel void sm_relu(const ulong n, __global const float* x, __global float* y) {
    SM_FOR_EACH(i, n) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

/* dx = y > 0 ? dy : 0; dy and dx may be the same buffer. */
__kernel void sm_relu_grad(const ulong n, __global const float* y, __global const float* dy,
                           __global float* dx) {
    SM_FOR_EACH(i, n) {
        /* dy is loaded whatever y is: a select, not a branch around a load, which a CPU
         * runtime can vectorize. */
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

/* y = value. */
__kernel void sm_fill(const ulong n, const float value, __global float* y) {
    SM_FOR_EACH(i, n) {
        y[i] = value;
    }
}

/* Sums `acc` over the work-group (local size a power of two); work-item 0 gets the total. */
float sm_group_sum(float acc, __local float* scratch) {
    const uint lid = get_local_id(0);
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = get_local_size(0) / 2; s > 0; s >>= 1) {
        if (lid < s) {
            scratch[lid] += scratch[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return scratch[0];
}

/* One work-group. Row i: P = softmax(X) with the row maximum subtracted first; its loss is
 * log(sum exp(x - max)) - (x[label] - max) = -log P[label], without ever taking log(0).
 * An out-of-range label makes the loss NaN (checking would need a read-back).
 * loss[0] = mean over the rows (0 when N == 0). In the same pass (a fused SoftmaxWithLoss +
 * Accuracy + SoftmaxWithLossGradient), on the P just written, with the expressions of
 * sm_accuracy and sm_softmax_loss_grad (bit for bit theirs): the accuracy of P into A[0] when
 * flags bit 0, and dX = (P - onehot(label)) / N when flags bit 1. */
__kernel void sm_softmax_loss(const uint N, const uint C, __global const float* X,
                              __global const int* labels, __global float* P,
                              __global float* loss, __global float* A, const uint top_k,
                              __global float* dX, __global float* S, const uint flags,
                              __local float* scratch) {
    const float scale = 1.0f / (float)N;
    float right = 0.0f;
    float acc = 0.0f;
    for (uint i = get_local_id(0); i < N; i += get_local_size(0)) {
        __global const float* x = X + (size_t)i * C;
        __global float* p = P + (size_t)i * C;
        float m = -INFINITY;
        for (uint j = 0; j < C; ++j) {
            m = fmax(m, x[j]);
        }
        float s = 0.0f;
        for (uint j = 0; j < C; ++j) {
            const float e = exp(x[j] - m);
            p[j] = e;
            s += e;
        }
        const float inv = 1.0f / s;
        for (uint j = 0; j < C; ++j) {
            p[j] *= inv;
        }
        const int l = labels[i];
        const bool ok = l >= 0 && (uint)l < C;
        acc += ok ? log(s) - (x[l] - m) : NAN;
        if (flags & 1u) {
            if (!ok) {
                right += NAN;
            } else {
                const float v = p[l];
                uint greater = 0;
                for (uint j = 0; j < C && greater < top_k; ++j) {
                    greater += p[j] > v ? 1 : 0;
                }
                right += greater < top_k ? 1.0f : 0.0f;
            }
        }
        if (flags & 2u) {
            __global float* dx = dX + (size_t)i * C;
            for (uint j = 0; j < C; ++j) {
                float g = p[j];
                if (!ok) {
                    g = NAN;
                } else if ((uint)l == j) {
                    g -= 1.0f;
                }
                dx[j] = g * scale;
            }
        }
    }
    const float total = sm_group_sum(acc, scratch);
    if (get_local_id(0) == 0) {
        loss[0] = N > 0 ? total / (float)N : 0.0f;
        if (flags & 4u) {
            S[0] = loss[0];
        }
    }
    if (flags & 1u) {
        /* Every work-item has read scratch[0] before it is written again. */
        barrier(CLK_LOCAL_MEM_FENCE);
        const float correct = sm_group_sum(right, scratch);
        if (get_local_id(0) == 0) {
            A[0] = N > 0 ? correct / (float)N : 0.0f;
            if (flags & 4u) {
                S[1] = A[0];
            }
        }
    }
}

/* dX = (P - onehot(label)) * dloss / N, dloss = dloss_buf[0] when has_dloss, else 1. */
__kernel void sm_softmax_loss_grad(const uint N, const uint C, __global const float* P,
                                   __global const int* labels, __global const float* dloss_buf,
                                   const uint has_dloss, __global float* dX) {
    const float scale = (has_dloss ? dloss_buf[0] : 1.0f) / (float)N;
    const ulong n = (ulong)N * C;
    SM_FOR_EACH(idx, n) {
        const uint i = (uint)(idx / C);
        const uint j = (uint)(idx % C);
        const int l = labels[i];
        float g = P[idx];
        if (l < 0 || (uint)l >= C) {
            g = NAN;
        } else if ((uint)l == j) {
            g -= 1.0f;
        }
        dX[idx] = g * scale;
    }
}

/* One work-group. Row i is correct when fewer than top_k scores are strictly greater than the
 * label's score (Caffe2's rule: ties count as correct). out[0] = fraction correct (0 when
 * N == 0); an out-of-range label makes it NaN. */
__kernel void sm_accuracy(const uint N, const uint C, const uint top_k, __global const float* X,
                          __global const int* labels, __global float* out,
                          __local float* scratch) {
    float acc = 0.0f;
    for (uint i = get_local_id(0); i < N; i += get_local_size(0)) {
        __global const float* x = X + (size_t)i * C;
        const int l = labels[i];
        if (l < 0 || (uint)l >= C) {
            acc += NAN;
            continue;
        }
        const float v = x[l];
        uint greater = 0;
        for (uint j = 0; j < C && greater < top_k; ++j) {
            greater += x[j] > v ? 1 : 0;
        }
        acc += greater < top_k ? 1.0f : 0.0f;
    }
    const float total = sm_group_sum(acc, scratch);
    if (get_local_id(0) == 0) {
        out[0] = N > 0 ? total / (float)N : 0.0f;
    }
}
"#;
