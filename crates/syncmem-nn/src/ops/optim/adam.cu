/* Adam's update in CUDA C: the twin of adam.cl, compiled by NVRTC (extern "C": the PTX entry
 * keeps its name). Grid-stride loop: element i < n only. */
extern "C" __global__ void adam_update(float* p, const float* g, float* m, float* v,
                                       unsigned int n, float2 beta, float epsilon,
                                       float lr_t) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float gi = g[i];
        const float mi = beta.x * m[i] + (1.0f - beta.x) * gi;
        const float vi = beta.y * v[i] + (1.0f - beta.y) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr_t * mi / (sqrtf(vi) + epsilon);
    }
}
