// Global average pooling: torchvision's AdaptiveAvgPool2d(1) then flatten.
//
//   x: (N, C, H, W)  ->  y: (N, C),   y[n, c] = (1/S) Σ_{h,w} x[n, c, h, w],   S = H·W
//   dx[n, c, h, w] = dy[n, c] / S
//
// The sum runs in double and is divided by S once (PyTorch computes the
// mean as a sum divided by the count).
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <stdio.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_vision.h"
#endif

typedef struct global_pool {
  px_module base;
  px_tensor x; /* saved input: only its shape is used */
} global_pool;

static px_status gap_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  global_pool *g = (global_pool *)m;
  if (x->ndim != 4 || x->shape[0] < 1 || x->shape[1] < 1 || x->shape[2] < 1 || x->shape[3] < 1) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "GlobalAvgPool2d: input %s must be 4-D (N, C, H, W) and not empty",
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  const int64_t planes = x->shape[0] * x->shape[1], S = x->shape[2] * x->shape[3];
  int64_t yshape[2] = {x->shape[0], x->shape[1]};
  px_status st = px_ctx_tensor(ctx, y, 2, yshape);
  if (st != PX_OK) return st;
  const float *X = px_f32(x);
  float *Y = px_f32(y);
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) {  // one block per plane, the same double sum (k_pool.cu)
    st = px_k_gap_fwd(X, Y, planes, S);
    if (st == PX_OK) g->x = *x;
    return st;
  }
#endif
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)(planes * S)))
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *xp = X + pl * S;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t q = 0; q < S; q++) sum += xp[q];
    Y[pl] = (float)(sum / (double)S);
  }
  g->x = *x;
  return PX_OK;
}

static px_status gap_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  global_pool *g = (global_pool *)m;
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &g->x);
  if (st != PX_OK) return st;
  const int64_t planes = g->x.shape[0] * g->x.shape[1], S = g->x.shape[2] * g->x.shape[3];
  const float *DY = px_f32(dy);
  float *DX = px_f32(dx);
#ifdef PX_HAVE_CUDA
  if (g->x.device == PX_CUDA) return px_k_gap_bwd(DY, DX, planes, S);
#endif
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)(planes * S)))
  for (int64_t pl = 0; pl < planes; pl++) {
    const float v = DY[pl] / (float)S;  // divide, as PyTorch's mean backward does
    float *dxp = DX + pl * S;
#pragma omp simd
    for (int64_t q = 0; q < S; q++) dxp[q] = v;
  }
  return PX_OK;
}

static const px_module_ops global_pool_ops = {
  .type = "GlobalAvgPool2d",
  .forward = gap_forward,
  .backward = gap_backward,
};

px_module *px_global_avgpool2d(void) { return px_module_alloc(sizeof(global_pool), &global_pool_ops); }
