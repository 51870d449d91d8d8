// Causal self-attention on the device, f32, the CPU path's algorithm
// (src/nn/attention.c): nothing of size (N, H, T, T) is stored; forward keeps
// one log-sum-exp per row, backward recomputes the probabilities from q, k
// and lse, and the attention-dropout mask is regenerated from the
// counter-based RNG (same bits as the CPU's mask_row).
//
// Layout: qkv (N, T, 3C) packed [q | k | v]; head h is columns [h·d, (h+1)·d)
// of each third; o and dout (N, T, C); lse and D (N, H, T).
//
// Kernels (one warp per row, kWarps rows per block, d <= 128 so a lane holds
// the columns c = lane + 32·k, k < 4, of a row's accumulator):
//   attn_fwd    warp per query row i: keys j <= i in chunks of 32, lane per
//               key for the score s_ij = q_i·k_j/√d, then an online softmax
//               (running max m and sum l, the accumulator rescaled by
//               e^{m_old - m_new}) and o_i += p'_ij v_j with p'_ij broadcast
//               by shuffles; o_i = acc / l, lse_i = m + log l.  Dropout
//               multiplies p_ij by M_ij/(1-p) in the accumulator only (l and
//               lse are the undropped softmax's, as on the CPU).
//   attn_bwd_dq warp per query row i: D_i = dO_i·O_i (saved for the next
//               kernel), then over keys j <= i: P = e^{s - lse_i},
//               dP = (dO_i·v_j)·M/(1-p), dS = P (dP - D_i), dq_i += dS k_j;
//               dq_i /= √d.
//   attn_bwd_dkv warp per key row j: over queries i >= j (lane per query):
//               the same P, dS, and dv_j += P' dO_i, dk_j += dS q_i; dk_j /= √d.
// Each of dq, dk, dv is written once by one warp: no atomics, the results
// do not depend on scheduling.
#include "tensor/cuda/k_transformer_a.h"
#include "tensor/cuda/px_cuda.h"
#include "tensor/cuda/rng.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int kWarps = 4;
constexpr int kCols = PX_CUDA_ATT_MAX_D / 32;  // columns per lane

struct Geo {
  int T, C, H, d, ld;  // ld = 3C
  float scale;         // 1/√d
};

struct Drop {
  bool on;
  float p, inv_keep;  // 1/(1-p)
  uint64_t seed, hi;
  int head0, heads_total;
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// M_ij/(1-p) for element (i, j) of local head h of sample n (1 without dropout).
__device__ __forceinline__ float mask_factor(const Drop &dr, int n, int h, int T, int i, int j) {
  if (!dr.on) return 1.0f;
  const uint64_t e = (((uint64_t)n * (uint64_t)dr.heads_total + (uint64_t)(dr.head0 + h)) * (uint64_t)T + (uint64_t)i) *
      (uint64_t)T +
    (uint64_t)j;
  return px_u32_to_unit_dev(px_philox_word_dev(dr.seed, dr.hi, e)) >= dr.p ? dr.inv_keep : 0.0f;
}

__device__ __forceinline__ float dot_row(const float *a_sh, const float *b, int d) {
  float s = 0.0f;
  for (int c = 0; c < d; c++) s += a_sh[c] * b[c];
  return s;
}

// Block: kWarps warps; blockIdx.x = (n·H + h)·tiles + tile; row = tile·kWarps + warp.
__device__ __forceinline__ bool row_of(const Geo &g, int &n, int &h, int &row) {
  const int tiles = (g.T + kWarps - 1) / kWarps;
  const int nh = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  n = nh / g.H;
  h = nh % g.H;
  row = tile * kWarps + (int)(threadIdx.x >> 5);
  return row < g.T;
}

__global__ void attn_fwd(const float *qkv, float *o, float *lse, Geo g, Drop dr) {
  __shared__ float qs[kWarps][PX_CUDA_ATT_MAX_D];
  int n, h, i;
  if (!row_of(g, n, h, i)) return;  // a whole warp leaves; no block barrier below
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld;
  const float *base = qkv + (size_t)n * g.T * ld + (size_t)h * d;
  const float *K = base + g.C, *V = base + 2 * g.C;
  for (int c = lane; c < d; c += 32) qs[w][c] = base[(size_t)i * ld + c];
  __syncwarp();
  float m = -INFINITY, l = 0.0f, acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) acc[k] = 0.0f;
  for (int j0 = 0; j0 <= i; j0 += 32) {
    const int j = j0 + lane;
    const bool valid = j <= i;
    const float s = valid ? g.scale * dot_row(qs[w], K + (size_t)j * ld, d) : -INFINITY;
    const float mn = fmaxf(m, warp_max(s));  // finite: key j0 <= i is valid
    const float corr = expf(m - mn);         // 0 on the first chunk (m = -inf)
    const float p = valid ? expf(s - mn) : 0.0f;
    l = l * corr + warp_sum(p);
    const float pw = valid ? p * mask_factor(dr, n, h, g.T, i, j) : 0.0f;
    m = mn;
#pragma unroll
    for (int k = 0; k < kCols; k++) acc[k] *= corr;
    const int nj = i - j0 + 1 < 32 ? i - j0 + 1 : 32;
    for (int jj = 0; jj < nj; jj++) {
      const float wj = __shfl_sync(0xffffffffu, pw, jj);
      const float *vr = V + (size_t)(j0 + jj) * ld;
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) acc[k] += wj * vr[c];
      }
    }
  }
  const float inv = 1.0f / l;
  float *orow = o + ((size_t)n * g.T + i) * g.C + (size_t)h * d;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) orow[c] = acc[k] * inv;
  }
  if (lane == 0) lse[((size_t)n * g.H + h) * g.T + i] = m + logf(l);
}

__global__ void attn_bwd_dq(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv,
                            float *Dterm, Geo g, Drop dr) {
  __shared__ float qs[kWarps][PX_CUDA_ATT_MAX_D], gs[kWarps][PX_CUDA_ATT_MAX_D];
  int n, h, i;
  if (!row_of(g, n, h, i)) return;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld;
  const float *base = qkv + (size_t)n * g.T * ld + (size_t)h * d;
  const float *K = base + g.C, *V = base + 2 * g.C;
  const size_t orow = ((size_t)n * g.T + i) * g.C + (size_t)h * d;
  float D = 0.0f;
  for (int c = lane; c < d; c += 32) {
    qs[w][c] = base[(size_t)i * ld + c];
    const float gv = dout[orow + c];
    gs[w][c] = gv;
    D += gv * o[orow + c];
  }
  D = warp_sum(D);
  __syncwarp();
  const size_t li = ((size_t)n * g.H + h) * g.T + i;
  const float L = lse[li];
  if (lane == 0) Dterm[li] = D;
  float acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) acc[k] = 0.0f;
  for (int j0 = 0; j0 <= i; j0 += 32) {
    const int j = j0 + lane;
    float dS = 0.0f;
    if (j <= i) {
      const float P = expf(g.scale * dot_row(qs[w], K + (size_t)j * ld, d) - L);
      const float dP = dot_row(gs[w], V + (size_t)j * ld, d) * mask_factor(dr, n, h, g.T, i, j);
      dS = P * (dP - D);
    }
    const int nj = i - j0 + 1 < 32 ? i - j0 + 1 : 32;
    for (int jj = 0; jj < nj; jj++) {
      const float sj = __shfl_sync(0xffffffffu, dS, jj);
      const float *kr = K + (size_t)(j0 + jj) * ld;
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) acc[k] += sj * kr[c];
      }
    }
  }
  float *dq = dqkv + ((size_t)n * g.T + i) * ld + (size_t)h * d;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) dq[c] = acc[k] * g.scale;
  }
}

__global__ void attn_bwd_dkv(const float *qkv, const float *lse, const float *dout, const float *Dterm, float *dqkv,
                             Geo g, Drop dr) {
  __shared__ float ks[kWarps][PX_CUDA_ATT_MAX_D], vs[kWarps][PX_CUDA_ATT_MAX_D];
  int n, h, j;
  if (!row_of(g, n, h, j)) return;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld, T = g.T;
  const float *Q = qkv + (size_t)n * T * ld + (size_t)h * d;
  const float *dO = dout + (size_t)n * T * g.C + (size_t)h * d;
  const float *L = lse + ((size_t)n * g.H + h) * T, *Dr = Dterm + ((size_t)n * g.H + h) * T;
  for (int c = lane; c < d; c += 32) {
    ks[w][c] = Q[(size_t)j * ld + g.C + c];
    vs[w][c] = Q[(size_t)j * ld + 2 * g.C + c];
  }
  __syncwarp();
  float ak[kCols], av[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) ak[k] = av[k] = 0.0f;
  for (int i0 = j; i0 < T; i0 += 32) {
    const int i = i0 + lane;
    float dS = 0.0f, Pm = 0.0f;
    if (i < T) {
      const float P = expf(g.scale * dot_row(ks[w], Q + (size_t)i * ld, d) - L[i]);
      const float M = mask_factor(dr, n, h, T, i, j);
      const float dP = dot_row(vs[w], dO + (size_t)i * g.C, d) * M;
      Pm = P * M;
      dS = P * (dP - Dr[i]);
    }
    const int ni = T - i0 < 32 ? T - i0 : 32;
    for (int ii = 0; ii < ni; ii++) {
      const float si = __shfl_sync(0xffffffffu, dS, ii), pi = __shfl_sync(0xffffffffu, Pm, ii);
      const float *qr = Q + (size_t)(i0 + ii) * ld, *gr = dO + (size_t)(i0 + ii) * g.C;
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) {
          ak[k] += si * qr[c];
          av[k] += pi * gr[c];
        }
      }
    }
  }
  float *dk = dqkv + ((size_t)n * T + j) * ld + g.C + (size_t)h * d, *dv = dk + g.C;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) {
      dk[c] = ak[k] * g.scale;
      dv[c] = av[k];
    }
  }
}

// ---- Tiled kernels (the default) -------------------------------------------
// The same algorithm, one warp per row as above, but the warps of a block
// (kTile consecutive rows of one (n, h)) share each chunk of 32 key (or
// query) rows through shared memory: loaded once, coalesced, per block
// instead of once per warp from L1/L2.  Rows a lane dots against are padded
// to d + 1 floats (lane r reads row r: banks (r + c) % 32, no conflicts).
// Inactive warps (rows >= T) stay for the block barriers.
constexpr int kTileF = 16;  // query rows per block, forward
constexpr int kTileB = 8;   // rows per block, backward (two padded chunks)
constexpr int kPad = PX_CUDA_ATT_MAX_D + 1;

__global__ void __launch_bounds__(32 * kTileF) attn_fwd_tiled(const float *qkv, float *o, float *lse, Geo g, Drop dr) {
  __shared__ float Ks[32][kPad];
  __shared__ float Vs[32][PX_CUDA_ATT_MAX_D];
  __shared__ float Qs[kTileF][PX_CUDA_ATT_MAX_D];
  const int tiles = (g.T + kTileF - 1) / kTileF;
  const int nh = blockIdx.x / tiles, tile = blockIdx.x % tiles, n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld;
  const int i = tile * kTileF + w, last = min(g.T - 1, tile * kTileF + kTileF - 1);
  const bool active = i < g.T;
  const float *base = qkv + (size_t)n * g.T * ld + (size_t)h * d;
  const float *K = base + g.C, *V = base + 2 * g.C;
  if (active)
    for (int c = lane; c < d; c += 32) Qs[w][c] = base[(size_t)i * ld + c];
  float m = -INFINITY, l = 0.0f, acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) acc[k] = 0.0f;
  for (int j0 = 0; j0 <= last; j0 += 32) {
    const int nk = min(32, last - j0 + 1);
    __syncthreads();  // the previous chunk is consumed (and Qs written, the first time)
    for (int idx = threadIdx.x; idx < nk * d; idx += blockDim.x) {
      const int r = idx / d, c = idx % d;
      Ks[r][c] = K[(size_t)(j0 + r) * ld + c];
      Vs[r][c] = V[(size_t)(j0 + r) * ld + c];
    }
    __syncthreads();
    if (!active || j0 > i) continue;
    const int j = j0 + lane;
    const bool valid = j <= i;
    const float s = valid ? g.scale * dot_row(Qs[w], Ks[lane], d) : -INFINITY;
    const float mn = fmaxf(m, warp_max(s));
    const float corr = expf(m - mn);
    const float p = valid ? expf(s - mn) : 0.0f;
    l = l * corr + warp_sum(p);
    const float pw = valid ? p * mask_factor(dr, n, h, g.T, i, j) : 0.0f;
    m = mn;
#pragma unroll
    for (int k = 0; k < kCols; k++) acc[k] *= corr;
    const int nj = min(32, i - j0 + 1);
    for (int jj = 0; jj < nj; jj++) {
      const float wj = __shfl_sync(0xffffffffu, pw, jj);
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) acc[k] += wj * Vs[jj][c];
      }
    }
  }
  if (!active) return;
  const float inv = 1.0f / l;
  float *orow = o + ((size_t)n * g.T + i) * g.C + (size_t)h * d;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) orow[c] = acc[k] * inv;
  }
  if (lane == 0) lse[((size_t)n * g.H + h) * g.T + i] = m + logf(l);
}

__global__ void __launch_bounds__(32 * kTileB)
  attn_bwd_dq_tiled(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv, float *Dterm,
                    Geo g, Drop dr) {
  __shared__ float Ks[32][kPad], Vs[32][kPad];
  __shared__ float Qs[kTileB][PX_CUDA_ATT_MAX_D], Gs[kTileB][PX_CUDA_ATT_MAX_D];
  const int tiles = (g.T + kTileB - 1) / kTileB;
  const int nh = blockIdx.x / tiles, tile = blockIdx.x % tiles, n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld;
  const int i = tile * kTileB + w, last = min(g.T - 1, tile * kTileB + kTileB - 1);
  const bool active = i < g.T;
  const float *base = qkv + (size_t)n * g.T * ld + (size_t)h * d;
  const float *K = base + g.C, *V = base + 2 * g.C;
  const size_t li = ((size_t)n * g.H + h) * g.T + (active ? i : 0);
  float D = 0.0f, L = 0.0f;
  if (active) {
    const size_t orow = ((size_t)n * g.T + i) * g.C + (size_t)h * d;
    for (int c = lane; c < d; c += 32) {
      Qs[w][c] = base[(size_t)i * ld + c];
      const float gv = dout[orow + c];
      Gs[w][c] = gv;
      D += gv * o[orow + c];
    }
    D = warp_sum(D);
    L = lse[li];
    if (lane == 0) Dterm[li] = D;
  }
  float acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) acc[k] = 0.0f;
  for (int j0 = 0; j0 <= last; j0 += 32) {
    const int nk = min(32, last - j0 + 1);
    __syncthreads();
    for (int idx = threadIdx.x; idx < nk * d; idx += blockDim.x) {
      const int r = idx / d, c = idx % d;
      Ks[r][c] = K[(size_t)(j0 + r) * ld + c];
      Vs[r][c] = V[(size_t)(j0 + r) * ld + c];
    }
    __syncthreads();
    if (!active || j0 > i) continue;
    const int j = j0 + lane;
    float dS = 0.0f;
    if (j <= i) {
      const float P = expf(g.scale * dot_row(Qs[w], Ks[lane], d) - L);
      const float dP = dot_row(Gs[w], Vs[lane], d) * mask_factor(dr, n, h, g.T, i, j);
      dS = P * (dP - D);
    }
    const int nj = min(32, i - j0 + 1);
    for (int jj = 0; jj < nj; jj++) {
      const float sj = __shfl_sync(0xffffffffu, dS, jj);
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) acc[k] += sj * Ks[jj][c];
      }
    }
  }
  if (!active) return;
  float *dq = dqkv + ((size_t)n * g.T + i) * ld + (size_t)h * d;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) dq[c] = acc[k] * g.scale;
  }
}

__global__ void __launch_bounds__(32 * kTileB) attn_bwd_dkv_tiled(const float *qkv, const float *lse, const float *dout,
                                                                  const float *Dterm, float *dqkv, Geo g, Drop dr) {
  __shared__ float Qs[32][kPad], Gs[32][kPad];
  __shared__ float Ks[kTileB][PX_CUDA_ATT_MAX_D], Vs[kTileB][PX_CUDA_ATT_MAX_D];
  __shared__ float Ls[32], Ds[32];
  const int T = g.T, tiles = (T + kTileB - 1) / kTileB;
  const int nh = blockIdx.x / tiles, tile = blockIdx.x % tiles, n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, d = g.d, ld = g.ld;
  const int first = tile * kTileB, j = first + w;
  const bool active = j < T;
  const float *Q = qkv + (size_t)n * T * ld + (size_t)h * d;
  const float *dO = dout + (size_t)n * T * g.C + (size_t)h * d;
  const float *L = lse + ((size_t)n * g.H + h) * T, *Dr = Dterm + ((size_t)n * g.H + h) * T;
  if (active)
    for (int c = lane; c < d; c += 32) {
      Ks[w][c] = Q[(size_t)j * ld + g.C + c];
      Vs[w][c] = Q[(size_t)j * ld + 2 * g.C + c];
    }
  float ak[kCols], av[kCols];
#pragma unroll
  for (int k = 0; k < kCols; k++) ak[k] = av[k] = 0.0f;
  for (int i0 = first; i0 < T; i0 += 32) {
    const int ni = min(32, T - i0);
    __syncthreads();
    for (int idx = threadIdx.x; idx < ni * d; idx += blockDim.x) {
      const int r = idx / d, c = idx % d;
      Qs[r][c] = Q[(size_t)(i0 + r) * ld + c];
      Gs[r][c] = dO[(size_t)(i0 + r) * g.C + c];
    }
    if (threadIdx.x < ni) {
      Ls[threadIdx.x] = L[i0 + threadIdx.x];
      Ds[threadIdx.x] = Dr[i0 + threadIdx.x];
    }
    __syncthreads();
    if (!active || i0 + ni - 1 < j) continue;
    const int i = i0 + lane;
    float dS = 0.0f, Pm = 0.0f;
    if (lane < ni && i >= j) {
      const float P = expf(g.scale * dot_row(Ks[w], Qs[lane], d) - Ls[lane]);
      const float M = mask_factor(dr, n, h, T, i, j);
      const float dP = dot_row(Vs[w], Gs[lane], d) * M;
      Pm = P * M;
      dS = P * (dP - Ds[lane]);
    }
    // Rows ii < ni only (the chunk's rows past T are not loaded); rows
    // before j carry dS = Pm = 0 against finite loaded values.
    for (int ii = 0; ii < ni; ii++) {
      const float si = __shfl_sync(0xffffffffu, dS, ii), pi = __shfl_sync(0xffffffffu, Pm, ii);
#pragma unroll
      for (int k = 0; k < kCols; k++) {
        const int c = lane + 32 * k;
        if (c < d) {
          ak[k] += si * Qs[ii][c];
          av[k] += pi * Gs[ii][c];
        }
      }
    }
  }
  if (!active) return;
  float *dk = dqkv + ((size_t)n * T + j) * ld + g.C + (size_t)h * d, *dv = dk + g.C;
#pragma unroll
  for (int k = 0; k < kCols; k++) {
    const int c = lane + 32 * k;
    if (c < d) {
      dk[c] = ak[k] * g.scale;
      dv[c] = av[k];
    }
  }
}

px_status check_geometry(const char *what, int N, int T, int C, int H) {
  if (N <= 0 || T <= 0 || C <= 0 || H <= 0 || C % H != 0 || C / H > PX_CUDA_ATT_MAX_D)
    return px_error(PX_ERR_UNSUPPORTED,
                    "%s (CUDA): N %d, T %d, width %d, heads %d: need a head width C/H of at most %d", what, N, T, C, H,
                    PX_CUDA_ATT_MAX_D);
  const long long blocks = (long long)N * H * ((T + kWarps - 1) / kWarps);
  if (blocks > 0x7fffffffLL) return px_error(PX_ERR_UNSUPPORTED, "%s (CUDA): %lld blocks is too many", what, blocks);
  return PX_OK;
}

Geo geo_of(int T, int C, int H) {
  Geo g;
  g.T = T;
  g.C = C;
  g.H = H;
  g.d = C / H;
  g.ld = 3 * C;
  g.scale = 1.0f / sqrtf((float)g.d);
  return g;
}

Drop drop_of(const px_cuda_att_drop *d) {
  Drop r = {};
  if (d && d->drop && d->p > 0.0f) {
    r.on = true;
    r.p = d->p;
    r.inv_keep = 1.0f / (1.0f - d->p);
    r.seed = d->seed;
    r.hi = d->hi;
    r.head0 = d->head0;
    r.heads_total = d->heads_total;
  }
  return r;
}

unsigned blocks_of(int N, int T, int H, int rows) { return (unsigned)((long long)N * H * ((T + rows - 1) / rows)); }

// PX_CUDA_ATTENTION=rowwise selects the first kernels (each warp reads its
// keys itself): the reference the tiled ones can be checked against.
bool use_rowwise() {
  const char *e = getenv("PX_CUDA_ATTENTION");
  return e && strcmp(e, "rowwise") == 0;
}

// ---- Tensor-core kernels (bf16 computation) ------------------------------------
// With the step in bf16 (px_ctx.compute_dtype = PX_BF16) attention runs on
// the tensor cores, FlashAttention-2's way: q, k, v and dO are read as f32
// and rounded to bf16 (nearest even) into shared memory, and every product
// is a 16x16x16 bf16 WMMA with f32 accumulation.  A block holds 64 rows
// (4 warps x 16) and walks 64-row tiles of the other side:
//   attn_fwd_tc     per query tile: S = Q Kᵀ, online softmax in f32 (a lane
//                   pair per row, each lane every other column), P (bf16,
//                   dropout applied) times V into the f32 output kept in
//                   registers and rescaled per tile; o = acc / l, lse.
//   attn_bwd_dq_tc  per query tile: D_i = bf16(dO_i)·bf16(O_i) (so that a
//                   row that sees one key gets dS = 0 as in exact
//                   arithmetic), then per key tile S = Q Kᵀ, dP = dO Vᵀ,
//                   dS = P (dP·M - D), dq += dS K in WMMA accumulators.
//   attn_bwd_dkv_tc per key tile: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, dv += (P M)ᵀ dO,
//                   dk += dSᵀ Q.
// Each output is written by one warp (no atomics): the results do not depend
// on scheduling.  Head widths 16, 32, 64 and 128 (others take the f32
// kernels).  Shared memory is dynamic (56-156 KB, above the 48 KB default).
constexpr int kTcRows = 64;  // rows per block and per tile of the other side

template <int D> struct TcLay {
  static constexpr int LDH = D + 8;                           // bf16 tile row stride (16 B of padding)
  static constexpr int SW = (D > kTcRows ? D : kTcRows) + 4;  // f32 per-warp scratch row stride
  static constexpr int PLD = kTcRows + 8;                     // bf16 per-warp P row stride
  static constexpr size_t TILE = (size_t)kTcRows * LDH * 2;   // bytes of one bf16 tile
  static constexpr size_t SCR = (size_t)4 * 16 * SW * 4;      // bytes of the 4 warps' f32 scratch
  static constexpr size_t PB = (size_t)4 * 16 * PLD * 2;      // bytes of the 4 warps' bf16 P
};

using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragBt;  // a transposed tile
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Rows [r0, r0 + 64) of a (T, D) slice with row stride ld (f32, 16-byte
// aligned rows) into a bf16 tile; rows past T are zeros.
template <int D> __device__ __forceinline__ void tc_load(__nv_bfloat16 *dst, const float *src, int ld, int r0, int T) {
  constexpr int V4 = D / 4;
  for (int idx = threadIdx.x; idx < kTcRows * V4; idx += blockDim.x) {
    const int r = idx / V4, c = (idx % V4) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r0 + r < T) v = *reinterpret_cast<const float4 *>(src + (size_t)(r0 + r) * ld + c);
    __nv_bfloat162 *d2 = reinterpret_cast<__nv_bfloat162 *>(dst + r * TcLay<D>::LDH + c);
    d2[0] = __floats2bfloat162_rn(v.x, v.y);
    d2[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// out(16 x 64, f32, row stride SW) = A rows (16 x D) · B rowsᵀ (64 x D)ᵀ.
template <int D> __device__ __forceinline__ void tc_abt(float *out, const __nv_bfloat16 *A, const __nv_bfloat16 *B) {
  constexpr int LDH = TcLay<D>::LDH;
#pragma unroll
  for (int kb = 0; kb < kTcRows / 16; kb++) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      FragA a;
      FragBt b;
      wmma::load_matrix_sync(a, A + kk * 16, LDH);
      wmma::load_matrix_sync(b, B + kb * 16 * LDH + kk * 16, LDH);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out + kb * 16, acc, TcLay<D>::SW, wmma::mem_row_major);
  }
}

// acc[D/16] += P (16 x 64, bf16, row stride PLD) · B (64 x D tile).
template <int D> __device__ __forceinline__ void tc_pb(FragC *acc, const __nv_bfloat16 *P, const __nv_bfloat16 *B) {
#pragma unroll
  for (int kb = 0; kb < kTcRows / 16; kb++) {
    FragA a;
    wmma::load_matrix_sync(a, P + kb * 16, TcLay<D>::PLD);
#pragma unroll
    for (int db = 0; db < D / 16; db++) {
      FragB b;
      wmma::load_matrix_sync(b, B + kb * 16 * TcLay<D>::LDH + db * 16, TcLay<D>::LDH);
      wmma::mma_sync(acc[db], a, b, acc[db]);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(128) attn_fwd_tc(const float *qkv, float *o, float *lse, Geo g, Drop dr) {
  using L = TcLay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Ks = (__nv_bfloat16 *)(smem + L::TILE),
                *Vs = (__nv_bfloat16 *)(smem + 2 * L::TILE);
  float *Sw = (float *)(smem + 3 * L::TILE);
  __nv_bfloat16 *Pw = (__nv_bfloat16 *)(smem + 3 * L::TILE + L::SCR);
  const int T = g.T, ld = g.ld, tiles = (T + kTcRows - 1) / kTcRows;
  // The longest tiles (last queries: most keys) first.
  const int nh = blockIdx.x / tiles, tile = tiles - 1 - (int)(blockIdx.x % tiles), n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int q0 = tile * kTcRows, i = q0 + w * 16 + r;
  const float *base = qkv + (size_t)n * T * ld + (size_t)h * D;
  float *S = Sw + w * 16 * L::SW;
  __nv_bfloat16 *P = Pw + w * 16 * L::PLD;
  tc_load<D>(Qs, base, ld, q0, T);
  float m = -INFINITY, l = 0.0f, acc[D / 2];
#pragma unroll
  for (int c = 0; c < D / 2; c++) acc[c] = 0.0f;
  const int kend = min(T, q0 + kTcRows);
  for (int k0 = 0; k0 < kend; k0 += kTcRows) {
    __syncthreads();  // the last tile's K and V are no longer read
    tc_load<D>(Ks, base + g.C, ld, k0, T);
    tc_load<D>(Vs, base + 2 * g.C, ld, k0, T);
    __syncthreads();
    tc_abt<D>(S, Qs + w * 16 * L::LDH, Ks);
    __syncwarp();
    float s[kTcRows / 2], mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTcRows / 2; t++) {
      const int c = 2 * t + half, j = k0 + c;
      s[t] = j <= i && j < T ? S[r * L::SW + c] * g.scale : -INFINITY;
      mx = fmaxf(mx, s[t]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mn = fmaxf(m, mx);  // finite: key k0 <= i is valid for every row
    float psum = 0.0f;
#pragma unroll
    for (int t = 0; t < kTcRows / 2; t++) {
      const int c = 2 * t + half;
      const float p = s[t] == -INFINITY ? 0.0f : expf(s[t] - mn);
      psum += p;
      const float pw = p == 0.0f ? 0.0f : p * mask_factor(dr, n, h, T, i, k0 + c);
      P[r * L::PLD + c] = __float2bfloat16_rn(pw);
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
    l = l * corr + psum;
    m = mn;
    __syncwarp();
    FragC pv[D / 16];
#pragma unroll
    for (int db = 0; db < D / 16; db++) wmma::fill_fragment(pv[db], 0.0f);
    tc_pb<D>(pv, P, Vs);
#pragma unroll
    for (int db = 0; db < D / 16; db++) wmma::store_matrix_sync(S + db * 16, pv[db], L::SW, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < D / 2; c++) acc[c] = acc[c] * corr + S[r * L::SW + half * (D / 2) + c];
    __syncwarp();
  }
  if (i < T) {
    const float inv = 1.0f / l;
    float *orow = o + ((size_t)n * T + i) * g.C + (size_t)h * D + half * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 2; c++) orow[c] = acc[c] * inv;
    if (half == 0) lse[((size_t)n * g.H + h) * T + i] = m + logf(l);
  }
}

template <int D>
__global__ void __launch_bounds__(128) attn_bwd_dq_tc(const float *qkv, const float *o, const float *lse,
                                                      const float *dout, float *dqkv, float *Dterm, Geo g, Drop dr) {
  using L = TcLay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Gs = (__nv_bfloat16 *)(smem + L::TILE),
                *Ks = (__nv_bfloat16 *)(smem + 2 * L::TILE), *Vs = (__nv_bfloat16 *)(smem + 3 * L::TILE);
  float *Sw = (float *)(smem + 4 * L::TILE), *dPw = (float *)(smem + 4 * L::TILE + L::SCR);
  __nv_bfloat16 *Pw = (__nv_bfloat16 *)(smem + 4 * L::TILE + 2 * L::SCR);
  const int T = g.T, ld = g.ld, tiles = (T + kTcRows - 1) / kTcRows;
  const int nh = blockIdx.x / tiles, tile = tiles - 1 - (int)(blockIdx.x % tiles), n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int q0 = tile * kTcRows, i = q0 + w * 16 + r;
  const float *base = qkv + (size_t)n * T * ld + (size_t)h * D;
  const float *dO = dout + (size_t)n * T * g.C + (size_t)h * D;
  float *S = Sw + w * 16 * L::SW, *dP = dPw + w * 16 * L::SW;
  __nv_bfloat16 *P = Pw + w * 16 * L::PLD;
  tc_load<D>(Qs, base, ld, q0, T);
  tc_load<D>(Gs, dO, g.C, q0, T);
  __syncthreads();
  const size_t li = ((size_t)n * g.H + h) * T + (size_t)(i < T ? i : 0);
  float Dv = 0.0f;
  if (i < T) {
    const float *orow = o + ((size_t)n * T + i) * g.C + (size_t)h * D;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++)
      Dv += __bfloat162float(Gs[(w * 16 + r) * L::LDH + c]) * bf16_round(orow[c]);
  }
  Dv += __shfl_xor_sync(0xffffffffu, Dv, 1);
  const float Lv = i < T ? lse[li] : 0.0f;
  if (i < T && half == 0) Dterm[li] = Dv;
  FragC dq[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; db++) wmma::fill_fragment(dq[db], 0.0f);
  const int kend = min(T, q0 + kTcRows);
  for (int k0 = 0; k0 < kend; k0 += kTcRows) {
    __syncthreads();
    tc_load<D>(Ks, base + g.C, ld, k0, T);
    tc_load<D>(Vs, base + 2 * g.C, ld, k0, T);
    __syncthreads();
    tc_abt<D>(S, Qs + w * 16 * L::LDH, Ks);
    tc_abt<D>(dP, Gs + w * 16 * L::LDH, Vs);
    __syncwarp();
#pragma unroll 4
    for (int t = 0; t < kTcRows / 2; t++) {
      const int c = 2 * t + half, j = k0 + c;
      float ds = 0.0f;
      if (j <= i && j < T && i < T) {
        const float p = expf(S[r * L::SW + c] * g.scale - Lv);
        ds = p * (dP[r * L::SW + c] * mask_factor(dr, n, h, T, i, j) - Dv);
      }
      P[r * L::PLD + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    tc_pb<D>(dq, P, Ks);
    __syncwarp();
  }
#pragma unroll
  for (int db = 0; db < D / 16; db++) wmma::store_matrix_sync(S + db * 16, dq[db], L::SW, wmma::mem_row_major);
  __syncwarp();
  if (i < T) {
    float *dqr = dqkv + ((size_t)n * T + i) * ld + (size_t)h * D + half * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 2; c++) dqr[c] = S[r * L::SW + half * (D / 2) + c] * g.scale;
  }
}

template <int D>
__global__ void __launch_bounds__(128) attn_bwd_dkv_tc(const float *qkv, const float *lse, const float *dout,
                                                       const float *Dterm, float *dqkv, Geo g, Drop dr) {
  using L = TcLay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16 *Ks = (__nv_bfloat16 *)smem, *Vs = (__nv_bfloat16 *)(smem + L::TILE),
                *Qs = (__nv_bfloat16 *)(smem + 2 * L::TILE), *Gs = (__nv_bfloat16 *)(smem + 3 * L::TILE);
  float *Sw = (float *)(smem + 4 * L::TILE), *dPw = (float *)(smem + 4 * L::TILE + L::SCR);
  __nv_bfloat16 *Pw = (__nv_bfloat16 *)(smem + 4 * L::TILE + 2 * L::SCR),
                *dSw = (__nv_bfloat16 *)(smem + 4 * L::TILE + 2 * L::SCR + L::PB);
  float *Ls = (float *)(smem + 4 * L::TILE + 2 * L::SCR + 2 * L::PB), *Ds = Ls + kTcRows;
  const int T = g.T, ld = g.ld, tiles = (T + kTcRows - 1) / kTcRows;
  // Key tile 0 sees every query: the longest first.
  const int nh = blockIdx.x / tiles, tile = (int)(blockIdx.x % tiles), n = nh / g.H, h = nh % g.H;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane >> 1, half = lane & 1;
  const int k0 = tile * kTcRows, j = k0 + w * 16 + r;
  const float *base = qkv + (size_t)n * T * ld + (size_t)h * D;
  const float *dO = dout + (size_t)n * T * g.C + (size_t)h * D;
  const float *Lr = lse + ((size_t)n * g.H + h) * T, *Dr = Dterm + ((size_t)n * g.H + h) * T;
  float *St = Sw + w * 16 * L::SW, *dPt = dPw + w * 16 * L::SW;
  __nv_bfloat16 *Pm = Pw + w * 16 * L::PLD, *dS = dSw + w * 16 * L::PLD;
  tc_load<D>(Ks, base + g.C, ld, k0, T);
  tc_load<D>(Vs, base + 2 * g.C, ld, k0, T);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int db = 0; db < D / 16; db++) {
    wmma::fill_fragment(dk[db], 0.0f);
    wmma::fill_fragment(dv[db], 0.0f);
  }
  for (int q0 = k0; q0 < T; q0 += kTcRows) {
    __syncthreads();
    tc_load<D>(Qs, base, ld, q0, T);
    tc_load<D>(Gs, dO, g.C, q0, T);
    if (threadIdx.x < kTcRows) {
      const int qi = q0 + (int)threadIdx.x;
      Ls[threadIdx.x] = qi < T ? Lr[qi] : 0.0f;
      Ds[threadIdx.x] = qi < T ? Dr[qi] : 0.0f;
    }
    __syncthreads();
    tc_abt<D>(St, Ks + w * 16 * L::LDH, Qs);
    tc_abt<D>(dPt, Vs + w * 16 * L::LDH, Gs);
    __syncwarp();
#pragma unroll 4
    for (int t = 0; t < kTcRows / 2; t++) {
      const int c = 2 * t + half, i = q0 + c;
      float pm = 0.0f, ds = 0.0f;
      if (i >= j && i < T && j < T) {
        const float p = expf(St[r * L::SW + c] * g.scale - Ls[c]);
        const float mk = mask_factor(dr, n, h, T, i, j);
        pm = p * mk;
        ds = p * (dPt[r * L::SW + c] * mk - Ds[c]);
      }
      Pm[r * L::PLD + c] = __float2bfloat16_rn(pm);
      dS[r * L::PLD + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    tc_pb<D>(dv, Pm, Gs);
    tc_pb<D>(dk, dS, Qs);
    __syncwarp();
  }
#pragma unroll
  for (int db = 0; db < D / 16; db++) {
    wmma::store_matrix_sync(St + db * 16, dk[db], L::SW, wmma::mem_row_major);
    wmma::store_matrix_sync(dPt + db * 16, dv[db], L::SW, wmma::mem_row_major);
  }
  __syncwarp();
  if (j < T) {
    float *dkr = dqkv + ((size_t)n * T + j) * ld + g.C + (size_t)h * D + half * (D / 2), *dvr = dkr + g.C;
#pragma unroll
    for (int c = 0; c < D / 2; c++) {
      dkr[c] = St[r * L::SW + half * (D / 2) + c] * g.scale;
      dvr[c] = dPt[r * L::SW + half * (D / 2) + c];
    }
  }
}

template <int D> constexpr size_t tc_fwd_smem() { return 3 * TcLay<D>::TILE + TcLay<D>::SCR + TcLay<D>::PB; }
template <int D> constexpr size_t tc_dq_smem() { return 4 * TcLay<D>::TILE + 2 * TcLay<D>::SCR + TcLay<D>::PB; }
template <int D> constexpr size_t tc_dkv_smem() {
  return 4 * TcLay<D>::TILE + 2 * TcLay<D>::SCR + 2 * TcLay<D>::PB + 2 * kTcRows * sizeof(float);
}

// Opts a kernel into `bytes` of dynamic shared memory (above 48 KB).  Before
// every launch: the attribute belongs to the current device, and a process
// of the threads backend drives several.
template <typename K> px_status tc_opt_in(K kernel, size_t bytes, const char *what) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess)
    return px_error(PX_ERR_UNSUPPORTED, "%s (CUDA, bf16 tensor cores): %zu bytes of shared memory: %s", what, bytes,
                    cudaGetErrorString(e));
  return PX_OK;
}

template <int D>
px_status tc_forward(const float *qkv, float *o, float *lse, int N, int T, const Geo &g, const Drop &dr,
                     cudaStream_t s) {
  px_status st = tc_opt_in(attn_fwd_tc<D>, tc_fwd_smem<D>(), "attention forward");
  if (st != PX_OK) return st;
  attn_fwd_tc<D><<<blocks_of(N, T, g.H, kTcRows), 128, tc_fwd_smem<D>(), s>>>(qkv, o, lse, g, dr);
  return px_cuda_check_launch("attention forward (bf16 tensor cores)");
}

template <int D>
px_status tc_backward(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv, float *Dterm,
                      int N, int T, const Geo &g, const Drop &dr, cudaStream_t s) {
  px_status st = tc_opt_in(attn_bwd_dq_tc<D>, tc_dq_smem<D>(), "attention backward (dq)");
  if (st == PX_OK) st = tc_opt_in(attn_bwd_dkv_tc<D>, tc_dkv_smem<D>(), "attention backward (dk, dv)");
  if (st != PX_OK) return st;
  const unsigned blocks = blocks_of(N, T, g.H, kTcRows);
  attn_bwd_dq_tc<D><<<blocks, 128, tc_dq_smem<D>(), s>>>(qkv, o, lse, dout, dqkv, Dterm, g, dr);
  st = px_cuda_check_launch("attention backward (dq, bf16 tensor cores)");
  if (st != PX_OK) return st;
  attn_bwd_dkv_tc<D><<<blocks, 128, tc_dkv_smem<D>(), s>>>(qkv, lse, dout, Dterm, dqkv, g, dr);
  return px_cuda_check_launch("attention backward (dk, dv, bf16 tensor cores)");
}

// The tensor-core kernels take head widths 16, 32, 64 and 128.
bool tc_width(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }

}  // namespace

// The tensor-core kernels: asked for (bf16), a head width they take, and
// 16-byte aligned rows for their float4 loads.
static bool tc_path(bool bf16, int C, int H, const void *a, const void *b) {
  return bf16 && tc_width(C / H) && C % 4 == 0 && (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

extern "C" px_status px_cuda_attention_forward(const float *qkv, float *o, float *lse, int N, int T, int C, int H,
                                               const px_cuda_att_drop *drop, bool bf16) {
  if (N == 0 || T == 0) return PX_OK;  // nothing to attend (the CPU path loops zero times)
  px_status st = check_geometry("attention forward", N, T, C, H);
  if (st != PX_OK) return st;
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  if (tc_path(bf16, C, H, qkv, o)) {
    const Geo g = geo_of(T, C, H);
    const Drop dr = drop_of(drop);
    switch (g.d) {
    case 16: return tc_forward<16>(qkv, o, lse, N, T, g, dr, s);
    case 32: return tc_forward<32>(qkv, o, lse, N, T, g, dr, s);
    case 64: return tc_forward<64>(qkv, o, lse, N, T, g, dr, s);
    default: return tc_forward<128>(qkv, o, lse, N, T, g, dr, s);
    }
  }
  if (use_rowwise())
    attn_fwd<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, o, lse, geo_of(T, C, H), drop_of(drop));
  else attn_fwd_tiled<<<blocks_of(N, T, H, kTileF), 32 * kTileF, 0, s>>>(qkv, o, lse, geo_of(T, C, H), drop_of(drop));
  return px_cuda_check_launch("attention forward");
}

extern "C" px_status px_cuda_attention_backward(const float *qkv, const float *o, const float *lse, const float *dout,
                                                float *dqkv, float *scratch, int N, int T, int C, int H,
                                                const px_cuda_att_drop *drop, bool bf16) {
  if (N == 0 || T == 0) return PX_OK;  // nothing to attend (the CPU path loops zero times)
  px_status st = check_geometry("attention backward", N, T, C, H);
  if (st != PX_OK) return st;
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  const Geo g = geo_of(T, C, H);
  const Drop dr = drop_of(drop);
  if (tc_path(bf16, C, H, qkv, dout) && ((((uintptr_t)o) & 15u) == 0)) {
    switch (g.d) {
    case 16: return tc_backward<16>(qkv, o, lse, dout, dqkv, scratch, N, T, g, dr, s);
    case 32: return tc_backward<32>(qkv, o, lse, dout, dqkv, scratch, N, T, g, dr, s);
    case 64: return tc_backward<64>(qkv, o, lse, dout, dqkv, scratch, N, T, g, dr, s);
    default: return tc_backward<128>(qkv, o, lse, dout, dqkv, scratch, N, T, g, dr, s);
    }
  }
  const bool rowwise = use_rowwise();
  if (rowwise) attn_bwd_dq<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, o, lse, dout, dqkv, scratch, g, dr);
  else attn_bwd_dq_tiled<<<blocks_of(N, T, H, kTileB), 32 * kTileB, 0, s>>>(qkv, o, lse, dout, dqkv, scratch, g, dr);
  if ((st = px_cuda_check_launch("attention backward (dq)")) != PX_OK) return st;
  if (rowwise) attn_bwd_dkv<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, lse, dout, scratch, dqkv, g, dr);
  else attn_bwd_dkv_tiled<<<blocks_of(N, T, H, kTileB), 32 * kTileB, 0, s>>>(qkv, lse, dout, scratch, dqkv, g, dr);
  return px_cuda_check_launch("attention backward (dk, dv)");
}
