// Token embedding (nn.Embedding) and learned positional embedding (GPT-2's
// wpe, added to its input).
//
// Embedding:     ids (...) i32 in [0, V)   W: (V, C)   y: (..., C)
//                y[p, :] = W[ids[p], :]
//                dW[ids[p], :] += dy[p, :]   (scatter-add; ids get no gradient)
// PosEmbedding:  x: (N, T, C)   W: (context, C)   T <= context
//                y[n, t, :] = x[n, t, :] + W[t, :]
//                dW[t, :] += Σ_n dy[n, t, :]     dx = dy (a view)
//
// GPT's input is Embedding → PosEmbedding → Dropout: wte(ids) + wpe(t).
//
// Determinism: the scatter-add of a repeated id sums rows of dy in position
// order whatever the thread count: a thread owns a block of columns of dW
// and walks every position in order, so no two threads touch one element
// and each element's additions come in the same order.
//
// On the GPU (ids, or PosEmbedding's input, with device PX_CUDA) the same
// math runs in src/tensor/cuda/k_embedding.cu.  The gather records the first
// bad id's position in a device word; forward copies that word back (one
// 8-byte copy, which waits for the stream) and fails with the CPU's message.
// Backward copies the ids to the host, sorts the positions by (id,
// position) (a counting sort over the vocabulary), uploads them, and one
// thread per (id, column) adds the rows of dy in position order: the CPU's
// additions in the CPU's order, so the same bits, and no atomics.
#include "plexus/nn.h"
#include "nn/device.h"
#include "nn/internal.h"
#include "tensor/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Columns of dW one thread owns: one AVX-512 vector.
#define EMB_COL_BLOCK 16

typedef struct embedding {
  px_module base;
  int vocab, dim;
  px_tensor ids;          /* saved input (...) i32 */
  bool awaiting_backward; /* forward ran, its backward has not (px_embedding_pending) */
#ifdef PX_HAVE_CUDA
  int32_t *host;   /* backward on the GPU: host scratch for the sort */
  size_t host_cap; /* its capacity, in int32 */
#endif
} embedding;

static const px_module_ops embedding_ops;

// "(1, 7)" for flat index p of a tensor of `shape`.
static char *index_str(int64_t p, int ndim, const int64_t *shape, char *buf, size_t len) {
  int64_t idx[PX_MAX_DIMS];
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = shape[d] ? p % shape[d] : 0;
    p = shape[d] ? p / shape[d] : 0;
  }
  size_t n = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < ndim && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (n < len) snprintf(buf + n, len - n, ")");
  return buf;
}

// The error for id `id` at flat position p of the ids x.
static px_status bad_id(const embedding *e, const px_tensor *x, int32_t id, int64_t p) {
  char s[PX_SHAPE_STR_MAX], at[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_INVALID,
                  "Embedding(%d, %d) \"%s\": token id %d at position %s of the ids %s "
                  "is outside [0, %d)",
                  e->vocab, e->dim, e->base.params[0].name, id, index_str(p, x->ndim, x->shape, at, sizeof at),
                  px_shape_str(x->ndim, x->shape, s, sizeof s), e->vocab);
}

#ifdef PX_HAVE_CUDA
static px_status emb_forward_cuda(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  embedding *e = (embedding *)m;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st != PX_OK) return st;
  const int64_t R = px_tensor_numel(x);
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim] = e->dim;
  if ((st = px_ctx_tensor(ctx, y, x->ndim + 1, shape)) != PX_OK) return st;
  uint64_t *bad = px_arena_alloc(ctx->arena, sizeof(uint64_t)), first_bad = 0;
  if (!bad) return PX_ERR_NOMEM;
  st = px_k_embedding_forward((const int32_t *)x->data, m->params[0].data, px_f32(y), bad, R, e->vocab, e->dim);
  if (st == PX_OK) st = px_cuda_to_host(&first_bad, bad, sizeof first_bad);
  if (st != PX_OK) return st;
  if (first_bad != UINT64_MAX) {
    int32_t id = 0;
    if ((st = px_cuda_to_host(&id, (const int32_t *)x->data + first_bad, sizeof id)) != PX_OK) return st;
    return bad_id(e, x, id, (int64_t)first_bad);
  }
  e->ids = *x;
  e->awaiting_backward = true;
  return PX_OK;
}

// dW[ids[p], :] += dy[p, :] in position order: the ids come to the host,
// a counting sort over the vocabulary groups the positions by id (each
// group in increasing position), and the groups go to the device as
// [segment ids (S) | segment starts (S + 1) | positions (R)].
static px_status emb_backward_cuda(px_module *m, px_ctx *ctx, const px_tensor *dy) {
  embedding *e = (embedding *)m;
  px_status st = px_nn_cuda_ctx(ctx, m);
  if (st != PX_OK) return st;
  const int64_t R = px_tensor_numel(&e->ids);
  const int V = e->vocab;
  if (R > INT32_MAX - 1)
    return px_error(PX_ERR_INVALID, "Embedding \"%s\": %lld positions in one backward, more than %d", m->params[0].name,
                    (long long)R, INT32_MAX - 1);
  // Host scratch: ids (R), counts (V + 1), then the upload (S + S + 1 + R <= 3R + 1).
  const size_t need = (size_t)R + (size_t)V + 1 + 3 * (size_t)R + 1;
  if (need > e->host_cap) {
    int32_t *h = realloc(e->host, need * sizeof(int32_t));
    if (!h)
      return px_error(PX_ERR_NOMEM, "Embedding \"%s\": %zu bytes of host scratch", m->params[0].name,
                      need * sizeof(int32_t));
    e->host = h;
    e->host_cap = need;
  }
  int32_t *ids = e->host, *count = ids + R, *up = count + V + 1;
  if (R && (st = px_cuda_to_host(ids, e->ids.data, (size_t)R * sizeof(int32_t))) != PX_OK) return st;
  memset(count, 0, ((size_t)V + 1) * sizeof(int32_t));
  for (int64_t p = 0; p < R; p++) {
    if (ids[p] < 0 || ids[p] >= V) return bad_id(e, &e->ids, ids[p], p);
    count[ids[p]]++;
  }
  int32_t S = 0;
  for (int v = 0; v < V; v++) S += count[v] > 0;
  int32_t *seg_id = up, *seg_start = up + S, *pos = seg_start + S + 1;
  // count[v] becomes the next free slot of id v in pos; the segments in id order.
  int32_t at = 0, s = 0;
  for (int v = 0; v < V; v++) {
    const int32_t c = count[v];
    if (!c) continue;
    seg_id[s] = v;
    seg_start[s++] = at;
    count[v] = at;
    at += c;
  }
  seg_start[S] = at;
  for (int64_t p = 0; p < R; p++) pos[count[ids[p]]++] = (int32_t)p;
  const size_t n_up = (size_t)S + (size_t)S + 1 + (size_t)R;
  int32_t *dev = px_arena_alloc(ctx->arena, n_up * sizeof(int32_t));
  if (!dev) return PX_ERR_NOMEM;
  if ((st = px_cuda_to_device(dev, up, n_up * sizeof(int32_t))) != PX_OK) return st;
  return px_k_embedding_backward(dev, dev + S, dev + S + S + 1, S, px_f32(dy), m->params[0].grad, e->dim);
}

static void emb_destroy(px_module *m) {
  embedding *e = (embedding *)m;
  free(e->host);
  e->host = NULL;
  e->host_cap = 0;
}
#endif

static px_status emb_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  embedding *e = (embedding *)m;
  if (x->dtype != PX_I32 || x->ndim < 1 || x->ndim >= PX_MAX_DIMS) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "Embedding(%d, %d) \"%s\": input must be int32 token ids of 1 to %d dims, "
                    "got %s %s",
                    e->vocab, e->dim, m->params[0].name, PX_MAX_DIMS - 1, px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) return emb_forward_cuda(m, ctx, x, y);
  if (ctx->device == PX_CUDA)
    return px_error(PX_ERR_INVALID,
                    "Embedding(%d, %d) \"%s\": the model is on the GPU but the token ids are on "
                    "the host; copy them to the device first",
                    e->vocab, e->dim, m->params[0].name);
#endif
  const int32_t *ids = (const int32_t *)x->data;
  const int64_t R = px_tensor_numel(x);
  for (int64_t p = 0; p < R; p++)
    if (ids[p] < 0 || ids[p] >= e->vocab) return bad_id(e, x, ids[p], p);
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim] = e->dim;
  px_status st = px_ctx_tensor(ctx, y, x->ndim + 1, shape);
  if (st != PX_OK) return st;
  const size_t C = (size_t)e->dim;
  const float *W = m->params[0].data;
  float *Y = px_f32(y);
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)R * C))
  for (int64_t p = 0; p < R; p++) memcpy(Y + (size_t)p * C, W + (size_t)ids[p] * C, C * sizeof(float));
  e->ids = *x;
  e->awaiting_backward = true;
  return PX_OK;
}

static px_status emb_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  embedding *e = (embedding *)m;
  if (dx)
    return px_error(PX_ERR_INVALID,
                    "Embedding \"%s\": its input (token ids) has no gradient; "
                    "call backward with dx = NULL",
                    m->params[0].name);
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) {
    px_status st = emb_backward_cuda(m, ctx, dy);
    if (st == PX_OK) e->awaiting_backward = false;
    return st;
  }
#endif
  const int32_t *ids = (const int32_t *)e->ids.data;
  const int64_t R = px_tensor_numel(&e->ids);
  const int C = e->dim;
  const float *DY = px_f32(dy);
  float *dW = m->params[0].grad;
  // dW[ids[p], j] += dy[p, j], thread-owned column blocks, positions in order.
  const int blocks = (C + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)R * (size_t)C))
  for (int blk = 0; blk < blocks; blk++) {
    const int j0 = blk * EMB_COL_BLOCK, j1 = j0 + EMB_COL_BLOCK < C ? j0 + EMB_COL_BLOCK : C;
    for (int64_t p = 0; p < R; p++) {
      float *restrict row = dW + (size_t)ids[p] * C;
      const float *restrict g = DY + (size_t)p * C;
#pragma omp simd
      for (int j = j0; j < j1; j++) row[j] += g[j];
    }
  }
  e->awaiting_backward = false;
  (void)ctx;
  return PX_OK;
}

static const px_module_ops embedding_ops = {
  .type = "Embedding",
  .forward = emb_forward,
  .backward = emb_backward,
#ifdef PX_HAVE_CUDA
  .destroy = emb_destroy,
#endif
};

px_module *px_embedding(int num_embeddings, int dim) {
  if (num_embeddings <= 0 || dim <= 0) {
    px_error(PX_ERR_INVALID, "Embedding(%d, %d): sizes must be positive", num_embeddings, dim);
    return NULL;
  }
  embedding *e = (embedding *)px_module_alloc(sizeof *e, &embedding_ops);
  if (!e) return NULL;
  e->vocab = num_embeddings;
  e->dim = dim;
  int64_t shape[2] = {num_embeddings, dim};
  // nn.Embedding: N(0, 1).  GPT-2 uses N(0, 0.02) (px_zoo_gpt sets it).
  px_module_add_param(&e->base, "weight", 2, shape, PX_INIT_NORMAL, 1.0f, false);
  return &e->base;
}

bool px_embedding_pending(const px_module *m) {
  return m && m->ops == &embedding_ops && ((const embedding *)m)->awaiting_backward;
}

bool px_is_embedding(const px_module *m) { return m && m->ops == &embedding_ops; }

/* ---- Learned positional embedding ---------------------------------------- */

typedef struct pos_embedding {
  px_module base;
  int context, dim;
  int part, parts; /* positions part·T .. of a sequence of parts·T (px_pos_embedding_part); 0, 1 */
  int64_t n, t;    /* saved input shape (N, T, C) */
  int64_t offset;  /* saved: the first position, part·T */
} pos_embedding;

static px_status pos_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  pos_embedding *pe = (pos_embedding *)m;
  if (x->dtype != PX_F32 || x->ndim != 3 || x->shape[2] != pe->dim) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "PosEmbedding(%d, %d) \"%s\": input must be f32 (N, T, %d), got %s %s", pe->context,
                    pe->dim, m->params[0].name, pe->dim, px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  if (x->shape[1] * pe->parts > pe->context) {
    if (pe->parts == 1)
      return px_error(PX_ERR_SHAPE,
                      "PosEmbedding(%d, %d) \"%s\": sequence length T = %lld exceeds the context "
                      "of %d positions",
                      pe->context, pe->dim, m->params[0].name, (long long)x->shape[1], pe->context);
    return px_error(PX_ERR_SHAPE,
                    "PosEmbedding(%d, %d) \"%s\" part %d of %d: %lld positions per part make a "
                    "sequence of %lld, more than the context of %d positions",
                    pe->context, pe->dim, m->params[0].name, pe->part, pe->parts, (long long)x->shape[1],
                    (long long)x->shape[1] * pe->parts, pe->context);
  }
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  const int64_t N = x->shape[0], T = x->shape[1];
  const size_t C = (size_t)pe->dim;
  const int64_t off = (int64_t)pe->part * T;
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) {
    if ((st = px_nn_cuda_ctx(ctx, m)) != PX_OK) return st;
    st = px_k_pos_embedding_forward(px_f32(x), m->params[0].data + (size_t)off * C, px_f32(y), N, T, (int)C);
    if (st != PX_OK) return st;
    pe->n = N;
    pe->t = T;
    pe->offset = off;
    return PX_OK;
  }
#endif
  const float *X = px_f32(x), *W = m->params[0].data + (size_t)off * C;
  float *Y = px_f32(y);
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)(N * T) * C))
  for (int64_t r = 0; r < N * T; r++) {
    const float *restrict xr = X + (size_t)r * C, *restrict w = W + (size_t)(r % T) * C;
    float *restrict yr = Y + (size_t)r * C;
#pragma omp simd
    for (size_t j = 0; j < C; j++) yr[j] = xr[j] + w[j];
  }
  pe->n = N;
  pe->t = T;
  pe->offset = off;
  return PX_OK;
}

static px_status pos_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  pos_embedding *pe = (pos_embedding *)m;
  const int64_t N = pe->n, T = pe->t;
  const size_t C = (size_t)pe->dim;
  const float *DY = px_f32(dy);
  float *dW = m->params[0].grad + (size_t)pe->offset * C;
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) {
    px_status st = px_nn_cuda_ctx(ctx, m);
    if (st == PX_OK) st = px_k_pos_embedding_backward(DY, dW, N, T, (int)C);
    if (st != PX_OK) return st;
    if (dx) {
      *dx = *dy;  // the identity, as below; dx stays on the device
      dx->owned = false;
    }
    return PX_OK;
  }
#endif
// dW[offset + t, :] += Σ_n dy[n, t, :], n in order: one thread per position t.
#pragma omp parallel for schedule(static) if (PX_PAR((size_t)(N * T) * C))
  for (int64_t t = 0; t < T; t++) {
    float *restrict w = dW + (size_t)t * C;
    for (int64_t n = 0; n < N; n++) {
      const float *restrict g = DY + ((size_t)n * (size_t)T + (size_t)t) * C;
#pragma omp simd
      for (size_t j = 0; j < C; j++) w[j] += g[j];
    }
  }
  if (dx) {
    *dx = *dy;  // y = x + W[t]: ∂y/∂x is the identity
    dx->owned = false;
  }
  (void)ctx;
  return PX_OK;
}

static const px_module_ops pos_embedding_ops = {
  .type = "PosEmbedding",
  .forward = pos_forward,
  .backward = pos_backward,
};

px_module *px_pos_embedding(int context, int dim) {
  if (context <= 0 || dim <= 0) {
    px_error(PX_ERR_INVALID, "PosEmbedding(%d, %d): sizes must be positive", context, dim);
    return NULL;
  }
  pos_embedding *pe = (pos_embedding *)px_module_alloc(sizeof *pe, &pos_embedding_ops);
  if (!pe) return NULL;
  pe->context = context;
  pe->dim = dim;
  pe->parts = 1;
  int64_t shape[2] = {context, dim};
  // GPT-2's initialisation: N(0, 0.02).
  px_module_add_param(&pe->base, "weight", 2, shape, PX_INIT_NORMAL, 0.02f, false);
  return &pe->base;
}

px_module *px_pos_embedding_part(int context, int dim, int part, int parts) {
  if (parts <= 0 || part < 0 || part >= parts) {
    px_error(PX_ERR_INVALID, "PosEmbedding(%d, %d): part %d of %d: need 0 <= part < parts", context, dim, part, parts);
    return NULL;
  }
  px_module *m = px_pos_embedding(context, dim);
  if (!m) return NULL;
  pos_embedding *pe = (pos_embedding *)m;
  pe->part = part;
  pe->parts = parts;
  return m;
}
