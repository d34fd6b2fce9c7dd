//! CUDA C sources, compiled by NVRTC at run time: the operator kernels ([`OPS`]) and the math
//! kernels of parameter blobs ([`MATH`], every kernel once for `float` (`_f32`) and once for
//! `double` (`_f64`); grid-stride loops, so any `n` works with any grid size).

/// Threads per block of the one-dimensional kernels (must match `SM_BLOCK` in [`OPS`]).
pub(super) const BLOCK: u32 = 256;
/// GEMM tile of C per block, rows (must match `SM_TM`).
pub(super) const TILE_M: usize = 64;
/// GEMM tile of C per block, columns (must match `SM_TN`).
pub(super) const TILE_N: usize = 64;
/// GEMM threads per block along x (columns) and y (rows) (must match `SM_BX`, `SM_BY`).
pub(super) const GEMM_THREADS: (u32, u32) = (16, 16);

/// The operator kernels (`float`, labels `int`), the twins of the OpenCL ones kernel for
/// kernel. No `#include` (NVRTC has no standard headers): infinity and NaN are spelled with
/// `__int_as_float`.
pub(super) const OPS: &str = r#"
#define SM_BLOCK 256

/* GEMM tiling: a block of SM_BX x SM_BY threads owns an SM_TM x SM_TN tile of C and walks K in
 * steps of SM_TK. Each thread computes SM_RM x SM_RN elements of C, strided by the block's
 * extent (rows ty + i * SM_BY, columns tx + j * SM_BX), so that a warp reads shared memory
 * without bank conflicts and writes C in runs of SM_BX consecutive floats. */
#define SM_TM 64
#define SM_TN 64
#define SM_TK 16
#define SM_BX 16
#define SM_BY 16
#define SM_RM (SM_TM / SM_BY)
#define SM_RN (SM_TN / SM_BX)
#define SM_THREADS (SM_BX * SM_BY)

#define SM_NEG_INF (-__int_as_float(0x7f800000))
#define SM_NAN __int_as_float(0x7fc00000)

/* C[M,N] = op(A)[M,K] * op(B)[K,N], then bias[n] added when flags bit 0, and the ReLU when
 * flags bit 1 (a fused FC + Relu), with the select of sm_relu: NaN and -0 become 0; then, when
 * flags bit 2, the mask of a fused ReLU gradient: the value where mask[m*N + n] > 0, else 0.
 * When flags bit 3 (a fused bias gradient, with ta), the blocks of the first column tile also
 * write sum[m] = sum_k op(A)[m,k], the column sums of A as stored, one accumulator per row, k
 * ascending: the order of sm_col_sum, so bit for bit its result.
 *   op(A)[m,k] = ta ? A[k*M + m] : A[m*K + k]
 *   op(B)[k,n] = tb ? B[n*K + k] : B[k*N + n]
 * At each K step the block copies a SM_TM x SM_TK tile of op(A) and a SM_TK x SM_TN tile of
 * op(B) into shared memory (k-major, one float of padding per row against bank conflicts;
 * zeros outside the matrices, so no size needs to be a multiple of a tile; consecutive threads
 * read consecutive global addresses in either layout), synchronizes, accumulates in registers,
 * and synchronizes again. Block (x, y) computes the column tile x and the row tiles y,
 * y + gridDim.y, ... (the grid's y extent is limited to 65535). Threads outside C compute on
 * zeros and write nothing. */
extern "C" __global__ void sm_gemm(unsigned int M, unsigned int N, unsigned int K,
                                   unsigned int ta, unsigned int tb, const float* A,
                                   const float* B, float* C, const float* bias,
                                   const float* mask, float* sum, unsigned int flags) {
    __shared__ float As[SM_TK][SM_TM + 1];
    __shared__ float Bs[SM_TK][SM_TN + 1];
    const unsigned int tx = threadIdx.x;
    const unsigned int ty = threadIdx.y;
    const unsigned int tid = ty * SM_BX + tx;
    const unsigned int n0 = blockIdx.x * SM_TN;
    /* Not (M + SM_TM - 1) / SM_TM: that wraps for M near 2^32 and would skip every row. */
    const unsigned int tiles_m = M / SM_TM + (M % SM_TM != 0u);
    for (unsigned int bm = blockIdx.y; bm < tiles_m; bm += gridDim.y) {
        const unsigned int m0 = bm * SM_TM;
        float acc[SM_RM][SM_RN];
#pragma unroll
        for (int i = 0; i < SM_RM; ++i) {
#pragma unroll
            for (int j = 0; j < SM_RN; ++j) {
                acc[i][j] = 0.0f;
            }
        }
        for (unsigned int t = 0; t < K; t += SM_TK) {
            for (unsigned int e = tid; e < SM_TM * SM_TK; e += SM_THREADS) {
                unsigned int mm, kk;
                if (ta) {
                    kk = e / SM_TM;
                    mm = e % SM_TM;
                } else {
                    mm = e / SM_TK;
                    kk = e % SM_TK;
                }
                const unsigned int gm = m0 + mm;
                const unsigned int gk = t + kk;
                float v = 0.0f;
                if (gm < M && gk < K) {
                    v = ta ? A[(size_t)gk * M + gm] : A[(size_t)gm * K + gk];
                }
                As[kk][mm] = v;
            }
            for (unsigned int e = tid; e < SM_TN * SM_TK; e += SM_THREADS) {
                unsigned int nn, kk;
                if (tb) {
                    nn = e / SM_TK;
                    kk = e % SM_TK;
                } else {
                    kk = e / SM_TN;
                    nn = e % SM_TN;
                }
                const unsigned int gn = n0 + nn;
                const unsigned int gk = t + kk;
                float v = 0.0f;
                if (gn < N && gk < K) {
                    v = tb ? B[(size_t)gn * K + gk] : B[(size_t)gk * N + gn];
                }
                Bs[kk][nn] = v;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < SM_TK; ++k) {
                float a[SM_RM];
                float b[SM_RN];
#pragma unroll
                for (int i = 0; i < SM_RM; ++i) {
                    a[i] = As[k][ty + i * SM_BY];
                }
#pragma unroll
                for (int j = 0; j < SM_RN; ++j) {
                    b[j] = Bs[k][tx + j * SM_BX];
                }
#pragma unroll
                for (int i = 0; i < SM_RM; ++i) {
#pragma unroll
                    for (int j = 0; j < SM_RN; ++j) {
                        acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                    }
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < SM_RM; ++i) {
            const unsigned int gm = m0 + ty + i * SM_BY;
#pragma unroll
            for (int j = 0; j < SM_RN; ++j) {
                const unsigned int gn = n0 + tx + j * SM_BX;
                if (gm < M && gn < N) {
                    const size_t at = (size_t)gm * N + gn;
                    float v = (flags & 1u) ? acc[i][j] + bias[gn] : acc[i][j];
                    v = (flags & 2u) ? (v > 0.0f ? v : 0.0f) : v;
#ifdef SM_USER_EPILOGUE
                    /* A user's activation (bit 4) or its gradient from the activation's
                     * output in mask (bit 5), defined by the prelude of a user's epilogue. */
                    v = (flags & 16u) ? sm_user_act(v) : v;
                    v = (flags & 32u) ? sm_user_act_grad(v, mask[at]) : v;
#endif
                    C[at] = (flags & 4u) ? (mask[at] > 0.0f ? v : 0.0f) : v;
                }
            }
        }
        if ((flags & 8u) && blockIdx.x == 0u) {
            for (unsigned int r = tid; r < SM_TM; r += SM_THREADS) {
                const unsigned int gm = m0 + r;
                if (gm < M) {
                    float s = 0.0f;
                    for (unsigned int k = 0; k < K; ++k) {
                        s += ta ? A[(size_t)k * M + gm] : A[(size_t)gm * K + k];
                    }
                    sum[gm] = s;
                }
            }
        }
    }
}

/* out[j] = sum_i X[i*cols + j]: one thread per column. */
extern "C" __global__ void sm_col_sum(unsigned int rows, unsigned int cols, const float* X,
                                      float* out) {
    const unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (j >= cols) {
        return;
    }
    float acc = 0.0f;
    for (unsigned int i = 0; i < rows; ++i) {
        acc += X[(size_t)i * cols + j];
    }
    out[j] = acc;
}

/* y = max(x, 0); x and y may be the same buffer. */
extern "C" __global__ void sm_relu(unsigned long long n, const float* x, float* y) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

/* dx = y > 0 ? dy : 0; dy and dx may be the same buffer. */
extern "C" __global__ void sm_relu_grad(unsigned long long n, const float* y, const float* dy,
                                        float* dx) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    }
}

/* y = value. */
extern "C" __global__ void sm_fill(unsigned long long n, float value, float* y) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = value;
    }
}

/* Sums `acc` over the block (blockDim.x == SM_BLOCK, a power of two); every thread gets the
 * total. Every thread of the block must call it. */
__device__ float sm_block_sum(float acc, float* scratch) {
    const unsigned int lid = threadIdx.x;
    scratch[lid] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (lid < s) {
            scratch[lid] += scratch[lid + s];
        }
        __syncthreads();
    }
    return scratch[0];
}

/* One block (fused with the accuracy and the gradient as sm_softmax_loss of the OpenCL
 * source: flags bit 0 writes the accuracy of P into A[0], bit 1 dX = (P - onehot) / N).
 * Row i: P = softmax(X) with the row maximum subtracted first; its loss is
 * log(sum exp(x - max)) - (x[label] - max) = -log P[label], without ever taking log(0).
 * An out-of-range label makes the loss NaN (checking would need a read-back).
 * loss[0] = mean over the rows (0 when N == 0). */
extern "C" __global__ void sm_softmax_loss(unsigned int N, unsigned int C, const float* X,
                                           const int* labels, float* P, float* loss, float* A,
                                           unsigned int top_k, float* dX, float* S,
                                           unsigned int flags) {
    __shared__ float scratch[SM_BLOCK];
    const float scale = 1.0f / (float)N;
    float right = 0.0f;
    float acc = 0.0f;
    for (unsigned long long i = threadIdx.x; i < N; i += blockDim.x) {
        const float* x = X + i * C;
        float* p = P + i * C;
        float m = SM_NEG_INF;
        for (unsigned int j = 0; j < C; ++j) {
            m = fmaxf(m, x[j]);
        }
        float s = 0.0f;
        for (unsigned int j = 0; j < C; ++j) {
            const float e = expf(x[j] - m);
            p[j] = e;
            s += e;
        }
        const float inv = 1.0f / s;
        for (unsigned int j = 0; j < C; ++j) {
            p[j] *= inv;
        }
        const int l = labels[i];
        const bool ok = l >= 0 && (unsigned int)l < C;
        acc += ok ? logf(s) - (x[l] - m) : SM_NAN;
        if (flags & 1u) {
            if (!ok) {
                right += SM_NAN;
            } else {
                const float v = p[l];
                unsigned int greater = 0;
                for (unsigned int j = 0; j < C && greater < top_k; ++j) {
                    greater += p[j] > v ? 1 : 0;
                }
                right += greater < top_k ? 1.0f : 0.0f;
            }
        }
        if (flags & 2u) {
            float* dx = dX + i * C;
            for (unsigned int j = 0; j < C; ++j) {
                float g = p[j];
                if (!ok) {
                    g = SM_NAN;
                } else if ((unsigned int)l == j) {
                    g -= 1.0f;
                }
                dx[j] = g * scale;
            }
        }
    }
    const float total = sm_block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        loss[0] = N > 0 ? total / (float)N : 0.0f;
        if (flags & 4u) {
            S[0] = loss[0];
        }
    }
    if (flags & 1u) {
        /* Every thread has read scratch[0] before it is written again. */
        __syncthreads();
        const float correct = sm_block_sum(right, scratch);
        if (threadIdx.x == 0) {
            A[0] = N > 0 ? correct / (float)N : 0.0f;
            if (flags & 4u) {
                S[1] = A[0];
            }
        }
    }
}

/* dX = (P - onehot(label)) * dloss / N, dloss = dloss_buf[0] when has_dloss, else 1. */
extern "C" __global__ void sm_softmax_loss_grad(unsigned int N, unsigned int C, const float* P,
                                                const int* labels, const float* dloss_buf,
                                                unsigned int has_dloss, float* dX) {
    const float scale = (has_dloss ? dloss_buf[0] : 1.0f) / (float)N;
    const unsigned long long n = (unsigned long long)N * C;
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         idx < n; idx += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int i = (unsigned int)(idx / C);
        const unsigned int j = (unsigned int)(idx % C);
        const int l = labels[i];
        float g = P[idx];
        if (l < 0 || (unsigned int)l >= C) {
            g = SM_NAN;
        } else if ((unsigned int)l == j) {
            g -= 1.0f;
        }
        dX[idx] = g * scale;
    }
}

/* One block. Row i is correct when fewer than top_k scores are strictly greater than the
 * label's score (Caffe2's rule: ties count as correct). out[0] = fraction correct (0 when
 * N == 0); an out-of-range label makes it NaN. */
extern "C" __global__ void sm_accuracy(unsigned int N, unsigned int C, unsigned int top_k,
                                       const float* X, const int* labels, float* out) {
    __shared__ float scratch[SM_BLOCK];
    float acc = 0.0f;
    for (unsigned long long i = threadIdx.x; i < N; i += blockDim.x) {
        const float* x = X + i * C;
        const int l = labels[i];
        if (l < 0 || (unsigned int)l >= C) {
            acc += SM_NAN;
            continue;
        }
        const float v = x[l];
        unsigned int greater = 0;
        for (unsigned int j = 0; j < C && greater < top_k; ++j) {
            greater += x[j] > v ? 1 : 0;
        }
        acc += greater < top_k ? 1.0f : 0.0f;
    }
    const float total = sm_block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        out[0] = N > 0 ? total / (float)N : 0.0f;
    }
}
"#;

/// Threads per block of the math kernels (must match `SM_BLOCK` in [`MATH`]).
pub(super) const MATH_BLOCK: u32 = 256;

/// The math kernels.
pub(super) const MATH: &str = r#"
#define SM_BLOCK 256

/* y + a * x with the product and the sum each rounded on its own (never contracted into a
 * fused multiply-add), as the host's axpy rounds them: SGD offloaded to the host gives these
 * bits. */
__device__ __forceinline__ float sm_axpy1(float a, float x, float y) {
    return __fadd_rn(y, __fmul_rn(a, x));
}
__device__ __forceinline__ double sm_axpy1(double a, double x, double y) {
    return __dadd_rn(y, __dmul_rn(a, x));
}

/* One pair of sm_axpy_multi: the grid-stride loop of sm_axpy over it. */
#define SM_AXPY_PAIR(N, X, Y)                                                                \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < (N); i += (unsigned long long)gridDim.x * blockDim.x) {                         \
        (Y)[i] = sm_axpy1(a, (X)[i], (Y)[i]);                                                \
    }

#define SM_KERNELS(T, SUF)                                                                   \
extern "C" __global__ void sm_axpy_##SUF(unsigned long long n, T a, const T* x, T* y) {      \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        y[i] = sm_axpy1(a, x[i], y[i]);                                                      \
    }                                                                                        \
}                                                                                            \
extern "C" __global__ void sm_scale_##SUF(unsigned long long n, T a, T* x) {                 \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;   \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        x[i] *= a;                                                                           \
    }                                                                                        \
}                                                                                            \
extern "C" __global__ void sm_axpy_multi_##SUF(                                              \
    T a, unsigned int count, unsigned long long n0, unsigned long long n1,                   \
    unsigned long long n2, unsigned long long n3, unsigned long long n4,                     \
    unsigned long long n5, unsigned long long n6, unsigned long long n7,                     \
    const T* x0, T* y0, const T* x1, T* y1,                                                  \
    const T* x2, T* y2, const T* x3, T* y3,                                                  \
    const T* x4, T* y4, const T* x5, T* y5,                                                  \
    const T* x6, T* y6, const T* x7, T* y7) {                                                \
    SM_AXPY_PAIR(n0, x0, y0)                                                                 \
    SM_AXPY_PAIR(n1, x1, y1)                                                                 \
    SM_AXPY_PAIR(n2, x2, y2)                                                                 \
    SM_AXPY_PAIR(n3, x3, y3)                                                                 \
    SM_AXPY_PAIR(n4, x4, y4)                                                                 \
    SM_AXPY_PAIR(n5, x5, y5)                                                                 \
    SM_AXPY_PAIR(n6, x6, y6)                                                                 \
    SM_AXPY_PAIR(n7, x7, y7)                                                                 \
}                                                                                            \
SM_REDUCE(T, sm_asum_##SUF, fabs(v))                                                         \
SM_REDUCE(T, sm_sumsq_##SUF, v * v)

/* One partial sum per block; blockDim.x == SM_BLOCK (a power of two). */
#define SM_REDUCE(T, NAME, EXPR)                                                             \
extern "C" __global__ void NAME(unsigned long long n, const T* x, T* partial) {              \
    __shared__ T scratch[SM_BLOCK];                                                          \
    const unsigned int lid = threadIdx.x;                                                    \
    T acc = (T)0;                                                                            \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + lid;           \
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {                           \
        const T v = x[i];                                                                    \
        acc += EXPR;                                                                         \
    }                                                                                        \
    scratch[lid] = acc;                                                                      \
    __syncthreads();                                                                         \
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {                                  \
        if (lid < s) {                                                                       \
            scratch[lid] += scratch[lid + s];                                                \
        }                                                                                    \
        __syncthreads();                                                                     \
    }                                                                                        \
    if (lid == 0) {                                                                          \
        partial[blockIdx.x] = scratch[0];                                                    \
    }                                                                                        \
}

SM_KERNELS(float, f32)
SM_KERNELS(double, f64)
"#;
