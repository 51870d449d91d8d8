// LayerNorm's forward and backward, and fixed-order column sums (the bias
// gradient of Linear and Conv1D), on the device.
//
// Forward: one block per row; the row's sum and sum of squared deviations
// in double (as src/nn/layernorm.c), reduced by a fixed tree (warp shuffles,
// then the warps' values in order), so the same input gives the same bits.
// Backward dx: one block per row, the same way.  dγ, dβ and column sums: the
// rows are cut into chunks of CHUNK_ROWS; block (column tile, chunk) writes
// one double partial per column, and a second kernel adds the chunks'
// partials in chunk order into the f32 gradient.  No atomics.
#include "tensor/cuda/k_transformer_b.h"
#include "tensor/cuda/px_cuda.h"

#include <cuda_runtime.h>

namespace {

constexpr int ROW_THREADS = 256;
constexpr int TILE_COLS = 32;    // columns of one partial block (a warp's width)
constexpr int TILE_ROWS = 8;     // threads down the rows of a chunk
constexpr int CHUNK_ROWS = 256;  // rows one partial covers

inline cudaStream_t stream() { return (cudaStream_t)px_cuda_compute_stream(); }

// Σ v over the block (blockDim.x a multiple of 32, <= 1024), in a fixed
// order; every thread gets the result.  `sh` holds 33 doubles.
__device__ double block_sum(double v, double *sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < nwarps; w++) s += sh[w];
    sh[32] = s;
  }
  __syncthreads();
  const double out = sh[32];
  __syncthreads();  // sh is reused by the next call
  return out;
}

__global__ void ln_forward_kernel(const float *__restrict__ x, const float *__restrict__ gamma,
                                  const float *__restrict__ beta, float *__restrict__ y, float *__restrict__ mean,
                                  float *__restrict__ rstd, int D, double eps) {
  __shared__ double sh[33];
  const size_t r = blockIdx.x;
  const float *xr = x + r * (size_t)D;
  float *yr = y + r * (size_t)D;
  double s = 0.0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
  const double mu = block_sum(s, sh) / D;
  double ss = 0.0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const double d = xr[j] - mu;
    ss += d * d;
  }
  ss = block_sum(ss, sh);
  const float fmu = (float)mu, rs = (float)(1.0 / sqrt(ss / D + eps));
  if (threadIdx.x == 0) {
    mean[r] = fmu;
    rstd[r] = rs;
  }
  // (x - μ)·rstd·γ + β rounded after each operation, as the CPU computes it.
  for (int j = threadIdx.x; j < D; j += blockDim.x)
    yr[j] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[j], fmu), rs), gamma[j]), beta[j]);
}

__global__ void ln_backward_dx_kernel(const float *__restrict__ x, const float *__restrict__ dy,
                                      const float *__restrict__ gamma, const float *__restrict__ mean,
                                      const float *__restrict__ rstd, float *__restrict__ dx, int D) {
  __shared__ double sh[33];
  const size_t r = blockIdx.x;
  const float *xr = x + r * (size_t)D, *gr = dy + r * (size_t)D;
  float *out = dx + r * (size_t)D;
  const float mu = mean[r], rs = rstd[r];
  double s1 = 0.0, s2 = 0.0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const double g = (double)gamma[j] * gr[j];
    s1 += g;
    s2 += g * __fmul_rn(__fsub_rn(xr[j], mu), rs);
  }
  s1 = block_sum(s1, sh);
  s2 = block_sum(s2, sh);
  const float m1 = (float)(s1 / D), m2 = (float)(s2 / D);
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    const float xh = __fmul_rn(__fsub_rn(xr[j], mu), rs);
    out[j] = __fmul_rn(rs, __fsub_rn(__fsub_rn(__fmul_rn(gamma[j], gr[j]), m1), __fmul_rn(xh, m2)));
  }
}

// Block (column tile bx, chunk by), TILE_COLS × TILE_ROWS threads: the
// chunk's partial sums of dy·x̂ (LN only) and dy for TILE_COLS columns.
template <bool LN>
__global__ void colsum_partials_kernel(const float *__restrict__ x, const float *__restrict__ dy,
                                       const float *__restrict__ mean, const float *__restrict__ rstd,
                                       double *__restrict__ part_g, double *__restrict__ part_b, int64_t R, int D) {
  __shared__ double sg[TILE_ROWS][TILE_COLS], sb[TILE_ROWS][TILE_COLS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int j = blockIdx.x * TILE_COLS + tx;
  const int64_t r0 = (int64_t)blockIdx.y * CHUNK_ROWS;
  const int64_t r1 = r0 + CHUNK_ROWS < R ? r0 + CHUNK_ROWS : R;
  double ag = 0.0, ab = 0.0;
  if (j < D) {
    for (int64_t r = r0 + ty; r < r1; r += TILE_ROWS) {
      const float g = dy[(size_t)r * D + j];
      if (LN) ag += (double)g * __fmul_rn(__fsub_rn(x[(size_t)r * D + j], mean[r]), rstd[r]);
      ab += g;
    }
  }
  sg[ty][tx] = ag;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && j < D) {
    double g = 0.0, b = 0.0;
    for (int k = 0; k < TILE_ROWS; k++) {
      g += sg[k][tx];
      b += sb[k][tx];
    }
    const size_t at = (size_t)blockIdx.y * D + j;
    if (LN) part_g[at] = g;
    part_b[at] = b;
  }
}

// dst[j] += Σ_chunk part[chunk, j], chunks in order; one thread per column.
__global__ void colsum_finish_kernel(const double *__restrict__ part_g, const double *__restrict__ part_b,
                                     float *__restrict__ dst_g, float *__restrict__ dst_b, int nchunks, int D) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= D) return;
  double g = 0.0, b = 0.0;
  for (int c = 0; c < nchunks; c++) {
    if (dst_g) g += part_g[(size_t)c * D + j];
    b += part_b[(size_t)c * D + j];
  }
  if (dst_g) dst_g[j] += (float)g;
  dst_b[j] += (float)b;
}

__global__ void rows_set_kernel(float *__restrict__ y, const float *__restrict__ b, size_t n, int C) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = b[i % (size_t)C];
}

inline int64_t nchunks_of(int64_t R) { return (R + CHUNK_ROWS - 1) / CHUNK_ROWS; }

inline unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

px_status check_rows(int64_t R, const char *what) {
  if (R > 0x7fffffffLL) return px_error(PX_ERR_INVALID, "%s: %lld rows exceed one grid", what, (long long)R);
  return PX_OK;
}

// Both stages of the column sums: LN = dγ and dβ, else dst_b only.
template <bool LN>
px_status colsums(const float *x, const float *dy, const float *mean, const float *rstd, float *dst_g, float *dst_b,
                  void *partials, int64_t R, int D, const char *what) {
  const int64_t nch = nchunks_of(R);
  if (nch > 65535) return px_error(PX_ERR_INVALID, "%s: %lld rows are more than %d chunks", what, (long long)R, 65535);
  double *part_b = (double *)partials, *part_g = LN ? part_b + (size_t)nch * D : nullptr;
  dim3 grid((unsigned)((D + TILE_COLS - 1) / TILE_COLS), (unsigned)nch), block(TILE_COLS, TILE_ROWS);
  colsum_partials_kernel<LN><<<grid, block, 0, stream()>>>(x, dy, mean, rstd, part_g, part_b, R, D);
  px_status st = px_cuda_check_launch(what);
  if (st != PX_OK) return st;
  colsum_finish_kernel<<<(unsigned)((D + 255) / 256), 256, 0, stream()>>>(part_g, part_b, dst_g, dst_b, (int)nch, D);
  return px_cuda_check_launch(what);
}

}  // namespace

extern "C" px_status px_k_layernorm_forward(const float *x, const float *gamma, const float *beta, float *y,
                                            float *mean, float *rstd, int64_t R, int D, float eps) {
  if (R == 0) return PX_OK;
  px_status st = check_rows(R, "layernorm forward");
  if (st != PX_OK) return st;
  ln_forward_kernel<<<(unsigned)R, ROW_THREADS, 0, stream()>>>(x, gamma, beta, y, mean, rstd, D, (double)eps);
  return px_cuda_check_launch("layernorm forward");
}

extern "C" size_t px_k_layernorm_partials_bytes(int64_t R, int D) {
  return 2 * (size_t)(nchunks_of(R) ? nchunks_of(R) : 1) * (size_t)D * sizeof(double);
}

extern "C" px_status px_k_layernorm_backward(const float *x, const float *dy, const float *gamma, const float *mean,
                                             const float *rstd, float *dgamma, float *dbeta, float *dx, void *partials,
                                             int64_t R, int D) {
  if (R == 0) return PX_OK;
  px_status st = check_rows(R, "layernorm backward");
  if (st != PX_OK) return st;
  st = colsums<true>(x, dy, mean, rstd, dgamma, dbeta, partials, R, D, "layernorm backward (dweight, dbias)");
  if (st != PX_OK || !dx) return st;
  ln_backward_dx_kernel<<<(unsigned)R, ROW_THREADS, 0, stream()>>>(x, dy, gamma, mean, rstd, dx, D);
  return px_cuda_check_launch("layernorm backward (dx)");
}

extern "C" size_t px_k_colsum_partials_bytes(int64_t R, int C) {
  return (size_t)(nchunks_of(R) ? nchunks_of(R) : 1) * (size_t)C * sizeof(double);
}

extern "C" px_status px_k_colsum_add(float *dst, const float *src, void *partials, int64_t R, int C) {
  if (R == 0 || C == 0) return PX_OK;
  return colsums<false>(nullptr, src, nullptr, nullptr, nullptr, dst, partials, R, C, "bias gradient (column sums)");
}

extern "C" px_status px_k_rows_set(float *y, const float *b, int64_t R, int C) {
  const size_t n = (size_t)R * (size_t)C;
  if (n == 0) return PX_OK;
  rows_set_kernel<<<grid_for(n, 256), 256, 0, stream()>>>(y, b, n, C);
  return px_cuda_check_launch("bias rows");
}
