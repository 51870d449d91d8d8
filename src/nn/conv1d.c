// GPT-2's Conv1D: a linear layer whose weight is stored (in, out), the way
// Hugging Face's GPT-2 checkpoints store c_attn, c_proj and c_fc.
//
//   y = x · W + b       x: (R, in)  W: (in, out)  b: (out,)  y: (R, out)
//   dW += xᵀ · dy       (in, R)·(R, out)
//   db += Σ_r dy[r, :]
//   dx  = dy · Wᵀ       (R, out)·(out, in)
// R is the product of all leading dimensions of x.
//
// On the GPU (input with device PX_CUDA) the GEMMs go through cuBLAS
// (px_cuda_sgemm; with ctx->compute_dtype PX_BF16 the operands are cast to
// bf16 in the arena and px_cuda_gemm_bf16 accumulates in f32), the bias
// gradient through a fixed-order column sum (k_norm.cu).
#include "plexus/nn.h"
#include "nn/device.h"
#include "tensor/internal.h"

typedef struct conv1d {
  px_module base;
  int in, out;
  bool has_bias;
  px_tensor x; /* saved input (R, in) */
} conv1d;

#ifdef PX_HAVE_CUDA
static px_status conv1d_forward_cuda(conv1d *l, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_module *m = &l->base;
  const int R = (int)(px_tensor_numel(x) / l->in), out = l->out;
  float *Y = px_f32(y);
  float beta = 0.0f;
  px_nn_operand X, W;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st == PX_OK && l->has_bias) {
    st = px_k_rows_set(Y, m->params[1].data, R, out);
    beta = 1.0f;
  }
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(x), (size_t)R * l->in, &X);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, m->params[0].data, (size_t)l->in * out, &W);
  // y (+)= x · W      (R, in)·(in, out)
  if (st == PX_OK) st = px_nn_cuda_gemm(false, false, R, out, l->in, &X, l->in, &W, out, beta, Y, out);
  if (st == PX_OK) l->x = *x;
  return st;
}

static px_status conv1d_backward_cuda(conv1d *l, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_module *m = &l->base;
  const int R = (int)(px_tensor_numel(&l->x) / l->in), out = l->out;
  px_nn_operand DY, X, W;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(dy), (size_t)R * out, &DY);
  if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(&l->x), (size_t)R * l->in, &X);
  // dW += xᵀ · dy
  if (st == PX_OK) st = px_nn_cuda_gemm(true, false, l->in, out, R, &X, l->in, &DY, out, 1.0f, m->params[0].grad, out);
  if (st == PX_OK && l->has_bias) {
    void *partials = px_arena_alloc(ctx->arena, px_k_colsum_partials_bytes(R, out));
    st = partials ? px_k_colsum_add(m->params[1].grad, px_f32(dy), partials, R, out) : PX_ERR_NOMEM;
  }
  if (st != PX_OK || !dx) return st;
  // dx = dy · Wᵀ
  if ((st = px_ctx_tensor_like(ctx, dx, &l->x)) != PX_OK) return st;
  if ((st = px_nn_cuda_operand(ctx, m->params[0].data, (size_t)l->in * out, &W)) != PX_OK) return st;
  return px_nn_cuda_gemm(false, true, R, l->in, out, &DY, out, &W, out, 0.0f, px_f32(dx), l->in);
}
#endif

static px_status conv1d_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  conv1d *l = (conv1d *)m;
  if (x->dtype != PX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != l->in) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "Conv1D(%d -> %d) \"%s\": input %s %s must be f32 ending in %d features", l->in,
                    l->out, m->params[0].name, px_dtype_name(x->dtype), px_shape_str(x->ndim, x->shape, s, sizeof s),
                    l->in);
  }
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = l->out;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) return conv1d_forward_cuda(l, ctx, x, y);
#endif
  const int R = (int)(px_tensor_numel(x) / l->in), out = l->out;
  float *Y = px_f32(y);
  float beta = 0.0f;
  if (l->has_bias) {
    // Every row of y starts at b; the GEMM adds x · W on top (beta = 1).
    const float *b = m->params[1].data;
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)R * (size_t)out))
    for (int r = 0; r < R; r++) {
      float *restrict yr = Y + (size_t)r * out;
#pragma omp simd
      for (int j = 0; j < out; j++) yr[j] = b[j];
    }
    beta = 1.0f;
  }
  // y (+)= x · W      (R, in)·(in, out)
  px_sgemm(false, false, R, out, l->in, 1.0f, px_f32(x), l->in, m->params[0].data, out, beta, Y, out);
  l->x = *x;
  return PX_OK;
}

static px_status conv1d_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  conv1d *l = (conv1d *)m;
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) return conv1d_backward_cuda(l, ctx, dy, dx);
#endif
  const int R = (int)(px_tensor_numel(&l->x) / l->in), out = l->out;
  const float *DY = px_f32(dy);
  // dW += xᵀ · dy      x: (R, in)  dy: (R, out)  dW: (in, out)
  px_sgemm(true, false, l->in, out, R, 1.0f, px_f32(&l->x), l->in, DY, out, 1.0f, m->params[0].grad, out);
  if (l->has_bias) {
    // db[j] += Σ_r dy[r, j]: a thread owns a block of columns, rows in order.
    float *db = m->params[1].grad;
    const int blocks = (out + 63) / 64;
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)R * (size_t)out))
    for (int blk = 0; blk < blocks; blk++) {
      const int j0 = blk * 64, j1 = j0 + 64 < out ? j0 + 64 : out;
      float acc[64] = {0};
      for (int r = 0; r < R; r++) {
        const float *restrict row = DY + (size_t)r * out;
#pragma omp simd
        for (int j = j0; j < j1; j++) acc[j - j0] += row[j];
      }
      for (int j = j0; j < j1; j++) db[j] += acc[j - j0];
    }
  }
  if (!dx) return PX_OK;
  // dx = dy · Wᵀ       dy: (R, out)  W: (in, out)  dx: (R, in)
  px_status st = px_ctx_tensor_like(ctx, dx, &l->x);
  if (st != PX_OK) return st;
  px_sgemm(false, true, R, l->in, out, 1.0f, DY, out, m->params[0].data, out, 0.0f, px_f32(dx), l->in);
  return PX_OK;
}

// px_checkpoint_pair: backward reads x only (dW += xᵀ·dy), so a recomputed
// copy of the input serves as well as the one forward saw.
static void conv1d_rebind(px_module *m, const px_tensor *x) { ((conv1d *)m)->x = *x; }

static const px_module_ops conv1d_ops = {
  .type = "Conv1D",
  .forward = conv1d_forward,
  .backward = conv1d_backward,
  .rebind = conv1d_rebind,
};

px_module *px_conv1d(int in_features, int out_features, bool bias) {
  if (in_features <= 0 || out_features <= 0) {
    px_error(PX_ERR_INVALID, "Conv1D: features must be positive, got %d -> %d", in_features, out_features);
    return NULL;
  }
  conv1d *l = (conv1d *)px_module_alloc(sizeof *l, &conv1d_ops);
  if (!l) return NULL;
  l->in = in_features;
  l->out = out_features;
  l->has_bias = bias;
  // Hugging Face's Conv1D: weight N(0, 0.02), bias zeros.
  int64_t wshape[2] = {in_features, out_features}, bshape[1] = {out_features};
  px_module_add_param(&l->base, "weight", 2, wshape, PX_INIT_NORMAL, 0.02f, false);
  if (bias) px_module_add_param(&l->base, "bias", 1, bshape, PX_INIT_ZEROS, 0.0f, false);
  return &l->base;
}
