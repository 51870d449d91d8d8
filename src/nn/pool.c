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

typedef struct pool2d {
  px_module base;
  int       k, stride, pad;  /* pad: max-pool only */
  bool      is_max;
  // Saved by forward for backward.
  px_tensor x;       /* (N, C, H, W): only the shape is used */
  int       Ho, Wo;
  int32_t  *argmax;  /* (N, C, H', W'): index ih·W + iw within the plane (max only) */
} pool2d;

#if defined(__GNUC__)
#define POOL_INLINE static inline __attribute__((always_inline))
#else
#define POOL_INLINE static inline
#endif

// One (H, W) plane -> (H', W').  Window taps in PyTorch's scan order (row by
// row); a tap replaces the maximum when strictly greater or NaN, so the
// first maximum wins and NaN propagates.
POOL_INLINE void max_plane(const float *xp, float *yp, int32_t *ap, int W, int Ho, int Wo, int k, int s) {
  for (int oh = 0; oh < Ho; oh++) {
    const int32_t row0 = (int32_t)oh * s * W;
    #pragma omp simd simdlen(8)
    for (int ow = 0; ow < Wo; ow++) {
      const int32_t first = row0 + ow * s;
      float best = xp[first];
      int32_t at = first;
      for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
          const int32_t idx = first + i * W + j;
          const float v = xp[idx];
          const bool take = (v > best) | (v != v);
          best = take ? v : best;
          at = take ? idx : at;
        }
      yp[oh * Wo + ow] = best;
      ap[oh * Wo + ow] = at;
    }
  }
}

// Padded max-pool (ResNet's 3×3/2 pad-1 stem pool): each window clipped
// to the image; the first pixel inside it starts the scan, as in PyTorch.
static void max_plane_padded(const float *xp, float *yp, int32_t *ap, int H, int W, int Ho, int Wo, int k,
                             int s, int p) {
  for (int oh = 0; oh < Ho; oh++) {
    const int h0 = oh * s - p, i_lo = h0 < 0 ? -h0 : 0, i_hi = h0 + k > H ? H - h0 : k;
    for (int ow = 0; ow < Wo; ow++) {
      const int w0 = ow * s - p, j_lo = w0 < 0 ? -w0 : 0, j_hi = w0 + k > W ? W - w0 : k;
      int32_t at = (int32_t)(h0 + i_lo) * W + (w0 + j_lo);
      float best = xp[at];
      for (int i = i_lo; i < i_hi; i++)
        for (int j = j_lo; j < j_hi; j++) {
          const int32_t idx = (int32_t)(h0 + i) * W + (w0 + j);
          const float v = xp[idx];
          if ((v > best) | (v != v)) { best = v; at = idx; }
        }
      yp[oh * Wo + ow] = best;
      ap[oh * Wo + ow] = at;
    }
  }
}

// The common 2x2, stride 2 window written out: vectorizes over ow.
static void max_plane_2x2(const float *xp, float *yp, int32_t *ap, int W, int Ho, int Wo) {
  for (int oh = 0; oh < Ho; oh++) {
    const float *r0 = xp + (size_t)2 * oh * W, *r1 = r0 + W;
    // 8 lanes: rows of 7, 14, 28 outputs are the usual; 16 would leave them scalar.
    #pragma omp simd simdlen(8)
    for (int ow = 0; ow < Wo; ow++) {
      const int32_t first = (int32_t)(2 * oh * W + 2 * ow);
      float best = r0[2 * ow], v;
      int32_t at = first;
      bool take;
      v = r0[2 * ow + 1]; take = (v > best) | (v != v); best = take ? v : best; at = take ? first + 1 : at;
      v = r1[2 * ow];     take = (v > best) | (v != v); best = take ? v : best; at = take ? first + W : at;
      v = r1[2 * ow + 1]; take = (v > best) | (v != v); best = take ? v : best; at = take ? first + W + 1 : at;
      yp[oh * Wo + ow] = best;
      ap[oh * Wo + ow] = at;
    }
  }
}

// Sum in scan order, then divide by k² (as PyTorch does, not × 1/k²).
POOL_INLINE void avg_plane(const float *xp, float *yp, int W, int Ho, int Wo, int k, int s) {
  const float area = (float)(k * k);
  for (int oh = 0; oh < Ho; oh++) {
    const int32_t row0 = (int32_t)oh * s * W;
    #pragma omp simd simdlen(8)
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
  return px_error(PX_ERR_SHAPE, "%s(k=%d, stride=%d, padding=%d): input %s %s", m->ops->type, p->k, p->stride,
                  p->pad, px_shape_str(x->ndim, x->shape, s, sizeof s), what);
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
  #pragma omp parallel for schedule(static) if (PX_PAR(planes * in_plane))
  for (size_t pl = 0; pl < planes; pl++) {
    const float *xp = X + pl * in_plane;
    float *yp = Y + pl * out_plane;
    int32_t *ap = is_max ? A + pl * out_plane : NULL;
    // Fixed (k, s) for the common windows let the compiler unroll the
    // window; the written-out 2x2 kernel measured 10x the generic loop.
    if (pad) max_plane_padded(xp, yp, ap, (int)H, (int)W, Ho, Wo, k, s, pad);
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
            #pragma omp simd simdlen(8)
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
