/* Claim: the transformer layers refuse bad input with errors that say what
 * and where (a token id out of range names the id and its position; a
 * sequence longer than the positional table; wrong widths; an embedding fed
 * floats); the tied head refuses a model in which the embedding's backward
 * would come before the head's (DDP would all-reduce wte's gradient before
 * the head's share is in); every layer's backward ADDS into the parameter
 * gradients (two backward passes give twice one, for the whole GPT);
 * and the embedding's scatter-add and the attention give the same bits with
 * 1 and 2 threads.
 * If this fails, a user gets a crash or a silent wrong answer instead of a
 * message, gradient accumulation (and tying) is wrong, or runs differ with
 * the thread count. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static px_model *make(px_module *root) {
  px_model *md;
  CHECK_OK(px_model_create(&md, root, 3));
  return md;
}

static void expect_error(px_status st, px_status want, const char *needle) {
  CHECK(st == want, "status %s, expected %s (%s)", px_status_name(st), px_status_name(want), px_last_error());
  CHECK(strstr(px_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", px_last_error(), needle);
}

static void check_bad_inputs(void) {
  px_gpt_config cfg = {.vocab_size = 10, .context = 4, .n_layer = 1, .n_head = 2, .n_embd = 8, .dropout = 0.0f};
  px_model *md = make(px_zoo_gpt(&cfg));
  px_tensor y;
  int32_t ids[2 * 3] = {1, 2, 3, 4, 5, 9};
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, 3});
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(y.ndim == 3 && y.shape[0] == 2 && y.shape[1] == 3 && y.shape[2] == 10, "logits (2, 3, 10)");
  ids[4] = 10;
  expect_error(px_model_forward(md, &t, &y), PX_ERR_INVALID, "token id 10 at position (1, 1)");
  expect_error(px_model_forward(md, &t, &y), PX_ERR_INVALID, "wte.weight");
  ids[4] = -1;
  expect_error(px_model_forward(md, &t, &y), PX_ERR_INVALID, "token id -1 at position (1, 1)");
  ids[4] = 5;
  int32_t longer[5] = {0, 1, 2, 3, 4};
  px_tensor tl = px_tensor_view(longer, PX_I32, 2, (int64_t[]){1, 5});
  expect_error(px_model_forward(md, &tl, &y), PX_ERR_SHAPE, "T = 5 exceeds the context of 4");
  float f[6] = {0};
  px_tensor tf = px_tensor_f32(f, 2, 2, 3, 0, 0);
  expect_error(px_model_forward(md, &tf, &y), PX_ERR_SHAPE, "int32 token ids");
  px_model_free(md);

  // Layers alone: wrong widths.
  md = make(px_causal_self_attention(8, 2, 0.0f, 0.0f));
  float x[2 * 3 * 6] = {0};
  px_tensor xt = px_tensor_f32(x, 3, 2, 3, 6, 0);
  expect_error(px_model_forward(md, &xt, &y), PX_ERR_SHAPE, "c_attn.weight");
  px_model_free(md);
  md = make(px_conv1d(8, 4, true));
  expect_error(px_model_forward(md, &xt, &y), PX_ERR_SHAPE, "ending in 8 features");
  px_model_free(md);
  CHECK(px_causal_self_attention(10, 3, 0.0f, 0.0f) == NULL, "10 is not a multiple of 3 heads");
  CHECK(strstr(px_last_error(), "multiple of the number of heads") != NULL, "%s", px_last_error());
  cfg.n_head = 3;
  CHECK(px_zoo_gpt(&cfg) == NULL, "gpt with n_embd 8 over 3 heads refused");
  px_module *relu = px_relu();
  CHECK(px_tied_head(relu) == NULL, "a head tied to a ReLU refused");
  px_module_free(relu);
}

/* A container that runs its children in an order given by the test:
 * child 0 is an embedding, child 1 the head tied to it. */
typedef struct order_box {
  px_module base;
  bool head_first_in_forward;
  bool embedding_first_in_backward;
  px_tensor h;
} order_box;

static px_status box_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  order_box *b = (order_box *)m;
  if (b->head_first_in_forward) {
    // The head on a float input before the embedding ran.
    static float h[2 * 4];
    px_tensor ht = px_tensor_f32(h, 2, 2, 4, 0, 0);
    return px_module_forward(m->children[1], ctx, &ht, y);
  }
  px_status st = px_module_forward(m->children[0], ctx, x, &b->h);
  return st != PX_OK ? st : px_module_forward(m->children[1], ctx, &b->h, y);
}

static px_status box_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  order_box *b = (order_box *)m;
  px_tensor dh;
  if (b->embedding_first_in_backward) {
    px_status st = px_module_backward(m->children[0], ctx, &b->h, NULL);  // any dy of h's shape
    return st != PX_OK ? st : px_module_backward(m->children[1], ctx, dy, &dh);
  }
  px_status st = px_module_backward(m->children[1], ctx, dy, &dh);
  return st != PX_OK ? st : px_module_backward(m->children[0], ctx, &dh, dx);
}

static const px_module_ops box_ops = {.type = "OrderBox", .forward = box_forward, .backward = box_backward};

static px_model *box_model(bool head_first, bool emb_first) {
  order_box *b = (order_box *)px_module_alloc(sizeof *b, &box_ops);
  b->head_first_in_forward = head_first;
  b->embedding_first_in_backward = emb_first;
  px_module *wte = px_embedding(6, 4);
  CHECK_OK(px_module_add_child(&b->base, "wte", wte));
  CHECK_OK(px_module_add_child(&b->base, "lm_head", px_tied_head(wte)));
  return make(&b->base);
}

static void check_tie_order(void) {
  int32_t ids[2] = {1, 5};
  px_tensor t = px_tensor_view(ids, PX_I32, 1, (int64_t[]){2});
  px_tensor y;
  // Right order: works.
  px_model *md = box_model(false, false);
  CHECK_OK(px_model_forward(md, &t, &y));
  px_tensor dy = y;
  dy.data = px_model_scratch(md, 12);
  memset(dy.data, 0, 12 * sizeof(float));
  CHECK_OK(px_model_backward(md, &dy, NULL));
  px_model_free(md);
  // The head before the embedding in forward.
  md = box_model(true, false);
  expect_error(px_model_forward(md, &t, &y), PX_ERR_INVALID, "has not run forward before the head");
  px_model_free(md);
  // The embedding's backward (its grads_ready) before the head's.
  md = box_model(false, true);
  CHECK_OK(px_model_forward(md, &t, &y));
  dy = y;
  dy.data = px_model_scratch(md, 12);
  memset(dy.data, 0, 12 * sizeof(float));
  expect_error(px_model_backward(md, &dy, NULL), PX_ERR_INVALID, "backward already ran");
  px_model_free(md);
}

static void fill_ids(int32_t *ids, size_t n, int vocab, uint64_t seed) {
  px_rng r = px_rng_make(seed, 0);
  for (size_t i = 0; i < n; i++) ids[i] = (int32_t)px_rng_below(&r, (uint64_t)vocab);
}

// Gradients of one backward; `passes` backward passes after one forward each.
static float *gpt_grads(px_model *md, const px_tensor *t, int passes) {
  px_model_zero_grad(md);
  for (int k = 0; k < passes; k++) {
    px_tensor y;
    CHECK_OK(px_model_forward(md, t, &y));
    px_tensor dy = y;
    size_t n = (size_t)px_tensor_numel(&y);
    dy.data = px_model_scratch(md, n);
    px_rng r = px_rng_make(9, 9);
    for (size_t i = 0; i < n; i++) px_f32(&dy)[i] = px_rng_uniform(&r) - 0.5f;
    CHECK_OK(px_model_backward(md, &dy, NULL));
  }
  float *g = malloc(md->n_param_elems * sizeof *g);
  memcpy(g, md->grad_data, md->n_param_elems * sizeof *g);
  return g;
}

static void check_accumulation(void) {
  // Dropout on: the masks depend on the step, so each pass differs; turn
  // it off to compare 2 passes with 2 × 1.
  px_gpt_config cfg = {.vocab_size = 13, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0.0f};
  px_model *md = make(px_zoo_gpt(&cfg));
  int32_t ids[3 * 7];
  fill_ids(ids, 21, 13, 1);
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){3, 7});
  float *g1 = gpt_grads(md, &t, 1), *g2 = gpt_grads(md, &t, 2);
  for (int k = 0; k < md->n_params; k++) {
    const px_param *p = md->params[k];
    // Exact for a gradient written by one addition per pass; rounding of
    // the order of additions (wte: head, then scatter) otherwise.
    const float scale = px_max_abs(g1 + p->offset, p->numel);
    size_t bad = 0;
    for (size_t i = 0; i < p->numel; i++) bad += fabsf(g2[p->offset + i] - 2.0f * g1[p->offset + i]) > 1e-5f * scale;
    CHECK(bad == 0, "\"%s\": %zu of %zu gradient elements are not twice one pass", p->name, bad, p->numel);
  }
  free(g1);
  free(g2);
  px_model_free(md);
}

static void check_scatter_threads(void) {
  // 64 × 64 positions, width 64: 262,144 elements, enough for the parallel path.
  enum { V = 50, C = 64, R = 64 * 64 };
  static int32_t ids[R];
  fill_ids(ids, R, V, 2);
  px_tensor t = px_tensor_view(ids, PX_I32, 2, (int64_t[]){64, 64});
  float *g[2];
  for (int k = 0; k < 2; k++) {
    px_set_num_threads(k + 1);
    px_model *md = make(px_embedding(V, C));
    g[k] = gpt_grads(md, &t, 1);
    px_model_free(md);
  }
  CHECK(memcmp(g[0], g[1], (size_t)V * C * sizeof(float)) == 0, "embedding gradient differs between 1 and 2 threads");
  free(g[0]);
  free(g[1]);
}

// The attention's core runs each (n, head) on one thread: 1 and 2 threads
// give the same bits.  Sizes: the core's N·H·T·T·d = 2^19 multiply-adds
// opens its OpenMP region (two tiles of query rows per head), while the
// Conv1D GEMMs (at most 512·24·8) stay below OpenBLAS's threading
// threshold, so they cannot differ either.
static void check_attention_threads(void) {
  enum { N = 4, T = 128, C = 8 };
  static float x[N * T * C];
  px_rng r = px_rng_make(4, 4);
  for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = 2.0f * px_rng_uniform(&r) - 1.0f;
  px_tensor xt = px_tensor_f32(x, 3, N, T, C, 0);
  float *g[2], *y[2], *dx[2];
  for (int k = 0; k < 2; k++) {
    px_set_num_threads(k + 1);
    px_module *att = px_causal_self_attention(C, 2, 0.1f, 0.0f);
    for (int c = 0; c < 2; c++) att->children[c]->params[0].init_a = 0.5f;  // attention far from uniform
    px_model *md = make(att);
    px_tensor out, dxt;
    CHECK_OK(px_model_forward(md, &xt, &out));
    px_tensor dy = out;
    dy.data = px_model_scratch(md, (size_t)px_tensor_numel(&out));
    px_rng rd = px_rng_make(4, 5);  // the same dy both times
    for (size_t i = 0; i < (size_t)px_tensor_numel(&out); i++) px_f32(&dy)[i] = px_rng_uniform(&rd) - 0.5f;
    px_model_zero_grad(md);
    CHECK_OK(px_model_backward(md, &dy, &dxt));
    y[k] = malloc(sizeof x);
    dx[k] = malloc(sizeof x);
    g[k] = malloc(md->n_param_elems * sizeof(float));
    memcpy(y[k], out.data, sizeof x);
    memcpy(dx[k], dxt.data, sizeof x);
    memcpy(g[k], md->grad_data, md->n_param_elems * sizeof(float));
    if (k == 1) {
      CHECK(memcmp(y[0], y[1], sizeof x) == 0, "attention output differs between 1 and 2 threads");
      CHECK(memcmp(dx[0], dx[1], sizeof x) == 0, "attention input gradient differs between 1 and 2 threads");
      CHECK(memcmp(g[0], g[1], md->n_param_elems * sizeof(float)) == 0,
            "attention parameter gradients differ between 1 and 2 threads");
    }
    px_model_free(md);
  }
  for (int k = 0; k < 2; k++) {
    free(g[k]);
    free(y[k]);
    free(dx[k]);
  }
}

int main(void) {
  check_bad_inputs();
  check_tie_order();
  check_accumulation();
  check_scatter_threads();
  check_attention_threads();
  return px_test_finish("test_transformer_layers_check_inputs_and_accumulate");
}
