/* MomentumSGD's update in CUDA C: the twin of momentum.cl, compiled by NVRTC (extern "C": the
 * PTX entry keeps its name). Grid-stride loop: element i < n only. */
extern "C" __global__ void momentum_sgd_update(float* p, const float* g, float* m,
                                               unsigned int n, float lr, float momentum,
                                               int nesterov) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float mi = m[i];
        const float mn = momentum * mi + lr * g[i];
        m[i] = mn;
        p[i] -= nesterov ? (1.0f + momentum) * mn - momentum * mi : mn;
    }
}
