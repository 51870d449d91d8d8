// LayerNorm over the last dimension, as torch.nn.LayerNorm(D).
//
//   x: (..., D) seen as (R, D)
//   μ_r = (1/D) Σ_j x[r, j],  σ²_r = (1/D) Σ_j (x[r, j] - μ_r)²   (biased)
//   x̂ = (x - μ_r)·rstd_r,  rstd_r = 1/√(σ²_r + ε),   y = γ ⊙ x̂ + β
//
// Backward:
//   dγ += Σ_r dy ⊙ x̂     dβ += Σ_r dy
//   dx̂ = γ ⊙ dy,  dx = rstd_r·(dx̂ - mean_j(dx̂) - x̂·mean_j(dx̂ ⊙ x̂))
// Row statistics accumulate in double.
//
// On the GPU (input with device PX_CUDA) the same math runs in
// src/tensor/cuda/k_norm.cu: one block per row, dγ and dβ as fixed-order
// column sums (no atomics: repeated runs give the same bits).
#include "plexus/nn.h"
#include "nn/device.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>

typedef struct layernorm {
  px_module base;
  int dim;
  float eps;
  // Saved by forward for backward.
  px_tensor x;        /* input, (R, D) */
  float *mean, *rstd; /* (R,) */
} layernorm;

// Columns of dγ, dβ that one thread owns while summing over rows.
#define LN_COL_BLOCK 64

PX_KERNEL static px_status ln_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  layernorm *l = (layernorm *)m;
  if (x->ndim < 1 || x->shape[x->ndim - 1] != l->dim) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "LayerNorm(%d, eps=%g) \"%s\": input %s must end in %d features", l->dim,
                    (double)l->eps, m->params[0].name, px_shape_str(x->ndim, x->shape, s, sizeof s), l->dim);
  }
  const int D = l->dim;
  const size_t R = (size_t)px_tensor_numel(x) / (size_t)D;
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  l->mean = px_arena_alloc(ctx->arena, (R ? R : 1) * sizeof(float));
  l->rstd = px_arena_alloc(ctx->arena, (R ? R : 1) * sizeof(float));
  if (!l->mean || !l->rstd) return PX_ERR_NOMEM;
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) {
    // y, mean and rstd came from the step arena, which is on the device.
    if ((st = px_nn_cuda_ctx(ctx, m)) != PX_OK) return st;
    st = px_k_layernorm_forward(px_f32(x), m->params[0].data, m->params[1].data, px_f32(y), l->mean, l->rstd,
                                (int64_t)R, D, l->eps);
    if (st == PX_OK) l->x = *x;
    return st;
  }
#endif
  const float *X = px_f32(x), *gamma = m->params[0].data, *beta = m->params[1].data;
  float *Y = px_f32(y);
  const double eps = l->eps;
#pragma omp parallel for schedule(static) if (PX_PAR(R * (size_t)D))
  for (size_t r = 0; r < R; r++) {
    const float *xr = X + r * D;
    float *yr = Y + r * D;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < D; j++) sum += xr[j];
    const double mu = sum / D;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < D; j++) {
      const double d = xr[j] - mu;
      ss += d * d;
    }
    const float fmu = (float)mu, rstd = (float)(1.0 / sqrt(ss / D + eps));
    l->mean[r] = fmu;
    l->rstd[r] = rstd;
#pragma omp simd
    for (int j = 0; j < D; j++) yr[j] = (xr[j] - fmu) * rstd * gamma[j] + beta[j];
  }
  l->x = *x;
  return PX_OK;
}

PX_KERNEL static px_status ln_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  layernorm *l = (layernorm *)m;
  const int D = l->dim;
  const size_t R = (size_t)px_tensor_numel(&l->x) / (size_t)D;
  const float *X = px_f32(&l->x), *DY = px_f32(dy), *gamma = m->params[0].data;
  float *dgamma = m->params[0].grad, *dbeta = m->params[1].grad;
  const float *mean = l->mean, *rstd = l->rstd;
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) {
    px_status st = px_nn_cuda_ctx(ctx, m);
    void *partials = st == PX_OK ? px_arena_alloc(ctx->arena, px_k_layernorm_partials_bytes((int64_t)R, D)) : NULL;
    if (st != PX_OK) return st;
    if (!partials) return PX_ERR_NOMEM;
    if (dx && (st = px_ctx_tensor_like(ctx, dx, &l->x)) != PX_OK) return st;
    return px_k_layernorm_backward(X, DY, gamma, mean, rstd, dgamma, dbeta, dx ? px_f32(dx) : NULL, partials,
                                   (int64_t)R, D);
  }
#endif
  // dγ[j] += Σ_r dy[r, j]·x̂[r, j],  dβ[j] += Σ_r dy[r, j]: a thread owns a block of columns.
  const int blocks = (D + LN_COL_BLOCK - 1) / LN_COL_BLOCK;
#pragma omp parallel for schedule(static) if (PX_PAR(R * (size_t)D))
  for (int blk = 0; blk < blocks; blk++) {
    const int j0 = blk * LN_COL_BLOCK, j1 = j0 + LN_COL_BLOCK < D ? j0 + LN_COL_BLOCK : D;
    double sg[LN_COL_BLOCK] = {0}, sb[LN_COL_BLOCK] = {0};
    for (size_t r = 0; r < R; r++) {
      const float *xr = X + r * D, *gr = DY + r * D;
      const float mu = mean[r], rs = rstd[r];
#pragma omp simd
      for (int j = j0; j < j1; j++) {
        sg[j - j0] += (double)gr[j] * ((xr[j] - mu) * rs);
        sb[j - j0] += gr[j];
      }
    }
    for (int j = j0; j < j1; j++) {
      dgamma[j] += (float)sg[j - j0];
      dbeta[j] += (float)sb[j - j0];
    }
  }
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &l->x);
  if (st != PX_OK) return st;
  float *DX = px_f32(dx);
#pragma omp parallel for schedule(static) if (PX_PAR(R * (size_t)D))
  for (size_t r = 0; r < R; r++) {
    const float *xr = X + r * D, *gr = DY + r * D;
    float *out = DX + r * D;
    const float mu = mean[r], rs = rstd[r];
    // mean_j(dx̂) and mean_j(dx̂ ⊙ x̂)
    double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
    for (int j = 0; j < D; j++) {
      const double g = (double)gamma[j] * gr[j];
      s1 += g;
      s2 += g * ((xr[j] - mu) * rs);
    }
    const float m1 = (float)(s1 / D), m2 = (float)(s2 / D);
#pragma omp simd
    for (int j = 0; j < D; j++) out[j] = rs * (gamma[j] * gr[j] - m1 - (xr[j] - mu) * rs * m2);
  }
  return PX_OK;
}

static const px_module_ops layernorm_ops = {
  .type = "LayerNorm",
  .forward = ln_forward,
  .backward = ln_backward,
};

px_module *px_layernorm(int dim, float eps) {
  if (dim <= 0 || !(eps >= 0.0f)) {
    px_error(PX_ERR_INVALID, "LayerNorm(%d, eps=%g): dim must be positive and eps >= 0", dim, (double)eps);
    return NULL;
  }
  layernorm *l = (layernorm *)px_module_alloc(sizeof *l, &layernorm_ops);
  if (!l) return NULL;
  l->dim = dim;
  l->eps = eps;
  int64_t shape[1] = {dim};
  px_module_add_param(&l->base, "weight", 1, shape, PX_INIT_ONES, 0.0f, false);
  px_module_add_param(&l->base, "bias", 1, shape, PX_INIT_ZEROS, 0.0f, false);
  return &l->base;
}
