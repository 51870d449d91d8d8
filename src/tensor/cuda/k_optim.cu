// The optimizers' update kernels (k_optim.h): one thread per element, a
// grid-stride loop, every operation rounded on its own so the bits match
// optim.c's CPU loops (which ISO C compiles without FMA contraction).
#include "tensor/cuda/k_optim.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  const size_t most = 65535u * 8u;  // the grid-stride loop covers the rest
  return (unsigned)(b < most ? (b ? b : 1) : most);
}

__global__ void sgd_plain_kernel(float *__restrict__ p, const float *__restrict__ g, size_t n, float lr, float wd) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float pi = p[i];
    const float d = __fadd_rn(g[i], __fmul_rn(wd, pi));
    p[i] = __fsub_rn(pi, __fmul_rn(lr, d));
  }
}

__global__ void sgd_momentum_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ buf,
                                    size_t n, float lr, float wd, float mom, float keep, float take, bool nesterov) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float pi = p[i];
    const float d = __fadd_rn(g[i], __fmul_rn(wd, pi));
    const float b = __fadd_rn(__fmul_rn(keep, buf[i]), __fmul_rn(take, d));
    buf[i] = b;
    const float step = nesterov ? __fadd_rn(d, __fmul_rn(mom, b)) : b;
    p[i] = __fsub_rn(pi, __fmul_rn(lr, step));
  }
}

__global__ void adam_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                            float *__restrict__ v, size_t n, float decay, float l2, float b1, float b2, float eps,
                            float c1, float c2, float neg_step_size, float bc2_sqrt) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float pi = __fmul_rn(p[i], decay);
    const float d = __fadd_rn(g[i], __fmul_rn(l2, pi));
    const float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(c1, d));
    const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(c2, d), d));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
  }
}

cudaStream_t stream() { return (cudaStream_t)px_cuda_compute_stream(); }

}  // namespace

extern "C" px_status px_cuda_sgd_plain(float *p, const float *g, size_t n, float lr, float wd) {
  if (n == 0) return PX_OK;
  sgd_plain_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(p, g, n, lr, wd);
  return px_cuda_check_launch("sgd update kernel");
}

extern "C" px_status px_cuda_sgd_momentum(float *p, const float *g, float *buf, size_t n, float lr, float wd, float mom,
                                          float keep, float take, bool nesterov) {
  if (n == 0) return PX_OK;
  sgd_momentum_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(p, g, buf, n, lr, wd, mom, keep, take, nesterov);
  return px_cuda_check_launch("sgd momentum update kernel");
}

extern "C" px_status px_cuda_adam(float *p, const float *g, float *m, float *v, size_t n, float decay, float l2,
                                  float b1, float b2, float eps, float c1, float c2, float neg_step_size,
                                  float bc2_sqrt) {
  if (n == 0) return PX_OK;
  adam_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(p, g, m, v, n, decay, l2, b1, b2, eps, c1, c2, neg_step_size,
                                                        bc2_sqrt);
  return px_cuda_check_launch("adam update kernel");
}

extern "C" px_status px_cuda_is_device_memory(const void *p, bool *out) {
  *out = false;
  if (!p) return PX_OK;
  cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: a plain host pointer is not an error
    return px_error(PX_ERR_INVALID, "cuda: cudaPointerGetAttributes(%p): %s", p, cudaGetErrorString(e));
  }
  *out = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  return PX_OK;
}
