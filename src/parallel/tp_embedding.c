// Vocabulary-parallel token embedding and the output head tied to it
// (Megatron-LM's VocabParallelEmbedding and parallel_lm_logits).
//
// The (V, C) table is split by rows: rank r holds E_r = rows [f_r, f_r + n_r)
// (px_tp_vocab_range: f_r = r·V/P, uneven when P does not divide V; no
// padding rows, so no logit has to be masked).
//
// Embedding   ids (…) i32 in [0, V)      E_r: (n_r, C)     y: (…, C)
//   y_r[p] = E_r[ids[p] - f_r] if f_r <= ids[p] < f_r + n_r, else 0
//   y = Σ_r y_r            one ALL-REDUCE forward (exactly one rank adds a
//                          non-zero row: the sum is exact)
//   dE_r[ids[p] - f_r] += dy[p]   for this rank's ids; dy is the same on every
//                          rank, so no communication backward
// Tied head   x: (R, C) (the same on every rank)   logits_r: (R, n_r)
//   logits_r = x · E_rᵀ            this rank's vocabulary columns; never the
//                                  full (R, V) (px_tp_cross_entropy)
//   dE_r += dyᵀ · x   (n_r, R)·(R, C)
//   dx = Σ_r dy_r · E_r            one ALL-REDUCE backward ("copy to the tp
//                                  region": x was used by every rank)
//
// Sequence parallel (px_tp_set_sequence_split): the residual stream between
// them holds T/P positions a rank.  The embedding reduce-scatters its
// partial (N, T, C) to this rank's (N, T/P, C) instead of all-reducing it,
// and all-gathers dy backward (every rank's ids need their rows' gradient);
// the head all-gathers its input (N, T/P, C) to (N, T, C) and reduce-
// scatters the partial dx back.  The same bytes as the all-reduce, halved.
// The head keeps only its T/P positions and gathers them again in backward
// (as the column-parallel layers do: tp_linear.c).
#include "parallel/tp_internal.h"

#include <string.h>

typedef struct tp_embedding {
  tp_module tm;
  int vocab, dim, first, count;
  px_tensor ids;
  bool awaiting_backward;
  bool seq; /* sequence split: reduce-scatter forward, all-gather backward */
} tp_embedding;

void px_tp_vocab_range(int vocab, int tp_rank, int tp_size, int *first, int *count) {
  const int64_t f = (int64_t)vocab * tp_rank / tp_size, e = (int64_t)vocab * (tp_rank + 1) / tp_size;
  *first = (int)f;
  *count = (int)(e - f);
}

static px_status emb_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  tp_embedding *e = (tp_embedding *)m;
  if (x->dtype != PX_I32 || x->ndim < 1 || x->ndim >= PX_MAX_DIMS) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "VocabParallelEmbedding(%d, %d) \"%s\": input must be int32 ids of 1 to %d dims, "
                    "got %s %s",
                    e->vocab, e->dim, m->params[0].name, PX_MAX_DIMS - 1, px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  const int32_t *ids = (const int32_t *)x->data;
  const int64_t R = px_tensor_numel(x);
  for (int64_t p = 0; p < R; p++)
    if (ids[p] < 0 || ids[p] >= e->vocab)
      return px_error(PX_ERR_INVALID,
                      "VocabParallelEmbedding(%d, %d) \"%s\": token id %d at flat position %lld is "
                      "outside [0, %d)",
                      e->vocab, e->dim, m->params[0].name, ids[p], (long long)p, e->vocab);
  const int P = e->tm.g->size;
  if (e->seq && (x->ndim != 2 || x->shape[1] % P != 0)) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "VocabParallelEmbedding(%d, %d) \"%s\", sequence parallel over tp %d: ids must be "
                    "(N, T) with T a multiple of %d, got %s",
                    e->vocab, e->dim, m->params[0].name, P, P, px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim] = e->dim;
  const size_t C = (size_t)e->dim;
  float *Y;
  px_status st;
  px_arena_mark mk = {0};
  if (e->seq) {  // y is this rank's (N, T/P, C); the partial (N, T, C) is scratch
    shape[1] /= P;
    if ((st = px_ctx_tensor(ctx, y, 3, shape)) != PX_OK) return st;
    mk = px_arena_get_mark(ctx->arena);
    if (!(Y = px_arena_alloc(ctx->arena, (size_t)R * C * sizeof(float)))) return PX_ERR_NOMEM;
  } else {
    if ((st = px_ctx_tensor(ctx, y, x->ndim + 1, shape)) != PX_OK) return st;
    Y = px_f32(y);
  }
  const float *W = m->params[0].data;
  for (int64_t p = 0; p < R; p++) {
    const int local = ids[p] - e->first;
    if (local >= 0 && local < e->count) memcpy(Y + (size_t)p * C, W + (size_t)local * C, C * sizeof(float));
    else memset(Y + (size_t)p * C, 0, C * sizeof(float));
  }
  e->ids = *x;
  e->awaiting_backward = true;
  if (e->seq) {
    st = px_tp_seq_reduce_scatter(e->tm.g, ctx, Y, px_f32(y), x->shape[0], x->shape[1], (int64_t)C, false);
    px_arena_rewind(ctx->arena, mk);
    return st;
  }
  return px_tp_allreduce(e->tm.g, Y, (size_t)R * C, PX_SUM, false);
}

static px_status emb_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  tp_embedding *e = (tp_embedding *)m;
  if (dx)
    return px_error(PX_ERR_INVALID,
                    "VocabParallelEmbedding \"%s\": token ids have no gradient; call backward with "
                    "dx = NULL",
                    m->params[0].name);
  const int32_t *ids = (const int32_t *)e->ids.data;
  const int64_t R = px_tensor_numel(&e->ids);
  const size_t C = (size_t)e->dim;
  float *dW = m->params[0].grad;
  const float *DY = px_f32(dy);
  const px_arena_mark mk = px_arena_get_mark(ctx->arena);
  if (e->seq) {  // every position's dy: this rank's rows may be used anywhere in the sequence
    float *whole = px_arena_alloc(ctx->arena, (size_t)R * C * sizeof(float));
    if (!whole) return PX_ERR_NOMEM;
    px_status st = px_tp_seq_all_gather(e->tm.g, ctx, DY, whole, e->ids.shape[0], e->ids.shape[1], (int64_t)C, true);
    if (st != PX_OK) return st;
    DY = whole;
  }
  // Positions in order: the same bits as the single-process embedding.
  for (int64_t p = 0; p < R; p++) {
    const int local = ids[p] - e->first;
    if (local >= 0 && local < e->count) px_axpy(dW + (size_t)local * C, DY + (size_t)p * C, C, 1.0f);
  }
  px_arena_rewind(ctx->arena, mk);
  e->awaiting_backward = false;
  return PX_OK;
}

const px_module_ops px_tp_vocab_embedding_ops = {
  .type = "VocabParallelEmbedding",
  .forward = emb_forward,
  .backward = emb_backward,
  .init = px_tp_init_boxes,
};

px_module *px_tp_vocab_embedding(px_tp_group *g, int vocab, int dim) {
  if (!g || vocab <= 0 || dim <= 0 || vocab < g->size) {
    px_error(PX_ERR_INVALID,
             "VocabParallelEmbedding(%d, %d): needs a tp group and positive sizes, at least one "
             "row per tp rank (tp %d)",
             vocab, dim, g ? g->size : 0);
    return NULL;
  }
  tp_embedding *e = (tp_embedding *)px_module_alloc(sizeof *e, &px_tp_vocab_embedding_ops);
  if (!e) return NULL;
  e->tm.g = g;
  e->vocab = vocab;
  e->dim = dim;
  px_tp_vocab_range(vocab, g->rank, g->size, &e->first, &e->count);
  px_module_add_param(&e->tm.base, "weight", 2, (int64_t[]){e->count, dim}, PX_INIT_NORMAL, 1.0f, false);
  e->tm.box[0] = (px_tp_box){.split_dim = 0,
                             .n_parts = 1,
                             .global_shape = {vocab, dim},
                             .global_offset = {e->first},
                             .local_offset = {0},
                             .size = {e->count}};
  return &e->tm.base;
}

/* ---- The tied head ----------------------------------------------------------- */

typedef struct tp_head {
  px_module base;
  tp_embedding *emb; /* not owned */
  px_tensor x;       /* saved input (R, C); sequence parallel: this rank's (N, T/P, C) */
  bool seq;          /* sequence split: all-gather x forward (and again backward), reduce-scatter dx */
} tp_head;

static px_status head_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  tp_head *h = (tp_head *)m;
  const tp_embedding *e = h->emb;
  const int C = e->dim, n = e->count;
  if (x->dtype != PX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != C) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "VocabParallelTiedHead(%d -> %d of %d) \"%s\": input %s %s must be f32 ending in "
                    "%d features",
                    C, n, e->vocab, e->tm.base.params[0].name, px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, s, sizeof s), C);
  }
  if (!e->awaiting_backward)
    return px_error(PX_ERR_INVALID,
                    "VocabParallelTiedHead tied to \"%s\": the embedding must run forward before the "
                    "head (its backward, after the head's, reports the gradient complete)",
                    e->tm.base.params[0].name);
  px_status st;
  h->x = *x;
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = n;
  const float *X = px_f32(x);
  px_arena_mark mk = {0};
  if (h->seq) {  // this rank's (N, T/P, C) -> everyone's (N, T, C), scratch (backward gathers again)
    if (x->ndim != 3) {
      char s[PX_SHAPE_STR_MAX];
      return px_error(PX_ERR_SHAPE,
                      "VocabParallelTiedHead \"%s\", sequence parallel: input must be (N, T/tp, %d), "
                      "got %s",
                      e->tm.base.params[0].name, C, px_shape_str(x->ndim, x->shape, s, sizeof s));
    }
    shape[1] *= e->tm.g->size;
    if ((st = px_ctx_tensor(ctx, y, 3, shape)) != PX_OK) return st;
    mk = px_arena_get_mark(ctx->arena);
    float *whole = px_arena_alloc(ctx->arena, (size_t)px_tensor_numel(x) * e->tm.g->size * sizeof(float));
    if (!whole) return PX_ERR_NOMEM;
    if ((st = px_tp_seq_all_gather(e->tm.g, ctx, X, whole, shape[0], shape[1], C, false)) != PX_OK) return st;
    X = whole;
  } else if ((st = px_ctx_tensor(ctx, y, x->ndim, shape)) != PX_OK) {
    return st;
  }
  const int R = (int)(px_tensor_numel(y) / n);
  // logits_r = x · E_rᵀ     (R, C)·(C, n_r)
  px_sgemm(false, true, R, n, C, 1.0f, X, C, e->tm.base.params[0].data, C, 0.0f, px_f32(y), n);
  if (h->seq) px_arena_rewind(ctx->arena, mk);
  return PX_OK;
}

static px_status head_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  tp_head *h = (tp_head *)m;
  const tp_embedding *e = h->emb;
  const int C = e->dim, n = e->count;
  const int R = (int)(px_tensor_numel(dy) / n);  // every position (sequence parallel: T, not T/P)
  const px_param *E = &e->tm.base.params[0];
  if (!e->awaiting_backward)
    return px_error(PX_ERR_INVALID, "VocabParallelTiedHead tied to \"%s\": the embedding's backward already ran",
                    E->name);
  px_status st;
  if (h->seq) {
    const int64_t N = h->x.shape[0], Tl = h->x.shape[1], T = Tl * e->tm.g->size;
    if (dx && (st = px_ctx_tensor(ctx, dx, 3, (int64_t[]){N, Tl, C})) != PX_OK) return st;
    const px_arena_mark mk = px_arena_get_mark(ctx->arena);
    float *whole = px_arena_alloc(ctx->arena, (size_t)R * C * sizeof(float));
    if (!whole) return PX_ERR_NOMEM;
    if ((st = px_tp_seq_all_gather(e->tm.g, ctx, px_f32(&h->x), whole, N, T, C, true)) != PX_OK) return st;
    // dE_r += dyᵀ · x     (n_r, R)·(R, C)
    px_sgemm(true, false, n, C, R, 1.0f, px_f32(dy), n, whole, C, 1.0f, E->grad, C);
    if (dx) {               // the partial (N, T, C), reduce-scattered to this rank's positions
      float *part = whole;  // x is no longer needed
      px_sgemm(false, false, R, C, n, 1.0f, px_f32(dy), n, E->data, C, 0.0f, part, C);
      st = px_tp_seq_reduce_scatter(e->tm.g, ctx, part, px_f32(dx), N, T, C, true);
    }
    px_arena_rewind(ctx->arena, mk);
    return st;
  }
  // dE_r += dyᵀ · x     (n_r, R)·(R, C)
  px_sgemm(true, false, n, C, R, 1.0f, px_f32(dy), n, px_f32(&h->x), C, 1.0f, E->grad, C);
  if (!dx) return PX_OK;
  if ((st = px_ctx_tensor_like(ctx, dx, &h->x)) != PX_OK) return st;
  // dx = Σ_r dy_r · E_r   (R, n_r)·(n_r, C), summed over the group
  px_sgemm(false, false, R, C, n, 1.0f, px_f32(dy), n, E->data, C, 0.0f, px_f32(dx), C);
  return px_tp_allreduce(e->tm.g, px_f32(dx), (size_t)R * C, PX_SUM, true);
}

static const px_module_ops tp_head_ops = {
  .type = "VocabParallelTiedHead",
  .forward = head_forward,
  .backward = head_backward,
};

px_module *px_tp_vocab_tied_head(px_tp_group *g, px_module *embedding) {
  if (!embedding || embedding->ops != &px_tp_vocab_embedding_ops || ((tp_embedding *)embedding)->tm.g != g) {
    px_error(PX_ERR_INVALID, "VocabParallelTiedHead: needs a px_tp_vocab_embedding of the same tp group, got %s",
             embedding ? embedding->ops->type : "NULL");
    return NULL;
  }
  tp_head *h = (tp_head *)px_module_alloc(sizeof *h, &tp_head_ops);
  if (!h) return NULL;
  h->emb = (tp_embedding *)embedding;
  if (px_module_add_foreign_param(&h->base, &embedding->params[0]) != PX_OK) {
    px_module_free(&h->base);
    return NULL;
  }
  return &h->base;
}

bool px_tp_vocab_set_sequence_split(px_module *m, bool on) {
  if (m && m->ops == &px_tp_vocab_embedding_ops) ((tp_embedding *)m)->seq = on;
  else if (m && m->ops == &tp_head_ops) ((tp_head *)m)->seq = on;
  else return false;
  return true;
}
