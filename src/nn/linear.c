// Linear: y = x · Wᵀ + b     x: (R, in)  W: (out, in)  b: (out,)  y: (R, out)
// where R is the product of all leading dimensions of x.
//
// On the GPU (input with device PX_CUDA) the GEMMs go through cuBLAS
// (px_cuda_sgemm; with ctx->compute_dtype PX_BF16 the operands are cast to
// bf16 in the arena and px_cuda_gemm_bf16 accumulates in f32), the bias
// gradient through a fixed-order column sum (k_norm.cu).
//
// On the CPU with plexus's packed GEMM (px_sgemm_epi, AVX-512), the bias is
// added in the GEMM's output pass instead of copied into y first, and in a
// Chain two neighbours fuse into it as well (chain.c, nn/internal.h): a Tanh
// right after (y = tanh(x·Wᵀ + b) in that pass) and a Tanh right before
// (dx = (dy·W)·(1 - x²), its backward, x being the Tanh's output).
#include "plexus/nn.h"
#include "nn/device.h"
#include "nn/internal.h"
#include "tensor/internal.h"

#include <math.h>

typedef struct linear {
  px_module base;
  int in, out;
  bool has_bias;
  px_tensor x;        /* saved input (R, in) */
  bool tanh_next;     /* the chain asks: apply the next Tanh in this forward */
  bool tanh_applied;  /* the last forward did */
  bool dtanh_prev;    /* the chain asks: apply the previous Tanh's backward to dx */
  bool dtanh_applied; /* the last backward did */
} linear;

#ifdef PX_HAVE_CUDA
static px_status linear_forward_cuda(linear *l, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_module *m = &l->base;
  const int R = (int)(px_tensor_numel(x) / l->in);
  float *Y = px_f32(y);
  float beta = 0.0f;
  px_nn_operand X, W;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st == PX_OK && l->has_bias) {
    st = px_k_rows_set(Y, m->params[1].data, R, l->out);
    beta = 1.0f;
  }
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(x), (size_t)R * l->in, &X);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, m->params[0].data, (size_t)l->out * l->in, &W);
  // y (+)= x · Wᵀ
  if (st == PX_OK) st = px_nn_cuda_gemm(false, true, R, l->out, l->in, &X, l->in, &W, l->in, beta, Y, l->out);
  if (st == PX_OK) l->x = *x;
  return st;
}

static px_status linear_backward_cuda(linear *l, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_module *m = &l->base;
  const int R = (int)(px_tensor_numel(&l->x) / l->in);
  px_nn_operand DY, X, W;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(dy), (size_t)R * l->out, &DY);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(&l->x), (size_t)R * l->in, &X);
  // dW += dyᵀ · x
  if (st == PX_OK)
    st = px_nn_cuda_gemm(true, false, l->out, l->in, R, &DY, l->out, &X, l->in, 1.0f, m->params[0].grad, l->in);
  if (st == PX_OK && l->has_bias) {
    void *partials = px_arena_alloc(ctx->arena, px_k_colsum_partials_bytes(R, l->out));
    st = partials ? px_k_colsum_add(m->params[1].grad, px_f32(dy), partials, R, l->out) : PX_ERR_NOMEM;
  }
  if (st != PX_OK || !dx) return st;
  // dx = dy · W
  if ((st = px_ctx_tensor_like(ctx, dx, &l->x)) != PX_OK) return st;
  if ((st = px_nn_cuda_operand(ctx, m->params[0].data, (size_t)l->out * l->in, &W)) != PX_OK) return st;
  return px_nn_cuda_gemm(false, false, R, l->in, l->out, &DY, l->out, &W, l->in, 0.0f, px_f32(dx), l->in);
}
#endif

// R rows are past the few-row kernels (px_sgemm_rows), so forward and dx go
// to the packed GEMM's px_sgemm_epi where it runs.
static bool past_row_kernels(int R) { return R > PX_SGEMM_ROWS_MAX || !px_sgemm_rows_on(); }

static px_status linear_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  linear *l = (linear *)m;
  const bool want_tanh = l->tanh_next;
  l->tanh_next = l->tanh_applied = false;
  if (x->ndim < 1 || x->shape[x->ndim - 1] != l->in) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Linear(%d -> %d) \"%s\": input %s must end in %d features", l->in, l->out,
                    m->params[0].name, px_shape_str(x->ndim, x->shape, s, sizeof s), l->in);
  }
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = l->out;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) return linear_forward_cuda(l, ctx, x, y);
#endif
  const int R = (int)(px_tensor_numel(x) / l->in);
  const float *W = m->params[0].data;
  float *Y = px_f32(y);
  l->x = *x;
  if (past_row_kernels(R)) {
    const px_gemm_epi epi = {.bias = l->has_bias ? m->params[1].data : NULL,
                             .act = want_tanh ? PX_GEMM_TANH : PX_GEMM_NONE};
    if (px_sgemm_epi(false, true, R, l->out, l->in, px_f32(x), l->in, W, l->in, Y, l->out, &epi)) {
      l->tanh_applied = want_tanh;
      return PX_OK;
    }
  }
  float beta = 0.0f;
  if (l->has_bias) {
    // Start every row of y at b, then accumulate x · Wᵀ on top (beta = 1).
    const float *b = m->params[1].data;
    for (int r = 0; r < R; r++) px_copy(Y + (size_t)r * l->out, b, (size_t)l->out);
    beta = 1.0f;
  }
  if (!px_sgemm_rows(true, R, l->out, l->in, px_f32(x), l->in, W, l->in, beta, Y, l->out))
    px_sgemm(false, true, R, l->out, l->in, 1.0f, px_f32(x), l->in, W, l->in, beta, Y, l->out);
  return PX_OK;
}

static px_status linear_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  linear *l = (linear *)m;
  const bool want_dtanh = l->dtanh_prev;
  l->dtanh_prev = l->dtanh_applied = false;
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) return linear_backward_cuda(l, ctx, dy, dx);
#endif
  const int R = (int)(px_tensor_numel(&l->x) / l->in);
  const float *DY = px_f32(dy);
  // dW += dyᵀ · x      dy: (R, out)  x: (R, in)  dW: (out, in)
  px_sgemm(true, false, l->out, l->in, R, 1.0f, DY, l->out, px_f32(&l->x), l->in, 1.0f, m->params[0].grad, l->in);
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
  if (past_row_kernels(R)) {
    // With the previous Tanh's backward: dx = (dy · W) · (1 - x²), x its output.
    const px_gemm_epi epi = {.act = want_dtanh ? PX_GEMM_DTANH : PX_GEMM_NONE, .S = px_f32(&l->x), .lds = l->in};
    if (px_sgemm_epi(false, false, R, l->in, l->out, DY, l->out, m->params[0].data, l->in, px_f32(dx), l->in, &epi)) {
      l->dtanh_applied = want_dtanh;
      return PX_OK;
    }
  }
  if (!px_sgemm_rows(false, R, l->in, l->out, DY, l->out, m->params[0].data, l->in, 0.0f, px_f32(dx), l->in))
    px_sgemm(false, false, R, l->in, l->out, 1.0f, DY, l->out, m->params[0].data, l->in, 0.0f, px_f32(dx), l->in);
  return PX_OK;
}

// px_checkpoint_pair: backward reads x only (dW += xᵀ·dy), so a recomputed
// copy of the input serves as well as the one forward saw.
static void linear_rebind(px_module *m, const px_tensor *x) { ((linear *)m)->x = *x; }

static const px_module_ops linear_ops;

bool px_is_linear(const px_module *m) { return m && m->ops == &linear_ops; }
void px_linear_fuse_tanh_next(px_module *m) { ((linear *)m)->tanh_next = true; }
bool px_linear_tanh_applied(const px_module *m) { return ((const linear *)m)->tanh_applied; }
void px_linear_fuse_dtanh_prev(px_module *m) { ((linear *)m)->dtanh_prev = true; }
bool px_linear_dtanh_applied(const px_module *m) { return ((const linear *)m)->dtanh_applied; }

static const px_module_ops linear_ops = {
  .type = "Linear",
  .forward = linear_forward,
  .backward = linear_backward,
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
