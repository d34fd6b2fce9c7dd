/* Adam's update in OpenCL C (Caffe2's Adam). Grid-stride loop: any grid covers any n;
 * element i < n only. lr_t is the learning rate with this step's bias correction,
 * lr * sqrt(1 - beta2^t) / (1 - beta1^t), computed once per step on the host; beta is
 * (beta1, beta2), one argument for both: eight arguments in all, which a launch on the cpu
 * device passes without a heap allocation.
 *
 *   m' = beta1 * m + (1 - beta1) * g
 *   v' = beta2 * v + (1 - beta2) * g * g
 *   p -= lr_t * m' / (sqrt(v') + epsilon)
 *
 * Each product and sum is rounded on its own (no contraction into a fused multiply-add), and
 * the program is built with -cl-fp32-correctly-rounded-divide-sqrt, as the host closure
 * rounds: an update offloaded to the host gives these bits.
 */
#pragma OPENCL FP_CONTRACT OFF
__kernel void adam_update(__global float* p, const __global float* g, __global float* m,
                          __global float* v, uint n, float2 beta, float epsilon,
                          float lr_t) {
    for (size_t i = get_global_id(0); i < n; i += get_global_size(0)) {
        const float gi = g[i];
        const float mi = beta.x * m[i] + (1.0f - beta.x) * gi;
        const float vi = beta.y * v[i] + (1.0f - beta.y) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr_t * mi / (sqrt(vi) + epsilon);
    }
}
