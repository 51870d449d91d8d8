// Dropout: in training, y = x ⊙ mask / (1 - p),  mask_i = [u_i >= p];
// in eval (or p = 0), y = x as a view.
//
// The mask is never stored: u_i is a pure function of (seed, module, step, i)
// from the counter-based RNG,
//   words = philox4x32(seed, (stream << 40) ^ step, i / 4),  u_i = unit(words[i % 4])
// so backward regenerates it (dx = dy ⊙ mask / (1 - p)), and every rank or
// thread that holds element i draws the same u_i whatever the layout.
#include "plexus/nn.h"
#include "tensor/internal.h"

#include <stdio.h>

typedef struct dropout {
  px_module base;
  float     p;
  // Saved by forward for backward.
  bool      identity;  /* forward was y = x */
  uint64_t  seed, step;
  px_tensor x;         /* only the shape is used */
} dropout;

// out = in ⊙ mask / (1 - p) for the mask of (seed, stream, step).
static void apply_mask(const dropout *d, const float *in, float *out, size_t n) {
  const float p = d->p, scale = 1.0f / (1.0f - p);  // PyTorch: x · (1 / (1 - p))
  const uint64_t hi = ((uint64_t)d->base.stream << 40) ^ d->step;
  const size_t blocks = (n + 3) / 4;
  #pragma omp parallel for schedule(static) if (PX_PAR(n))
  for (size_t blk = 0; blk < blocks; blk++) {
    uint32_t w[4];
    px_philox4x32(d->seed, hi, (uint64_t)blk, w);
    const size_t i0 = blk * 4, i1 = i0 + 4 < n ? i0 + 4 : n;
    for (size_t i = i0; i < i1; i++) out[i] = px_u32_to_unit(w[i - i0]) >= p ? in[i] * scale : 0.0f;
  }
}

static px_status dropout_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  dropout *d = (dropout *)m;
  d->x = *x;
  d->identity = !m->training || d->p == 0.0f;
  if (d->identity) {
    *y = *x;
    y->owned = false;
    return PX_OK;
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  d->seed = ctx->seed;
  d->step = ctx->step;
  apply_mask(d, px_f32(x), px_f32(y), (size_t)px_tensor_numel(x));
  return PX_OK;
}

static px_status dropout_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  dropout *d = (dropout *)m;
  if (!dx) return PX_OK;
  if (d->identity) {
    *dx = *dy;
    dx->owned = false;
    return PX_OK;
  }
  px_status st = px_ctx_tensor_like(ctx, dx, &d->x);
  if (st != PX_OK) return st;
  apply_mask(d, px_f32(dy), px_f32(dx), (size_t)px_tensor_numel(dy));
  return PX_OK;
}

static const px_module_ops dropout_ops = {
  .type = "Dropout", .forward = dropout_forward, .backward = dropout_backward,
};

px_module *px_dropout(float p) {
  if (!(p >= 0.0f && p < 1.0f)) {
    px_error(PX_ERR_INVALID, "Dropout(p=%g): p must be in [0, 1)", (double)p);
    return NULL;
  }
  dropout *d = (dropout *)px_module_alloc(sizeof *d, &dropout_ops);
  if (!d) return NULL;
  d->p = p;
  return &d->base;
}
