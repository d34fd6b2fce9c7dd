/* MomentumSGD's update in CUDA C: the twin of momentum.cl, compiled by NVRTC (extern "C": the
 * PTX entry keeps its name). Grid-stride loop: element i < n only.
 * Every product and sum is rounded on its own (__fmul_rn, __fadd_rn: never contracted into a
 * fused multiply-add), as the host closure rounds them, so an update offloaded to the host
 * gives these bits. */
extern "C" __global__ void momentum_sgd_update(float* p, const float* g, float* m,
                                               unsigned int n, float lr, float momentum,
                                               int nesterov) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float mi = m[i];
        const float mn = __fadd_rn(__fmul_rn(momentum, mi), __fmul_rn(lr, g[i]));
        m[i] = mn;
        const float step =
            nesterov ? __fsub_rn(__fmul_rn(__fadd_rn(1.0f, momentum), mn), __fmul_rn(momentum, mi))
                     : mn;
        p[i] = __fsub_rn(p[i], step);
    }
}
