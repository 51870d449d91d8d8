// Linear: y = x · Wᵀ + b     x: (R, in)  W: (out, in)  b: (out,)  y: (R, out)
// where R is the product of all leading dimensions of x.
#include "plexus/nn.h"

#include <math.h>

typedef struct linear {
  px_module base;
  int       in, out;
  bool      has_bias;
  px_tensor x;  /* saved input (R, in) */
} linear;

static px_status linear_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  linear *l = (linear *)m;
  if (x->ndim < 1 || x->shape[x->ndim - 1] != l->in) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Linear(%d -> %d) \"%s\": input %s must end in %d features",
                    l->in, l->out, m->params[0].name, px_shape_str(x->ndim, x->shape, s, sizeof s), l->in);
  }
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = l->out;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
  const int R = (int)(px_tensor_numel(x) / l->in);
  const float *W = m->params[0].data;
  float *Y = px_f32(y);
  float beta = 0.0f;
  if (l->has_bias) {
    // Start every row of y at b, then accumulate x · Wᵀ on top (beta = 1).
    const float *b = m->params[1].data;
    for (int r = 0; r < R; r++) px_copy(Y + (size_t)r * l->out, b, (size_t)l->out);
    beta = 1.0f;
  }
  px_sgemm(false, true, R, l->out, l->in, 1.0f, px_f32(x), l->in, W, l->in, beta, Y, l->out);
  l->x = *x;
  return PX_OK;
}

static px_status linear_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  linear *l = (linear *)m;
  const int R = (int)(px_tensor_numel(&l->x) / l->in);
  const float *DY = px_f32(dy);
  // dW += dyᵀ · x      dy: (R, out)  x: (R, in)  dW: (out, in)
  px_sgemm(true, false, l->out, l->in, R, 1.0f, DY, l->out, px_f32(&l->x), l->in, 1.0f,
           m->params[0].grad, l->in);
  if (l->has_bias) {
    // db += Σ_r dy[r, :]
    float *db = m->params[1].grad;
    for (int r = 0; r < R; r++) {
      const float *row = DY + (size_t)r * l->out;
      #pragma omp simd
      for (int j = 0; j < l->out; j++) db[j] += row[j];
    }
  }
  if (!dx) return PX_OK;
  // dx = dy · W        dy: (R, out)  W: (out, in)  dx: (R, in)
  px_status st = px_ctx_tensor_like(ctx, dx, &l->x);
  if (st != PX_OK) return st;
  px_sgemm(false, false, R, l->in, l->out, 1.0f, DY, l->out, m->params[0].data, l->in, 0.0f,
           px_f32(dx), l->in);
  return PX_OK;
}

// px_checkpoint_pair: backward reads x only (dW += xᵀ·dy), so a recomputed
// copy of the input serves as well as the one forward saw.
static void linear_rebind(px_module *m, const px_tensor *x) { ((linear *)m)->x = *x; }

static const px_module_ops linear_ops = {
  .type = "Linear", .forward = linear_forward, .backward = linear_backward,
  .rebind = linear_rebind,
};

px_module *px_linear(int in_features, int out_features, bool bias) {
  if (in_features <= 0 || out_features <= 0) {
    px_error(PX_ERR_INVALID, "Linear: features must be positive, got %d -> %d", in_features, out_features);
    return NULL;
  }
  linear *l = (linear *)px_module_alloc(sizeof *l, &linear_ops);
  if (!l) return NULL;
  l->in = in_features;
  l->out = out_features;
  l->has_bias = bias;
  // PyTorch: kaiming_uniform(a=√5) on W and U(±1/√fan_in) on b both give
  // U(-1/√in, 1/√in).
  float bound = 1.0f / sqrtf((float)in_features);
  int64_t wshape[2] = {out_features, in_features}, bshape[1] = {out_features};
  px_module_add_param(&l->base, "weight", 2, wshape, PX_INIT_UNIFORM, bound, false);
  if (bias) px_module_add_param(&l->base, "bias", 1, bshape, PX_INIT_UNIFORM, bound, false);
  return &l->base;
}
