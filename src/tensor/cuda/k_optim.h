/* tensor/cuda/k_optim.h — the optimizers' update kernels over device
 * buffers (internal; src/optim/optim.c calls them for a device optimizer).
 *
 * Each launcher updates one segment, n elements of params, grads and state
 * (device pointers), on the calling thread's compute stream, with the same
 * formulas and order of operations as the CPU loops of optim.c: every
 * product, sum, quotient and square root is rounded on its own (__fmul_rn,
 * __fadd_rn, __fdiv_rn, __fsqrt_rn: no contraction to FMA), so an element
 * gets the CPU's bits.  Scalars (the bias corrections, the first-step
 * momentum factors) are computed on the host exactly as the CPU does and
 * passed in.  Returns px_status of the launch (px_cuda_check_launch). */
#ifndef PX_TENSOR_CUDA_K_OPTIM_H
#define PX_TENSOR_CUDA_K_OPTIM_H

#include "plexus/base.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Plain SGD (no state):  d = g + wd·p;  p = p - lr·d. */
px_status px_cuda_sgd_plain(float *p, const float *g, size_t n, float lr, float wd);
/* SGD with momentum buffer buf:  d = g + wd·p;  b = keep·buf + take·d;
 * buf = b;  p = p - lr·(d + mom·b) (nesterov) or p - lr·b. */
px_status px_cuda_sgd_momentum(float *p, const float *g, float *buf, size_t n, float lr, float wd, float mom,
                               float keep, float take, bool nesterov);
/* Adam / AdamW (optim.c's adam_segment):
 *   pi = p·decay;  d = g + l2·pi;  m = m·b1 + c1·d;  v = v·b2 + c2·d·d;
 *   p = pi + neg_step_size·m / (sqrt(v) / bc2_sqrt + eps). */
px_status px_cuda_adam(float *p, const float *g, float *m, float *v, size_t n, float decay, float l2, float b1,
                       float b2, float eps, float c1, float c2, float neg_step_size, float bc2_sqrt);

/* *out = whether p is device memory (cudaPointerGetAttributes: device or
 * managed); host memory, registered or not, is false.  NULL is false. */
px_status px_cuda_is_device_memory(const void *p, bool *out);

#ifdef __cplusplus
}
#endif
#endif
