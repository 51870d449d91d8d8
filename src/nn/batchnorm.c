// BatchNorm over the channel dimension, as torch.nn.BatchNorm1d/2d.
//
//   x: (N, C), (N, C, L) or (N, C, H, W), seen as (N, C, S);  n = N·S values per channel
//   training:  μ = (1/n) Σ x,  σ² = (1/n) Σ (x - μ)²           (biased)
//              running_mean = (1 - m)·running_mean + m·μ
//              running_var  = (1 - m)·running_var  + m·σ²·n/(n - 1)   (unbiased)
//   eval:      μ, σ² = running_mean, running_var
//   y = γ·(x - μ)·istd + β,  istd = 1/√(σ² + ε)    computed as y = x·α + (β - μ·α), α = γ·istd
//
// Backward (per channel, sums over the n values):
//   dβ += Σ dy          dγ += Σ dy·x̂,   x̂ = (x - μ)·istd
//   training (μ, σ² depend on x):
//     dx = γ·istd·(dy - (1/n)Σdy - x̂·(1/n)Σ(dy·x̂))
//        = (1/n)·istd·(n·dx̂ - Σdx̂ - x̂·Σ(dx̂·x̂)),  dx̂ = γ·dy
//   eval (constants): dx = γ·istd·dy
// Sums accumulate in double, as PyTorch's CPU kernel does.
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>

typedef struct batchnorm {
  px_module base;
  int       channels;
  float     eps, momentum;
  // Saved by forward for backward.
  px_tensor x;           /* input, (N, C, S) */
  float    *mean, *istd; /* (C,) the statistics used */
  bool      batch_stats; /* forward normalised with batch statistics */
} batchnorm;

enum { BN_WEIGHT, BN_BIAS, BN_RUNNING_MEAN, BN_RUNNING_VAR };

static px_status bn_shape_error(const px_module *m, const px_tensor *x, const char *why) {
  const batchnorm *b = (const batchnorm *)m;
  char s[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "BatchNorm(%d, eps=%g, momentum=%g) \"%s\": input %s %s", b->channels,
                  (double)b->eps, (double)b->momentum, m->params[BN_WEIGHT].name,
                  px_shape_str(x->ndim, x->shape, s, sizeof s), why);
}

// N, S of x seen as (N, C, S).
static void bn_dims(const px_tensor *x, int64_t *N, int64_t *S) {
  *N = x->shape[0];
  *S = 1;
  for (int i = 2; i < x->ndim; i++) *S *= x->shape[i];
}

static px_status bn_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  batchnorm *b = (batchnorm *)m;
  char why[128];
  if (x->ndim < 2) return bn_shape_error(m, x, "must be (N, C), (N, C, L) or (N, C, H, W)");
  if (x->shape[1] != b->channels) {
    snprintf(why, sizeof why, "has %lld channels, expected %d", (long long)x->shape[1], b->channels);
    return bn_shape_error(m, x, why);
  }
  int64_t N, S;
  bn_dims(x, &N, &S);
  const int C = b->channels;
  const int64_t n = N * S;
  const bool batch_stats = m->training;
  if (n < 1) return bn_shape_error(m, x, "is empty");
  if (batch_stats && n < 2) {
    snprintf(why, sizeof why, "has 1 value per channel; training needs more than 1 (the variance is undefined)");
    return bn_shape_error(m, x, why);
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  b->mean = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
  b->istd = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
  if (!b->mean || !b->istd) return PX_ERR_NOMEM;

  const float *X = px_f32(x), *gamma = m->params[BN_WEIGHT].data, *beta = m->params[BN_BIAS].data;
  float *rmean = m->params[BN_RUNNING_MEAN].data, *rvar = m->params[BN_RUNNING_VAR].data;
  float *Y = px_f32(y);
  const size_t total = (size_t)n * (size_t)C;
  const float mom = b->momentum, eps = b->eps;
  #pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    float mu, istd;
    if (batch_stats) {
      double sum = 0.0;
      for (int64_t i = 0; i < N; i++) {
        const float *row = X + ((size_t)i * C + c) * S;
        #pragma omp simd reduction(+ : sum)
        for (int64_t q = 0; q < S; q++) sum += row[q];
      }
      const double dmu = sum / (double)n;
      double ss = 0.0;
      for (int64_t i = 0; i < N; i++) {
        const float *row = X + ((size_t)i * C + c) * S;
        #pragma omp simd reduction(+ : ss)
        for (int64_t q = 0; q < S; q++) { const double d = row[q] - dmu; ss += d * d; }
      }
      mu = (float)dmu;
      istd = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
      rmean[c] = (float)(mom * dmu + (1.0 - mom) * rmean[c]);
      rvar[c] = (float)(mom * (ss / (double)(n - 1)) + (1.0 - mom) * rvar[c]);
    } else {
      mu = rmean[c];
      istd = (float)(1.0 / sqrt((double)rvar[c] + (double)eps));
    }
    b->mean[c] = mu;
    b->istd[c] = istd;
    const float alpha = gamma[c] * istd, shift = beta[c] - mu * alpha;
    for (int64_t i = 0; i < N; i++) {
      const float *row = X + ((size_t)i * C + c) * S;
      float *out = Y + ((size_t)i * C + c) * S;
      #pragma omp simd
      for (int64_t q = 0; q < S; q++) out[q] = row[q] * alpha + shift;
    }
  }
  b->x = *x;
  b->batch_stats = batch_stats;
  return PX_OK;
}

static px_status bn_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  batchnorm *b = (batchnorm *)m;
  int64_t N, S;
  bn_dims(&b->x, &N, &S);
  const int C = b->channels;
  const int64_t n = N * S;
  if (dx) {
    px_status st = px_ctx_tensor_like(ctx, dx, &b->x);
    if (st != PX_OK) return st;
  }
  const float *X = px_f32(&b->x), *DY = px_f32(dy), *gamma = m->params[BN_WEIGHT].data;
  float *dgamma = m->params[BN_WEIGHT].grad, *dbeta = m->params[BN_BIAS].grad;
  float *DX = dx ? px_f32(dx) : NULL;
  const size_t total = (size_t)n * (size_t)C;
  #pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    const float mu = b->mean[c], istd = b->istd[c];
    // Σ dy and Σ dy·(x - μ)
    double sum_dy = 0.0, dot = 0.0;
    for (int64_t i = 0; i < N; i++) {
      const float *xr = X + ((size_t)i * C + c) * S, *gr = DY + ((size_t)i * C + c) * S;
      #pragma omp simd reduction(+ : sum_dy, dot)
      for (int64_t q = 0; q < S; q++) { sum_dy += gr[q]; dot += (double)gr[q] * (xr[q] - mu); }
    }
    dgamma[c] += (float)(dot * istd);  // Σ dy·x̂
    dbeta[c] += (float)sum_dy;
    if (!DX) continue;
    if (b->batch_stats) {
      // dx = γ·istd·(dy - Σdy/n - (x - μ)·istd²·Σ(dy·(x - μ))/n)
      const float mean_dy = (float)(sum_dy / (double)n);
      const float proj = (float)(dot * istd * istd / (double)n);
      const float scale = gamma[c] * istd;
      for (int64_t i = 0; i < N; i++) {
        const size_t off = ((size_t)i * C + c) * S;
        const float *xr = X + off, *gr = DY + off;
        float *out = DX + off;
        #pragma omp simd
        for (int64_t q = 0; q < S; q++) out[q] = (gr[q] - mean_dy - (xr[q] - mu) * proj) * scale;
      }
    } else {
      const float scale = gamma[c] * istd;
      for (int64_t i = 0; i < N; i++) {
        const size_t off = ((size_t)i * C + c) * S;
        const float *gr = DY + off;
        float *out = DX + off;
        #pragma omp simd
        for (int64_t q = 0; q < S; q++) out[q] = gr[q] * scale;
      }
    }
  }
  return PX_OK;
}

static const px_module_ops batchnorm_ops = {
  .type = "BatchNorm", .forward = bn_forward, .backward = bn_backward,
};

px_module *px_batchnorm(int channels, float eps, float momentum) {
  if (channels <= 0 || !(eps >= 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f)) {
    px_error(PX_ERR_INVALID,
             "BatchNorm(%d, eps=%g, momentum=%g): channels must be positive, eps >= 0, momentum in [0, 1]",
             channels, (double)eps, (double)momentum);
    return NULL;
  }
  batchnorm *b = (batchnorm *)px_module_alloc(sizeof *b, &batchnorm_ops);
  if (!b) return NULL;
  b->channels = channels;
  b->eps = eps;
  b->momentum = momentum;
  int64_t shape[1] = {channels};
  // Order fixes the enum above and PyTorch's state_dict order.
  px_module_add_param(&b->base, "weight", 1, shape, PX_INIT_ONES, 0.0f, false);
  px_module_add_param(&b->base, "bias", 1, shape, PX_INIT_ZEROS, 0.0f, false);
  px_module_add_param(&b->base, "running_mean", 1, shape, PX_INIT_ZEROS, 0.0f, true);
  px_module_add_param(&b->base, "running_var", 1, shape, PX_INIT_ONES, 0.0f, true);
  return &b->base;
}
