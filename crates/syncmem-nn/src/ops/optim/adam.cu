/* Adam's update in CUDA C: the twin of adam.cl, compiled by NVRTC (extern "C": the PTX entry
 * keeps its name). Grid-stride loop: element i < n only.
 * Every operation is rounded on its own and correctly (__fmul_rn, __fadd_rn, __fdiv_rn,
 * __fsqrt_rn: no fused multiply-add, whatever -use_fast_math says), as the host closure rounds
 * them, so an update offloaded to the host gives these bits. */
extern "C" __global__ void adam_update(float* p, const float* g, float* m, float* v,
                                       unsigned int n, float2 beta, float epsilon,
                                       float lr_t) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float gi = g[i];
        const float mi = __fadd_rn(__fmul_rn(beta.x, m[i]), __fmul_rn(__fsub_rn(1.0f, beta.x), gi));
        const float vi = __fadd_rn(__fmul_rn(beta.y, v[i]),
                                   __fmul_rn(__fmul_rn(__fsub_rn(1.0f, beta.y), gi), gi));
        m[i] = mi;
        v[i] = vi;
        const float step = __fdiv_rn(__fmul_rn(lr_t, mi), __fadd_rn(__fsqrt_rn(vi), epsilon));
        p[i] = __fsub_rn(p[i], step);
    }
}
