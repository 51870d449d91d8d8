// MaxPool2d and AvgPool2d: k×k windows, stride s, floor mode (PyTorch's
// defaults; stride <= 0 means s = k); max-pool may pad by p <= k/2.
//
//   x: (N, C, H, W)  ->  y: (N, C, H', W'),  H' = (H + 2p - k)/s + 1
//   max: y[oh, ow] = x[a],  a = first argmax over the window in scan order
//        (strictly greater replaces, NaN wins, as PyTorch); window rows
//        oh·s - p + i, columns ow·s - p + j; padding is -∞ (never chosen:
//        with p <= k/2 every window holds at least one pixel)
//        dx[a] += dy[oh, ow]           (overlapping windows may share a)
//   avg: y[oh, ow] = (1/k²) Σ_window x
//        dx[window] += dy[oh, ow] / k²
//
// One thread owns one (n, c) plane, so backward's scatter is race-free.
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_vision.h"
#endif

typedef struct pool2d {
  px_module base;
  int k, stride, pad; /* pad: max-pool only */
  bool is_max;
  // Saved by forward for backward.
  px_tensor x; /* (N, C, H, W): only the shape is used */
  int Ho, Wo;
  int32_t *argmax; /* (N, C, H', W'): index ih·W + iw within the plane (max only) */
} pool2d;

#if defined(__GNUC__)
#define POOL_INLINE static inline __attribute__((always_inline))
#else
#define POOL_INLINE static inline
#endif

// The scan's step: (best, at) = (v, idx) when v > best or v is NaN, so the
// first maximum wins and NaN propagates.  Written with bit masks, not a
// branch or a float select that the compiler may turn into one: which way
// it goes depends on the data, and a mispredicted branch per tap made the
// 2x2 pool several times slower (docs/PERFORMANCE.md, "Figures behind code
// comments").
POOL_INLINE uint32_t take_mask(float v, float best) { return 0u - (uint32_t)((v > best) | (v != v)); }
POOL_INLINE float select_f32(uint32_t m, float a, float b) {  // m ? a : b, m all ones or zero
  uint32_t ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  ua = (ua & m) | (ub & ~m);
  memcpy(&a, &ua, sizeof a);
  return a;
}
POOL_INLINE int32_t select_i32(uint32_t m, int32_t a, int32_t b) {
  return (int32_t)(((uint32_t)a & m) | ((uint32_t)b & ~m));
}
POOL_INLINE void take_max(float v, int32_t idx, float *best, int32_t *at) {
  const uint32_t m = take_mask(v, *best);
  *best = select_f32(m, v, *best);
  *at = select_i32(m, idx, *at);
}

// Outputs [ow_lo, ow_hi) of one output row whose windows lie inside the
// plane: rows h0 .. h0 + k - 1, columns ow·s - p .. ow·s - p + k - 1.  Taps
// in PyTorch's scan order (row by row), each a take_max.  4 lanes: rows of
// 7 to 56 outputs are the usual (wider vectors left them to scalar code).
POOL_INLINE void max_row_inside(const float *restrict xp, float *restrict yrow, int32_t *restrict arow, int W, int h0,
                                int ow_lo, int ow_hi, int k, int s, int p) {
#pragma omp simd simdlen(4)
  for (int ow = ow_lo; ow < ow_hi; ow++) {
    const int32_t first = (int32_t)h0 * W + ow * s - p;
    float best = xp[first];
    int32_t at = first;
    for (int i = 0; i < k; i++)
      for (int j = 0; j < k; j++) take_max(xp[first + i * W + j], first + i * W + j, &best, &at);
    yrow[ow] = best;
    arow[ow] = at;
  }
}

// One (H, W) plane -> (H', W'), no padding.
POOL_INLINE void max_plane(const float *xp, float *yp, int32_t *ap, int W, int Ho, int Wo, int k, int s) {
  for (int oh = 0; oh < Ho; oh++) max_row_inside(xp, yp + oh * Wo, ap + oh * Wo, W, oh * s, 0, Wo, k, s, 0);
}

// Padded max-pool (ResNet's 3×3/2 pad-1 stem pool).  A window that reaches
// past an edge is clipped to the plane, and its first pixel inside starts
// the scan, as in PyTorch; windows wholly inside take max_row_inside.
POOL_INLINE void max_plane_padded(const float *xp, float *yp, int32_t *ap, int H, int W, int Ho, int Wo, int k, int s,
                                  int p) {
  // Columns whose windows are inside: ow·s - p >= 0 and ow·s - p + k <= W.
  int ow_lo = (p + s - 1) / s, ow_hi = W - k + p >= 0 ? (W - k + p) / s + 1 : 0;
  if (ow_hi > Wo) ow_hi = Wo;
  if (ow_lo > ow_hi) ow_lo = ow_hi;
  for (int oh = 0; oh < Ho; oh++) {
    const int h0 = oh * s - p, i_lo = h0 < 0 ? -h0 : 0, i_hi = h0 + k > H ? H - h0 : k;
    const bool rows_inside = i_lo == 0 && i_hi == k;
    if (rows_inside) max_row_inside(xp, yp + oh * Wo, ap + oh * Wo, W, h0, ow_lo, ow_hi, k, s, p);
    for (int ow = 0; ow < Wo; ow++) {
      if (rows_inside && ow == ow_lo) ow = ow_hi;  // done above
      if (ow >= Wo) break;
      const int w0 = ow * s - p, j_lo = w0 < 0 ? -w0 : 0, j_hi = w0 + k > W ? W - w0 : k;
      int32_t at = (int32_t)(h0 + i_lo) * W + (w0 + j_lo);
      float best = xp[at];
      for (int i = i_lo; i < i_hi; i++)
        for (int j = j_lo; j < j_hi; j++) {
          const int32_t idx = (int32_t)(h0 + i) * W + (w0 + j);
          take_max(xp[idx], idx, &best, &at);
        }
      yp[oh * Wo + ow] = best;
      ap[oh * Wo + ow] = at;
    }
  }
}

// The common 2x2, stride 2 window written out, as a tree that keeps the
// scan's rule: the first row's winner, then the second row's if it beats it
// (a tie stays with the earlier tap, a NaN of the later row wins).
static void max_plane_2x2(const float *restrict xp, float *restrict yp, int32_t *restrict ap, int W, int Ho, int Wo) {
  for (int oh = 0; oh < Ho; oh++) {
    const float *r0 = xp + (size_t)2 * oh * W, *r1 = r0 + W;
#pragma omp simd simdlen(4)
    for (int ow = 0; ow < Wo; ow++) {
      const int32_t first = (int32_t)(2 * oh * W + 2 * ow);
      const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      const uint32_t mb = take_mask(b, a), md = take_mask(d, c);
      const float top = select_f32(mb, b, a), bottom = select_f32(md, d, c);
      const uint32_t mv = take_mask(bottom, top);
      yp[oh * Wo + ow] = select_f32(mv, bottom, top);
      ap[oh * Wo + ow] = select_i32(mv, first + W + (int32_t)(md & 1), first + (int32_t)(mb & 1));
    }
  }
}

// Sum in scan order, then divide by k² (as PyTorch does, not × 1/k²).
POOL_INLINE void avg_plane(const float *xp, float *yp, int W, int Ho, int Wo, int k, int s) {
  const float area = (float)(k * k);
  for (int oh = 0; oh < Ho; oh++) {
    const int32_t row0 = (int32_t)oh * s * W;
#pragma omp simd simdlen(4)
    for (int ow = 0; ow < Wo; ow++) {
      const int32_t first = row0 + ow * s;
      float sum = 0.0f;
      for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) sum += xp[first + i * W + j];
      yp[oh * Wo + ow] = sum / area;
    }
  }
}

static px_status pool_check(const px_module *m, const px_tensor *x) {
  const pool2d *p = (const pool2d *)m;
  const char *what = NULL;
  char why[128];
  if (x->ndim != 4) what = "must be 4-D (N, C, H, W)";
  else if (x->shape[0] < 1 || x->shape[1] < 1) what = "is empty";
  else if (x->shape[2] + 2 * p->pad < p->k || x->shape[3] + 2 * p->pad < p->k) {
    if (p->pad) snprintf(why, sizeof why, "is smaller than the %dx%d window (padded by %d)", p->k, p->k, p->pad);
    else snprintf(why, sizeof why, "is smaller than the %dx%d window", p->k, p->k);
    what = why;
  } else if (x->shape[2] * x->shape[3] > INT32_MAX) {
    what = "has planes too large for int32 argmax indices";
  }
  if (!what) return PX_OK;
  char s[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "%s(k=%d, stride=%d, padding=%d): input %s %s", m->ops->type, p->k, p->stride, p->pad,
                  px_shape_str(x->ndim, x->shape, s, sizeof s), what);
}

static px_status pool_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  pool2d *p = (pool2d *)m;
  px_status st = pool_check(m, x);
  if (st != PX_OK) return st;
  const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  const int k = p->k, s = p->stride, pad = p->pad;
  const int Ho = (int)((H + 2 * pad - k) / s + 1), Wo = (int)((W + 2 * pad - k) / s + 1);
  int64_t yshape[4] = {N, C, Ho, Wo};
  st = px_ctx_tensor(ctx, y, 4, yshape);
  if (st != PX_OK) return st;
  const size_t planes = (size_t)(N * C), in_plane = (size_t)(H * W), out_plane = (size_t)Ho * Wo;
  p->argmax = NULL;
  if (p->is_max) {
    p->argmax = px_arena_alloc(ctx->arena, planes * out_plane * sizeof *p->argmax);
    if (!p->argmax) return PX_ERR_NOMEM;
  }
  const float *X = px_f32(x);
  float *Y = px_f32(y);
  int32_t *A = p->argmax;
  const bool is_max = p->is_max;
#ifdef PX_HAVE_CUDA
  // The device path: one thread per output, the same scan (k_pool.cu).
  if (x->device == PX_CUDA) {
    st = is_max ? px_k_maxpool_fwd(X, Y, A, (int64_t)planes, (int)H, (int)W, k, s, pad, Ho, Wo)
                : px_k_avgpool_fwd(X, Y, (int64_t)planes, (int)H, (int)W, k, s, Ho, Wo);
    if (st != PX_OK) return st;
    p->x = *x;
    p->Ho = Ho;
    p->Wo = Wo;
    return PX_OK;
  }
#endif
#pragma omp parallel for schedule(static) if (PX_PAR(planes * in_plane))
  for (size_t pl = 0; pl < planes; pl++) {
    const float *xp = X + pl * in_plane;
    float *yp = Y + pl * out_plane;
    int32_t *ap = is_max ? A + pl * out_plane : NULL;
    // Fixed (k, s) for the common windows let the compiler unroll the
    // window; the written-out 2x2 kernel is many times the generic loop
    // (docs/PERFORMANCE.md, "Figures behind code comments").
    if (pad && k == 3 && s == 2 && pad == 1) max_plane_padded(xp, yp, ap, (int)H, (int)W, Ho, Wo, 3, 2, 1);
    else if (pad) max_plane_padded(xp, yp, ap, (int)H, (int)W, Ho, Wo, k, s, pad);
    else if (is_max && k == 2 && s == 2) max_plane_2x2(xp, yp, ap, (int)W, Ho, Wo);
    else if (is_max && k == 3 && s == 2) max_plane(xp, yp, ap, (int)W, Ho, Wo, 3, 2);
    else if (is_max) max_plane(xp, yp, ap, (int)W, Ho, Wo, k, s);
    else if (k == 2 && s == 2) avg_plane(xp, yp, (int)W, Ho, Wo, 2, 2);
    else avg_plane(xp, yp, (int)W, Ho, Wo, k, s);
  }
  p->x = *x;
  p->Ho = Ho;
  p->Wo = Wo;
  return PX_OK;
}

static px_status pool_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  pool2d *p = (pool2d *)m;
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &p->x);
  if (st != PX_OK) return st;
  const int64_t W = p->x.shape[3];
  const int k = p->k, s = p->stride, Ho = p->Ho, Wo = p->Wo;
  const size_t planes = (size_t)(p->x.shape[0] * p->x.shape[1]);
  const size_t in_plane = (size_t)(p->x.shape[2] * W), out_plane = (size_t)Ho * Wo;
  const float *DY = px_f32(dy);
  float *DX = px_f32(dx);
  const int32_t *A = p->argmax;
#ifdef PX_HAVE_CUDA
  // The device path: one thread per input pixel gathers what the CPU's
  // scatter below adds to it, in the same order (k_pool.cu).
  if (p->x.device == PX_CUDA) {
    const int H = (int)p->x.shape[2];
    return p->is_max ? px_k_maxpool_bwd(DY, A, DX, (int64_t)planes, H, (int)W, k, s, p->pad, Ho, Wo)
                     : px_k_avgpool_bwd(DY, DX, (int64_t)planes, H, (int)W, k, s, Ho, Wo);
  }
#endif
  const float area = (float)(k * k);  // divide, as PyTorch does (not × 1/k²)
#pragma omp parallel for schedule(static) if (PX_PAR(planes * in_plane))
  for (size_t pl = 0; pl < planes; pl++) {
    float *dxp = DX + pl * in_plane;
    const float *dyp = DY + pl * out_plane;
    memset(dxp, 0, in_plane * sizeof *dxp);
    if (p->is_max) {
      const int32_t *ap = A + pl * out_plane;
      for (size_t q = 0; q < out_plane; q++) dxp[ap[q]] += dyp[q];
    } else {
      // Distinct ow touch distinct elements for a fixed tap (i, j): the ow loop vectorizes.
      for (int oh = 0; oh < Ho; oh++) {
        const float *g = dyp + (size_t)oh * Wo;
        for (int i = 0; i < k; i++)
          for (int j = 0; j < k; j++) {
            float *r = dxp + (size_t)(oh * s + i) * W + j;
#pragma omp simd simdlen(4)
            for (int ow = 0; ow < Wo; ow++) r[(size_t)ow * s] += g[ow] / area;
          }
      }
    }
  }
  return PX_OK;
}

static const px_module_ops maxpool_ops = {.type = "MaxPool2d", .forward = pool_forward, .backward = pool_backward};
static const px_module_ops avgpool_ops = {.type = "AvgPool2d", .forward = pool_forward, .backward = pool_backward};

static px_module *pool_new(const px_module_ops *ops, int kernel_size, int stride, int padding, bool is_max) {
  if (kernel_size <= 0) {
    px_error(PX_ERR_INVALID, "%s(k=%d, stride=%d): kernel size must be positive", ops->type, kernel_size, stride);
    return NULL;
  }
  // PyTorch's rule too: a wider pad would make windows of padding only.
  if (padding < 0 || padding > kernel_size / 2) {
    px_error(PX_ERR_INVALID, "%s(k=%d, stride=%d, padding=%d): padding must be in [0, k/2] = [0, %d]", ops->type,
             kernel_size, stride, padding, kernel_size / 2);
    return NULL;
  }
  pool2d *p = (pool2d *)px_module_alloc(sizeof *p, ops);
  if (!p) return NULL;
  p->k = kernel_size;
  p->stride = stride > 0 ? stride : kernel_size;
  p->pad = padding;
  p->is_max = is_max;
  return &p->base;
}

px_module *px_maxpool2d(int kernel_size, int stride) { return pool_new(&maxpool_ops, kernel_size, stride, 0, true); }
px_module *px_maxpool2d_padded(int kernel_size, int stride, int padding) {
  return pool_new(&maxpool_ops, kernel_size, stride, padding, true);
}
px_module *px_avgpool2d(int kernel_size, int stride) { return pool_new(&avgpool_ops, kernel_size, stride, 0, false); }
