/* Claim: every parameter of the tensor-parallel GPT is a box of the named
 * global tensor (DESIGN decision 8): the tp ranks' boxes of a split tensor
 * cover each of its elements exactly once, a replicated tensor is held
 * whole by every rank, names are the single-process names; c_attn's box is
 * its heads' q, k and v columns; px_tp_load_state_dict fills a tp model
 * (of another seed) with the boxes of a single-process model, after which
 * both give the same loss; and a full model of another width is refused
 * naming the parameter.  tp 2 and 4, threads backend.
 * If this fails, a checkpoint storing these boxes would lose or duplicate
 * elements, or a full model would not move into tensor-parallel form. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { V = 23, T = 6, C = 16, H = 4 };

static const px_gpt_config full_cfg =
  {.vocab_size = V, .context = T, .n_layer = 2, .n_head = H, .n_embd = C, .dropout = 0.0f};

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  px_tp_group g = px_tp_group_of(c);
  const int P = g.size, rank = g.rank;
  px_tp_gpt_config cfg = {.vocab_size = V, .context = T, .n_layer = 2, .n_head = H, .n_embd = C, .dropout = 0.0f};
  px_model *tp, *full;
  CHECK_OK(px_model_create(&tp, px_tp_gpt(&g, &cfg), 5));
  CHECK_OK(px_model_create(&full, px_zoo_gpt(&full_cfg), 11));
  CHECK(tp->n_params == full->n_params, "%d parameters, one process %d", tp->n_params, full->n_params);
  // Coverage: each rank marks the global elements its box holds; the sum
  // over ranks must be P for replicated tensors and 1 for split ones.
  for (int i = 0; i < tp->n_params; i++) {
    const px_param *p = tp->params[i], *q = px_model_find(full, p->name);
    CHECK(q != NULL, "\"%s\" has no single-process namesake", p->name);
    if (!q) continue;
    float *global = malloc(q->numel * sizeof *global), *local = malloc(p->numel * sizeof *local);
    for (size_t k = 0; k < q->numel; k++) global[k] = (float)k;  // each element its index
    px_tp_box_take(p, global, local);
    memset(global, 0, q->numel * sizeof *global);
    for (size_t k = 0; k < p->numel; k++) global[(size_t)local[k]] += 1.0f;
    CHECK_OK(px_comm_allreduce(c, global, q->numel, PX_F32, PX_SUM));
    const px_tp_box b = px_tp_param_box(p);
    const float want = b.split_dim < 0 ? (float)P : 1.0f;
    size_t wrong = 0;
    for (size_t k = 0; k < q->numel; k++) wrong += global[k] != want;
    CHECK(wrong == 0, "tp %d: \"%s\": %zu of %zu elements held %s", P, p->name, wrong, q->numel,
          b.split_dim < 0 ? "by fewer than every rank" : "by no rank or by two");
    free(global);
    free(local);
  }
  // c_attn: rank r's q, k, v columns [r·C/P, (r+1)·C/P) of each third.
  const px_tp_box qkv = px_tp_param_box(px_model_find(tp, "h.0.attn.c_attn.weight"));
  CHECK(qkv.split_dim == 1 && qkv.n_parts == 3 && qkv.global_shape[0] == C && qkv.global_shape[1] == 3 * C,
        "c_attn.weight's box: split %d, %d parts of (%lld, %lld)", qkv.split_dim, qkv.n_parts,
        (long long)qkv.global_shape[0], (long long)qkv.global_shape[1]);
  for (int part = 0; part < 3; part++)
    CHECK(qkv.global_offset[part] == part * C + rank * (C / P) && qkv.size[part] == C / P,
          "c_attn.weight part %d: offset %lld size %lld", part, (long long)qkv.global_offset[part],
          (long long)qkv.size[part]);
  CHECK(px_tp_param_box(px_model_find(tp, "h.0.ln_1.weight")).split_dim == -1, "ln_1 is not replicated");
  CHECK(px_tp_param_box(px_model_find(tp, "h.0.attn.c_proj.bias")).split_dim == -1, "c_proj.bias is not replicated");
  // Load the single-process model (another seed): same loss.
  px_state_dict sd;
  CHECK_OK(px_model_state_dict(full, &sd));
  CHECK_OK(px_tp_load_state_dict(tp, &sd));
  int32_t ids[2 * T], tg[2 * T];
  for (int i = 0; i < 2 * T; i++) {
    ids[i] = (i * 5) % V;
    tg[i] = (i * 3 + 2) % V;
  }
  px_tensor x = px_tensor_view(ids, PX_I32, 2, (int64_t[]){2, T}), y, yf;
  CHECK_OK(px_model_forward(tp, &x, &y));
  CHECK_OK(px_model_forward(full, &x, &yf));
  float l, lf;
  CHECK_OK(px_tp_cross_entropy(&g, &y, V, tg, -100, &l, NULL));
  CHECK_OK(px_cross_entropy_loss(&yf, tg, NULL, &lf, NULL));
  CHECK(fabs(l - lf) <= 1e-6 * fabs(lf), "tp %d: loaded model's loss %.9g, one process %.9g", P, (double)l, (double)lf);
  px_state_dict_free(&sd);
  // A full model of another width: refused, naming the parameter.
  px_gpt_config wide = full_cfg;
  wide.n_embd = 2 * C;
  px_model *other;
  CHECK_OK(px_model_create(&other, px_zoo_gpt(&wide), 1));
  CHECK_OK(px_model_state_dict(other, &sd));
  px_status st = px_tp_load_state_dict(tp, &sd);
  CHECK(st == PX_ERR_SHAPE && strstr(px_last_error(), "\"wte.weight\" is F32 (23, 32) in the full model"),
        "another width: %s \"%s\"", px_status_name(st), px_last_error());
  if (rank == 0) printf("  tp %d: boxes cover every tensor once; refused: %s\n", P, px_last_error());
  px_state_dict_free(&sd);
  px_model_free(other);
  px_model_free(full);
  px_model_free(tp);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 4; n *= 2) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run, NULL, &code));
    CHECK(code == 0, "tp %d: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_tp_boxes_cover_and_load");
}
