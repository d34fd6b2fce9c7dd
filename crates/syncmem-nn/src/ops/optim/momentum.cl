/* MomentumSGD's update in OpenCL C (Caffe2's MomentumSGDUpdate, without writing the adjusted
 * gradient back). Grid-stride loop: any grid covers any n; element i < n only.
 *
 *   m' = momentum * m + lr * g
 *   p -= m'                                  (nesterov = 0)
 *   p -= (1 + momentum) * m' - momentum * m  (nesterov = 1)
 *
 * Each product and sum is rounded on its own (no contraction into a fused multiply-add), as
 * the host closure rounds them: an update offloaded to the host gives these bits.
 */
#pragma OPENCL FP_CONTRACT OFF
__kernel void momentum_sgd_update(__global float* p, const __global float* g,
                                  __global float* m, uint n, float lr, float momentum,
                                  int nesterov) {
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) {
        const float mi = m[i];
        const float mn = momentum * mi + lr * g[i];
        m[i] = mn;
        p[i] -= nesterov ? (1.0f + momentum) * mn - momentum * mi : mn;
    }
}
