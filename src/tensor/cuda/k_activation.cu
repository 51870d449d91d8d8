// Pointwise activations on the device (src/nn/activation.c), the same
// formulas.  The tanh of Tanh and of GELU's tanh approximation is the CPU's
// px_tanhf (a rational function), ported with every operation rounded on
// its own (__fmul_rn, __fadd_rn: no fused multiply-add, which the CPU build
// never uses either), so those give the CPU's bits; expf and erff are
// CUDA's (within 2 ulp of the CPU's libm).
#include "tensor/cuda/k_transformer_b.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

namespace {

inline cudaStream_t stream() { return (cudaStream_t)px_cuda_compute_stream(); }

inline unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f
#define INV_SQRT_2 0.7071067811865476f

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

// src/tensor/internal.h's px_tanhf, operation for operation.
__device__ float tanh_rational(float x) {
  const float c = 7.90531110763549805f;
  float xc = x > c ? c : (x < -c ? -c : x);
  float x2 = mul(xc, xc);
  float p = -2.76076847742355e-16f;
  p = add(mul(p, x2), 2.00018790482477e-13f);
  p = add(mul(p, x2), -8.60467152213735e-11f);
  p = add(mul(p, x2), 5.12229709037114e-08f);
  p = add(mul(p, x2), 1.48572235717979e-05f);
  p = add(mul(p, x2), 6.37261928875436e-04f);
  p = add(mul(p, x2), 4.89352455891786e-03f);
  p = mul(p, xc);
  float q = 1.19825839466702e-06f;
  q = add(mul(q, x2), 1.18534705686654e-04f);
  q = add(mul(q, x2), 2.26843463243900e-03f);
  q = add(mul(q, x2), 4.89352518554385e-03f);
  float r = __fdiv_rn(p, q);
  return (x < 0.0004f && x > -0.0004f) ? x : r;
}

__device__ __forceinline__ float gelu_tanh_u(float v) {
  // √(2/π)·(v + c·v³), left to right as the CPU: ((c·v)·v)·v
  return mul(SQRT_2_OVER_PI, add(v, mul(mul(mul(GELU_C, v), v), v)));
}

__global__ void act_forward_kernel(int kind, const float *__restrict__ x, float *__restrict__ y, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = x[i];
    float out;
    switch (kind) {
    case PX_K_RELU: out = v > 0.0f ? v : 0.0f; break;
    case PX_K_TANH: out = tanh_rational(v); break;
    case PX_K_SIGMOID: out = __fdiv_rn(1.0f, add(1.0f, expf(-v))); break;
    case PX_K_GELU: out = mul(mul(0.5f, v), add(1.0f, erff(mul(v, INV_SQRT_2)))); break;
    default: out = mul(mul(0.5f, v), add(1.0f, tanh_rational(gelu_tanh_u(v)))); break;
    }
    y[i] = out;
  }
}

__global__ void act_backward_kernel(int kind, const float *__restrict__ s, const float *__restrict__ dy,
                                    float *__restrict__ dx, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = s[i], g = dy[i];
    float out;
    switch (kind) {
    case PX_K_RELU: out = v > 0.0f ? g : 0.0f; break;
    case PX_K_TANH: out = mul(g, sub(1.0f, mul(v, v))); break;
    case PX_K_SIGMOID: out = mul(mul(g, v), sub(1.0f, v)); break;
    case PX_K_GELU: {
      const float cdf = mul(0.5f, add(1.0f, erff(mul(v, INV_SQRT_2))));
      const float pdf = mul(0.3989422804014327f, expf(mul(mul(-0.5f, v), v)));
      out = mul(g, add(cdf, mul(v, pdf)));
      break;
    }
    default: {
      const float t = tanh_rational(gelu_tanh_u(v));
      const float du = mul(SQRT_2_OVER_PI, add(1.0f, mul(mul(mul(3.0f, GELU_C), v), v)));
      out = mul(g, add(mul(0.5f, add(1.0f, t)), mul(mul(mul(0.5f, v), sub(1.0f, mul(t, t))), du)));
      break;
    }
    }
    dx[i] = out;
  }
}

}  // namespace

extern "C" px_status px_k_activation_forward(int kind, const float *x, float *y, size_t n) {
  if (kind < PX_K_RELU || kind > PX_K_GELU_TANH) return px_error(PX_ERR_INVALID, "activation: unknown kind %d", kind);
  if (n == 0) return PX_OK;
  act_forward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(kind, x, y, n);
  return px_cuda_check_launch("activation forward");
}

extern "C" px_status px_k_activation_backward(int kind, const float *saved, const float *dy, float *dx, size_t n) {
  if (kind < PX_K_RELU || kind > PX_K_GELU_TANH) return px_error(PX_ERR_INVALID, "activation: unknown kind %d", kind);
  if (n == 0) return PX_OK;
  act_backward_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(kind, saved, dy, dx, n);
  return px_cuda_check_launch("activation backward");
}
