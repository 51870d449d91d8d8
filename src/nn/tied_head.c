// Output projection tied to a token embedding (GPT-2's lm_head):
//
//   logits = x · Eᵀ     x: (..., C)  E: (V, C)  logits: (..., V)
//   dE    += dyᵀ · x    (V, R)·(R, C), into the EMBEDDING's gradient slice
//   dx     = dy · E     (R, V)·(V, C)
//
// E is the embedding module's "weight"; the head declares no parameter of
// its own, so the model holds E once (wte.weight) and both users add into
// the one gradient.
//
// Tying and DDP.  DDP marks a parameter ready when the grads_ready hook of
// the module that OWNS it fires.  The head adds to E's gradient without
// owning it, so the rule is: the owner's backward must come after every
// other user's backward.  Backward runs containers in reverse, so it holds
// when the embedding runs forward before the head in the same pass, as in
// GPT (wte first, lm_head last; wte's backward ends the pass).  The head
// checks the rule every step rather than trusting it: forward fails unless
// the embedding has run forward and still awaits its backward, and backward
// fails if the embedding's backward (and so its grads_ready) has already
// run.  A model built the other way round gets an error, never a DDP
// all-reduce of a gradient that is still missing the head's share.
//
// The head declares E as a foreign parameter (px_module_add_foreign_param),
// so a strategy that gathers parameters or materialises gradient storage
// per module (ZeRO stages 2-3) does it for E around the head too.
//
// On the GPU (input with device PX_CUDA) the three GEMMs go through cuBLAS
// (px_cuda_sgemm, or px_cuda_gemm_bf16 on bf16 casts with compute_dtype
// PX_BF16); E and its gradient are the embedding's device slices.
#include "plexus/nn.h"
#include "nn/device.h"
#include "nn/internal.h"

typedef struct tied_head {
  px_module base;
  px_module *emb; /* the embedding whose weight is E; not owned */
  int vocab, dim;
  px_tensor x; /* saved input (R, C) */
} tied_head;

static const px_module *root_of(const px_module *m) {
  while (m->parent) m = m->parent;
  return m;
}

static px_status head_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  tied_head *h = (tied_head *)m;
  const px_param *E = &h->emb->params[0];
  if (x->dtype != PX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != h->dim) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "TiedHead(%d -> %d, tied to \"%s\"): input %s %s must be f32 ending in %d features",
                    h->dim, h->vocab, E->name, px_dtype_name(x->dtype), px_shape_str(x->ndim, x->shape, s, sizeof s),
                    h->dim);
  }
  if (!E->data || root_of(h->emb) != root_of(m))
    return px_error(PX_ERR_INVALID,
                    "TiedHead: its embedding is not part of the same model; add the embedding "
                    "to the model that holds the head");
  if (!px_embedding_pending(h->emb))
    return px_error(PX_ERR_INVALID,
                    "TiedHead tied to \"%s\": the embedding has not run forward before the head "
                    "in this pass; the tied embedding must come first (its backward must come after the head's, "
                    "so that DDP sees \"%s\" complete only when both gradients are in)",
                    E->name, E->name);
  int64_t shape[PX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = h->vocab;
  px_status st = px_ctx_tensor(ctx, y, x->ndim, shape);
  if (st != PX_OK) return st;
  const int R = (int)(px_tensor_numel(x) / h->dim);
#ifdef PX_HAVE_CUDA
  if (x->device == PX_CUDA) {
    // logits = x · Eᵀ
    px_nn_operand X, W;
    if ((st = px_nn_cuda_ctx(ctx, m)) != PX_OK) return st;
    if ((st = px_nn_cuda_operand(ctx, px_f32(x), (size_t)R * h->dim, &X)) != PX_OK) return st;
    if ((st = px_nn_cuda_operand(ctx, E->data, (size_t)h->vocab * h->dim, &W)) != PX_OK) return st;
    if (X.bf16 && h->vocab % 8 != 0) {
      // Rows of logits not 16-byte aligned (an odd vocabulary): cuBLAS's
      // fast kernels need them so; the product goes to a padded block
      // (from the caching allocator, given back at once: the compute
      // stream orders its reuse) and is copied into y.
      const size_t lp = ((size_t)h->vocab + 7) / 8 * 8;
      float *tmp = px_cuda_malloc((size_t)R * lp * sizeof(float));
      if (!tmp) return px_error_wrap(PX_ERR_NOMEM, "TiedHead: padded logits");
      st = px_nn_cuda_gemm(false, true, R, h->vocab, h->dim, &X, h->dim, &W, h->dim, 0.0f, tmp, (int)lp);
      if (st == PX_OK) st = px_cuda_copy_2d(px_f32(y), (size_t)h->vocab, tmp, lp, (size_t)R, (size_t)h->vocab);
      px_cuda_free(tmp);
    } else {
      st = px_nn_cuda_gemm(false, true, R, h->vocab, h->dim, &X, h->dim, &W, h->dim, 0.0f, px_f32(y), h->vocab);
    }
    if (st == PX_OK) h->x = *x;
    return st;
  }
#endif
  // logits = x · Eᵀ     (R, C)·(C, V)
  px_sgemm(false, true, R, h->vocab, h->dim, 1.0f, px_f32(x), h->dim, E->data, h->dim, 0.0f, px_f32(y), h->vocab);
  h->x = *x;
  return PX_OK;
}

static px_status head_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  tied_head *h = (tied_head *)m;
  const px_param *E = &h->emb->params[0];
  if (!px_embedding_pending(h->emb))
    return px_error(PX_ERR_INVALID,
                    "TiedHead tied to \"%s\": the embedding's backward already ran in this pass, "
                    "so its gradient was reported complete without the head's share; run the embedding before "
                    "the head in forward",
                    E->name);
  const int R = (int)(px_tensor_numel(&h->x) / h->dim);
  const float *DY = px_f32(dy);
#ifdef PX_HAVE_CUDA
  if (dy->device == PX_CUDA) {
    // dE += dyᵀ · x, then dx = dy · E
    // (In bf16 dy's copy has its rows padded to 16 bytes: ldd.)
    px_nn_operand D, X, W;
    int ldd = h->vocab;
    px_status st = px_nn_cuda_ctx(ctx, m);
    if (st == PX_OK) st = px_nn_cuda_operand_padded(ctx, DY, (size_t)R, (size_t)h->vocab, &D, &ldd);
    if (st == PX_OK) st = px_nn_cuda_operand(ctx, px_f32(&h->x), (size_t)R * h->dim, &X);
    if (st == PX_OK) st = px_nn_cuda_gemm(true, false, h->vocab, h->dim, R, &D, ldd, &X, h->dim, 1.0f, E->grad, h->dim);
    if (st != PX_OK || !dx) return st;
    if ((st = px_ctx_tensor_like(ctx, dx, &h->x)) != PX_OK) return st;
    if ((st = px_nn_cuda_operand(ctx, E->data, (size_t)h->vocab * h->dim, &W)) != PX_OK) return st;
    return px_nn_cuda_gemm(false, false, R, h->dim, h->vocab, &D, ldd, &W, h->dim, 0.0f, px_f32(dx), h->dim);
  }
#endif
  // dE += dyᵀ · x      dy: (R, V)  x: (R, C)  dE: (V, C)
  px_sgemm(true, false, h->vocab, h->dim, R, 1.0f, DY, h->vocab, px_f32(&h->x), h->dim, 1.0f, E->grad, h->dim);
  if (!dx) return PX_OK;
  // dx = dy · E        dy: (R, V)  E: (V, C)  dx: (R, C)
  px_status st = px_ctx_tensor_like(ctx, dx, &h->x);
  if (st != PX_OK) return st;
  px_sgemm(false, false, R, h->dim, h->vocab, 1.0f, DY, h->vocab, E->data, h->dim, 0.0f, px_f32(dx), h->dim);
  return PX_OK;
}

static const px_module_ops tied_head_ops = {
  .type = "TiedHead",
  .forward = head_forward,
  .backward = head_backward,
};

px_module *px_tied_head(px_module *embedding) {
  if (!px_is_embedding(embedding)) {
    px_error(PX_ERR_INVALID, "TiedHead: needs a px_embedding to tie to, got %s",
             embedding ? embedding->ops->type : "NULL");
    return NULL;
  }
  tied_head *h = (tied_head *)px_module_alloc(sizeof *h, &tied_head_ops);
  if (!h) return NULL;
  h->emb = embedding;
  // Say so in the protocol too: strategies that gather parameters or
  // materialise gradients per module (ZeRO 2-3) must do it for E around the
  // head as well as around the embedding.
  if (px_module_add_foreign_param(&h->base, &embedding->params[0]) != PX_OK) {
    px_module_free(&h->base);
    return NULL;
  }
  h->vocab = (int)embedding->params[0].shape[0];
  h->dim = (int)embedding->params[0].shape[1];
  return &h->base;
}
