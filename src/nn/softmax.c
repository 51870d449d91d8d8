// Softmax over the last dimension.
//
//   x: (..., D) seen as (R, D)
//   y[r, j] = exp(x[r, j] - max_r) / Σ_k exp(x[r, k] - max_r)   (max subtracted: no overflow)
//   dx[r, :] = y[r, :] ⊙ (dy[r, :] - Σ_k dy[r, k]·y[r, k])
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <math.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_transformer_a.h"
#endif

typedef struct softmax {
  px_module base;
  px_tensor y; /* saved output (R, D) */
} softmax;

PX_KERNEL static px_status softmax_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  softmax *sm = (softmax *)m;
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Softmax(dim=-1): input %s has no last dimension to normalise over",
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  const size_t D = (size_t)x->shape[x->ndim - 1], R = (size_t)px_tensor_numel(x) / D;
  if (x->device == PX_CUDA) {
#ifdef PX_HAVE_CUDA
    if (y->device != PX_CUDA)
      return px_error(PX_ERR_INVALID, "Softmax: input on the GPU but the step context on the CPU");
    sm->y = *y;
    return px_cuda_softmax_forward(px_f32(x), px_f32(y), R, D);
#else
    return px_error(PX_ERR_UNSUPPORTED, "Softmax: input on the GPU, but plexus was built without CUDA");
#endif
  }
  const float *X = px_f32(x);
  float *Y = px_f32(y);
#pragma omp parallel for schedule(static) if (PX_PAR(R * D))
  for (size_t r = 0; r < R; r++) {
    const float *xr = X + r * D;
    float *yr = Y + r * D;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (size_t j = 0; j < D; j++) mx = xr[j] > mx ? xr[j] : mx;
    float sum = 0.0f;
    for (size_t j = 0; j < D; j++) {
      yr[j] = expf(xr[j] - mx);
      sum += yr[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (size_t j = 0; j < D; j++) yr[j] *= inv;
  }
  sm->y = *y;
  return PX_OK;
}

PX_KERNEL static px_status softmax_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  softmax *sm = (softmax *)m;
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &sm->y);
  if (st != PX_OK) return st;
  const size_t D = (size_t)sm->y.shape[sm->y.ndim - 1], R = (size_t)px_tensor_numel(&sm->y) / D;
#ifdef PX_HAVE_CUDA
  if (sm->y.device == PX_CUDA) return px_cuda_softmax_backward(px_f32(&sm->y), px_f32(dy), px_f32(dx), R, D);
#endif
  const float *Y = px_f32(&sm->y), *DY = px_f32(dy);
  float *DX = px_f32(dx);
#pragma omp parallel for schedule(static) if (PX_PAR(R * D))
  for (size_t r = 0; r < R; r++) {
    const float *yr = Y + r * D, *gr = DY + r * D;
    float *out = DX + r * D;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (size_t j = 0; j < D; j++) dot += (double)gr[j] * yr[j];
    const float fdot = (float)dot;
#pragma omp simd
    for (size_t j = 0; j < D; j++) out[j] = yr[j] * (gr[j] - fdot);
  }
  return PX_OK;
}

static const px_module_ops softmax_ops = {
  .type = "Softmax",
  .forward = softmax_forward,
  .backward = softmax_backward,
};

px_module *px_softmax(void) { return px_module_alloc(sizeof(softmax), &softmax_ops); }
