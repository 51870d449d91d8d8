// Sequence parallelism's operator pair (Megatron-LM, "Reducing Activation
// Recomputation in Large Transformer Models", §4.2.2: g and ḡ).  P ranks,
// rank r holds positions [r·Tl, (r+1)·Tl) of every sequence, Tl = T/P.
//
//   gather    x_r: (N, Tl, C)  ->  y: (N, T, C),  y[:, r·Tl + t] = x_r[:, t]
//             forward all-gather; backward dx_r = Σ_q dy_q[:, r·Tl : (r+1)·Tl]
//             (a reduce-scatter: the column-parallel layers after it leave
//             dy partial on each rank)
//   scatter   y_q: (N, T, C) partial sums  ->  z_r: (N, Tl, C) = Σ_q y_q[:, r·Tl …]
//             forward reduce-scatter; backward dy = all-gather of dz_r
//
// The collectives move contiguous blocks, rank q's block at q·N·Tl·C, so
// the (N, T, C) tensors are packed to (P, N, Tl, C) on the way in and out.
#include "parallel/tp_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct tp_seq {
  px_module base;
  px_tp_group *g;
  bool gather;     /* gather (true) or scatter */
  int64_t n, t, c; /* the full (N, T, C) */
} tp_seq;

// (N, T, C) -> (P, N, Tl, C) and back.
static void pack(const float *full, float *blocks, int64_t N, int64_t T, int64_t C, int P, bool to_blocks) {
  const int64_t Tl = T / P;
  for (int q = 0; q < P; q++)
    for (int64_t n = 0; n < N; n++) {
      float *b = blocks + (((size_t)q * N + n) * Tl) * C;
      const float *f = full + ((size_t)n * T + (size_t)q * Tl) * C;
      if (to_blocks) memcpy(b, f, (size_t)(Tl * C) * sizeof(float));
      else memcpy((float *)f, b, (size_t)(Tl * C) * sizeof(float));
    }
}

static px_status count_rs(px_tp_group *g, bool backward, size_t n) {
  if (backward) g->counts.bwd_reduce_scatter++;
  else g->counts.fwd_reduce_scatter++;
  g->counts.elems += n;
  return PX_OK;
}

px_status px_tp_seq_reduce_scatter(px_tp_group *g, px_ctx *ctx, const float *in, float *out, int64_t N, int64_t T,
                                   int64_t C, bool backward) {
  const int P = g->size;
  const size_t chunk = (size_t)(N * (T / P) * C);
  if (P == 1) {
    memcpy(out, in, chunk * sizeof(float));
    return PX_OK;
  }
  const px_arena_mark mk = px_arena_get_mark(ctx->arena);  // the packed copy is scratch
  float *blocks = px_arena_alloc(ctx->arena, chunk * (size_t)P * sizeof(float));
  if (!blocks) return PX_ERR_NOMEM;
  pack(in, blocks, N, T, C, P, true);
  count_rs(g, backward, chunk * (size_t)P);
  const double t0 = px_time_now();
  px_status st = px_comm_reduce_scatter(g->comm, blocks, out, chunk, PX_F32, PX_SUM);
  g->counts.seconds += px_time_now() - t0;
  px_arena_rewind(ctx->arena, mk);
  return st == PX_OK
    ? st
    : px_error_wrap(st, "sequence parallel (tp %d): reduce-scatter in %s", P, backward ? "backward" : "forward");
}

px_status px_tp_seq_all_gather(px_tp_group *g, px_ctx *ctx, const float *in, float *out, int64_t N, int64_t T,
                               int64_t C, bool backward) {
  const int P = g->size;
  const size_t chunk = (size_t)(N * (T / P) * C);
  const px_arena_mark mk = px_arena_get_mark(ctx->arena);  // the packed copy is scratch
  float *blocks = px_arena_alloc(ctx->arena, chunk * (size_t)P * sizeof(float));
  if (!blocks) return PX_ERR_NOMEM;
  px_status st = px_tp_allgather(g, in, blocks, chunk, backward);
  if (st != PX_OK) return st;
  pack(out, blocks, N, T, C, P, false);
  px_arena_rewind(ctx->arena, mk);
  return PX_OK;
}

// out (N, Tl, C) = Σ_q rank q's rows r·Tl… of in (N, T, C).
static px_status reduce_scatter(tp_seq *s, px_ctx *ctx, const float *in, float *out, bool backward) {
  return px_tp_seq_reduce_scatter(s->g, ctx, in, out, s->n, s->t, s->c, backward);
}

// out (N, T, C) = every rank's (N, Tl, C) at its positions.
static px_status all_gather(tp_seq *s, px_ctx *ctx, const float *in, float *out, bool backward) {
  return px_tp_seq_all_gather(s->g, ctx, in, out, s->n, s->t, s->c, backward);
}

static px_status seq_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  tp_seq *s = (tp_seq *)m;
  const int P = s->g->size;
  if (x->dtype != PX_F32 || x->ndim != 3 || (!s->gather && x->shape[1] % P != 0)) {
    char b[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "%s (tp %d): input must be f32 (N, T, C)%s, got %s %s", m->ops->type, P,
                    s->gather ? "" : " with T a multiple of tp", px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  s->n = x->shape[0];
  s->t = s->gather ? x->shape[1] * P : x->shape[1];
  s->c = x->shape[2];
  const int64_t shape[3] = {s->n, s->gather ? s->t : s->t / P, s->c};
  px_status st = px_ctx_tensor(ctx, y, 3, shape);
  if (st != PX_OK) return st;
  return s->gather ? all_gather(s, ctx, px_f32(x), px_f32(y), false)
                   : reduce_scatter(s, ctx, px_f32(x), px_f32(y), false);
}

static px_status seq_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  tp_seq *s = (tp_seq *)m;
  if (!dx) return PX_OK;
  const int64_t shape[3] = {s->n, s->gather ? s->t / s->g->size : s->t, s->c};
  px_status st = px_ctx_tensor(ctx, dx, 3, shape);
  if (st != PX_OK) return st;
  return s->gather ? reduce_scatter(s, ctx, px_f32(dy), px_f32(dx), true)
                   : all_gather(s, ctx, px_f32(dy), px_f32(dx), true);
}

static const px_module_ops gather_ops = {.type = "SequenceGather", .forward = seq_forward, .backward = seq_backward};
static const px_module_ops scatter_ops = {.type = "SequenceScatter", .forward = seq_forward, .backward = seq_backward};

static px_module *make(px_tp_group *g, bool gather) {
  if (!g) {
    px_error(PX_ERR_INVALID, "sequence parallel: needs a tp group");
    return NULL;
  }
  tp_seq *s = (tp_seq *)px_module_alloc(sizeof *s, gather ? &gather_ops : &scatter_ops);
  if (!s) return NULL;
  s->g = g;
  s->gather = gather;
  return &s->base;
}

px_module *px_tp_sequence_gather(px_tp_group *g) { return make(g, true); }
px_module *px_tp_sequence_scatter(px_tp_group *g) { return make(g, false); }

/* ---- Replicated modules on a split sequence -----------------------------------
 * A layer norm or the position embedding keeps its own ops, wrapped: the
 * module's struct is the layer's own (so nothing else changes: names,
 * streams, the tree), m->ops points at a copy of the layer's table whose
 * backward sums this backward's parameter gradients over the tp group, and
 * m->user holds that table, the layer's own and the group. */
typedef struct seq_replicated {
  px_module_ops ops;          /* m->ops: the layer's, backward and destroy replaced */
  const px_module_ops *inner; /* the layer's */
  px_tp_group *g;
} seq_replicated;

static px_status replicated_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  const seq_replicated *s = m->user;
  size_t n = 0;
  for (int k = 0; k < m->n_params; k++)
    if (!m->params[k].is_buffer) n += m->params[k].numel;
  if (s->g->size <= 1 || n == 0) return s->inner->backward(m, ctx, dy, dx);
  // Earlier micro-batches' gradients (already summed) aside; this backward's
  // land in zeroed gradients, are summed over tp, and the earlier ones added.
  float *kept = px_arena_alloc(ctx->arena, 2 * n * sizeof(float));
  if (!kept) return PX_ERR_NOMEM;
  float *sum = kept + n;
  size_t at = 0;
  for (int k = 0; k < m->n_params; k++) {
    px_param *p = &m->params[k];
    if (p->is_buffer) continue;
    memcpy(kept + at, p->grad, p->numel * sizeof(float));
    memset(p->grad, 0, p->numel * sizeof(float));
    at += p->numel;
  }
  px_status st = s->inner->backward(m, ctx, dy, dx);
  if (st != PX_OK) return st;
  at = 0;
  for (int k = 0; k < m->n_params; k++) {
    const px_param *p = &m->params[k];
    if (p->is_buffer) continue;
    memcpy(sum + at, p->grad, p->numel * sizeof(float));
    at += p->numel;
  }
  if ((st = px_tp_allreduce(s->g, sum, n, PX_SUM, true)) != PX_OK) return st;
  at = 0;
  for (int k = 0; k < m->n_params; k++) {
    px_param *p = &m->params[k];
    if (p->is_buffer) continue;
    for (size_t i = 0; i < p->numel; i++) p->grad[i] = kept[at + i] + sum[at + i];
    at += p->numel;
  }
  return PX_OK;
}

static void replicated_destroy(px_module *m) {
  seq_replicated *s = m->user;
  m->user = NULL;
  if (s->inner->destroy) s->inner->destroy(m);
  m->ops = s->inner;
  free(s);
}

px_module *px_tp_sequence_replicated(px_tp_group *g, px_module *m) {
  if (!m) return NULL;
  seq_replicated *s = malloc(sizeof *s);
  if (!s || m->user) {
    free(s);
    px_module_free(m);
    px_error(PX_ERR_NOMEM, "sequence parallel: out of memory wrapping a replicated module");
    return NULL;
  }
  s->inner = m->ops;
  s->ops = *m->ops;
  s->ops.backward = replicated_backward;
  s->ops.destroy = replicated_destroy;
  s->g = g;
  m->ops = &s->ops;
  m->user = s;
  return m;
}
