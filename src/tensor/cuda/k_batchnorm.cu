// tensor/cuda/k_batchnorm.cu — BatchNorm's device kernels, the arithmetic
// of nn/batchnorm.c step for step: per-channel sums in double (one block per
// channel, fixed order), the statistics and running-statistics update in
// double, the elementwise parts in f32 with explicit rounding (__fmul_rn,
// __fadd_rn: no FMA contraction the CPU does not do).
#include "tensor/cuda/k_vision.h"
#include "tensor/cuda/k_reduce.cuh"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

static cudaStream_t stream(void) { return (cudaStream_t)px_cuda_compute_stream(); }

// Value v (0 <= v < N·S) of channel c in x seen as (N, C, S).
static __device__ __forceinline__ long long at(long long v, int c, int C, long long S) {
  const long long n = v / S;
  return (n * C + c) * S + (v - n * S);
}

static __global__ void stats_kernel(const float *__restrict__ x, long long N, int C, long long S, bool batch_stats,
                                    bool update_running, float eps, float momentum, float *running_mean,
                                    float *running_var, float *mean, float *istd) {
  __shared__ double buf[PX_K_RED_THREADS];
  const int c = blockIdx.x;
  if (!batch_stats) {
    if (threadIdx.x == 0) {
      mean[c] = running_mean[c];
      istd[c] = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
    }
    return;
  }
  const long long n = N * S;
  double acc = 0.0;
  for (long long v = threadIdx.x; v < n; v += PX_K_RED_THREADS) acc += x[at(v, c, C, S)];
  const double dmu = px_k_block_sum(acc, buf) / (double)n;
  acc = 0.0;
  for (long long v = threadIdx.x; v < n; v += PX_K_RED_THREADS) {
    const double d = x[at(v, c, C, S)] - dmu;
    acc += d * d;
  }
  const double ss = px_k_block_sum(acc, buf);
  if (threadIdx.x == 0) {
    mean[c] = (float)dmu;
    istd[c] = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    if (update_running) {
      const double mom = momentum;
      running_mean[c] = (float)(mom * dmu + (1.0 - mom) * running_mean[c]);
      running_var[c] = (float)(mom * (ss / (double)(n - 1)) + (1.0 - mom) * running_var[c]);
    }
  }
}

static __global__ void apply_kernel(const float *__restrict__ x, float *__restrict__ y, long long total, int C,
                                    long long S, const float *__restrict__ gamma, const float *__restrict__ beta,
                                    const float *__restrict__ mean, const float *__restrict__ istd) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int c = (int)((e / S) % C);
    const float alpha = __fmul_rn(gamma[c], istd[c]);
    const float shift = __fsub_rn(beta[c], __fmul_rn(mean[c], alpha));
    y[e] = __fadd_rn(__fmul_rn(x[e], alpha), shift);
  }
}

// One block per channel: Σ dy and Σ dy·(x - μ) (x - μ in f32) in double;
// the parameter gradients and dx's per-channel coefficients.
static __global__ void grad_sums_kernel(const float *__restrict__ x, const float *__restrict__ dy, long long N, int C,
                                        long long S, bool batch_stats, const float *__restrict__ gamma,
                                        const float *__restrict__ mean, const float *__restrict__ istd, float *dgamma,
                                        float *dbeta, float *coef) {
  __shared__ double buf[PX_K_RED_THREADS];
  const int c = blockIdx.x;
  const long long n = N * S;
  const float mu = mean[c];
  double g = 0.0, d = 0.0;
  for (long long v = threadIdx.x; v < n; v += PX_K_RED_THREADS) {
    const long long i = at(v, c, C, S);
    g += dy[i];
    d += (double)dy[i] * (double)__fsub_rn(x[i], mu);
  }
  const double sum_dy = px_k_block_sum(g, buf);
  const double dot = px_k_block_sum(d, buf);
  if (threadIdx.x == 0) {
    const float is = istd[c];
    dgamma[c] += (float)(dot * is);
    dbeta[c] += (float)sum_dy;
    coef[c] = batch_stats ? (float)(sum_dy / (double)n) : 0.0f;            /* mean_dy */
    coef[C + c] = batch_stats ? (float)(dot * is * is / (double)n) : 0.0f; /* proj */
    coef[2 * C + c] = __fmul_rn(gamma[c], is);                             /* scale */
  }
}

static __global__ void dx_kernel(const float *__restrict__ x, const float *__restrict__ dy, float *__restrict__ dx,
                                 long long total, int C, long long S, bool batch_stats, const float *__restrict__ mean,
                                 const float *__restrict__ coef) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int c = (int)((e / S) % C);
    const float scale = coef[2 * C + c];
    if (batch_stats) {
      const float t = __fsub_rn(dy[e], coef[c]);
      const float u = __fmul_rn(__fsub_rn(x[e], mean[c]), coef[C + c]);
      dx[e] = __fmul_rn(__fsub_rn(t, u), scale);
    } else {
      dx[e] = __fmul_rn(dy[e], scale);
    }
  }
}

extern "C" px_status px_k_bn_stats(const float *x, int64_t N, int C, int64_t S, bool batch_stats, bool update_running,
                                   float eps, float momentum, float *running_mean, float *running_var, float *mean,
                                   float *istd) {
  stats_kernel<<<C, PX_K_RED_THREADS, 0, stream()>>>(x, N, C, S, batch_stats, update_running, eps, momentum,
                                                     running_mean, running_var, mean, istd);
  return px_cuda_check_launch("BatchNorm statistics");
}

extern "C" px_status px_k_bn_apply(const float *x, float *y, int64_t N, int C, int64_t S, const float *gamma,
                                   const float *beta, const float *mean, const float *istd) {
  const long long total = (long long)N * C * S;
  apply_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(x, y, total, C, S, gamma, beta, mean, istd);
  return px_cuda_check_launch("BatchNorm forward");
}

extern "C" px_status px_k_bn_backward(const float *x, const float *dy, float *dx, int64_t N, int C, int64_t S,
                                      bool batch_stats, const float *gamma, const float *mean, const float *istd,
                                      float *dgamma, float *dbeta, float *coef) {
  grad_sums_kernel<<<C, PX_K_RED_THREADS, 0, stream()>>>(x, dy, N, C, S, batch_stats, gamma, mean, istd, dgamma, dbeta,
                                                         coef);
  px_status st = px_cuda_check_launch("BatchNorm gradient sums");
  if (st != PX_OK || !dx) return st;
  const long long total = (long long)N * C * S;
  dx_kernel<<<px_k_blocks(total), 256, 0, stream()>>>(x, dy, dx, total, C, S, batch_stats, mean, coef);
  return px_cuda_check_launch("BatchNorm dx");
}
