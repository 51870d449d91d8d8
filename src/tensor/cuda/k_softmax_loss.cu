// Softmax over the last dimension and cross-entropy on the device, as
// src/nn/softmax.c and src/nn/loss.c compute them: one block per row, block
// reductions for the row's max and sums (sums in double where the CPU sums
// in double), so the results match the CPU's to f32 rounding.
//
// Cross-entropy runs three kernels and one copy to the host:
//   ce_count   one block: rows whose target is not ignore_index, and the
//              first row whose target is not a class (an error, as on the CPU)
//   ce_rows    one block per row: ℓ_r (double) and dz_r, scaled by
//              1/valid read from ce_count's result on the device
//   ce_mean    one block: Σ ℓ_r in a fixed order, / valid
// so the loss is deterministic (no atomics) and the host waits once.
#include "tensor/cuda/k_transformer_a.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int kThreads = 256;

// Block-wide reductions (blockDim.x == kThreads); every thread gets the result.
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T *shm) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shm may still be read by a previous reduction
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  v = shm[0];
  for (int w = 1; w < kThreads / 32; w++) v = op(v, shm[w]);
  return v;
}

struct MaxF {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct AddF {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct AddL {
  __device__ long long operator()(long long a, long long b) const { return a + b; }
};
struct MinL {
  __device__ long long operator()(long long a, long long b) const { return b < a ? b : a; }
};

__global__ void softmax_fwd(const float *x, float *y, size_t R, size_t D) {
  __shared__ float shf[kThreads / 32];
  for (size_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float *xr = x + r * D;
    float *yr = y + r * D;
    float mx = -INFINITY;
    for (size_t j = threadIdx.x; j < D; j += kThreads) mx = xr[j] > mx ? xr[j] : mx;
    mx = block_reduce(mx, MaxF(), shf);
    float sum = 0.0f;
    for (size_t j = threadIdx.x; j < D; j += kThreads) {
      const float e = expf(xr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    sum = block_reduce(sum, AddF(), shf);
    const float inv = 1.0f / sum;
    for (size_t j = threadIdx.x; j < D; j += kThreads) yr[j] *= inv;
  }
}

__global__ void softmax_bwd(const float *y, const float *dy, float *dx, size_t R, size_t D) {
  __shared__ double shd[kThreads / 32];
  for (size_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float *yr = y + r * D, *gr = dy + r * D;
    float *out = dx + r * D;
    double dot = 0.0;
    for (size_t j = threadIdx.x; j < D; j += kThreads) dot += (double)gr[j] * yr[j];
    dot = block_reduce(dot, AddD(), shd);
    const float fdot = (float)dot;
    for (size_t j = threadIdx.x; j < D; j += kThreads) out[j] = yr[j] * (gr[j] - fdot);
  }
}

struct CeResult {
  long long valid;    // rows counted in the mean
  long long bad_row;  // first row with a target outside [0, C) (N when none)
  int bad_target;
  float loss;
};

__global__ void ce_count(const int32_t *targets, long long N, int C, int ignore_index, CeResult *res) {
  __shared__ long long shl[kThreads / 32];
  long long valid = 0, bad = N;
  for (long long r = threadIdx.x; r < N; r += kThreads) {
    const int32_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= C) {
      bad = r < bad ? r : bad;
      continue;
    }
    valid++;
  }
  valid = block_reduce(valid, AddL(), shl);
  bad = block_reduce(bad, MinL(), shl);
  if (threadIdx.x == 0) {
    res->valid = valid;
    res->bad_row = bad;
    res->bad_target = bad < N ? targets[bad] : 0;
    res->loss = 0.0f;
  }
}

// loss.c's ce_row: ℓ = (1-ε)(lse - z_t) + ε(lse - Σz/C),
// dz_j = (p_j - ε/C - (1-ε)[j = t]) / valid.  dz may alias z: every z_j a
// thread writes it has read itself, and z_t is read before the barrier
// that precedes the first write.
__global__ void ce_rows(const float *z, const int32_t *targets, long long N, int C, int ignore_index, float eps,
                        const CeResult *res, float *dz, double *row_loss) {
  __shared__ float shf[kThreads / 32];
  __shared__ double shd[kThreads / 32];
  const long long valid = res->valid;
  const bool ok = res->bad_row == N;
  const float inv_valid = valid ? 1.0f / (float)valid : 0.0f;
  for (long long r = blockIdx.x; r < N; r += gridDim.x) {
    const float *zr = z + r * C;
    float *dr = dz ? dz + r * C : nullptr;
    const int32_t t = targets[r];
    if (!ok || t == ignore_index) {
      if (dr)
        for (int j = threadIdx.x; j < C; j += kThreads) dr[j] = 0.0f;
      if (threadIdx.x == 0) row_loss[r] = 0.0;
      continue;
    }
    float zmax = -INFINITY;
    for (int j = threadIdx.x; j < C; j += kThreads) zmax = zr[j] > zmax ? zr[j] : zmax;
    zmax = block_reduce(zmax, MaxF(), shf);
    const float zt = zr[t];
    double sz = 0.0;
    if (eps != 0.0f) {
      for (int j = threadIdx.x; j < C; j += kThreads) sz += zr[j];
      sz = block_reduce(sz, AddD(), shd);
    }
    __syncthreads();  // every thread has read z_t (and z) before dz overwrites it
    double se = 0.0;
    for (int j = threadIdx.x; j < C; j += kThreads) {
      const float e = expf(zr[j] - zmax);
      if (dr) dr[j] = e;
      se += e;
    }
    se = block_reduce(se, AddD(), shd);
    if (dr) {
      const float a = (float)(1.0 / se) * inv_valid, b = eps / (float)C * inv_valid;
      for (int j = threadIdx.x; j < C; j += kThreads) {
        float g = dr[j] * a - b;
        if (j == t) g -= (1.0f - eps) * inv_valid;
        dr[j] = g;
      }
    }
    if (threadIdx.x == 0) {
      const double lse = zmax + log(se);
      row_loss[r] = (1.0 - eps) * (lse - zt) + eps * (lse - sz / C);
    }
  }
}

__global__ void ce_mean(const double *row_loss, long long N, CeResult *res) {
  __shared__ double shd[kThreads / 32];
  double s = 0.0;
  for (long long r = threadIdx.x; r < N; r += kThreads) s += row_loss[r];
  s = block_reduce(s, AddD(), shd);
  if (threadIdx.x == 0) res->loss = res->valid ? (float)(s / (double)res->valid) : 0.0f;
}

unsigned rows_grid(size_t R) { return R < 65535u * 16u ? (unsigned)R : 65535u * 16u; }

}  // namespace

extern "C" px_status px_cuda_softmax_forward(const float *x, float *y, size_t R, size_t D) {
  if (R == 0 || D == 0) return PX_OK;
  softmax_fwd<<<rows_grid(R), kThreads, 0, (cudaStream_t)px_cuda_compute_stream()>>>(x, y, R, D);
  return px_cuda_check_launch("softmax forward");
}

extern "C" px_status px_cuda_softmax_backward(const float *y, const float *dy, float *dx, size_t R, size_t D) {
  if (R == 0 || D == 0) return PX_OK;
  softmax_bwd<<<rows_grid(R), kThreads, 0, (cudaStream_t)px_cuda_compute_stream()>>>(y, dy, dx, R, D);
  return px_cuda_check_launch("softmax backward");
}

extern "C" px_status px_cuda_cross_entropy(const float *logits, const int32_t *targets, int64_t N, int C,
                                           int ignore_index, float label_smoothing, float *loss, float *dlogits) {
  if (N <= 0 || C <= 0) return px_error(PX_ERR_SHAPE, "cross_entropy: empty logits");
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  CeResult *res = (CeResult *)px_cuda_malloc(sizeof(CeResult));
  double *rows = (double *)px_cuda_malloc((size_t)N * sizeof(double));
  px_status st = res && rows ? PX_OK : PX_ERR_NOMEM;
  if (st == PX_OK) {
    ce_count<<<1, kThreads, 0, s>>>(targets, (long long)N, C, ignore_index, res);
    st = px_cuda_check_launch("cross_entropy (targets)");
  }
  if (st == PX_OK) {
    ce_rows<<<rows_grid((size_t)N), kThreads, 0, s>>>(logits, targets, (long long)N, C, ignore_index, label_smoothing,
                                                      res, dlogits, rows);
    st = px_cuda_check_launch("cross_entropy (rows)");
  }
  if (st == PX_OK) {
    ce_mean<<<1, kThreads, 0, s>>>(rows, (long long)N, res);
    st = px_cuda_check_launch("cross_entropy (mean)");
  }
  CeResult h = {};
  if (st == PX_OK) st = px_cuda_to_host(&h, res, sizeof h);
  px_cuda_free(rows);
  px_cuda_free(res);
  if (st != PX_OK) return st;
  if (h.bad_row < N)
    return px_error(PX_ERR_INVALID, "cross_entropy: target %d of row %lld is not a class in [0, %d)", h.bad_target,
                    h.bad_row, C);
  *loss = h.loss;
  return PX_OK;
}
