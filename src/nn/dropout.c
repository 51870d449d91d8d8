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

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_transformer_a.h"
#endif

typedef struct dropout {
  px_module base;
  float p;
  int part, parts; /* px_dropout_part: the input is part `part` of `parts` along axis 1; 0, 1 */
  // Saved by forward for backward.
  bool identity; /* forward was y = x */
  uint64_t seed, step;
  px_tensor x; /* only the shape is used */
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

// The same for part `part` of `parts` along axis 1: in is (N, Tl, …), the
// whole (N, parts·Tl, …); local row (n, t) is the whole's row
// n·parts·Tl + part·Tl + t, so its elements draw the whole's u_i.
static void apply_mask_part(const dropout *d, const float *in, float *out, int64_t N, int64_t Tl, size_t inner) {
  const float p = d->p, scale = 1.0f / (1.0f - p);
  const uint64_t hi = ((uint64_t)d->base.stream << 40) ^ d->step;  // as apply_mask: the stream, not the uid
  const int64_t rows = N * Tl;
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)rows * inner))
  for (int64_t r = 0; r < rows; r++) {
    const int64_t n = r / Tl, t = r % Tl;
    const uint64_t g0 = (uint64_t)((n * d->parts + d->part) * Tl + t) * inner;
    const float *restrict xr = in + (size_t)r * inner;
    float *restrict yr = out + (size_t)r * inner;
    uint32_t w[4];
    uint64_t blk = UINT64_MAX;
    for (size_t j = 0; j < inner; j++) {
      const uint64_t gi = g0 + j;
      if (gi / 4 != blk) {
        blk = gi / 4;
        px_philox4x32(d->seed, hi, blk, w);
      }
      yr[j] = px_u32_to_unit(w[gi % 4]) >= p ? xr[j] * scale : 0.0f;
    }
  }
}

// On the GPU (shape_of->device == PX_CUDA, in and out device memory): the
// same mask from rng.cuh's Philox, bit for bit (tensor/cuda/k_dropout.cu).
static px_status mask(const dropout *d, const float *in, float *out, const px_tensor *shape_of) {
  const size_t n = (size_t)px_tensor_numel(shape_of);
  if (shape_of->device == PX_CUDA) {
#ifdef PX_HAVE_CUDA
    const uint64_t hi = ((uint64_t)d->base.stream << 40) ^ d->step;
    if (d->parts == 1) return px_cuda_dropout(in, out, n, d->p, d->seed, hi);
    const int64_t N = shape_of->shape[0], Tl = shape_of->shape[1];
    return px_cuda_dropout_part(in, out, N, Tl, N * Tl > 0 ? n / (size_t)(N * Tl) : 0, d->part, d->parts, d->p, d->seed,
                                hi);
#else
    return px_error(PX_ERR_UNSUPPORTED, "Dropout(p=%g): input on the GPU, but plexus was built without CUDA",
                    (double)d->p);
#endif
  }
  if (d->parts == 1) {
    apply_mask(d, in, out, n);
    return PX_OK;
  }
  const int64_t N = shape_of->shape[0], Tl = shape_of->shape[1];
  apply_mask_part(d, in, out, N, Tl, N * Tl > 0 ? n / (size_t)(N * Tl) : 0);
  return PX_OK;
}

static px_status dropout_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  dropout *d = (dropout *)m;
  if (d->parts > 1 && x->ndim < 2) {
    char b[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Dropout(p=%g) part %d of %d: input must be (N, T, …), split along T, got %s",
                    (double)d->p, d->part, d->parts, px_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  d->x = *x;
  d->identity = !m->training || d->p == 0.0f;
  if (d->identity) {
    *y = *x;
    y->owned = false;
    return PX_OK;
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  if (y->device != x->device)
    return px_error(PX_ERR_INVALID, "Dropout(p=%g): input and step context on different devices", (double)d->p);
  d->seed = ctx->seed;
  d->step = ctx->step;
  return mask(d, px_f32(x), px_f32(y), x);
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
  if (dx->device != dy->device)
    return px_error(PX_ERR_INVALID, "Dropout(p=%g): gradient and step context on different devices", (double)d->p);
  return mask(d, px_f32(dy), px_f32(dx), dy);
}

static const px_module_ops dropout_ops = {
  .type = "Dropout",
  .forward = dropout_forward,
  .backward = dropout_backward,
};

px_module *px_dropout(float p) {
  if (!(p >= 0.0f && p < 1.0f)) {
    px_error(PX_ERR_INVALID, "Dropout(p=%g): p must be in [0, 1)", (double)p);
    return NULL;
  }
  dropout *d = (dropout *)px_module_alloc(sizeof *d, &dropout_ops);
  if (!d) return NULL;
  d->p = p;
  d->parts = 1;
  return &d->base;
}

px_module *px_dropout_part(float p, int part, int parts) {
  if (parts <= 0 || part < 0 || part >= parts) {
    px_error(PX_ERR_INVALID, "Dropout(p=%g): part %d of %d: need 0 <= part < parts", (double)p, part, parts);
    return NULL;
  }
  px_module *m = px_dropout(p);
  if (!m) return NULL;
  ((dropout *)m)->part = part;
  ((dropout *)m)->parts = parts;
  return m;
}
