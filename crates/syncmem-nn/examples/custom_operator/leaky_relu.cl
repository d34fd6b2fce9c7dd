/* LeakyRelu and its gradient in OpenCL C, for the custom_operator example. Grid-stride loops:
 * any grid covers any n. */

/* y[i] = x[i] > 0 ? x[i] : alpha * x[i] */
__kernel void leaky_relu(const __global float* x, __global float* y, uint n, float alpha) {
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : alpha * v;
    }
}

/* dx[i] = y[i] > 0 ? dy[i] : alpha * dy[i], from the forward's output y (for alpha > 0 it has
 * the sign of the forward's input). */
__kernel void leaky_relu_grad(const __global float* y, const __global float* dy,
                              __global float* dx, uint n, float alpha) {
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) {
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : alpha * g;
    }
}
