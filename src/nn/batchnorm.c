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
//
// Fused ReLU (CPU, not synchronized): when a Chain runs a BatchNorm right
// before a ReLU it asks for the ReLU here (px_batchnorm_fuse_relu_next),
// and the normalising pass writes y = max(x·α + shift, 0) with the ReLU's
// own formula; the ReLU then passes its input through (activation.c).
// Backward masks dy with [y > 0] inside its two passes, which is the ReLU's
// [x > 0] on the same values, y recomputed from the input with the forward's
// α and shift (the same float operations, so the same y): the same bits as
// the two modules apart, one pass over the activations fewer each way, and
// y never read again (docs/LAYERS.md).
//
// Synchronized (px_sync_batchnorm_convert, as torch.nn.SyncBatchNorm): in
// training the statistics are those of the batch of ALL ranks of a comm:
//   forward   Σx and n all-reduced -> μ;  Σ(x - μ)² all-reduced -> σ²
//   backward  Σdy and Σdy·(x - μ) all-reduced for dx (n the global count);
//             dγ, dβ take this rank's sums (DDP averages them, as it does
//             every gradient)
// so N ranks of B samples compute what one process computes on the N·B
// batch (the loss of each rank being the mean over its B).  Every rank
// must run the same training forwards and backwards (DDP's contract).
#include "plexus/nn.h"
#include "plexus/parallel.h" /* px_sync_batchnorm_convert, px_comm */
#include "nn/internal.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_vision.h"
#endif

typedef struct batchnorm {
  px_module base;
  int channels;
  float eps, momentum;
  // Saved by forward for backward.
  px_tensor x;          /* input, (N, C, S) */
  float *mean, *istd;   /* (C,) the statistics used */
  bool batch_stats;     /* forward normalised with batch statistics */
  px_comm *sync;        /* synchronized: statistics over this comm's ranks (NULL: this rank's batch) */
  double n_total;       /* values per channel the statistics saw (all ranks) */
  bool relu_next;       /* the caller's Chain runs a ReLU on y next: fuse it (this forward only) */
  bool relu_applied;    /* the last forward wrote relu(y): backward masks dy with [y > 0] */
  float *alpha, *shift; /* (C,) that forward's y = x·alpha + shift (with relu_applied) */
} batchnorm;

enum { BN_WEIGHT, BN_BIAS, BN_RUNNING_MEAN, BN_RUNNING_VAR };

static px_status bn_shape_error(const px_module *m, const px_tensor *x, const char *why) {
  const batchnorm *b = (const batchnorm *)m;
  char s[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "BatchNorm(%d, eps=%g, momentum=%g) \"%s\": input %s %s", b->channels, (double)b->eps,
                  (double)b->momentum, m->params[BN_WEIGHT].name, px_shape_str(x->ndim, x->shape, s, sizeof s), why);
}

// N, S of x seen as (N, C, S).
static void bn_dims(const px_tensor *x, int64_t *N, int64_t *S) {
  *N = x->shape[0];
  *S = 1;
  for (int i = 2; i < x->ndim; i++) *S *= x->shape[i];
}

// The statistics of channel c sum over N rows of S values each.  They run
// in double as four independent chains, rows i..i+3 side by side: with one
// accumulator every vector add waits for the one before, and the passes
// ran at a fraction of the speed the loads allow (docs/PERFORMANCE.md,
// "Figures behind code comments", has the measurement).
//   channel_sum:      Σ x
//   channel_sum_dev2: Σ (x - μ)²
//   channel_dy_sums:  Σ dy and Σ dy·(x - μ)   (x - μ in float)
// `base` points at row 0 of channel c; rows are `stride` floats apart (C·S).
PX_KERNEL static double channel_sum(const float *base, int64_t N, int64_t S, size_t stride) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= N; i += 4) {
    const float *r0 = base + (size_t)i * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t q = 0; q < S; q++) {
      s0 += r0[q];
      s1 += r1[q];
      s2 += r2[q];
      s3 += r3[q];
    }
  }
  for (; i < N; i++) {
    const float *r0 = base + (size_t)i * stride;
#pragma omp simd reduction(+ : s0)
    for (int64_t q = 0; q < S; q++) s0 += r0[q];
  }
  return (s0 + s1) + (s2 + s3);
}

PX_KERNEL static double channel_sum_dev2(const float *base, int64_t N, int64_t S, size_t stride, double mu) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= N; i += 4) {
    const float *r0 = base + (size_t)i * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t q = 0; q < S; q++) {
      const double d0 = r0[q] - mu, d1 = r1[q] - mu, d2 = r2[q] - mu, d3 = r3[q] - mu;
      s0 += d0 * d0;
      s1 += d1 * d1;
      s2 += d2 * d2;
      s3 += d3 * d3;
    }
  }
  for (; i < N; i++) {
    const float *r0 = base + (size_t)i * stride;
#pragma omp simd reduction(+ : s0)
    for (int64_t q = 0; q < S; q++) {
      const double d = r0[q] - mu;
      s0 += d * d;
    }
  }
  return (s0 + s1) + (s2 + s3);
}

// dy of a fused ReLU's output: the ReLU module's backward formula, [y > 0]
// with y = x·α + shift recomputed from the BatchNorm's input and the α,
// shift its forward used (saved): the same float operations as the forward
// (no FMA contraction in ISO C), so the same y and the same mask, without
// reading y (one stream of three fewer in each backward pass).  A select
// between two loaded values (a load under the condition does not vectorise).
static inline float relu_dy(float g, float x, float alpha, float shift) {
  const float y = x * alpha + shift;
  return y > 0.0f ? g : 0.0f;
}

// With `masked`, dy is read as relu_dy (a fused ReLU's backward); the flag
// is a constant in each caller, so each copy is a plain loop.
static inline __attribute__((always_inline)) void dy_sums_impl(const float *xb, const float *gb, bool masked,
                                                               float alpha, float shift, int64_t N, int64_t S,
                                                               size_t stride, float mu, double *sum_dy, double *dot) {
#define MASKED_DY(g, x, q) (masked ? relu_dy((g)[q], (x)[q], alpha, shift) : (g)[q])
  double g0 = 0.0, g1 = 0.0, g2 = 0.0, g3 = 0.0, d0 = 0.0, d1 = 0.0, d2 = 0.0, d3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= N; i += 4) {
    const size_t o = (size_t)i * stride;
    const float *x0 = xb + o, *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
    const float *y0 = gb + o, *y1 = y0 + stride, *y2 = y1 + stride, *y3 = y2 + stride;
#pragma omp simd reduction(+ : g0, g1, g2, g3, d0, d1, d2, d3)
    for (int64_t q = 0; q < S; q++) {
      const float e0 = MASKED_DY(y0, x0, q), e1 = MASKED_DY(y1, x1, q), e2 = MASKED_DY(y2, x2, q),
                  e3 = MASKED_DY(y3, x3, q);
      g0 += e0;
      g1 += e1;
      g2 += e2;
      g3 += e3;
      d0 += (double)e0 * (x0[q] - mu);
      d1 += (double)e1 * (x1[q] - mu);
      d2 += (double)e2 * (x2[q] - mu);
      d3 += (double)e3 * (x3[q] - mu);
    }
  }
  for (; i < N; i++) {
    const size_t o = (size_t)i * stride;
    const float *x0 = xb + o, *y0 = gb + o;
#pragma omp simd reduction(+ : g0, d0)
    for (int64_t q = 0; q < S; q++) {
      const float e0 = MASKED_DY(y0, x0, q);
      g0 += e0;
      d0 += (double)e0 * (x0[q] - mu);
    }
  }
  *sum_dy = (g0 + g1) + (g2 + g3);
  *dot = (d0 + d1) + (d2 + d3);
#undef MASKED_DY
}

PX_KERNEL static void channel_dy_sums(const float *xb, const float *gb, int64_t N, int64_t S, size_t stride, float mu,
                                      double *sum_dy, double *dot) {
  dy_sums_impl(xb, gb, false, 0.0f, 0.0f, N, S, stride, mu, sum_dy, dot);
}

PX_KERNEL static void channel_dy_sums_relu(const float *xb, const float *gb, float alpha, float shift, int64_t N,
                                           int64_t S, size_t stride, float mu, double *sum_dy, double *dot) {
  dy_sums_impl(xb, gb, true, alpha, shift, N, S, stride, mu, sum_dy, dot);
}

// Channel c of y = x·α + shift, or of relu(x·α + shift) with the ReLU
// module's formula.  No FMA contraction (ISO C: -ffp-contract=off), so every
// copy of PX_KERNEL rounds as the baseline one.
PX_KERNEL static void apply_channel(const float *X, float *Y, int c, int C, int64_t N, int64_t S, float alpha,
                                    float shift, bool relu) {
  for (int64_t i = 0; i < N; i++) {
    const float *row = X + ((size_t)i * C + c) * S;
    float *out = Y + ((size_t)i * C + c) * S;
    if (relu) {
#pragma omp simd
      for (int64_t q = 0; q < S; q++) {
        const float v = row[q] * alpha + shift;
        out[q] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp simd
      for (int64_t q = 0; q < S; q++) out[q] = row[q] * alpha + shift;
    }
  }
}

// y = x·α + (β - μ·α) per channel, with the statistics in b->mean, b->istd.
static void bn_apply(batchnorm *b, const px_tensor *x, px_tensor *y) {
  int64_t N, S;
  bn_dims(x, &N, &S);
  const int C = b->channels;
  const float *X = px_f32(x), *gamma = b->base.params[BN_WEIGHT].data, *beta = b->base.params[BN_BIAS].data;
  float *Y = px_f32(y);
  const size_t total = (size_t)(N * S) * (size_t)C;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    const float alpha = gamma[c] * b->istd[c], shift = beta[c] - b->mean[c] * alpha;
    apply_channel(X, Y, c, C, N, S, alpha, shift, false);
  }
}

// Training forward of a synchronized batch norm: the statistics of every
// rank's batch (two all-reduces of C + 1 and C doubles).
static px_status sync_forward(batchnorm *b, px_ctx *ctx, const px_tensor *x, px_tensor *y, bool update_running) {
  px_module *m = &b->base;
  int64_t N, S;
  bn_dims(x, &N, &S);
  const int C = b->channels;
  const float *X = px_f32(x);
  double *red = px_arena_alloc(ctx->arena, (size_t)(C + 1) * sizeof(double));
  if (!red) return PX_ERR_NOMEM;
  const size_t total = (size_t)(N * S) * (size_t)C;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) red[c] = channel_sum(X + (size_t)c * S, N, S, (size_t)C * S);
  red[C] = (double)(N * S);
  px_status st = px_comm_allreduce(b->sync, red, (size_t)C + 1, PX_F64, PX_SUM);
  if (st != PX_OK) return px_error_wrap(st, "SyncBatchNorm \"%s\": all-reduce of the sums", m->params[BN_WEIGHT].name);
  const double n = red[C];
  if (n < 2) {
    char why[160];
    snprintf(why, sizeof why, "has %.0f value%s per channel over all ranks; training needs more than 1", n,
             n == 1 ? "" : "s");
    return bn_shape_error(m, x, why);
  }
  b->n_total = n;
  double *mu = red;  // Σx / n, then the deviations' sums in a second array
  for (int c = 0; c < C; c++) mu[c] /= n;
  double *ss = px_arena_alloc(ctx->arena, (size_t)C * sizeof(double));
  if (!ss) return PX_ERR_NOMEM;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) ss[c] = channel_sum_dev2(X + (size_t)c * S, N, S, (size_t)C * S, mu[c]);
  st = px_comm_allreduce(b->sync, ss, (size_t)C, PX_F64, PX_SUM);
  if (st != PX_OK)
    return px_error_wrap(st, "SyncBatchNorm \"%s\": all-reduce of the deviations", m->params[BN_WEIGHT].name);
  float *rmean = m->params[BN_RUNNING_MEAN].data, *rvar = m->params[BN_RUNNING_VAR].data;
  const float mom = b->momentum;
  for (int c = 0; c < C; c++) {
    b->mean[c] = (float)mu[c];
    b->istd[c] = (float)(1.0 / sqrt(ss[c] / n + (double)b->eps));
    if (update_running) {
      rmean[c] = (float)(mom * mu[c] + (1.0 - mom) * rmean[c]);
      rvar[c] = (float)(mom * (ss[c] / (n - 1)) + (1.0 - mom) * rvar[c]);
    }
  }
  bn_apply(b, x, y);
  b->x = *x;
  b->batch_stats = true;
  return PX_OK;
}

static px_status bn_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  batchnorm *b = (batchnorm *)m;
  const bool relu_next = b->relu_next;  // asked for this call only
  b->relu_next = false;
  b->relu_applied = false;
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
  const bool update_running = batch_stats && ctx->recomputing == 0;
  if (n < 1) return bn_shape_error(m, x, "is empty");
  if (batch_stats && n < 2 && !b->sync) {
    snprintf(why, sizeof why, "has 1 value per channel; training needs more than 1 (the variance is undefined)");
    return bn_shape_error(m, x, why);
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  b->mean = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
  b->istd = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
  if (!b->mean || !b->istd) return PX_ERR_NOMEM;
  if (relu_next) {
    b->alpha = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
    b->shift = px_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
    if (!b->alpha || !b->shift) return PX_ERR_NOMEM;
  }

  b->n_total = (double)n;
#ifdef PX_HAVE_CUDA
  // The device path: the statistics (and the running update) by one block
  // per channel, the same double sums as below (k_batchnorm.cu).
  if (x->device == PX_CUDA) {
    if (batch_stats && b->sync)
      return px_error(PX_ERR_UNSUPPORTED,
                      "SyncBatchNorm \"%s\": the synchronized batch norm runs on the CPU only (its statistics' "
                      "all-reduce is a host collective); on CUDA use the plain BatchNorm",
                      m->params[BN_WEIGHT].name);
    st = px_k_bn_stats(px_f32(x), N, C, S, batch_stats, update_running, b->eps, b->momentum,
                       m->params[BN_RUNNING_MEAN].data, m->params[BN_RUNNING_VAR].data, b->mean, b->istd);
    if (st == PX_OK)
      st = px_k_bn_apply(px_f32(x), px_f32(y), N, C, S, m->params[BN_WEIGHT].data, m->params[BN_BIAS].data, b->mean,
                         b->istd);
    if (st != PX_OK) return st;
    b->x = *x;
    b->batch_stats = batch_stats;
    return PX_OK;
  }
#endif
  if (batch_stats && b->sync) return sync_forward(b, ctx, x, y, update_running);

  const float *X = px_f32(x), *gamma = m->params[BN_WEIGHT].data, *beta = m->params[BN_BIAS].data;
  float *rmean = m->params[BN_RUNNING_MEAN].data, *rvar = m->params[BN_RUNNING_VAR].data;
  float *Y = px_f32(y);
  const size_t total = (size_t)n * (size_t)C;
  const float mom = b->momentum, eps = b->eps;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    float mu, istd;
    if (batch_stats) {
      const float *base = X + (size_t)c * S;
      const double dmu = channel_sum(base, N, S, (size_t)C * S) / (double)n;
      const double ss = channel_sum_dev2(base, N, S, (size_t)C * S, dmu);
      mu = (float)dmu;
      istd = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
      // A recompute (px_checkpoint) sees the same batch again: the running
      // statistics took it in already.
      if (update_running) {
        rmean[c] = (float)(mom * dmu + (1.0 - mom) * rmean[c]);
        rvar[c] = (float)(mom * (ss / (double)(n - 1)) + (1.0 - mom) * rvar[c]);
      }
    } else {
      mu = rmean[c];
      istd = (float)(1.0 / sqrt((double)rvar[c] + (double)eps));
    }
    b->mean[c] = mu;
    b->istd[c] = istd;
    const float alpha = gamma[c] * istd, shift = beta[c] - mu * alpha;
    apply_channel(X, Y, c, C, N, S, alpha, shift, relu_next);  // only this path fuses the ReLU
    if (relu_next) {
      b->alpha[c] = alpha;
      b->shift[c] = shift;
    }
  }
  b->x = *x;
  b->batch_stats = batch_stats;
  b->relu_applied = relu_next;
  return PX_OK;
}

// dx of channel c with batch statistics (plain and synchronized):
// dx = γ·istd·(dy - mean_dy - (x - μ)·proj), mean_dy = Σdy/n and
// proj = istd²·Σ(dy·(x - μ))/n over the batch (over every rank when synced).
// relu: a fused ReLU (dy read as relu_dy with the forward's alpha, shift).
PX_KERNEL static void dx_channel(const float *X, const float *DY, float *DX, int c, int C, int64_t N, int64_t S,
                                 float mu, float mean_dy, float proj, float scale, bool relu, float alpha,
                                 float shift) {
  for (int64_t i = 0; i < N; i++) {
    const size_t off = ((size_t)i * C + c) * S;
    const float *xr = X + off, *gr = DY + off;
    float *out = DX + off;
    if (relu) {
#pragma omp simd
      for (int64_t q = 0; q < S; q++)
        out[q] = (relu_dy(gr[q], xr[q], alpha, shift) - mean_dy - (xr[q] - mu) * proj) * scale;
    } else {
#pragma omp simd
      for (int64_t q = 0; q < S; q++) out[q] = (gr[q] - mean_dy - (xr[q] - mu) * proj) * scale;
    }
  }
}

// Backward of a synchronized batch norm in training: this rank's Σdy and
// Σdy·(x - μ) for dγ, dβ; their sums over the ranks for dx.
static px_status sync_backward(batchnorm *b, px_ctx *ctx, const float *DY, float *DX) {
  px_module *m = &b->base;
  int64_t N, S;
  bn_dims(&b->x, &N, &S);
  const int C = b->channels;
  const float *X = px_f32(&b->x), *gamma = m->params[BN_WEIGHT].data;
  float *dgamma = m->params[BN_WEIGHT].grad, *dbeta = m->params[BN_BIAS].grad;
  double *sums = px_arena_alloc(ctx->arena, (size_t)C * 2 * sizeof(double));  // [Σdy (C) | Σdy·(x-μ) (C)]
  if (!sums) return PX_ERR_NOMEM;
  const size_t total = (size_t)(N * S) * (size_t)C;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++)
    channel_dy_sums(X + (size_t)c * S, DY + (size_t)c * S, N, S, (size_t)C * S, b->mean[c], &sums[c], &sums[C + c]);
  for (int c = 0; c < C; c++) {
    dgamma[c] += (float)(sums[C + c] * b->istd[c]);
    dbeta[c] += (float)sums[c];
  }
  px_status st = px_comm_allreduce(b->sync, sums, (size_t)C * 2, PX_F64, PX_SUM);
  if (st != PX_OK)
    return px_error_wrap(st, "SyncBatchNorm \"%s\": all-reduce of the gradient sums", m->params[BN_WEIGHT].name);
  if (!DX) return PX_OK;
  const double n = b->n_total;
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    const float mu = b->mean[c], istd = b->istd[c];
    const float mean_dy = (float)(sums[c] / n);
    const float proj = (float)(sums[C + c] * istd * istd / n);
    const float scale = gamma[c] * istd;
    dx_channel(X, DY, DX, c, C, N, S, mu, mean_dy, proj, scale, false, 0.0f, 0.0f);
  }
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
#ifdef PX_HAVE_CUDA
  if (b->x.device == PX_CUDA) {  // a synchronized one never ran forward there (refused above)
    float *coef = px_arena_alloc(ctx->arena, (size_t)3 * C * sizeof(float));
    if (!coef) return PX_ERR_NOMEM;
    return px_k_bn_backward(X, DY, DX, N, C, S, b->batch_stats, gamma, b->mean, b->istd, dgamma, dbeta, coef);
  }
#endif
  if (b->sync && b->batch_stats) return sync_backward(b, ctx, DY, DX);
  const bool relu = b->relu_applied;  // a fused ReLU: dy read as [y > 0]·dy
#pragma omp parallel for schedule(static) if (PX_PAR(total))
  for (int c = 0; c < C; c++) {
    const float mu = b->mean[c], istd = b->istd[c];
    // Σ dy and Σ dy·(x - μ)
    double sum_dy, dot;
    if (relu)
      channel_dy_sums_relu(X + (size_t)c * S, DY + (size_t)c * S, b->alpha[c], b->shift[c], N, S, (size_t)C * S, mu,
                           &sum_dy, &dot);
    else channel_dy_sums(X + (size_t)c * S, DY + (size_t)c * S, N, S, (size_t)C * S, mu, &sum_dy, &dot);
    dgamma[c] += (float)(dot * istd);  // Σ dy·x̂
    dbeta[c] += (float)sum_dy;
    if (!DX) continue;
    if (b->batch_stats) {
      // dx = γ·istd·(dy - Σdy/n - (x - μ)·istd²·Σ(dy·(x - μ))/n)
      const float mean_dy = (float)(sum_dy / (double)n);
      const float proj = (float)(dot * istd * istd / (double)n);
      const float scale = gamma[c] * istd;
      dx_channel(X, DY, DX, c, C, N, S, mu, mean_dy, proj, scale, relu, relu ? b->alpha[c] : 0.0f,
                 relu ? b->shift[c] : 0.0f);
    } else {
      const float scale = gamma[c] * istd;
      for (int64_t i = 0; i < N; i++) {
        const size_t off = ((size_t)i * C + c) * S;
        const float *gr = DY + off;
        float *out = DX + off;
        if (relu) {
          const float *xr = X + off, alpha = b->alpha[c], shift = b->shift[c];
#pragma omp simd
          for (int64_t q = 0; q < S; q++) out[q] = relu_dy(gr[q], xr[q], alpha, shift) * scale;
        } else {
#pragma omp simd
          for (int64_t q = 0; q < S; q++) out[q] = gr[q] * scale;
        }
      }
    }
  }
  return PX_OK;
}

static const px_module_ops batchnorm_ops = {
  .type = "BatchNorm",
  .forward = bn_forward,
  .backward = bn_backward,
};

px_module *px_batchnorm(int channels, float eps, float momentum) {
  if (channels <= 0 || !(eps >= 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f)) {
    px_error(PX_ERR_INVALID,
             "BatchNorm(%d, eps=%g, momentum=%g): channels must be positive, eps >= 0, momentum in [0, 1]", channels,
             (double)eps, (double)momentum);
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

bool px_is_batchnorm(const px_module *m) { return m && m->ops == &batchnorm_ops; }

void px_batchnorm_fuse_relu_next(px_module *m) { ((batchnorm *)m)->relu_next = true; }

bool px_batchnorm_relu_applied(const px_module *m) { return ((const batchnorm *)m)->relu_applied; }

static void convert(px_module *m, px_comm *comm, int *n) {
  if (m->ops == &batchnorm_ops) {
    ((batchnorm *)m)->sync = comm;
    (*n)++;
  }
  for (int i = 0; i < m->n_children; i++) convert(m->children[i], comm, n);
}

px_status px_sync_batchnorm_convert(px_module *root, px_comm *comm, int *converted) {
  if (converted) *converted = 0;
  if (!root) return px_error(PX_ERR_INVALID, "px_sync_batchnorm_convert: root is NULL");
  int n = 0;
  convert(root, comm, &n);
  if (converted) *converted = n;
  return PX_OK;
}
