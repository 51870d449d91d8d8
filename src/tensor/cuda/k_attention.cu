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

#include <cuda_runtime.h>
#include <math.h>
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
  bool     on;
  float    p, inv_keep;  // 1/(1-p)
  uint64_t seed, hi;
  int      head0, heads_total;
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
  const uint64_t e = (((uint64_t)n * (uint64_t)dr.heads_total + (uint64_t)(dr.head0 + h)) * (uint64_t)T +
                      (uint64_t)i) * (uint64_t)T + (uint64_t)j;
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

__global__ void attn_bwd_dkv(const float *qkv, const float *lse, const float *dout, const float *Dterm,
                             float *dqkv, Geo g, Drop dr) {
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

__global__ void __launch_bounds__(32 * kTileB) attn_bwd_dq_tiled(const float *qkv, const float *o, const float *lse,
                                                                 const float *dout, float *dqkv, float *Dterm, Geo g,
                                                                 Drop dr) {
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
                    "%s (CUDA): N %d, T %d, width %d, heads %d: need a head width C/H of at most %d",
                    what, N, T, C, H, PX_CUDA_ATT_MAX_D);
  const long long blocks = (long long)N * H * ((T + kWarps - 1) / kWarps);
  if (blocks > 0x7fffffffLL) return px_error(PX_ERR_UNSUPPORTED, "%s (CUDA): %lld blocks is too many", what, blocks);
  return PX_OK;
}

Geo geo_of(int T, int C, int H) {
  Geo g;
  g.T = T; g.C = C; g.H = H; g.d = C / H; g.ld = 3 * C;
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

}  // namespace

extern "C" px_status px_cuda_attention_forward(const float *qkv, float *o, float *lse, int N, int T, int C, int H,
                                               const px_cuda_att_drop *drop) {
  if (N == 0 || T == 0) return PX_OK;  // nothing to attend (the CPU path loops zero times)
  px_status st = check_geometry("attention forward", N, T, C, H);
  if (st != PX_OK) return st;
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  if (use_rowwise())
    attn_fwd<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, o, lse, geo_of(T, C, H), drop_of(drop));
  else
    attn_fwd_tiled<<<blocks_of(N, T, H, kTileF), 32 * kTileF, 0, s>>>(qkv, o, lse, geo_of(T, C, H), drop_of(drop));
  return px_cuda_check_launch("attention forward");
}

extern "C" px_status px_cuda_attention_backward(const float *qkv, const float *o, const float *lse,
                                                const float *dout, float *dqkv, float *scratch, int N, int T,
                                                int C, int H, const px_cuda_att_drop *drop) {
  if (N == 0 || T == 0) return PX_OK;  // nothing to attend (the CPU path loops zero times)
  px_status st = check_geometry("attention backward", N, T, C, H);
  if (st != PX_OK) return st;
  cudaStream_t s = (cudaStream_t)px_cuda_compute_stream();
  const Geo g = geo_of(T, C, H);
  const Drop dr = drop_of(drop);
  const bool rowwise = use_rowwise();
  if (rowwise)
    attn_bwd_dq<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, o, lse, dout, dqkv, scratch, g, dr);
  else
    attn_bwd_dq_tiled<<<blocks_of(N, T, H, kTileB), 32 * kTileB, 0, s>>>(qkv, o, lse, dout, dqkv, scratch, g, dr);
  if ((st = px_cuda_check_launch("attention backward (dq)")) != PX_OK) return st;
  if (rowwise)
    attn_bwd_dkv<<<blocks_of(N, T, H, kWarps), 32 * kWarps, 0, s>>>(qkv, lse, dout, scratch, dqkv, g, dr);
  else
    attn_bwd_dkv_tiled<<<blocks_of(N, T, H, kTileB), 32 * kTileB, 0, s>>>(qkv, lse, dout, scratch, dqkv, g, dr);
  return px_cuda_check_launch("attention backward (dk, dv)");
}
