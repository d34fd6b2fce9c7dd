/* LeakyRelu and its gradient in CUDA C, for the custom_operator example: the twins of
 * leaky_relu.cl, compiled by NVRTC (extern "C": the PTX entries keep these names). */

/* y[i] = x[i] > 0 ? x[i] : alpha * x[i] */
extern "C" __global__ void leaky_relu(const float* x, float* y, unsigned int n, float alpha) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : alpha * v;
    }
}

/* dx[i] = y[i] > 0 ? dy[i] : alpha * dy[i], from the forward's output y. */
extern "C" __global__ void leaky_relu_grad(const float* y, const float* dy, float* dx,
                                           unsigned int n, float alpha) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : alpha * g;
    }
}
