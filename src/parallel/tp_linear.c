// Column- and row-parallel linear layers (Megatron-LM, "Efficient Large-Scale
// Language Model Training", §3).  P ranks of a tp group, rank r; R rows.
//
// Column-parallel: output features split, W = [W_0 | … | W_{P-1}].
//   nn.Linear layout   y_r = x · W_rᵀ + b_r     x: (R, in)  W_r: (out/P, in)
//   Conv1D layout      y_r = x · W_r + b_r      x: (R, in)  W_r: (in, out/P)
//   backward           dW_r += dy_rᵀ·x (Linear) or xᵀ·dy_r (Conv1D);  db_r += Σ_R dy_r
//                      dx = Σ_r dy_r · W_r  — the ALL-REDUCE of "copy to the
//                      tp region" (x was used by every rank: its gradient is
//                      the sum of their contributions)
//   gather_output      y = all-gather(y_r) → (R, out); backward takes dy's
//                      columns of rank r (no communication)
//   parts = 3 (c_attn) the global out features are [q | k | v]; rank r holds
//                      columns r·w … (r+1)·w of each third (w = out/(3P)),
//                      stored [q_r | k_r | v_r]: its heads' q, k and v.
//
// Row-parallel: input features split, x arrives split (x_r: (R, in/P)).
//   y = Σ_r x_r · W_rᵀ + b   (Linear: W_r (out, in/P); Conv1D: W_r (in/P, out))
//   the sum is the ALL-REDUCE of "reduce from the tp region" (forward); b is
//   replicated and added once, after it.
//   backward: dy is the same on every rank; dx_r = dy · W_r (Linear) or
//   dy · W_rᵀ (Conv1D); dW_r += …; db += Σ_R dy: no communication.
//
// So column then row (the MLP; q, k, v then the projection) is one
// all-reduce forward (the row layer's) and one backward (the column
// layer's), of (R, out) and (R, in) floats.
#include "parallel/tp_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct tp_linear {
  tp_module tm;
  px_tp_layout layout;
  bool column, has_bias, gather;
  bool seq;       /* sequence parallel: no all-reduce (a gather / scatter does it) */
  bool split;     /* sequence split at the boundary: the layer gathers / scatters itself */
  int64_t sn, st; /* split: the saved N and the full T */
  int in, out;    /* global features */
  int lin, lout;  /* this rank's: column (in, out/P), row (in/P, out) */
  px_tensor x;    /* saved input (R, lin) */
} tp_linear;

static px_status shape_error(const tp_linear *l, const px_tensor *x) {
  char s[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "%s(%d -> %d, tp %d) \"%s\": input %s %s must be f32 ending in %d features%s",
                  l->tm.base.ops->type, l->in, l->out, l->tm.g->size, l->tm.base.params[0].name,
                  px_dtype_name(x->dtype), px_shape_str(x->ndim, x->shape, s, sizeof s), l->lin,
                  l->column ? "" : " (this rank's share of the input features)");
}

// y (R, lout) = x · W (+ b)   in the layer's layout.
static void local_gemm(const tp_linear *l, const float *X, int R, float *Y) {
  const px_module *m = &l->tm.base;
  float beta = 0.0f;
  if (l->has_bias && l->column) {
    for (int r = 0; r < R; r++) px_copy(Y + (size_t)r * l->lout, m->params[1].data, (size_t)l->lout);
    beta = 1.0f;
  }
  if (l->layout == PX_TP_LINEAR)  // (R, lin)·(lin, lout) with W stored (lout, lin)
    px_sgemm(false, true, R, l->lout, l->lin, 1.0f, X, l->lin, m->params[0].data, l->lin, beta, Y, l->lout);
  else  // W stored (lin, lout)
    px_sgemm(false, false, R, l->lout, l->lin, 1.0f, X, l->lin, m->params[0].data, l->lout, beta, Y, l->lout);
}

// dW += …, db += Σ dy  for R rows of dy (R, lout) against the input X (R, lin).
static void param_grads(tp_linear *l, const float *X, const float *DY, int R) {
  px_module *m = &l->tm.base;
  const int lin = l->lin, lout = l->lout;
  if (l->layout == PX_TP_LINEAR)  // dW += dyᵀ · x    (lout, R)·(R, lin)
    px_sgemm(true, false, lout, lin, R, 1.0f, DY, lout, X, lin, 1.0f, m->params[0].grad, lin);
  else  // dW += xᵀ · dy    (lin, R)·(R, lout)
    px_sgemm(true, false, lin, lout, R, 1.0f, X, lin, DY, lout, 1.0f, m->params[0].grad, lout);
  if (l->has_bias) {
    float *db = m->params[1].grad;  // db += Σ_r dy[r, :]
    for (int r = 0; r < R; r++) px_axpy(db, DY + (size_t)r * lout, (size_t)lout, 1.0f);
  }
}

// DX (R, lin) = dy · W (Linear) or dy · Wᵀ (Conv1D).
static void input_grad(const tp_linear *l, const float *DY, int R, float *DX) {
  const px_module *m = &l->tm.base;
  const int lin = l->lin, lout = l->lout;
  if (l->layout == PX_TP_LINEAR)  // dx = dy · W      (R, lout)·(lout, lin)
    px_sgemm(false, false, R, lin, lout, 1.0f, DY, lout, m->params[0].data, lin, 0.0f, DX, lin);
  else  // dx = dy · Wᵀ     W stored (lin, lout)
    px_sgemm(false, true, R, lin, lout, 1.0f, DY, lout, m->params[0].data, lout, 0.0f, DX, lin);
}

// Sequence split at the boundary (px_tp_set_sequence_split).  Column: x
// (N, T/P, in) is all-gathered to (N, T, in) in scratch, y (N, T, out/P);
// only x (this rank's positions) is kept, and backward all-gathers it again
// (Megatron-LM's trade: one more all-gather for (P-1)/P of the input's
// bytes), then reduce-scatters the partial dx back to (N, T/P, in).  Row: y =
// reduce-scatter of the partial x_r · W_r to (N, T/P, out), then b on every
// rank (the scatter made y whole); backward all-gathers dy to (N, T, out),
// so db and dx are complete.  Scratch is released (arena marks) as soon as
// the collective is done: what stays is what backward needs.
static px_status split_forward(tp_linear *l, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_tp_group *g = l->tm.g;
  const int P = g->size;
  if (l->gather || x->dtype != PX_F32 || x->ndim != 3 || x->shape[2] != l->lin ||
      (!l->column && x->shape[1] % P != 0)) {
    char b[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "%s(%d -> %d, tp %d) \"%s\", sequence split: input must be f32 (N, T, %d)%s, "
                    "got %s %s",
                    l->tm.base.ops->type, l->in, l->out, P, l->tm.base.params[0].name, l->lin,
                    l->column ? "" : " with T a multiple of tp", px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  const int64_t N = x->shape[0], T = l->column ? x->shape[1] * P : x->shape[1];
  const int R = (int)(N * T);
  l->sn = N;
  l->st = T;
  l->x = *x;
  px_status st;
  if (l->column) {
    if ((st = px_ctx_tensor(ctx, y, 3, (int64_t[]){N, T, l->lout})) != PX_OK) return st;
    const px_arena_mark mk = px_arena_get_mark(ctx->arena);
    float *whole = px_arena_alloc(ctx->arena, (size_t)R * l->lin * sizeof(float));
    if (!whole) return PX_ERR_NOMEM;
    if ((st = px_tp_seq_all_gather(g, ctx, px_f32(x), whole, N, T, l->lin, false)) != PX_OK) return st;
    local_gemm(l, whole, R, px_f32(y));
    px_arena_rewind(ctx->arena, mk);
    return PX_OK;
  }
  if ((st = px_ctx_tensor(ctx, y, 3, (int64_t[]){N, T / P, l->out})) != PX_OK) return st;
  const px_arena_mark mk = px_arena_get_mark(ctx->arena);
  float *part = px_arena_alloc(ctx->arena, (size_t)R * l->out * sizeof(float));
  if (!part) return PX_ERR_NOMEM;
  local_gemm(l, px_f32(x), R, part);
  if ((st = px_tp_seq_reduce_scatter(g, ctx, part, px_f32(y), N, T, l->out, false)) != PX_OK) return st;
  px_arena_rewind(ctx->arena, mk);
  if (l->has_bias)
    for (int64_t r = 0; r < N * (T / P); r++)
      px_axpy(px_f32(y) + (size_t)r * l->out, l->tm.base.params[1].data, (size_t)l->out, 1.0f);
  return PX_OK;
}

static px_status split_backward(tp_linear *l, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  px_tp_group *g = l->tm.g;
  const int64_t N = l->sn, T = l->st, Tl = T / g->size;
  const int R = (int)(N * T);
  px_status st;
  if (dx && (st = px_ctx_tensor(ctx, dx, 3, (int64_t[]){N, l->column ? Tl : T, l->lin})) != PX_OK) return st;
  const px_arena_mark mk = px_arena_get_mark(ctx->arena);
  if (l->column) {
    float *whole = px_arena_alloc(ctx->arena, (size_t)R * l->lin * sizeof(float));
    if (!whole) return PX_ERR_NOMEM;
    if ((st = px_tp_seq_all_gather(g, ctx, px_f32(&l->x), whole, N, T, l->lin, true)) != PX_OK) return st;
    param_grads(l, whole, px_f32(dy), R);
    if (dx) {
      float *part = px_arena_alloc(ctx->arena, (size_t)R * l->lin * sizeof(float));
      if (!part) return PX_ERR_NOMEM;
      input_grad(l, px_f32(dy), R, part);
      if ((st = px_tp_seq_reduce_scatter(g, ctx, part, px_f32(dx), N, T, l->lin, true)) != PX_OK) return st;
    }
    px_arena_rewind(ctx->arena, mk);
    return PX_OK;
  }
  float *whole = px_arena_alloc(ctx->arena, (size_t)R * l->out * sizeof(float));
  if (!whole) return PX_ERR_NOMEM;
  if ((st = px_tp_seq_all_gather(g, ctx, px_f32(dy), whole, N, T, l->out, true)) != PX_OK) return st;
  param_grads(l, px_f32(&l->x), whole, R);
  if (dx) input_grad(l, whole, R, px_f32(dx));
  px_arena_rewind(ctx->arena, mk);
  return PX_OK;
}

static px_status tp_linear_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  tp_linear *l = (tp_linear *)m;
  if (l->split) return split_forward(l, ctx, x, y);
  if (x->dtype != PX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != l->lin) return shape_error(l, x);
  const int R = (int)(px_tensor_numel(x) / l->lin);
  const int yout = l->gather ? l->out : l->lout;
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = yout;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
  l->x = *x;
  if (!l->gather) {
    local_gemm(l, px_f32(x), R, px_f32(y));
    if (l->column) return PX_OK;  // copy to the tp region: identity forward
    if (l->seq) {
      // Sequence parallel: y stays partial for px_tp_sequence_scatter; the
      // bias joins the sum once, from tp rank 0.
      if (l->has_bias && l->tm.g->rank == 0)
        for (int r = 0; r < R; r++) px_axpy(px_f32(y) + (size_t)r * l->out, m->params[1].data, (size_t)l->out, 1.0f);
      return PX_OK;
    }
    // Reduce from the tp region: y = Σ_r x_r · W_r, then b once.
    if ((st = px_tp_allreduce(l->tm.g, px_f32(y), (size_t)R * l->out, PX_SUM, false)) != PX_OK) return st;
    if (l->has_bias)
      for (int r = 0; r < R; r++) px_axpy(px_f32(y) + (size_t)r * l->out, m->params[1].data, (size_t)l->out, 1.0f);
    return PX_OK;
  }
  // Gathered output: y_r into scratch, all-gather (P, R, w), then
  // y[:, r·w + j] = gathered[r, :, j].
  const int P = l->tm.g->size, w = l->lout;
  float *mine = px_arena_alloc(ctx->arena, (size_t)R * w * sizeof(float));
  float *all = px_arena_alloc(ctx->arena, (size_t)P * R * w * sizeof(float));
  if (!mine || !all) return PX_ERR_NOMEM;
  local_gemm(l, px_f32(x), R, mine);
  if ((st = px_tp_allgather(l->tm.g, mine, all, (size_t)R * w, false)) != PX_OK) return st;
  float *Y = px_f32(y);
  for (int q = 0; q < P; q++)
    for (int r = 0; r < R; r++)
      memcpy(Y + (size_t)r * l->out + (size_t)q * w, all + ((size_t)q * R + r) * w, (size_t)w * sizeof(float));
  return PX_OK;
}

static px_status tp_linear_backward(px_module *m, px_ctx *ctx, const px_tensor *dy_in, px_tensor *dx) {
  tp_linear *l = (tp_linear *)m;
  if (l->split) return split_backward(l, ctx, dy_in, dx);
  const int R = (int)(px_tensor_numel(&l->x) / l->lin), lin = l->lin, lout = l->lout;
  const float *DY = px_f32(dy_in);
  if (l->gather) {
    // dy_r = this rank's columns of dy (R, out).
    float *mine = px_arena_alloc(ctx->arena, (size_t)R * lout * sizeof(float));
    if (!mine) return PX_ERR_NOMEM;
    const size_t c0 = (size_t)l->tm.g->rank * lout;
    for (int r = 0; r < R; r++)
      memcpy(mine + (size_t)r * lout, DY + (size_t)r * l->out + c0, (size_t)lout * sizeof(float));
    DY = mine;
  }
  param_grads(l, px_f32(&l->x), DY, R);
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, &l->x);
  if (st != PX_OK) return st;
  input_grad(l, DY, R, px_f32(dx));
  // Copy to the tp region, backward: every rank used x, so dx = Σ_r dx_r.
  // (Sequence parallel: px_tp_sequence_gather's backward sums it instead.)
  if (l->column && !l->seq) return px_tp_allreduce(l->tm.g, px_f32(dx), (size_t)R * lin, PX_SUM, true);
  return PX_OK;
}

const px_module_ops px_tp_column_ops = {
  .type = "ColumnParallelLinear",
  .forward = tp_linear_forward,
  .backward = tp_linear_backward,
  .init = px_tp_init_boxes,
};
const px_module_ops px_tp_row_ops = {
  .type = "RowParallelLinear",
  .forward = tp_linear_forward,
  .backward = tp_linear_backward,
  .init = px_tp_init_boxes,
};

// Declares weight and bias with the init of the single-process layer of this
// layout: nn.Linear U(±1/√in) for both; Conv1D N(0, 0.02) and zeros.
static void declare(tp_linear *l, const int64_t wlocal[2], int64_t blocal) {
  px_module *m = &l->tm.base;
  const bool lin = l->layout == PX_TP_LINEAR;
  const float bound = 1.0f / sqrtf((float)l->in);
  px_module_add_param(m, "weight", 2, wlocal, lin ? PX_INIT_UNIFORM : PX_INIT_NORMAL, lin ? bound : 0.02f, false);
  if (l->has_bias)
    px_module_add_param(m, "bias", 1, (int64_t[]){blocal}, lin ? PX_INIT_UNIFORM : PX_INIT_ZEROS, lin ? bound : 0.0f,
                        false);
}

static tp_linear *alloc_layer(px_tp_group *g, px_tp_layout layout, bool column, int in, int out, bool bias) {
  const char *what = column ? "ColumnParallelLinear" : "RowParallelLinear";
  if (!g || g->size <= 0 || (layout != PX_TP_LINEAR && layout != PX_TP_CONV1D) || in <= 0 || out <= 0) {
    px_error(PX_ERR_INVALID, "%s: needs a tp group, a layout and positive features, got %d -> %d", what, in, out);
    return NULL;
  }
  tp_linear *l = (tp_linear *)px_module_alloc(sizeof *l, column ? &px_tp_column_ops : &px_tp_row_ops);
  if (!l) return NULL;
  l->tm.g = g;
  l->layout = layout;
  l->column = column;
  l->has_bias = bias;
  l->in = in;
  l->out = out;
  return l;
}

px_module *px_tp_column_parallel(px_tp_group *g, px_tp_layout layout, int in_features, int out_features, bool bias,
                                 int parts, bool gather_output) {
  if (g &&
      (parts < 1 || parts > PX_TP_MAX_PARTS || (gather_output && parts != 1) ||
       out_features % (parts * g->size) != 0)) {
    px_error(PX_ERR_INVALID,
             "ColumnParallelLinear(%d -> %d): %d output features in %d part(s) over tp %d: the "
             "features must be a multiple of parts × tp, parts in 1..%d, and a gathered output has one part",
             in_features, out_features, out_features, parts, g->size, PX_TP_MAX_PARTS);
    return NULL;
  }
  tp_linear *l = alloc_layer(g, layout, true, in_features, out_features, bias);
  if (!l) return NULL;
  const int P = g->size, w = out_features / (parts * P);
  l->lin = in_features;
  l->lout = parts * w;
  l->gather = gather_output;
  const bool L = layout == PX_TP_LINEAR;
  const int64_t wl[2] = {L ? l->lout : in_features, L ? in_features : l->lout};
  declare(l, wl, l->lout);
  for (int k = 0; k < l->tm.base.n_params; k++) {
    px_tp_box *b = &l->tm.box[k];
    const bool weight = k == 0;
    b->split_dim = weight && !L ? 1 : 0;
    b->n_parts = parts;
    b->global_shape[0] = weight ? (L ? out_features : in_features) : out_features;
    b->global_shape[1] = weight ? (L ? in_features : out_features) : 1;
    for (int p = 0; p < parts; p++) {
      b->global_offset[p] = (int64_t)p * (out_features / parts) + (int64_t)g->rank * w;
      b->local_offset[p] = (int64_t)p * w;
      b->size[p] = w;
    }
  }
  return &l->tm.base;
}

px_module *px_tp_row_parallel(px_tp_group *g, px_tp_layout layout, int in_features, int out_features, bool bias) {
  if (g && in_features % g->size != 0) {
    px_error(PX_ERR_INVALID, "RowParallelLinear(%d -> %d): %d input features do not split over tp %d", in_features,
             out_features, in_features, g->size);
    return NULL;
  }
  tp_linear *l = alloc_layer(g, layout, false, in_features, out_features, bias);
  if (!l) return NULL;
  const int w = in_features / g->size;
  l->lin = w;
  l->lout = out_features;
  const bool L = layout == PX_TP_LINEAR;
  const int64_t wl[2] = {L ? out_features : w, L ? w : out_features};
  declare(l, wl, out_features);
  px_tp_box *b = &l->tm.box[0];
  b->split_dim = L ? 1 : 0;
  b->n_parts = 1;
  b->global_shape[0] = L ? out_features : in_features;
  b->global_shape[1] = L ? in_features : out_features;
  b->global_offset[0] = (int64_t)g->rank * w;
  b->local_offset[0] = 0;
  b->size[0] = w;
  if (bias) {  // replicated: added once after the all-reduce
    l->tm.box[1] =
      (px_tp_box){.split_dim = -1, .n_parts = 1, .global_shape = {out_features, 1}, .size = {out_features}};
  }
  return &l->tm.base;
}

void px_tp_set_sequence_parallel(px_module *m, bool on) {
  if (m && (m->ops == &px_tp_column_ops || m->ops == &px_tp_row_ops) && !((tp_linear *)m)->gather)
    ((tp_linear *)m)->seq = on;
}

void px_tp_set_sequence_split(px_module *m, bool on) {
  if (m && (m->ops == &px_tp_column_ops || m->ops == &px_tp_row_ops) && !((tp_linear *)m)->gather)
    ((tp_linear *)m)->split = on;
  else px_tp_vocab_set_sequence_split(m, on);
}
